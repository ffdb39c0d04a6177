//! Fuzz target bodies, shared by `fuzz/` (cargo fuzz, libFuzzer) and by the
//! corpus regression test that `cargo test` runs on stable. Each takes raw
//! bytes, drives a public entry point and asserts what must always hold; a
//! panic is a bug.

use alloc::string::String;
use alloc::vec::Vec;

use crate::config::{Config, OnServerError, Profile};
use crate::headers::{is_storable_value, is_valid_key, normalize_value, parse_sf_string_item};
use crate::machine::Session;
use crate::types::*;
use crate::{fingerprint, responses};

fn session(config: Config) -> Session {
    Session::open(config).expect("fuzz configs are valid")
}

/// A config varied by one byte: profile, key policy, release policy, caps.
fn config_from(b: &mut Bytes) -> Config {
    let flags = b.byte();
    let profile = if flags & 1 == 0 { Profile::Recipe } else { Profile::Ietf };
    Config {
        key_required: flags & 2 == 0,
        on_server_error: if flags & 4 == 0 { OnServerError::Store } else { OnServerError::Release },
        request_body_cap_bytes: u64::from(b.byte()) * 64,
        wait_ms: u64::from(flags >> 4) * 100,
        ..Config::for_profile(profile)
    }
}

/// Reads structured values out of fuzz bytes; runs dry by returning zeros.
pub struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes(data)
    }
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    /// A string whose chars are the bytes read as ISO-8859-1 (every byte valid).
    pub fn latin1(&mut self) -> String {
        let n = self.byte() as usize;
        self.take(n).iter().map(|&b| b as char).collect()
    }
    /// Any UTF-8 text (invalid sequences replaced).
    pub fn text(&mut self) -> String {
        let n = self.byte() as usize * 2;
        String::from_utf8_lossy(self.take(n)).into_owned()
    }
    pub fn int(&mut self) -> i64 {
        let mut b = [0u8; 8];
        let src = self.take(8);
        b[..src.len()].copy_from_slice(src);
        i64::from_le_bytes(b)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = self.0;
        self.0 = &[];
        rest
    }
    pub fn value(&mut self) -> Value {
        match self.byte() % 6 {
            0 => Value::Null,
            1 | 5 => Value::Integer(self.int() % 4),
            2 => Value::Real(f64::from_bits(self.int() as u64)),
            3 => Value::Text(self.text()),
            _ => Value::Blob(self.take(4).to_vec()),
        }
    }
    pub fn headers(&mut self) -> Vec<Header> {
        (0..self.byte() % 6).map(|_| Header { name: self.latin1(), value: self.latin1() }).collect()
    }
}

const NAMES: [&str; 6] = ["content-type", "Content-Type", "x-api-version", "idempotency-key", "location", "x-other"];

/// SPEC 1 and 4: admission and fingerprints of arbitrary request heads.
pub fn request_head(data: &[u8]) {
    let mut b = Bytes::new(data);
    let config = config_from(&mut b);
    let principal = match b.byte() % 4 {
        0 => None,
        1 => Some(String::new()),
        _ => Some(b.text()),
    };
    let method = ["POST", "post", "GET", "PATCH", "DELETE", "PUT"][b.byte() as usize % 6];
    let mut headers = b.headers();
    for _ in 0..b.byte() % 4 {
        headers.push(Header { name: NAMES[b.byte() as usize % NAMES.len()].into(), value: b.latin1() });
    }
    let head = RequestHead { method: method.into(), path_and_query: b.text(), headers };
    let body = b.rest();
    let prefix = fingerprint::prefix(&config, &head);
    assert!(prefix.starts_with(&method.to_ascii_uppercase()));
    assert!(prefix.ends_with('\n'));
    let digest = fingerprint::fingerprint(&config, &head, body);
    assert!(fingerprint::is_fingerprint(&digest));
    assert_eq!(digest, fingerprint::digest(&prefix, body));
    let session = session(config.clone());
    let protected = session.policy().protected_methods.iter().any(|m| m == &method.to_ascii_uppercase());
    match session.admit(&head, principal.as_deref()) {
        Err(ProtocolError::InvalidArgument(_)) => {
            let p = principal.unwrap_or_default();
            assert!(p.len() > machine_principal_cap() || p.contains('\0'));
        }
        Err(e) => panic!("admit failed: {e}"),
        Ok(Admission::PassThrough) => assert!(!protected || !config.key_required),
        Ok(Admission::Reject(r)) => {
            assert!(protected);
            let status = match r.reason {
                RejectionReason::PrincipalRequired => 401,
                RejectionReason::BodyTooLarge => 413,
                RejectionReason::KeyRequired | RejectionReason::KeyInvalid => 400,
                other => panic!("admission never answers {other:?}"),
            };
            assert_eq!(r.response.status, status);
        }
        Ok(Admission::Protected(p)) => {
            assert!(protected && principal.is_some_and(|p| !p.is_empty()));
            assert!(is_valid_key(&p.key));
            assert_eq!(p.fingerprint_prefix, prefix);
        }
    }
}

