//! Replays the committed fuzz corpus (fuzz/corpus/<target>/*) through the
//! fuzz target bodies on stable, so every input the fuzzer kept stays a test.

use std::path::Path;

use idempotency_ledger_core::fuzzing;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 8] = [
    ("request_head", fuzzing::request_head),
    ("key", fuzzing::key),
    ("stored_row", fuzzing::stored_row),
    ("step_results", fuzzing::step_results),
    ("completion_roundtrip", fuzzing::completion_roundtrip),
    ("sf_string", fuzzing::sf_string),
    ("admission_policy", fuzzing::admission_policy),
    ("exchange_events", fuzzing::exchange_events),
];

#[test]
fn committed_corpus_replays_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut total = 0;
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("corpus entry").path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "{name}: empty corpus");
        for input in &inputs {
            target(&std::fs::read(input).expect("read corpus input"));
        }
        // Edge inputs that need no corpus to matter.
        for edge in [&b""[..], &[0xff; 64][..], &[0u8; 1024][..]] {
            target(edge);
        }
        total += inputs.len();
    }
    println!("replayed {total} corpus inputs");
}
