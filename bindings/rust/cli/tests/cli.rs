//! The `idempotency-ledger` binary, run as a user would.

use std::io::Write;
use std::process::{Command, Stdio};

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idempotency-ledger"))
}

fn run(args: &[&str], stdin: &[u8]) -> (bool, String, String) {
    let (code, out, err) = run_code(args, stdin);
    (code == Some(0), out, err)
}

fn run_code(args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let mut child = cli()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the CLI");
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn fingerprint_matches_the_recipe() {
    // The recipe's computeFingerprint over this request, by hand:
    // "POST\n/orders?id=1\ncontent-type:application/json\nx-api-version:\n" + body.
    use sha2::Digest;
    let body = br#"{"sku":"A-1"}"#;
    let mut expected = sha2::Sha256::new();
    expected.update(b"POST\n/orders?id=1\ncontent-type:application/json\nx-api-version:\n");
    expected.update(body);
    let expected = hex::encode(expected.finalize());
    let args = ["fingerprint", "--method", "post", "--path-and-query", "/orders?id=1", "--header", "Content-Type: application/json", "--header", "X-Trace-Id: ignored"];
    let (ok, out, err) = run(&args, body);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), expected);
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("body");
    std::fs::write(&file, body).expect("write body");
    let mut from_file = args.to_vec();
    from_file.extend(["--body-file", file.to_str().expect("path")]);
    assert_eq!(run(&from_file, b"").1.trim(), expected);
}

#[test]
fn schema_into_a_closed_pipe_ends_quietly() {
    // `idempotency-ledger schema | head -c 1`: the reader goes away at once.
    ends_quietly_into_a_closed_pipe(cli().arg("schema"));
}

#[test]
fn demo_into_a_closed_pipe_ends_quietly() {
    // `idempotency-ledger demo | head -1`.
    let dir = tempfile::tempdir().expect("tmp");
    ends_quietly_into_a_closed_pipe(cli().args(["demo", "--db"]).arg(dir.path().join("demo.sqlite")));
}

/// Runs `command` with its stdout closed before it writes: it must exit 0
/// without a panic message.
fn ends_quietly_into_a_closed_pipe(command: &mut Command) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn the CLI");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn schema_inspect_and_sweep_on_a_real_file() {
    let (ok, schema, _) = run(&["schema"], b"");
    assert!(ok);
    assert!(schema.contains("CREATE TABLE IF NOT EXISTS idempotency_keys"));
    assert!(schema.contains("idx_idempotency_keys_updated_at"));
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("l.sqlite");
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute_batch(&schema).expect("the printed schema applies");
    conn.execute_batch(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, created_at, updated_at) VALUES
           ('p', 'old', 'f', 'completed', 0, 0), ('p', 'stale', 'f', 'pending', 1, 1),
           ('p', 'new', 'f', 'completed', 9000000000000, 9000000000000);",
    )
    .expect("rows");
    let db = db.to_str().expect("path");
    let (ok, report, err) = run(&["inspect", "--database", db], b"");
    assert!(ok, "{err}");
    assert!(report.contains("rows: 3"), "{report}");
    assert!(report.contains("completed: 2") && report.contains("pending: 1"), "{report}");
    assert!(report.contains("stale pending rows (older than the 30000 ms TTL; the next retry takes them over): 1"), "{report}");
    assert!(report.contains("expired rows awaiting the sweep (older than the 86400000 ms retention): 2"), "{report}");
    let (ok, report, _) = run(&["inspect", "--database", db, "--json"], b"");
    assert!(ok);
    let report: serde_json::Value = serde_json::from_str(&report).expect("inspect --json");
    assert_eq!((report["rows"].as_i64(), report["stale_pending"].as_i64(), report["expired"].as_i64()), (Some(3), Some(1), Some(2)));
    let (ok, swept, _) = run(&["sweep", "--database", db, "--all"], b"");
    assert!(ok);
    assert!(swept.starts_with("swept 2 expired rows"), "{swept}");
    let remaining: i64 = conn.query_row("SELECT COUNT(*) FROM idempotency_keys", [], |r| r.get(0)).expect("count");
    assert_eq!(remaining, 1);
}

