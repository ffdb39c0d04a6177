//! Idempotent functions (`run_once`): a call runs at most once per
//! (principal, key) on a real SQLite file; retries get the stored value;
//! another payload under the key is refused; a failed call keeps or
//! releases its key as the settings say.

use std::cell::Cell;

use idempotency_ledger::{
    AsyncLedger, AsyncSqlite, FunctionCall, FunctionError, Ledger, ManualClock, OnServerError, Outcome, Runtime, Settings,
    SqliteBackend,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

const T0: i64 = 1_767_225_600_000;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    id: u32,
    amount: f64,
}

fn ledger(path: &std::path::Path, settings: Settings) -> Ledger {
    let backend = SqliteBackend::open(path).expect("sqlite");
    let mut ledger = Ledger::new(Runtime::shared().expect("runtime"), backend, settings, ManualClock::new(T0)).expect("ledger");
    ledger.migrate().expect("migrate");
    ledger
}

#[test]
fn a_call_runs_once_and_its_retries_get_the_stored_value() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut ledger = ledger(&dir.path().join("f.sqlite"), Settings::default());
    let runs = Cell::new(0);
    let call = FunctionCall::new("charge", "acct", "msg-1", json!({"amount": 12.5, "currency": "EUR"}));
    for n in 0..3 {
        let receipt: Receipt = ledger
            .run_once(&call, || {
                runs.set(runs.get() + 1);
                Ok::<_, String>(Receipt { id: 7 + n, amount: 12.5 })
            })
            .expect("value");
        assert_eq!(receipt, Receipt { id: 7, amount: 12.5 }, "call {n} gets the first call's value");
    }
    assert_eq!(runs.get(), 1);

    // The payload is compared canonically: the same members in another order are the same call.
    let same = FunctionCall::new("charge", "acct", "msg-1", json!({"currency": "EUR", "amount": 12.5}));
    let again: Receipt = ledger.run_once(&same, || Ok::<_, String>(Receipt { id: 99, amount: 0.0 })).expect("replayed");
    assert_eq!(again.id, 7);

    // Another principal's key is another call.
    let theirs = FunctionCall::new("charge", "other", "msg-1", json!({"amount": 12.5, "currency": "EUR"}));
    let theirs: Receipt = ledger.run_once(&theirs, || Ok::<_, String>(Receipt { id: 8, amount: 12.5 })).expect("ran");
    assert_eq!(theirs.id, 8);
}

#[test]
fn another_payload_under_the_same_key_is_refused_without_running() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut ledger = ledger(&dir.path().join("f.sqlite"), Settings::default());
    let call = FunctionCall::new("charge", "acct", "msg-2", json!({"amount": 1}));
    let _: u32 = ledger.run_once(&call, || Ok::<_, String>(1)).expect("ran");
    let other = FunctionCall::new("charge", "acct", "msg-2", json!({"amount": 2}));
    let refused = ledger.run_once(&other, || -> Result<u32, String> { panic!("must not run") }).expect_err("refused");
    match refused {
        FunctionError::Refused { outcome, response } => {
            assert_eq!(outcome, Outcome::KeyReused);
            assert_eq!(response.status, 409, "the default (recipe) profile answers a reused key with 409");
        }
        other => panic!("expected a refusal, got {other}"),
    }
}

#[test]
fn a_failed_call_releases_its_key_under_release_and_keeps_it_pending_otherwise() {
    let dir = tempfile::tempdir().expect("tmp");
    let release = Settings { on_server_error: Some(OnServerError::Release), ..Settings::default() };
    let mut ledger = ledger(&dir.path().join("r.sqlite"), release);
    let call = FunctionCall::new("ship", "acct", "job-1", json!(["a", "b"]));
    let failed = ledger.run_once(&call, || Err::<u32, _>("warehouse down".to_string())).expect_err("failed");
    assert!(matches!(failed, FunctionError::Failed(ref e) if e == "warehouse down"), "{failed}");
    let retried: u32 = ledger.run_once(&call, || Ok::<_, String>(5)).expect("the released key runs again");
    assert_eq!(retried, 5);

    let mut keep = ledger_at(&dir.path().join("k.sqlite"));
    let failed = keep.run_once(&call, || Err::<u32, _>("warehouse down".to_string())).expect_err("failed");
    assert!(matches!(failed, FunctionError::Failed(_)));
    match keep.run_once(&call, || -> Result<u32, String> { panic!("must not run while the key is pending") }) {
        Err(FunctionError::Refused { outcome, response }) => {
            assert_eq!(outcome, Outcome::InProgress);
            assert_eq!(response.status, 409);
        }
        other => panic!("expected in-progress, got {other:?}"),
    }
}

fn ledger_at(path: &std::path::Path) -> Ledger {
    ledger(path, Settings { on_server_error: Some(OnServerError::Store), ..Settings::default() })
}

#[test]
fn a_stored_answer_that_is_not_the_functions_value_is_reported_not_guessed() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut ledger = ledger(&dir.path().join("f.sqlite"), Settings::default());
    let call = FunctionCall::new("count", "acct", "job-2", json!(null));
    let _: String = ledger.run_once(&call, || Ok::<_, String>("seven".into())).expect("ran");
    match ledger.run_once(&call, || -> Result<u32, String> { panic!("must not run") }) {
        Err(FunctionError::Undecodable { outcome, .. }) => assert_eq!(outcome, Outcome::Replayed),
        other => panic!("expected an undecodable replay, got {other:?}"),
    }
}

#[tokio::test]
async fn the_async_ledger_runs_a_call_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let backend = AsyncSqlite::open(dir.path().join("a.sqlite")).expect("sqlite");
    let ledger = AsyncLedger::open(backend).await.expect("ledger");
    let call = FunctionCall::new("charge", "acct", "msg-3", json!({"amount": 3}));
    let runs = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..2 {
        let value: u32 = ledger
            .run_once(&call, || async {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, String>(42)
            })
            .await
            .expect("value");
        assert_eq!(value, 42);
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}
