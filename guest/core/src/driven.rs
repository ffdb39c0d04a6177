//! The driven API: the same steps with a ledger that runs each batch.
//! The component's `driven` interface and native hosts both use these.

use crate::config::Config;
use crate::machine;
use crate::types::{
    Completion, Decision, LedgerError, MutationResponse, ProtocolError, Statement, StatementResult, Ticket,
};
use alloc::vec::Vec;

/// Runs a batch of statements as one atomic unit, one result per statement.
pub trait Ledger {
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, LedgerError>;
}

impl<F> Ledger for F
where
    F: FnMut(&[Statement]) -> Result<Vec<StatementResult>, LedgerError>,
{
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, LedgerError> {
        self(statements)
    }
}

fn run(ledger: &mut impl Ledger, statements: &[Statement]) -> Result<Vec<StatementResult>, ProtocolError> {
    ledger.execute_batch(statements).map_err(ProtocolError::Ledger)
}

pub fn migrate(ledger: &mut impl Ledger, config: &Config) -> Result<(), ProtocolError> {
    config.validate()?;
    let statements: Vec<Statement> = config.dialect.statements().schema.iter().map(|sql| Statement { sql, params: Vec::new() }).collect();
    run(ledger, &statements).map(|_| ())
}

pub fn decide(
    ledger: &mut impl Ledger,
    config: &Config,
    principal: &str,
    key: &str,
    fingerprint: &str,
    now: i64,
) -> Result<Decision, ProtocolError> {
    let plan = machine::plan_decision(config, principal, key, fingerprint, now)?;
    let results = run(ledger, &plan)?;
    machine::decide(config, principal, key, fingerprint, now, &results)
}

pub fn complete(
    ledger: &mut impl Ledger,
    config: &Config,
    ticket: &Ticket,
    response: MutationResponse,
    now: i64,
) -> Result<Completion, ProtocolError> {
    let plan = machine::plan_completion(config, ticket, response, now)?;
    let results = run(ledger, &plan.statements)?;
    let stored = machine::finish_completion(&results)?;
    Ok(Completion { response: plan.response, fenced_out: !stored })
}

pub fn release(ledger: &mut impl Ledger, config: &Config, ticket: &Ticket) -> Result<bool, ProtocolError> {
    let plan = machine::plan_release(config, ticket)?;
    machine::finish_release(&run(ledger, &plan)?)
}

pub fn sweep(ledger: &mut impl Ledger, config: &Config, now: i64) -> Result<u64, ProtocolError> {
    let plan = machine::plan_sweep(config, now)?;
    machine::finish_sweep(&run(ledger, &plan)?)
}
