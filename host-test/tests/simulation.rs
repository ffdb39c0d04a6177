//! The bounded simulation CI runs (`make simulate SEEDS=A..B` runs more):
//! both engines, every path of the scheduler reached, the exactly-once ones
//! included (transactional handlers' commits, rollbacks, fences, lock
//! conflicts, crashes inside transactions, renewals held, lost and failed,
//! live owners kept past the TTL, silent ones taken over).

use std::ops::Range;

use idempotency_ledger_host_test::sim::{run_seeds, SimDb};

const STEPS: u64 = 2_000;

/// Runs `seeds` on one engine (the component, or the native core) over a
/// SQLite file: every step taken, every path of the scheduler reached.
fn simulate(seeds: Range<u64>, component: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let (engine, reproduce) = if component { ("component", " COMPONENT=1") } else { ("native core", "") };
    match run_seeds(seeds.clone(), STEPS, component, SimDb::Sqlite(dir.path())) {
        Ok(report) => {
            println!("simulation ({engine}): seeds {seeds:?}: {report}");
            assert_eq!(report.steps, (seeds.end - seeds.start) * STEPS);
            assert!(report.unreached().is_empty(), "the scheduler must reach every path; not reached: {:?}", report.unreached());
        }
        Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed>{reproduce}"),
    }
}

#[test]
fn simulation_native_core_32_seeds() {
    simulate(0..32, false);
}

#[test]
fn simulation_component_8_seeds() {
    simulate(1_000..1_008, true);
}