fn machine_principal_cap() -> usize {
    crate::machine::MAX_PRINCIPAL_LEN
}

/// SPEC 1: the key format, against its definition.
pub fn key(data: &[u8]) {
    let value: String = data.iter().map(|&b| b as char).collect();
    let head = RequestHead {
        method: "POST".into(),
        path_and_query: "/".into(),
        headers: alloc::vec![Header { name: "Idempotency-Key".into(), value: value.clone() }],
    };
    let trimmed = normalize_value(&value);
    let expected = !trimmed.is_empty() && trimmed.len() <= 255 && trimmed.bytes().all(|c| (0x20..=0x7e).contains(&c));
    match session(Config::default()).admit(&head, Some("p")).expect("valid principal") {
        Admission::Protected(p) => {
            assert!(expected);
            assert_eq!(p.key, trimmed);
        }
        Admission::Reject(r) => {
            assert!(!expected);
            let want = if trimmed.is_empty() { RejectionReason::KeyRequired } else { RejectionReason::KeyInvalid };
            assert_eq!(r.reason, want);
        }
        Admission::PassThrough => panic!("POST is protected"),
    }
    // The ietf profile: a quoted value is an sf-string, a bare one is as above.
    match session(Config::for_profile(Profile::Ietf)).admit(&head, Some("p")).expect("valid principal") {
        Admission::Protected(p) if trimmed.starts_with('"') => {
            assert_eq!(Ok(p.key.clone()), parse_sf_string_item(trimmed));
            assert!(is_valid_key(&p.key));
            // Re-encoding the decoded key parses back to itself.
            let quoted = alloc::format!("\"{}\"", p.key.replace('\\', "\\\\").replace('"', "\\\""));
            assert_eq!(parse_sf_string_item(&quoted), Ok(p.key));
        }
        Admission::Protected(p) => {
            assert!(expected);
            assert_eq!(p.key, trimmed);
        }
        Admission::Reject(r) if trimmed.starts_with('"') => {
            assert_eq!(r.reason, RejectionReason::KeyInvalid);
            assert!(parse_sf_string_item(trimmed).is_err() || !expected);
        }
        Admission::Reject(_) => assert!(!expected),
        Admission::PassThrough => panic!("POST is protected"),
    }
}

/// SPEC 5, 7, 9: a completed row with arbitrary stored response columns
/// replays a sendable response or answers record-corrupt; it never executes.
pub fn stored_row(data: &[u8]) {
    let mut b = Bytes::new(data);
    let config = config_from(&mut b);
    let fp = fingerprint::digest("x", b"");
    let status = ["completed", "pending", "", "COMPLETED"][b.byte() as usize % 4];
    let response_status = match b.byte() % 3 {
        0 => Value::Integer(i64::from(b.byte()) * 3 + i64::from(b.byte())),
        1 => b.value(),
        _ => Value::Integer(b.int()),
    };
    let body = if b.byte() % 4 == 0 { b.value() } else { Value::Text(b.text()) };
    let headers_json = String::from_utf8_lossy(b.rest()).into_owned();
    let row = alloc::vec![
        Value::Text(fp.clone()),
        Value::Text(status.into()),
        Value::Integer(1),
        response_status,
        body,
        Value::Text(headers_json),
        Value::Integer(0),
    ];
    let results = [StatementResult::default(), StatementResult::default(), StatementResult { rows: alloc::vec![row], changes: 0 }];
    match session(config).decide("p", "k", &fp, 0, 0, &results).expect("well-formed results") {
        Decision::Execute(_) => panic!("an existing row never executes"),
        Decision::Wait(ms) => assert!((1..=crate::machine::MAX_POLL_MS as u32).contains(&ms)),
        Decision::Replay(r) => {
            assert!(responses::is_sendable_status(i64::from(r.status)));
            assert!(r.headers.iter().all(|h| crate::headers::is_token(&h.name) && is_storable_value(&h.value)));
            if responses::is_null_body_status(r.status) {
                assert!(r.body.is_none());
            }
        }
        Decision::Reject(r) => assert!(matches!(r.reason, RejectionReason::RecordCorrupt | RejectionReason::InProgress)),
    }
}

