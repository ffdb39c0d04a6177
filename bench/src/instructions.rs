//! Instructions per request, counted by callgrind: the protocol table's two
//! sides (`Ledger::handle` under wasmtime, the core linked natively) on the
//! same requests, counted instead of timed. A count does not move with the
//! machine's load or speed, so it shows what the component path executes
//! more than the native one on any host; the times show what that costs on
//! this one (cache misses and the CPU's speed are not in a count).
//!
//! The bench runs itself under `valgrind --tool=callgrind` with
//! [`CHILD`] set; the child runs each side's requests in one call of
//! `counted_component` or `counted_native`, followed by a call of
//! `counted_end`, and callgrind writes its counts out (and starts anew)
//! before each call of the three (`--dump-before`: callgrind honours one
//! trigger per function), so the dump made before `counted_end` holds
//! exactly one side's requests.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;

use idempotency_ledger::{Ledger, ManualClock, Request, Runtime, Settings, SqliteBackend};
use idempotency_ledger_core as core;

use crate::{arrange, created, native, order, T0};

/// Set in the environment of the child the bench starts under callgrind.
pub const CHILD: &str = "IDEMPOTENCY_BENCH_COUNTED";

const PATHS: [&str; 4] = ["fresh", "replay", "reuse (409)", "in progress (409)"];
const WARM: usize = 20;
const COUNTED: usize = 96;

/// The component's SQLite batches (the host backend behind the ledger import)
/// and the native side's, as callgrind_annotate names them.
const SQL_COMPONENT: &str = "<idempotency_ledger::sqlite::SqliteBackend as idempotency_ledger::SqlBackend>::execute_batch ";
const SQL_NATIVE: &str = "idempotency_ledger_bench::native::run ";

#[inline(never)]
fn counted_component(ledger: &mut Ledger, requests: &[Request]) {
    for request in requests {
        black_box(ledger.handle("acct", request, created).expect("handled"));
    }
}

/// Marks the end of a counted call (the dump before it holds that call).
#[inline(never)]
fn counted_end() {
    black_box(());
}

#[inline(never)]
fn counted_native(native: &mut native::Native, requests: &[Request]) {
    for request in requests {
        black_box(native.handle("acct", request, created));
    }
}

/// The child: each path's requests, warmed up, then counted on each side.
pub fn child(runtime: &Runtime, dir: &Path) {
    let body = br#"{"sku":"A-1","qty":2}"#;
    let other = br#"{"sku":"A-1","qty":3}"#;
    for (n, path) in PATHS.iter().enumerate() {
        let comp_db = dir.join(format!("count-c-{n}.sqlite"));
        let mut component =
            Ledger::new(runtime.clone(), SqliteBackend::open(&comp_db).expect("db"), Settings::default(), ManualClock::new(T0)).expect("ledger");
        component.migrate().expect("migrate");
        let mut native = native::Native::open(&dir.join(format!("count-n-{n}.sqlite")), core::Config::default(), T0);
        arrange(path, &comp_db, &mut component, &mut native, 0);
        let requests: Vec<Request> = (0..WARM + COUNTED)
            .map(|i| match *path {
                "fresh" => order(&format!("fresh-{i}"), body),
                "replay" => order("done", body),
                "reuse (409)" => order("done", other),
                _ => order("busy", body),
            })
            .collect();
        let (warm, counted) = requests.split_at(WARM);
        for request in warm {
            black_box(component.handle("acct", request, created).expect("handled"));
            black_box(native.handle("acct", request, created));
        }
        counted_component(&mut component, counted);
        counted_end();
        counted_native(&mut native, counted);
        counted_end();
    }
}

/// One side's count per request: all its instructions, those in its SQLite
/// batches, and (the component's side) those in wasmtime's own code and in
/// the component's compiled code.
struct Count {
    total: f64,
    sql: f64,
    wasmtime: f64,
    guest: f64,
}

