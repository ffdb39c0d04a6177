//! The operator commands on PostgreSQL (make test-postgres): a fresh schema on
//! the throwaway server, rows written by the library, then inspect, show,
//! release and sweep through the binary as an operator runs them.

use std::process::Command;

use idempotency_ledger::wit::Value;
use idempotency_ledger::{url_with_options, PostgresPool, SqlBackend, SqlStatement};

fn sql(text: &str, params: Vec<Value>) -> SqlStatement {
    SqlStatement { sql: text.into(), params }
}

fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idempotency-ledger")).args(args).output().expect("run the CLI");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn inspect_show_release_and_sweep_on_postgres() {
    let url = std::env::var("IDEMPOTENCY_PG_URL").expect("IDEMPOTENCY_PG_URL must name a PostgreSQL server (scripts/postgres.sh run -- ...)");
    let schema = format!("cli_{}", std::process::id());
    let admin = PostgresPool::connect(&url, 1).expect("pool");
    admin.backend().execute_batch(&[sql(&format!("CREATE SCHEMA {schema}"), vec![])]).expect("schema");
    let url = url_with_options(&url, &format!("-c search_path={schema}"));
    let pool = PostgresPool::connect(&url, 1).expect("pool");
    let mut backend = pool.backend();
    let ddl: Vec<SqlStatement> =
        idempotency_ledger::schema(idempotency_ledger::Dialect::Postgres).expect("schema").iter().map(|s| sql(s, vec![])).collect();
    backend.execute_batch(&ddl).expect("migrate");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    let insert = "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, created_at, updated_at) \
                  VALUES ($1, $2, 'f', $3, 1, $4, $5, $6, $6)";
    for (key, status, response, at) in [("stuck", "pending", None, now), ("done", "completed", Some(201), now), ("old", "completed", Some(200), 0)] {
        let response = response.map_or(Value::Null, Value::Integer);
        let body = if status == "completed" { Value::Text("{}".into()) } else { Value::Null };
        let params = vec![Value::Text("acct".into()), Value::Text(key.into()), Value::Text(status.into()), response, body, Value::Integer(at)];
        backend.execute_batch(&[sql(insert, params)]).expect("insert");
    }

    let (code, report, err) = cli(&["inspect", "--database", &url, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&report).expect("json");
    assert_eq!((report["rows"].as_i64(), report["expired"].as_i64()), (Some(3), Some(1)));
    let (code, shown, _) = cli(&["show", "stuck", "--principal", "acct", "--database", &url, "--json"]);
    assert_eq!(code, Some(0));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).expect("json")["state"].as_str(), Some("in-progress"));
    assert_eq!(cli(&["release", "done", "--principal", "acct", "--database", &url]).0, Some(3), "a completed key is never released");
    let (code, _, err) = cli(&["release", "stuck", "--principal", "acct", "--database", &url]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(cli(&["show", "stuck", "--principal", "acct", "--database", &url]).0, Some(1), "released: gone");
    let (code, swept, _) = cli(&["sweep", "--database", &url, "--all"]);
    assert_eq!(code, Some(0));
    assert!(swept.starts_with("swept 1 expired rows"), "{swept}");
    admin.backend().execute_batch(&[sql(&format!("DROP SCHEMA {schema} CASCADE"), vec![])]).expect("drop schema");
}