/// The step API fed arbitrary SQL results: an answer or an error, never a panic.
pub fn step_results(data: &[u8]) {
    let mut b = Bytes::new(data);
    let session = session(config_from(&mut b));
    let fp = fingerprint::digest("x", b"");
    let results: Vec<StatementResult> = (0..b.byte() % 5)
        .map(|_| StatementResult {
            rows: (0..b.byte() % 3).map(|_| (0..b.byte() % 9).map(|_| b.value()).collect()).collect(),
            changes: b.int() as u64 % 4,
        })
        .collect();
    let now = b.int();
    if let Ok(Decision::Execute(ticket)) = session.decide("p", "k", &fp, now, b.int(), &results) {
        assert!(ticket.generation >= 1);
        assert_eq!(ticket.fingerprint, fp);
    }
    let _ = session.finish_completion(CompletionAction::Store, &results);
    let _ = session.finish_completion(CompletionAction::Release, &results);
    let _ = session.finish_release(&results);
    if let Ok(sweep) = session.finish_sweep(&results) {
        assert_eq!(sweep.more, sweep.deleted >= u64::from(session.config().sweep_batch));
    }
}

/// SPEC 7: whatever a mutation returns, the stored row replays exactly what
/// the first caller got.
pub fn completion_roundtrip(data: &[u8]) {
    let mut b = Bytes::new(data);
    let config = Config { body_cap_bytes: u32::from(b.byte()), ..config_from(&mut b) };
    let session = session(config.clone());
    let fp = fingerprint::digest("x", b"");
    let status = u16::from_le_bytes([b.byte(), b.byte() % 3]);
    let mut headers = b.headers();
    for _ in 0..b.byte() % 4 {
        headers.push(Header { name: NAMES[b.byte() as usize % NAMES.len()].into(), value: b.latin1() });
    }
    let body = if b.byte() % 2 == 0 { ResponseBody::Text(b.text()) } else { ResponseBody::Bytes(b.rest().to_vec()) };
    let ticket = Ticket { principal: "p".into(), key: "k".into(), fingerprint: fp.clone(), generation: 1, created_at: 0 };
    let plan = session.plan_completion(&ticket, MutationResponse { status, headers, body }, 5).expect("valid");
    let fresh = plan.response;
    assert!(responses::is_sendable_status(i64::from(fresh.status)));
    if let Some(body) = &fresh.body {
        assert!(body.len() <= config.body_cap_bytes as usize);
    }
    assert!(!plan.send_mutation_body || (config.profile == Profile::Ietf && fresh.body.is_none() && plan.log.is_some()));
    if plan.action == CompletionAction::Release {
        assert!(config.on_server_error == OnServerError::Release && status >= 500);
        return;
    }
    // The row the completion writes, read back by a later decision.
    let params = &plan.statements[0].params;
    let row = alloc::vec![Value::Text(fp.clone()), Value::Text("completed".into()), Value::Integer(1), params[0].clone(), params[1].clone(), params[2].clone(), Value::Integer(5)];
    let results = [StatementResult::default(), StatementResult::default(), StatementResult { rows: alloc::vec![row], changes: 0 }];
    match session.decide("p", "k", &fp, 6, 6, &results).expect("decides") {
        Decision::Replay(mut replayed) => {
            if let Some(name) = &config.replay_header {
                let marker = replayed.headers.pop().expect("the replay marker is last");
                assert!(marker.name.eq_ignore_ascii_case(name) && marker.value == "true");
            }
            if plan.send_mutation_body {
                // The body was left out: the same status and headers, plus the marker.
                let omitted = replayed.headers.pop().expect("the omitted marker");
                assert_eq!(omitted.name, responses::BODY_OMITTED_HEADER);
                assert_eq!((replayed.status, &replayed.headers, replayed.body), (fresh.status, &fresh.headers, None));
            } else {
                assert_eq!(replayed, fresh);
            }
        }
        other => panic!("a stored completion must replay, got {other:?}"),
    }
}

/// The ietf key parser on arbitrary bytes: a decoded key is always a valid
/// key, and parsing never panics.
pub fn sf_string(data: &[u8]) {
    let value: String = core::iter::once('"').chain(data.iter().map(|&b| b as char)).collect();
    if let Ok(key) = parse_sf_string_item(&value) {
        assert!(is_valid_key(&key));
        assert!(value.len() >= key.len() + 2);
    }
}
