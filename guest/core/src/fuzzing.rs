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

/// `head` with only the headers `policy().request_headers` names (what a
/// host may pass instead of all of them).
fn read_headers_only(session: &Session, head: &RequestHead) -> RequestHead {
    let names = &session.policy().request_headers;
    let headers = head.headers.iter().filter(|h| names.iter().any(|n| h.name.eq_ignore_ascii_case(n))).cloned().collect();
    RequestHead { method: head.method.clone(), path_and_query: head.path_and_query.clone(), headers }
}

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
    let admitted = session.admit(&head, principal.as_deref());
    assert_eq!(session.admit(&read_headers_only(&session, &head), principal.as_deref()), admitted, "a head of only the headers the policy names");
    match admitted {
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

/// SPEC 1.4-1.6 at their edges, against a model written from the SPEC's
/// words: principals around the 4 096-byte limit (counted in bytes, with
/// multi-byte characters across it, NUL anywhere), `Content-Length` values
/// around the request body cap (repeats of one number, disagreeing repeats,
/// signs, spaces, leading zeros, overflow), repeated and malformed keys, and
/// methods in any case. A 413 names the cap and is what `body_too_large()`
/// answers.
pub fn admission_policy(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let profile = if flags & 1 == 0 { Profile::Recipe } else { Profile::Ietf };
    let max_cap = crate::config::MAX_DURATION_MS;
    let cap: u64 = match b.byte() % 6 {
        0 => 0,
        1 => u64::from(b.byte()),
        2 => u64::from(u16::from_le_bytes([b.byte(), b.byte()])),
        3 => Config::default().request_body_cap_bytes,
        4 => (b.int() as u64) % (max_cap + 1),
        _ => max_cap,
    };
    let config = Config { key_required: flags & 2 == 0, request_body_cap_bytes: cap, ..Config::for_profile(profile) };
    let limit = machine_principal_cap();
    let principal: Option<String> = match b.byte() % 5 {
        0 => None,
        1 => Some(String::new()),
        2 => {
            let c = ['a', '\u{e9}', '\u{2713}', '\u{1f600}'][b.byte() as usize % 4];
            let target = limit - 8 + usize::from(b.byte() % 16);
            let mut p = String::new();
            while p.len() < target {
                p.push(c);
            }
            Some(p)
        }
        3 => {
            let mut p = b.text();
            let mut at = b.byte() as usize % (p.len() + 1);
            while !p.is_char_boundary(at) {
                at -= 1;
            }
            p.insert(at, '\0');
            Some(p)
        }
        _ => Some(b.text()),
    };
    let method = ["POST", "post", "Patch", "DELETE", "GET", "PUT", "HEAD"][b.byte() as usize % 7];
    let mut headers: Vec<Header> = Vec::new();
    let mut place = |b: &mut Bytes, header: Header| {
        let at = b.byte() as usize % (headers.len() + 1);
        headers.insert(at, header);
    };
    for _ in 0..b.byte() % 3 {
        let name = ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"][b.byte() as usize % 3];
        let value = match b.byte() % 7 {
            0 => String::new(),
            1 => " \t".into(),
            2 => (0..1 + b.byte() % 40).map(|_| char::from(0x20 + b.byte() % 95)).collect(),
            3 => "k".repeat(254 + usize::from(b.byte() % 3)),
            4 => alloc::format!("\"{}\"", b.latin1()),
            5 => alloc::format!(" {} ", (0..1 + b.byte() % 8).map(|_| char::from(b'a' + b.byte() % 26)).collect::<String>()),
            _ => b.latin1(),
        };
        place(&mut b, Header { name: name.into(), value });
    }
    for _ in 0..b.byte() % 4 {
        let name = ["Content-Length", "content-length", "CONTENT-LENGTH"][b.byte() as usize % 3];
        let n = [0, cap.saturating_sub(1), cap, cap.saturating_add(1), u64::MAX, b.int() as u64][b.byte() as usize % 6];
        let value = match b.byte() % 9 {
            0 => alloc::format!("{n}"),
            1 => alloc::format!("0{n}"),
            2 => alloc::format!(" {n}\t"),
            3 => alloc::format!("{n}, {n}"),
            4 => alloc::format!("{n},{}", n.wrapping_add(1)),
            5 => alloc::format!("+{n}"),
            6 => "18446744073709551616".into(),
            7 => alloc::format!("{n},"),
            _ => b.latin1(),
        };
        place(&mut b, Header { name: name.into(), value });
    }
    let head = RequestHead { method: method.into(), path_and_query: "/orders".into(), headers: headers.clone() };
    let session = session(config.clone());
    let got = session.admit(&head, principal.as_deref());
    assert_eq!(session.admit(&read_headers_only(&session, &head), principal.as_deref()), got, "a head of only the headers the policy names");

    // The model (SPEC 1.1-1.7, in order).
    let ws = |c: char| matches!(c, ' ' | '\t' | '\r' | '\n');
    let combined = |name: &str| -> Option<String> {
        let values: Vec<&str> = headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value.trim_matches(ws)).collect();
        if values.is_empty() {
            None
        } else {
            Some(values.join(", "))
        }
    };
    let declared = |v: &str| -> Option<u64> {
        let mut value = None;
        for part in v.split(',') {
            let part = part.trim_matches(ws);
            if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let n: u64 = part.parse().ok()?;
            if value.is_some_and(|v| v != n) {
                return None;
            }
            value = Some(n);
        }
        value
    };
    let printable = |k: &str| (1..=255).contains(&k.len()) && k.bytes().all(|c| (0x20..=0x7e).contains(&c));
    let protected = matches!(method.to_ascii_uppercase().as_str(), "POST" | "PATCH" | "DELETE");
    let key = combined("idempotency-key").filter(|k| !k.is_empty());
    enum Want {
        Pass,
        Reject(RejectionReason),
        InvalidPrincipal,
        Protected(String),
    }
    let want = if !protected || (key.is_none() && !config.key_required) {
        Want::Pass
    } else {
        match principal.as_deref().filter(|p| !p.is_empty()) {
            None => Want::Reject(RejectionReason::PrincipalRequired),
            Some(p) if p.len() > limit || p.contains('\0') => Want::InvalidPrincipal,
            Some(_) => match key {
                None => Want::Reject(RejectionReason::KeyRequired),
                Some(raw) => {
                    let decoded = if profile == Profile::Ietf && raw.starts_with('"') { parse_sf_string_item(&raw).ok() } else { Some(raw) };
                    match decoded.filter(|k| printable(k)) {
                        None => Want::Reject(RejectionReason::KeyInvalid),
                        Some(k) => match combined("content-length").and_then(|v| declared(&v)) {
                            Some(n) if n > cap => Want::Reject(RejectionReason::BodyTooLarge),
                            _ => Want::Protected(k),
                        },
                    }
                }
            },
        }
    };
    match (want, got) {
        (Want::Pass, Ok(Admission::PassThrough)) => {}
        (Want::InvalidPrincipal, Err(ProtocolError::InvalidArgument(_))) => {}
        (Want::Protected(k), Ok(Admission::Protected(p))) => {
            assert_eq!(p.key, k);
            assert_eq!(p.fingerprint_prefix, fingerprint::prefix(&config, &head));
        }
        (Want::Reject(reason), Ok(Admission::Reject(r))) => {
            assert_eq!(r.reason, reason);
            let status = match reason {
                RejectionReason::PrincipalRequired => 401,
                RejectionReason::BodyTooLarge => 413,
                _ => 400,
            };
            assert_eq!(r.response.status, status);
            if reason == RejectionReason::BodyTooLarge {
                assert_eq!(r.response, session.body_too_large().response);
                let body = r.response.body.as_deref().expect("a 413 has a body");
                assert!(body.contains(&alloc::format!("The request body exceeds {cap} bytes.")));
            }
        }
        (_, got) => panic!("admission disagrees with the SPEC's rules: got {got:?}"),
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

/// SPEC 7: whatever a handler returns, the stored row replays exactly:
/// the handler's status, allowlisted headers and body when it could be
/// stored, else the 500 the first caller got too (or, under `ietf`, the
/// status and headers without the body).
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
    let handler = MutationResponse { status, headers, body };
    let ticket = Ticket { principal: "p".into(), key: "k".into(), fingerprint: fp.clone(), generation: 1, created_at: 0 };
    let plan = session.plan_completion(&ticket, handler.clone(), 5).expect("valid");
    let names = &session.policy().response_headers;
    let read_only = MutationResponse { headers: handler.headers.iter().filter(|h| names.iter().any(|n| h.name.eq_ignore_ascii_case(n))).cloned().collect(), ..handler.clone() };
    assert_eq!(session.plan_completion(&ticket, read_only, 5).expect("valid"), plan, "a response of only the headers the policy names");
    if let Answer::Core(sent) = &plan.answer {
        assert_eq!(sent.status, 500, "the core answers an executed request only with its unstorable 500");
        assert!(plan.log.is_some());
    }
    if plan.action == CompletionAction::Release {
        // Released, never stored: the caller gets the handler's own 5xx, nothing to log.
        assert!(config.on_server_error == OnServerError::Release && (500..=599).contains(&status));
        assert_eq!((&plan.answer, &plan.log), (&Answer::Handler, &None));
        return;
    }
    // The row the completion writes, read back by a later decision.
    let params = &plan.statements[0].params;
    let row = alloc::vec![Value::Text(fp.clone()), Value::Text("completed".into()), Value::Integer(1), params[0].clone(), params[1].clone(), params[2].clone(), Value::Integer(5), Value::Integer(0)];
    let results = [StatementResult::default(), StatementResult::default(), StatementResult { rows: alloc::vec![row], changes: 0 }];
    let mut replayed = match session.decide("p", "k", &fp, 6, 6, &results).expect("decides") {
        Decision::Replay(replayed) => replayed,
        other => panic!("a stored completion must replay, got {other:?}"),
    };
    if let Some(name) = &config.replay_header {
        let marker = replayed.headers.pop().expect("the replay marker is last");
        assert!(marker.name.eq_ignore_ascii_case(name) && marker.value == "true");
    }
    match (&plan.answer, plan.log.is_some()) {
        (Answer::Core(sent), _) => assert_eq!(&replayed, sent),
        (Answer::Handler, true) => {
            // ietf: the body was left out; status and headers kept, plus the marker.
            assert_eq!(config.profile, Profile::Ietf);
            let omitted = replayed.headers.pop().expect("the omitted marker");
            assert_eq!(omitted.name, responses::BODY_OMITTED_HEADER);
            assert_eq!((replayed.status, replayed.body), (status, None));
        }
        (Answer::Handler, false) => {
            assert_eq!(replayed.status, status);
            let expected = if responses::is_null_body_status(status) {
                None
            } else {
                Some(match handler.body {
                    ResponseBody::Text(t) => t,
                    ResponseBody::Bytes(bytes) => String::from_utf8(bytes).expect("stored bodies are UTF-8"),
                })
            };
            assert_eq!(replayed.body, expected);
            for h in &replayed.headers {
                assert!(config.replay_headers.iter().any(|n| n.eq_ignore_ascii_case(&h.name)));
            }
        }
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

/// The exchange under any sequence of events: it never panics, runs the
/// handler at most once, and after a final action answers every further
/// event with the 500 of a host bug.
pub fn exchange_events(data: &[u8]) {
    use crate::exchange::{Action, BodyProblem, Event, HandlerResult};
    let mut b = Bytes::new(data);
    let session = session(config_from(&mut b));
    let mut headers = b.headers();
    if b.byte() % 4 != 0 {
        headers.push(Header { name: "Idempotency-Key".into(), value: b.latin1() });
    }
    let head = RequestHead { method: if b.byte() % 5 == 0 { "GET".into() } else { "POST".into() }, path_and_query: "/o".into(), headers };
    let principal = if b.byte() % 6 == 0 { None } else { Some(b.latin1()) };
    let transactional = b.byte() % 2 == 0;
    let (mut action, exchange) = session.start(&head, principal.as_deref(), transactional);
    let Some(mut exchange) = exchange else {
        assert!(action.is_final());
        return;
    };
    let mut handlers = 0;
    let mut ended = false;
    for _ in 0..(b.byte() % 12) {
        let event = match b.byte() % 12 {
            0 => {
                let n = b.byte() as usize;
                Event::Body(b.take(n).to_vec())
            }
            1 => Event::BodyHashed(if b.byte() % 2 == 0 { fingerprint::digest("p", b"") } else { b.latin1() }),
            2 => Event::BodyTooLarge,
            3 => Event::BodyUnreadable([BodyProblem::LengthUnknown, BodyProblem::Incomplete, BodyProblem::Consumed][b.byte() as usize % 3]),
            4 | 5 => Event::BatchDone(
                (0..b.byte() % 4)
                    .map(|_| StatementResult {
                        rows: (0..b.byte() % 2).map(|_| (0..b.byte() % 9).map(|_| b.value()).collect()).collect(),
                        changes: b.int() as u64 % 3,
                    })
                    .collect(),
            ),
            6 => Event::BatchFailed(BatchError::database(b.latin1(), b.latin1())),
            7 => Event::Slept,
            8 => Event::Committed,
            9 => Event::CommitFailed(BatchError::OutcomeUnknown(b.latin1())),
            10 => Event::RolledBack,
            _ => Event::HandlerDone(match b.byte() % 4 {
                0 => HandlerResult::Answered(MutationResponse { status: b.int() as u16, headers: b.headers(), body: ResponseBody::Text(b.text()) }),
                1 => HandlerResult::Raised(b.text()),
                2 => HandlerResult::NothingChanged,
                _ => HandlerResult::Declined,
            }),
        };
        let was_final = action.is_final();
        action = exchange.step(&session, b.int(), event);
        if was_final || ended {
            ended = true;
            match &action {
                Action::Respond(reply) => assert_eq!(reply.outcome, Outcome::InternalError),
                other => panic!("an event after a final action must be refused, got {other:?}"),
            }
        }
        if let Action::RunHandler(run) = &action {
            handlers += 1;
            assert!(run.ticket.generation >= 1);
            assert_eq!(run.transaction, transactional);
        }
        assert!(handlers <= 1, "the handler ran twice in one exchange");
    }
}

