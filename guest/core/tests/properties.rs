//! Properties of the core over generated inputs, where a list of vectors
//! cannot cover the space.

use idempotency_ledger_core::fingerprint::{fingerprint, prefix};
use idempotency_ledger_core::{fuzzing, Config, Decision, Header, RejectionReason, RequestHead, Session, StatementResult, Value};
use proptest::prelude::*;

fn header_value() -> impl Strategy<Value = String> {
    proptest::collection::vec(0u8..=255, 0..24).prop_map(|b| b.into_iter().map(char::from).collect())
}

fn noise_header() -> impl Strategy<Value = Header> {
    ("x-[a-z]{1,8}|user-agent|traceparent|cookie", header_value()).prop_map(|(n, v)| Header::new(n, v))
}

fn head() -> impl Strategy<Value = RequestHead> {
    (
        "(?i)post|patch|delete",
        "/[ -~]{0,40}",
        proptest::option::of(header_value()),
        proptest::option::of(header_value()),
    )
        .prop_map(|(method, path, ct, version)| {
            let mut headers = Vec::new();
            if let Some(ct) = ct {
                headers.push(Header::new("Content-Type", ct));
            }
            if let Some(v) = version {
                headers.push(Header::new("x-api-version", v));
            }
            RequestHead { method, path_and_query: path, headers }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn non_allowlisted_headers_never_change_the_fingerprint(
        head in head(), noise in proptest::collection::vec(noise_header(), 0..6), body in proptest::collection::vec(any::<u8>(), 0..64),
        at in any::<prop::sample::Index>(),
    ) {
        let config = Config::default();
        let mut noisy = head.clone();
        for h in noise {
            let i = at.index(noisy.headers.len() + 1);
            noisy.headers.insert(i, h);
        }
        prop_assert_eq!(fingerprint(&config, &head, &body), fingerprint(&config, &noisy, &body));
    }

    #[test]
    fn header_name_case_and_surrounding_whitespace_never_matter(head in head(), pad in "[ \t]{0,3}") {
        let config = Config::default();
        let mut shouted = head.clone();
        for h in shouted.headers.iter_mut() {
            h.name = h.name.to_ascii_uppercase();
            h.value = format!("{pad}{}{pad}", h.value);
        }
        prop_assert_eq!(prefix(&config, &head), prefix(&config, &shouted));
    }

    #[test]
    fn every_body_byte_counts(head in head(), body in proptest::collection::vec(any::<u8>(), 1..256), at in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let config = Config::default();
        let mut other = body.clone();
        let i = at.index(body.len());
        other[i] ^= flip;
        prop_assert_ne!(fingerprint(&config, &head, &body), fingerprint(&config, &head, &other));
    }

    #[test]
    fn method_case_never_matters(head in head()) {
        let config = Config::default();
        let mut lower = head.clone();
        lower.method = lower.method.to_ascii_lowercase();
        prop_assert_eq!(prefix(&config, &head), prefix(&config, &lower));
    }

    #[test]
    fn a_stored_completion_replays_exactly_what_the_first_caller_got(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzzing::completion_roundtrip(&data);
    }

    #[test]
    fn another_fingerprint_is_always_reuse_whatever_the_row(
        status in "completed|pending|[a-z]{0,6}", generation in 1i64..10, updated in any::<i64>(), now in any::<i64>(),
    ) {
        let config = Config::default();
        let stored = "a".repeat(64);
        let asked = "b".repeat(64);
        let row = vec![Value::Text(stored), Value::Text(status), Value::Integer(generation), Value::Null, Value::Null, Value::Null, Value::Integer(updated), Value::Integer(0)];
        let results = [StatementResult::default(), StatementResult::default(), StatementResult { rows: vec![row], changes: 0 }];
        match Session::open(config).expect("defaults are valid").decide("p", "k", &asked, now, now, &results) {
            Ok(Decision::Reject(r)) => prop_assert_eq!(r.reason, RejectionReason::KeyReused),
            other => prop_assert!(false, "expected reuse, got {:?}", other),
        }
    }

    #[test]
    fn arbitrary_results_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        fuzzing::step_results(&data);
        fuzzing::stored_row(&data);
        fuzzing::request_head(&data);
        fuzzing::key(&data);
        fuzzing::sf_string(&data);
    }
}
