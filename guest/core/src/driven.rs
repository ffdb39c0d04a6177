//! The driven I/O mode: an exchange whose batches a [`Ledger`] runs. The
//! component's `driven` exchanges (through the `ledger` import) and native
//! tests use it; the sequence is the exchange's own.

use alloc::vec::Vec;

use crate::exchange::{Action, Event, Exchange};
use crate::machine::Session;
use crate::types::{BatchError, ProtocolError, Statement, StatementResult, SweepReport};

/// Runs a batch of statements as one atomic unit, one result per statement.
pub trait Ledger {
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError>;

    /// [`Ledger::execute_batch`] of a batch the caller is done with (the
    /// exchange's own, in [`drive`]): a ledger that copies the statements
    /// anyway (across the component boundary) moves them instead.
    fn execute_owned(&mut self, statements: Vec<Statement>) -> Result<Vec<StatementResult>, BatchError> {
        self.execute_batch(&statements)
    }
}

impl<F> Ledger for F
where
    F: FnMut(&[Statement]) -> Result<Vec<StatementResult>, BatchError>,
{
    fn execute_batch(&mut self, statements: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
        self(statements)
    }
}

/// Performs every `run-batch` the exchange asks for through `ledger` (at
/// `now`), returning the first action that is not a batch.
pub fn drive(session: &Session, exchange: &mut Exchange, ledger: &mut impl Ledger, now: i64, mut action: Action) -> Action {
    while let Action::RunBatch(statements) = action {
        let event = match ledger.execute_owned(statements) {
            Ok(results) => Event::BatchDone(results),
            Err(error) => Event::BatchFailed(error),
        };
        action = exchange.step(session, now, event);
    }
    action
}

impl Session {
    /// Creates the table and index if missing.
    pub fn migrate(&self, ledger: &mut impl Ledger) -> Result<(), ProtocolError> {
        ledger.execute_owned(self.migration()).map(|_| ()).map_err(|e| ProtocolError::Ledger(self.classify(&e)))
    }

    /// One lease renewal through `ledger`.
    pub fn renew(&self, ledger: &mut impl Ledger, ticket: &crate::Ticket, now: i64) -> crate::Lease {
        match self.plan_renewal(ticket, now) {
            Ok(statements) => match ledger.execute_owned(statements) {
                Ok(results) => self.renewed(ticket, Ok(&results)),
                Err(error) => self.renewed(ticket, Err(&error)),
            },
            Err(error) => crate::Lease {
                state: crate::LeaseState::Unknown,
                log: Some(self.log_line(&crate::LogEvent::RenewalFailed { ticket: ticket.clone(), error })),
            },
        }
    }

    /// One bounded sweep batch through `ledger`.
    pub fn run_sweep(&self, ledger: &mut impl Ledger, now: i64) -> SweepReport {
        match ledger.execute_owned(self.plan_sweep(now)) {
            Ok(results) => self.swept(Ok(&results)),
            Err(error) => self.swept(Err(&error)),
        }
    }
}