#[test]
fn show_and_release_one_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("l.sqlite");
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute_batch(&run(&["schema"], b"").1).expect("schema");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    conn.execute(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES
           ('acct', 'stuck', 'f', 'pending', 2, ?1, ?1)",
        [now],
    )
    .expect("pending row");
    conn.execute(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at)
         VALUES ('acct', 'done', 'f', 'completed', 1, 201, '{\"id\":1}', '{\"content-type\":\"application/json\"}', ?1, ?1)",
        [now],
    )
    .expect("completed row");
    let db = db.to_str().expect("path");
    let (ok, shown, err) = run(&["show", "stuck", "--principal", "acct", "--database", db], b"");
    assert!(ok, "{err}");
    assert!(shown.contains("pending, in progress") && shown.contains("generation: 2"), "{shown}");
    let (ok, shown, _) = run(&["show", "done", "--principal", "acct", "--database", db, "--json"], b"");
    assert!(ok);
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("show --json");
    assert_eq!((shown["state"].as_str(), shown["response_status"].as_i64()), (Some("completed"), Some(201)));
    assert_eq!(shown["response_headers"]["content-type"].as_str(), Some("application/json"));
    // A completed key is never released; an unknown key is "not found".
    assert_eq!(run_code(&["release", "done", "--principal", "acct", "--database", db], b"").0, Some(3));
    assert_eq!(run_code(&["show", "nope", "--principal", "acct", "--database", db], b"").0, Some(1));
    assert_eq!(run_code(&["release", "stuck", "--principal", "other", "--database", db], b"").0, Some(1));
    let (ok, released, err) = run(&["release", "stuck", "--principal", "acct", "--database", db, "--json"], b"");
    assert!(ok, "{err}");
    let released: serde_json::Value = serde_json::from_str(&released).expect("release --json");
    assert_eq!((released["released"].as_bool(), released["generation"].as_i64()), (Some(true), Some(2)));
    let left: i64 = conn.query_row("SELECT COUNT(*) FROM idempotency_keys WHERE key = 'stuck'", [], |r| r.get(0)).expect("count");
    assert_eq!(left, 0, "the pending row is gone: a retry runs again");
}

#[test]
fn schema_per_dialect() {
    let (ok, sqlite, _) = run(&["schema", "--dialect", "sqlite"], b"");
    assert!(ok);
    assert_eq!(sqlite, run(&["schema"], b"").1, "sqlite is the default");
    let (ok, postgres, _) = run(&["schema", "--dialect", "postgres"], b"");
    assert!(ok);
    assert!(postgres.contains("generation BIGINT NOT NULL DEFAULT 1"), "{postgres}");
    assert!(postgres.contains("created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL"), "{postgres}");
    assert!(sqlite.contains("created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL"), "{sqlite}");
}

#[test]
fn bad_usage_is_a_clear_error() {
    for args in [
        &["inspect"][..],
        &["frobnicate"],
        &["fingerprint", "--method", "POST"],
        &["schema", "--dialect", "oracle"],
        &["demo", "--db", "x.sqlite", "--postgres", "postgresql://localhost/x"],
        &["release", "k", "--database", "x.sqlite"],
    ] {
        let (code, _, err) = run_code(args, b"");
        assert_eq!(code, Some(2), "{args:?} is bad usage: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
    let (code, _, err) = run_code(&["inspect", "--database", "/nonexistent/x.sqlite"], b"");
    assert_eq!(code, Some(4));
    assert!(err.starts_with("idempotency-ledger: /nonexistent/x.sqlite: no such database"), "{err}");
}

#[test]
fn demo_runs_to_completion() {
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("demo.sqlite");
    let (ok, out, err) = run(&["demo", "--db", db.to_str().expect("path")], b"");
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("replay byte-identical to the first answer (status, body, Location): yes"));
    assert!(out.contains("the client's retry on server B: -> 409"), "a renewed lease is not taken over: {out}");
    assert!(out.contains("orders committed for order-4: 1 "), "the fenced-out owner's write rolled back: {out}");
    assert!(out.contains("The order endpoint ran 6 times"), "{out}");
    assert!(err.contains(r#"fenced out: principal="account-42" key="order-4" generation=1: a takeover superseded this owner"#), "{err}");
}
