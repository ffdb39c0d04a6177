//! The Idempotency-Key protocol (the server side of the Stripe-style
//! contract, and of draft-ietf-httpapi-idempotency-key-header) as a
//! deterministic core: no I/O, no clock, no panics on any input. A
//! [`Session`] is a validated [`Config`]; `machine` holds every state
//! transition as its methods, `driven` runs them against a
//! [`driven::Ledger`]; the WebAssembly component is a thin shell over both.
//!
//! Where each rule of docs/SPEC.md lives:
//! - 1 (admission: methods, principal, key, request body cap): [`Session::admit`], [`headers`]
//! - 2 (schema): [`sql::Statements::schema`] per [`sql::Dialect`]
//! - 3, 5, 6 (claim, decision, wait, takeover): [`Session::plan_decision`], [`Session::decide`]
//! - 4 (fingerprint): [`fingerprint`]
//! - 6-7 (fenced completion, response lifecycle): [`Session::plan_completion`], [`responses::shape`]
//! - 8 (sweep): [`Session::sweep_due`], [`Session::plan_sweep`]
//! - 9 (fail closed, release, classification, logs): [`responses::error_response`],
//!   [`Session::plan_abandon`], [`classify`], [`log`]

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod classify;
pub mod config;
pub mod driven;
pub mod exchange;
pub mod fingerprint;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod json;
pub mod log;
pub mod machine;
pub mod responses;
pub mod sql;
pub mod types;

pub use config::{Config, OnServerError, Profile};
pub use exchange::{Action, BodyProblem, Event, Exchange, Failure, HandlerResult, HandlerRun, ReadBody, Reply};
pub use machine::Session;
pub use sql::{Dialect, Query};
pub use types::*;
