//! `simulate [--seeds A..B | --seeds N] [--steps S] [--component] [--postgres]`:
//! runs the deterministic simulation (host-test/src/sim.rs); a failing seed
//! prints its trace and the command that reproduces it.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let seeds = value("--seeds").unwrap_or_else(|| "0..200".into());
    let (start, end) = match seeds.split_once("..") {
        Some((a, b)) => (a.parse().expect("seed range start"), b.parse().expect("seed range end")),
        None => {
            let n: u64 = seeds.parse().expect("--seeds N or A..B");
            (n, n + 1)
        }
    };
    let steps: u64 = value("--steps").map(|s| s.parse().expect("--steps S")).unwrap_or(2_000);
    let component = args.iter().any(|a| a == "--component");
    let postgres = args.iter().any(|a| a == "--postgres");
    let dir = tempfile::tempdir().expect("temp dir");
    // PostgreSQL: a schema of its own on the server at IDEMPOTENCY_PG_URL.
    let pg = postgres.then(idempotency_ledger_host_test::TestDb::postgres);
    let url = pg.as_ref().map(|pg| {
        idempotency_ledger_host_test::sim::postgres_url_for(&idempotency_ledger_host_test::postgres_url(), &pg.pg().expect("postgres").name)
    });
    let db = match &url {
        Some(url) => idempotency_ledger_host_test::sim::SimDb::Postgres(url),
        None => idempotency_ledger_host_test::sim::SimDb::Sqlite(dir.path()),
    };
    let started = std::time::Instant::now();
    match idempotency_ledger_host_test::sim::run_seeds(start..end, steps, component, db) {
        Ok(report) => {
            println!(
                "simulation ({}, {}): seeds {start}..{end}, {report} in {:.1} s",
                if component { "component" } else { "native core" },
                if postgres { "PostgreSQL" } else { "SQLite" },
                started.elapsed().as_secs_f64()
            );
            let unreached = report.unreached();
            if !unreached.is_empty() {
                println!("paths not reached by these seeds: {}", unreached.join(", "));
            }
            std::process::ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("{failure}");
            let seed = failure.split_whitespace().nth(1).unwrap_or("?").trim_end_matches(':');
            eprintln!(
                "reproduce: make simulate SEEDS={seed} STEPS={steps}{}{}",
                if component { " COMPONENT=1" } else { "" },
                if postgres { " POSTGRES=1" } else { "" }
            );
            std::process::ExitCode::FAILURE
        }
    }
}
