//! The bounded simulation CI runs (`make simulate SEEDS=A..B` runs more).

use idempotency_ledger_host_test::sim::{run_seeds, SimDb};

#[test]
fn simulation_native_core_100_seeds() {
    let dir = tempfile::tempdir().expect("tmp");
    match run_seeds(0..100, 2_000, false, SimDb::Sqlite(dir.path())) {
        Ok(report) => {
            println!("simulation (native core): seeds 0..100: {report}");
            assert_eq!(report.steps, 200_000);
            assert!(report.takeovers > 0 && report.fenced_out > 0 && report.replays > 0 && report.sweeps_deleted > 0,
                "the scheduler must reach every path: {report}");
        }
        Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed>"),
    }
}

#[test]
fn simulation_component_20_seeds() {
    let dir = tempfile::tempdir().expect("tmp");
    match run_seeds(1_000..1_020, 2_000, true, SimDb::Sqlite(dir.path())) {
        Ok(report) => {
            println!("simulation (component): seeds 1000..1020: {report}");
            assert_eq!(report.steps, 40_000);
            assert!(report.takeovers > 0 && report.fenced_out > 0, "{report}");
        }
        Err(failure) => panic!("{failure}\nreproduce: make simulate SEEDS=<seed> COMPONENT=1"),
    }
}
