//! The Idempotency-Key protocol (the server side of the Stripe-style
//! contract) as a deterministic core: no I/O, no clock, no panics on any
//! input. `machine` holds every state transition; `driven` runs them against
//! a [`driven::Ledger`]; the WebAssembly component is a thin shell over both.
//!
//! Where each SPEC rule lives:
//! - SPEC 1 (header contract): [`machine::admit`], [`headers`]
//! - SPEC 2 (schema): [`sql::Statements::schema`] per [`sql::Dialect`]
//! - SPEC 3, 5, 6 (claim, decision, takeover): [`machine::plan_decision`], [`machine::decide`]
//! - SPEC 4 (fingerprint): [`fingerprint`]
//! - SPEC 6-7 (fenced completion, response lifecycle): [`machine::plan_completion`], [`responses::shape`]
//! - SPEC 8 (sweep): [`machine::plan_sweep`]
//! - SPEC 9 (fail closed): [`responses::error_response`], [`machine::plan_release`]

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod config;
pub mod driven;
pub mod fingerprint;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod machine;
pub mod responses;
pub mod sql;
pub mod types;

pub use config::Config;
pub use sql::Dialect;
pub use types::*;

/// The log line for a completion that was fenced out.
pub fn fenced_out_message(ticket: &Ticket) -> alloc::string::String {
    alloc::format!(
        "[idempotency] fenced out for principal={}, key={}, generation={} superseded",
        ticket.principal, ticket.key, ticket.generation
    )
}
