//! The test kit as a user would test their own protected axum handler
//! (README, "Testing your handlers"): five duplicates at once run it once,
//! the ledger holds the stored answer, and the clock moves past the
//! retention for the sweep.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idempotency_ledger::testing::{fire_duplicates, TestLedger};
use idempotency_ledger::{Outcome, Settings};
use tower::ServiceExt;

fn order(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .header("X-User", "alice")
        .body(Body::from(r#"{"sku":"tea"}"#))
        .expect("request")
}

#[tokio::test]
async fn five_duplicates_at_once_run_the_handler_once() {
    // Duplicates wait for the first request's answer (by default they get a 409 at once).
    let kit = TestLedger::new(Settings { wait_ms: Some(5_000), ..Settings::default() }).await.expect("test ledger");
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new().route(
        "/orders",
        post(move || {
            let runs = counted.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                (StatusCode::CREATED, r#"{"id":1}"#)
            }
        })
        .layer(kit.layer(|parts| parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(String::from))),
    );

    let answers = fire_duplicates(5, |_| app.clone().oneshot(order("k-1"))).await;

    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for five duplicates");
    let mut outcomes: Vec<Outcome> = Vec::new();
    for answer in answers {
        let response = answer.expect("served");
        assert_eq!(response.status(), StatusCode::CREATED, "every duplicate gets the stored answer");
        outcomes.push(*response.extensions().get::<Outcome>().expect("the outcome rides in the extensions"));
    }
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Executed).count(), 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Executed | Outcome::ReplayedAfterWait)), "{outcomes:?}");

    let row = kit.row("alice", "k-1").expect("a row for the key");
    assert_eq!((row.status.as_str(), row.response_status), ("completed", Some(201)));

    // Past the retention the sweep removes it, and the key is new again.
    assert_eq!(kit.sweep().await.expect("sweep"), 0, "nothing is past the retention yet");
    let retention = kit.ledger().config().retention_ms;
    kit.clock().advance(Duration::from_millis(retention + 1));
    assert_eq!(kit.sweep().await.expect("sweep"), 1);
    assert!(kit.rows().is_empty());
    let again = app.clone().oneshot(order("k-1")).await.expect("served");
    assert_eq!(again.extensions().get::<Outcome>(), Some(&Outcome::Executed));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
