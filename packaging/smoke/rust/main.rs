//! dist-check: the Rust README's blocking example, built against the
//! unpacked .crate files in a cargo project outside the repository.

use idempotency_ledger::{Ledger, MutationResponse, Outcome, Request};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: smoke LEDGER.sqlite")?;
    let mut ledger = Ledger::open(&path)?; // creates and migrates; one per thread
    let request = Request::new("POST", "/orders")
        .header("Idempotency-Key", "order-7f3a")
        .header("Content-Type", "application/json")
        .body(br#"{"sku":"A-1"}"#.to_vec());
    let mut runs = 0;
    let mut create = |_: &Request| {
        runs += 1;
        Ok::<_, std::io::Error>(MutationResponse::json(201, r#"{"id":"o_1"}"#).header("Location", "/orders/o_1"))
    };
    let first = ledger.handle("account-42", &request, &mut create)?;
    let retry = ledger.handle("account-42", &request, &mut create)?;
    let kind = |outcome: &Outcome| match outcome {
        Outcome::Executed { .. } => "executed",
        Outcome::Replayed => "replayed",
        _ => "other",
    };
    println!(
        "rust: first {} {} {:?}, retry {} {} {:?}, mutation ran {} time(s)",
        first.response.status,
        kind(&first.outcome),
        first.response.body_text().unwrap_or_default(),
        retry.response.status,
        kind(&retry.outcome),
        retry.response.body_text().unwrap_or_default(),
        runs
    );
    assert!(matches!(first.outcome, Outcome::Executed { .. }), "first: {:?}", first.outcome);
    assert!(matches!(retry.outcome, Outcome::Replayed), "retry: {:?}", retry.outcome);
    // The first caller gets the handler's response as it made it; the replay
    // the stored one (the same status, body and allowlisted headers; header
    // names as stored, lower case).
    assert_eq!((first.response.status, &first.response.body), (retry.response.status, &retry.response.body));
    for name in ["content-type", "location"] {
        assert_eq!(first.response.header(name), retry.response.header(name), "{name}");
    }
    assert_eq!((first.response.status, first.response.header("Location")), (201, Some("/orders/o_1")));
    assert_eq!(runs, 1);
    let body: serde_json::Value = serde_json::from_slice(&retry.response.body)?;
    assert_eq!(body["id"], "o_1");
    Ok(())
}