/// Runs the child under callgrind and writes the table.
pub fn run(md: &mut String, dir: &Path) {
    use std::fmt::Write as _;
    let _ = writeln!(md, "\n### Instructions per request, counted by callgrind\n");
    let out = dir.join("callgrind.out");
    let ran = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--dump-before=idempotency_ledger_bench::instructions::counted_*")
        .arg(std::env::current_exe().expect("the bench's own path"))
        .env(CHILD, dir)
        .output();
    match ran {
        Ok(ran) if ran.status.success() => {}
        Ok(ran) => {
            let _ = writeln!(md, "Skipped: callgrind failed ({}): {}", ran.status, String::from_utf8_lossy(&ran.stderr).lines().last().unwrap_or(""));
            return;
        }
        Err(error) => {
            let _ = writeln!(md, "Skipped: valgrind could not be started ({error}).");
            return;
        }
    }
    // Per path, four dumps: before the component's call (the set-up), before
    // its end (the component's requests), before the native call (nothing),
    // before its end (the native side's requests).
    let counts: Result<Vec<Count>, String> = (0..PATHS.len() * 2)
        .map(|k| {
            let dump = dir.join(format!("callgrind.out.{}", 2 * k + 2));
            let sql = if k % 2 == 0 { SQL_COMPONENT } else { SQL_NATIVE };
            let per_request = |n: u64| n as f64 / COUNTED as f64;
            let read = read_dump(&dump, sql)?;
            Ok(Count { total: per_request(read.total), sql: per_request(read.sql), wasmtime: per_request(read.wasmtime), guest: per_request(read.guest) })
        })
        .collect();
    let counts = match counts {
        Ok(counts) => counts,
        Err(error) => {
            let _ = writeln!(md, "Skipped: {error}.");
            return;
        }
    };
    let _ = writeln!(
        md,
        "The protocol table's requests (the first four paths), {COUNTED} per path and side after {WARM} warm-up requests, run under \
         `valgrind --tool=callgrind` (the component compiled by cranelift at start: valgrind's CPU lacks features the precompiled one \
         uses); each side's requests are counted apart. A count does not change with the machine's load or speed; what a count leaves \
         out (cache misses, the CPU's own speed) the protocol table's times include. *SQLite*: the batches themselves (the host backend's \
         `execute_batch` behind the ledger import; the native side's own run of the same statements). *wasmtime*: the runtime's own \
         code (entering the component, lowering values into it with a `cabi_realloc` call each, lifting them out); *the component's \
         code*: the core and its WIT glue compiled to WebAssembly. *Outside SQLite*: everything but the batches (on the native side, \
         the core's work).\n"
    );
    let _ = writeln!(
        md,
        "| path | component: instructions per request | of them SQLite | wasmtime | the component's code | native | of them SQLite | component / native | outside SQLite: component / native |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (path, sides) in PATHS.iter().zip(counts.chunks(2)) {
        let (c, n) = (&sides[0], &sides[1]);
        let _ = writeln!(
            md,
            "| {path} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}x | {:.0} / {:.0} = {:.2}x |",
            c.total,
            c.sql,
            c.wasmtime,
            c.guest,
            n.total,
            n.sql,
            c.total / n.total,
            c.total - c.sql,
            n.total - n.sql,
            (c.total - c.sql) / (n.total - n.sql)
        );
    }
}

/// What one dump holds.
struct Dump {
    total: u64,
    /// Inclusive: the function that runs the SQLite batches.
    sql: u64,
    /// Exclusive: functions of wasmtime, and code callgrind knows no object
    /// for (the component's, compiled by cranelift at run time).
    wasmtime: u64,
    guest: u64,
}

/// Reads a dump: its total, and what callgrind_annotate lists for the
/// function named `sql` (inclusive; every counted request runs a batch, so
/// a listing without it means the name changed) and for wasmtime's and the
/// component's code (exclusive).
fn read_dump(dump: &Path, sql: &str) -> Result<Dump, String> {
    let text = std::fs::read_to_string(dump).map_err(|e| format!("{}: {e}", dump.display()))?;
    let total = text
        .lines()
        .find_map(|line| line.strip_prefix("totals:").or_else(|| line.strip_prefix("summary:")))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("{}: no totals line", dump.display()))?;
    let listing = |inclusive: bool| -> Result<Vec<(u64, String)>, String> {
        let out = Command::new("callgrind_annotate")
            .args([if inclusive { "--inclusive=yes" } else { "--inclusive=no" }, "--threshold=100", "--auto=no"])
            .arg(dump)
            .output()
            .map_err(|e| format!("callgrind_annotate could not be started ({e})"))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (count, rest) = line.trim_start().split_once(' ')?;
                let count = count.replace(',', "").parse().ok()?;
                let name = rest.split_once(')').map_or(rest, |(_, name)| name).trim().to_string();
                Some((count, name))
            })
            .collect())
    };
    let sql = listing(true)?
        .into_iter()
        .find(|(_, name)| name.contains(sql))
        .map(|(count, _)| count)
        .ok_or_else(|| format!("callgrind_annotate lists no `{}` in {}", sql.trim(), dump.display()))?;
    let (mut wasmtime, mut guest) = (0, 0);
    for (count, name) in listing(false)? {
        if name.ends_with("[???]") {
            guest += count;
        } else if name.contains("wasmtime") {
            wasmtime += count;
        }
    }
    Ok(Dump { total, sql, wasmtime, guest })
}
