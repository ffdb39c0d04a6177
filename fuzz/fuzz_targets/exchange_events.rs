#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotency_ledger_core::fuzzing::exchange_events(data));
