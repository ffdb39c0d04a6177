//! The driven API: the session's steps with a ledger that runs each batch.
//! The component's `run-*` methods and native hosts both use these.

use alloc::vec::Vec;

use crate::machine::Session;
use crate::types::{
    AbandonReason, BatchError, Completion, CompletionOutcome, Decision, MutationResponse, ProtocolError, Statement,
    StatementResult, SweepResult, Ticket,
};

/// Runs a batch of statements as one atomic unit, one result per statement.
pub trait Ledger {
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError>;
}

impl<F> Ledger for F
where
    F: FnMut(&[Statement]) -> Result<Vec<StatementResult>, BatchError>,
{
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
        self(statements)
    }
}

impl Session {
    fn run(&self, ledger: &mut impl Ledger, statements: &[Statement]) -> Result<Vec<StatementResult>, ProtocolError> {
        ledger.execute_batch(statements).map_err(|e| ProtocolError::Ledger(self.classify(&e)))
    }

    pub fn migrate(&self, ledger: &mut impl Ledger) -> Result<(), ProtocolError> {
        let statements: Vec<Statement> =
            self.config().dialect.statements().schema.iter().map(|sql| Statement { sql, params: Vec::new() }).collect();
        self.run(ledger, &statements).map(|_| ())
    }

    pub fn run_decision(
        &self,
        ledger: &mut impl Ledger,
        principal: &str,
        key: &str,
        fingerprint: &str,
        now: i64,
        waiting_since: i64,
    ) -> Result<Decision, ProtocolError> {
        let plan = self.plan_decision(principal, key, fingerprint, now)?;
        let results = self.run(ledger, &plan)?;
        self.decide(principal, key, fingerprint, now, waiting_since, &results)
    }

    pub fn run_completion(
        &self,
        ledger: &mut impl Ledger,
        ticket: &Ticket,
        response: MutationResponse,
        now: i64,
    ) -> Result<Completion, ProtocolError> {
        let plan = self.plan_completion(ticket, response, now)?;
        let results = self.run(ledger, &plan.statements)?;
        let outcome = self.finish_completion(plan.action, &results)?;
        let mut log: Vec<_> = plan.log.into_iter().collect();
        if outcome == CompletionOutcome::FencedOut {
            log.push(self.fenced_out_log(ticket));
        }
        Ok(Completion {
            response: plan.response,
            send_mutation_body: plan.send_mutation_body,
            outcome,
            sweep_due: plan.sweep_due,
            log,
        })
    }

    pub fn run_abandon(&self, ledger: &mut impl Ledger, ticket: &Ticket, reason: AbandonReason) -> Result<bool, ProtocolError> {
        match self.plan_abandon(ticket, reason)? {
            Some(plan) => self.finish_release(&self.run(ledger, &plan)?),
            None => Ok(false),
        }
    }

    pub fn run_sweep(&self, ledger: &mut impl Ledger, now: i64) -> Result<SweepResult, ProtocolError> {
        let plan = self.plan_sweep(now);
        self.finish_sweep(&self.run(ledger, &plan)?)
    }
}
