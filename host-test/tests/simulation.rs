//! The bounded simulation CI runs (`make simulate SEEDS=A..B` runs more):
//! both engines, every path of the scheduler reached, the exactly-once ones
//! included (transactional handlers' commits, rollbacks, fences, lock
//! conflicts, crashes inside transactions, renewals held, lost and failed,
//! live owners kept past the TTL, silent ones taken over).

use idempotency_ledger_host_test::sim::{run_seeds, SimDb};

#[test]
fn simulation_native_core_32_seeds() {
    let dir = tempfile::tempdir().expect("tmp");
    match run_seeds(0..32, 2_000, false, SimDb::Sqlite(dir.path())) {
        Ok(report) => {
            println!("simulation (native core): seeds 0..32: {report}");
            assert_eq!(report.steps, 64_000);
            assert!(report.unreached().is_empty(), "the scheduler must reach every path; not reached: {:?}", report.unreached());
        }
        Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed>"),
    }
}

#[test]
fn simulation_component_8_seeds() {
    let dir = tempfile::tempdir().expect("tmp");
    match run_seeds(1_000..1_008, 2_000, true, SimDb::Sqlite(dir.path())) {
        Ok(report) => {
            println!("simulation (component): seeds 1000..1008: {report}");
            assert_eq!(report.steps, 16_000);
            assert!(report.unreached().is_empty(), "the scheduler must reach every path; not reached: {:?}", report.unreached());
        }
        Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed> COMPONENT=1"),
    }
}
