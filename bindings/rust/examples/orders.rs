//! The README's usage example, compiled by `cargo test` and runnable with
//! `cargo run -p idempotency-ledger --example orders`.

use idempotency_ledger::{HandleError, Ledger, MutationResponse, Request, Response};

fn create_order(ledger: &mut Ledger, account: &str, http: &Request) -> Response {
    // `account` comes from your auth layer, never from a client header.
    let handled = ledger.handle(account, http, |req| {
        let order_id = format!("o_{}", req.body.len()); // your real insert: runs at most once
        Ok::<_, std::io::Error>(
            MutationResponse::json(201, format!(r#"{{"id":"{order_id}"}}"#))
                .header("Location", format!("/orders/{order_id}")),
        )
    });
    match handled {
        // Executed, replayed, 400, 409, or the core's 5xx when the ledger failed: ready to send.
        Ok(handled) => handled.response,
        // The handler failed (the row stays pending until the TTL); the core's 500 to send.
        Err(HandleError { error, response, .. }) => {
            eprintln!("create_order failed: {error}");
            response.expect("a protected request's failure comes with the core's 500")
        }
    }
}

fn main() -> Result<(), idempotency_ledger::Error> {
    let path = std::env::temp_dir().join("idempotency-ledger-example.sqlite");
    let mut ledger = Ledger::open(&path)?; // creates and migrates; use one per thread
    let request = Request::new("POST", "/orders")
        .header("Idempotency-Key", format!("example-{}", std::process::id()))
        .header("Content-Type", "application/json")
        .body(br#"{"sku":"A-1"}"#.to_vec());
    let first = create_order(&mut ledger, "account-42", &request);
    let retry = create_order(&mut ledger, "account-42", &request);
    println!("{} {:?} / retry {} {:?}", first.status, first.body_text(), retry.status, retry.body_text());
    assert_eq!(first, retry);
    ledger.sweep()?; // off the request path in a real service
    Ok(())
}
