//! One request, from its head to its answer: the WIT `exchange`. The host
//! feeds events (the body, a batch's results, "slept", the handler's end)
//! and performs the action each returns; every transition of a request is
//! in [`Exchange::step`], and every answer, wait and log line comes out of
//! it. Time is the host's `now`, passed with each event.
//!
//! The exchange never touches a database: each batch is a
//! [`Action::RunBatch`]. [`crate::driven::drive`] runs those through a
//! [`crate::driven::Ledger`] for blocking hosts (the component's `driven`
//! mode), so both I/O styles share this one sequence.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::mem;

use crate::fingerprint::{digest, is_fingerprint};
use crate::machine::Session;
use crate::responses;
use crate::types::{
    AbandonReason, Admission, Answer, BatchError, CompletionAction, CompletionOutcome, Decision, LedgerError, LogEvent,
    LogLine, MutationResponse, Outcome, ProtectedRequest, ProtocolError, Rejection, RejectionReason, RequestHead, Response, RollbackCause,
    Statement, StatementResult, Ticket,
};

/// Read the body (at most `cap` bytes), then feed [`Event::Body`] or
/// [`Event::BodyHashed`] (SHA-256 of `prefix` then the body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBody {
    pub cap: u64,
    pub prefix: String,
}

/// Why the host cannot read the body the client sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyProblem {
    /// No `Content-Length` and no way to find the body's end: 411.
    LengthUnknown,
    /// The body stream broke before its end: 400.
    Incomplete,
    /// Something before the middleware consumed it: 500, logged.
    Consumed,
}

/// How the handler ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandlerResult {
    Answered(MutationResponse),
    Raised(String),
    NothingChanged,
    /// The framework refused the request before the handler ran.
    Declined,
}

/// How to run the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerRun {
    pub ticket: Ticket,
    /// Renew the lease this often while the handler runs; `None`: off.
    pub renew_every_ms: Option<u32>,
    /// Run the handler inside a transaction on the ledger's database.
    pub transaction: bool,
}

/// What happened since the last action.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Body(Vec<u8>),
    BodyHashed(String),
    BodyTooLarge,
    BodyUnreadable(BodyProblem),
    BatchDone(Vec<StatementResult>),
    BatchFailed(BatchError),
    Slept,
    Committed,
    CommitFailed(BatchError),
    RolledBack,
    HandlerDone(HandlerResult),
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Body(_) => "body",
            Event::BodyHashed(_) => "body-hashed",
            Event::BodyTooLarge => "body-too-large",
            Event::BodyUnreadable(_) => "body-unreadable",
            Event::BatchDone(_) => "batch-done",
            Event::BatchFailed(_) => "batch-failed",
            Event::Slept => "slept",
            Event::Committed => "committed",
            Event::CommitFailed(_) => "commit-failed",
            Event::RolledBack => "rolled-back",
            Event::HandlerDone(_) => "handler-done",
        }
    }
}

/// The final answer of an exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub send: Answer,
    /// Close the connection after sending: the body was not read to its end.
    pub close: bool,
    pub log: Vec<LogLine>,
    /// Sweep off the request path once the answer is sent.
    pub sweep: bool,
    pub outcome: Outcome,
}

/// The final action after the handler raised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub log: Vec<LogLine>,
    pub outcome: Outcome,
    /// For a host that cannot re-raise the failure: a 500.
    pub response: Response,
}

/// What the host does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    ReadBody(ReadBody),
    RunBatch(Vec<Statement>),
    Sleep(u32),
    RunHandler(HandlerRun),
    /// Run the fenced completion inside the handler's transaction.
    CompleteInTransaction(Vec<Statement>),
    Commit,
    Rollback,
    /// Final: run the handler without the ledger, send its response as it is.
    PassThrough,
    /// Final.
    Respond(Reply),
    /// Final: re-raise the handler's failure.
    Propagate(Failure),
}

impl Action {
    /// True for the actions after which the exchange takes no event.
    pub fn is_final(&self) -> bool {
        matches!(self, Action::PassThrough | Action::Respond(_) | Action::Propagate(_))
    }
}

/// The request a decision batch is about, and how long it has waited.
#[derive(Clone, Debug)]
struct Claim {
    principal: String,
    key: String,
    fingerprint: String,
    /// The `now` of the first decision: bounds the wait.
    since: i64,
    /// The `now` the pending decision batch was planned at.
    at: i64,
    waited: bool,
}

#[derive(Debug)]
enum State {
    ReadingBody { principal: String, key: String, prefix: String },
    Deciding(Claim),
    Sleeping(Claim),
    Running(Ticket),
    Completing { ticket: Ticket, action: CompletionAction, answer: Answer, log: Vec<LogLine>, sweep_due: bool },
    /// SPEC 10: a transactional completion, inside the handler's transaction.
    CompletingInTransaction { ticket: Ticket, answer: Answer, log: Vec<LogLine>, sweep_due: bool },
    Committing { ticket: Ticket, answer: Answer, log: Vec<LogLine>, sweep_due: bool },
    RollingBack { ticket: Ticket, then: AfterRollback },
    /// After a fenced-out transactional completion: the current owner's answer.
    LookingUp(Ticket),
    Releasing { ticket: Ticket, ending: Ending },
    Done,
}

/// What follows a transactional handler's rollback.
#[derive(Debug)]
enum AfterRollback {
    /// Fenced out: answer with the current owner's stored answer or a 409.
    Lookup,
    /// Release the reservation, then end as `Ending` says.
    Release(Ending),
    /// The completion's batch broke with an unknown outcome: on D1 that batch
    /// is the commit, so it may have committed. Answer so, with the plan's log.
    OutcomeUnknown { error: ProtocolError, log: Vec<LogLine> },
}

/// How a handler that leaves no stored response ends, once its release ran.
#[derive(Debug)]
enum Ending {
    /// Abandoned: raised, changed nothing, or declined by the framework.
    Abandoned { reason: AbandonReason, detail: String },
    /// A 5xx of a transactional handler under `on-server-error: release`.
    ServerError,
    /// A transactional handler's transaction was rolled back.
    RolledBack(RollbackCause),
    /// A transactional handler's transaction could not begin: it never ran.
    NotBegun(ProtocolError),
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::ReadingBody { .. } => "reading the body",
            State::Deciding(_) => "deciding",
            State::Sleeping(_) => "sleeping",
            State::Running(_) => "running the handler",
            State::Completing { .. } => "completing",
            State::CompletingInTransaction { .. } => "completing in the handler's transaction",
            State::Committing { .. } => "committing",
            State::RollingBack { .. } => "rolling back",
            State::LookingUp(_) => "looking up the current owner's answer",
            State::Releasing { .. } => "releasing",
            State::Done => "done",
        }
    }
}

/// One request's state (see the module docs).
#[derive(Debug)]
pub struct Exchange {
    state: State,
    /// The handler's writes commit with its completion (SPEC 10).
    transactional: bool,
}

impl Session {
    /// Starts a request: pass-through, an answer at once (401, 400, 413, or
    /// a 500 for a principal the core refuses), or `read-body` and the
    /// exchange to feed next.
    pub fn start(&self, head: &RequestHead, principal: Option<&str>, transactional: bool) -> (Action, Option<Exchange>) {
        match self.admitted(head, principal) {
            Ok(protected) => {
                let action = Action::ReadBody(ReadBody {
                    cap: self.config().request_body_cap_bytes,
                    prefix: protected.fingerprint_prefix.clone(),
                });
                (action, Some(Exchange::reading_body(principal, protected, transactional)))
            }
            Err(answered) => (answered, None),
        }
    }

    /// [`Session::start`] for a host that already holds the whole body (WIT
    /// `request-start.body`): what `start`, then [`Event::Body`] fed at
    /// `now`, answers, in one call. The exchange is `None` once the action
    /// is final.
    pub fn start_with_body(
        &self,
        head: &RequestHead,
        principal: Option<&str>,
        transactional: bool,
        now: i64,
        body: Vec<u8>,
    ) -> (Action, Option<Exchange>) {
        match self.admitted(head, principal) {
            Ok(protected) => {
                let mut exchange = Exchange::reading_body(principal, protected, transactional);
                let action = exchange.step(self, now, Event::Body(body));
                let exchange = (!action.is_final()).then_some(exchange);
                (action, exchange)
            }
            Err(answered) => (answered, None),
        }
    }

    /// Admission: a protected request (its key and fingerprint prefix), or
    /// the final action (pass-through, 401, 400, 413, the 500 for a
    /// principal the core refuses).
    fn admitted(&self, head: &RequestHead, principal: Option<&str>) -> Result<ProtectedRequest, Action> {
        match self.admit(head, principal) {
            Ok(Admission::PassThrough) => Err(Action::PassThrough),
            Ok(Admission::Reject(rejection)) => Err(rejected(rejection)),
            Ok(Admission::Protected(protected)) => Ok(protected),
            Err(error) => {
                let log = vec![self.log_line(&LogEvent::PrincipalInvalid { error: error.clone() })];
                Err(respond(Answer::Core(self.error_response(&error)), log, Outcome::PrincipalInvalid))
            }
        }
    }
}

impl Exchange {
    /// A protected request's exchange, waiting for its body.
    fn reading_body(principal: Option<&str>, protected: ProtectedRequest, transactional: bool) -> Exchange {
        let state = State::ReadingBody {
            principal: principal.unwrap_or_default().into(),
            key: protected.key,
            prefix: protected.fingerprint_prefix,
        };
        Exchange { state, transactional }
    }

    /// Feeds `event`, which happened at `now`, and returns the next action.
    /// Every transition of a request is here.
    pub fn step(&mut self, session: &Session, now: i64, event: Event) -> Action {
        let state = mem::replace(&mut self.state, State::Done);
        let action = match (state, event) {
            // ---- the body ----
            (State::ReadingBody { principal, key, prefix }, Event::Body(body)) => {
                if body.len() as u64 > session.config().request_body_cap_bytes {
                    rejected(session.body_too_large())
                } else {
                    let fingerprint = digest(&prefix, &body);
                    self.decide_first(session, now, principal, key, fingerprint)
                }
            }
            (State::ReadingBody { principal, key, .. }, Event::BodyHashed(fingerprint)) => {
                if is_fingerprint(&fingerprint) {
                    self.decide_first(session, now, principal, key, fingerprint)
                } else {
                    internal_error(session, format!("body-hashed {fingerprint:?} is not a lowercase hex SHA-256 (the host's hash)"))
                }
            }
            (State::ReadingBody { .. }, Event::BodyTooLarge) => rejected(session.body_too_large()),
            (State::ReadingBody { principal, key, .. }, Event::BodyUnreadable(problem)) => {
                let profile = session.config().profile;
                match problem {
                    BodyProblem::LengthUnknown => rejected(responses::length_required(profile)),
                    BodyProblem::Incomplete => rejected(responses::body_incomplete(profile)),
                    BodyProblem::Consumed => {
                        let rejection = responses::body_unavailable(profile);
                        let log = vec![session.log_line(&LogEvent::BodyConsumed { principal, key })];
                        respond(Answer::Core(rejection.response), log, Outcome::BodyUnavailable)
                    }
                }
            }

            // ---- the decision (SPEC 3, 5, 6) ----
            (State::Deciding(claim), Event::BatchDone(results)) => {
                let decided = session.decide(&claim.principal, &claim.key, &claim.fingerprint, claim.at, claim.since, &results);
                match decided {
                    Ok(Decision::Execute(ticket)) => {
                        self.state = State::Running(ticket.clone());
                        let renew_every_ms = session.config().renew_every_ms();
                        Action::RunHandler(HandlerRun { ticket, renew_every_ms, transaction: self.transactional })
                    }
                    Ok(Decision::Replay(response)) => {
                        let outcome = if claim.waited { Outcome::ReplayedAfterWait } else { Outcome::Replayed };
                        respond(Answer::Core(response), vec![], outcome)
                    }
                    Ok(Decision::Reject(rejection)) => rejected(rejection),
                    Ok(Decision::Wait(ms)) => {
                        self.state = State::Sleeping(Claim { waited: true, ..claim });
                        Action::Sleep(ms)
                    }
                    Err(error) => decision_failed(session, &claim, error),
                }
            }
            (State::Deciding(claim), Event::BatchFailed(error)) => {
                decision_failed(session, &claim, ProtocolError::Ledger(session.classify(&error)))
            }
            (State::Sleeping(claim), Event::Slept) => self.plan_decision(session, Claim { at: now, ..claim }),

            // ---- the handler ----
            (State::Running(ticket), Event::HandlerDone(result)) => self.handler_done(session, now, ticket, result),
            // SPEC 10.2: the handler's transaction could not begin, so the handler never ran: the
            // reservation is released and the caller gets the ledger's answer. A BEGIN whose
            // outcome is unknown opened nothing that could commit.
            (State::Running(ticket), Event::BatchFailed(error)) if self.transactional => {
                let error = match session.classify(&error) {
                    LedgerError::OutcomeUnknown(detail) => LedgerError::Io(detail),
                    classified => classified,
                };
                self.release(session, ticket, Ending::NotBegun(ProtocolError::Ledger(error)))
            }

            // ---- completion (SPEC 6, 7) ----
            (State::Completing { ticket, action, answer, log, sweep_due }, Event::BatchDone(results)) => {
                match session.finish_completion(action, &results) {
                    Ok(stored) => completed(session, ticket, answer, log, sweep_due, stored),
                    Err(error) => completion_failed(session, ticket, answer, log, error),
                }
            }
            (State::Completing { ticket, answer, log, .. }, Event::BatchFailed(error)) => {
                completion_failed(session, ticket, answer, log, ProtocolError::Ledger(session.classify(&error)))
            }

            // ---- a transactional completion (SPEC 10) ----
            (State::CompletingInTransaction { ticket, answer, log, sweep_due }, Event::BatchDone(results)) => {
                let completion = match results.as_slice() {
                    [completion, _fence] => session.finish_completion(CompletionAction::Store, core::slice::from_ref(completion)),
                    other => Err(ProtocolError::MalformedResult(format!("transactional completion: expected 2 results, got {}", other.len()))),
                };
                match completion {
                    Ok(CompletionOutcome::Stored) => {
                        self.state = State::Committing { ticket, answer, log, sweep_due };
                        Action::Commit
                    }
                    // The fence aborts a completion that matched no row; reaching here means it did not.
                    Ok(_) => self.roll_back(ticket, AfterRollback::Lookup),
                    Err(error) => self.roll_back(ticket, AfterRollback::Release(Ending::RolledBack(RollbackCause::Write(error)))),
                }
            }
            (State::CompletingInTransaction { ticket, log, .. }, Event::BatchFailed(error)) => {
                if session.is_fence_violation(&error) {
                    self.roll_back(ticket, AfterRollback::Lookup)
                } else {
                    match session.classify(&error) {
                        // Never "nothing changed" when the batch may have committed (D1).
                        unknown @ LedgerError::OutcomeUnknown(_) => {
                            self.roll_back(ticket, AfterRollback::OutcomeUnknown { error: ProtocolError::Ledger(unknown), log })
                        }
                        classified => {
                            let cause = RollbackCause::Write(ProtocolError::Ledger(classified));
                            self.roll_back(ticket, AfterRollback::Release(Ending::RolledBack(cause)))
                        }
                    }
                }
            }
            (State::Committing { ticket, answer, log, sweep_due }, Event::Committed) => {
                completed(session, ticket, answer, log, sweep_due, CompletionOutcome::Stored)
            }
            (State::Committing { ticket, mut log, .. }, Event::CommitFailed(error)) => match session.classify(&error) {
                LedgerError::OutcomeUnknown(detail) => {
                    let error = ProtocolError::Ledger(LedgerError::OutcomeUnknown(detail));
                    log.push(session.log_line(&LogEvent::CommitOutcomeUnknown { ticket, error }));
                    respond(Answer::Core(responses::commit_outcome_unknown(session.config())), log, Outcome::CompletionFailed)
                }
                // Nothing committed, but the transaction may still be open (SQLite keeps it
                // after a COMMIT that failed busy): roll it back before the release batch.
                classified => {
                    let cause = RollbackCause::Commit(ProtocolError::Ledger(classified));
                    self.roll_back(ticket, AfterRollback::Release(Ending::RolledBack(cause)))
                }
            },
            (State::RollingBack { ticket, then }, Event::RolledBack) => match then {
                AfterRollback::Lookup => {
                    let statements = session.plan_lookup(&ticket.principal, &ticket.key);
                    self.state = State::LookingUp(ticket);
                    Action::RunBatch(statements)
                }
                AfterRollback::Release(ending) => self.release(session, ticket, ending),
                AfterRollback::OutcomeUnknown { error, mut log } => {
                    log.push(session.log_line(&LogEvent::CommitOutcomeUnknown { ticket, error }));
                    respond(Answer::Core(responses::commit_outcome_unknown(session.config())), log, Outcome::CompletionFailed)
                }
            },
            (State::LookingUp(ticket), Event::BatchDone(results)) => {
                fenced_answer(session, &ticket, session.decide_lookup(&ticket.fingerprint, now, &results))
            }
            (State::LookingUp(ticket), Event::BatchFailed(error)) => {
                fenced_answer(session, &ticket, Err(ProtocolError::Ledger(session.classify(&error))))
            }

            // ---- release (SPEC 9.3) ----
            (State::Releasing { ticket, ending }, Event::BatchDone(results)) => match session.finish_release(&results) {
                Ok(released) => released_ending(session, ticket, ending, released),
                Err(error) => release_failed(session, ticket, ending, error),
            },
            (State::Releasing { ticket, ending }, Event::BatchFailed(error)) => {
                release_failed(session, ticket, ending, ProtocolError::Ledger(session.classify(&error)))
            }

            (state, event) => {
                let what = format!("the host fed {} while the exchange was {}", event.name(), state.name());
                internal_error(session, what)
            }
        };
        action
    }

    /// The first decision: `now` starts the wait.
    fn decide_first(&mut self, session: &Session, now: i64, principal: String, key: String, fingerprint: String) -> Action {
        self.plan_decision(session, Claim { principal, key, fingerprint, since: now, at: now, waited: false })
    }

    fn plan_decision(&mut self, session: &Session, claim: Claim) -> Action {
        match session.plan_decision(&claim.principal, &claim.key, &claim.fingerprint, claim.at) {
            Ok(statements) => {
                self.state = State::Deciding(claim);
                Action::RunBatch(statements)
            }
            Err(error) => decision_failed(session, &claim, error),
        }
    }

    fn handler_done(&mut self, session: &Session, now: i64, ticket: Ticket, result: HandlerResult) -> Action {
        let (reason, detail) = match result {
            HandlerResult::Answered(response) => return self.complete(session, now, ticket, response),
            HandlerResult::Raised(detail) => (AbandonReason::Raised, detail),
            HandlerResult::NothingChanged => (AbandonReason::NothingChanged, String::new()),
            HandlerResult::Declined => (AbandonReason::Declined, String::new()),
        };
        if self.transactional {
            // Its writes are rolled back, so nothing happened: the key is released.
            return self.roll_back(ticket, AfterRollback::Release(Ending::Abandoned { reason, detail }));
        }
        match session.plan_abandon(&ticket, reason) {
            Ok(Some(_)) => self.release(session, ticket, Ending::Abandoned { reason, detail }),
            // Raised under `store`: the row stays pending until the TTL.
            Ok(None) => abandoned(session, ticket, reason, detail, false, false),
            Err(error) => internal_error(session, format!("the ticket cannot be released: {error}")),
        }
    }

    fn roll_back(&mut self, ticket: Ticket, then: AfterRollback) -> Action {
        self.state = State::RollingBack { ticket, then };
        Action::Rollback
    }

    fn release(&mut self, session: &Session, ticket: Ticket, ending: Ending) -> Action {
        let statements = session.release_statements(&ticket);
        self.state = State::Releasing { ticket, ending };
        Action::RunBatch(statements)
    }

    fn complete(&mut self, session: &Session, now: i64, ticket: Ticket, response: MutationResponse) -> Action {
        match session.plan_completion(&ticket, response, now) {
            Ok(plan) if self.transactional && plan.action == CompletionAction::Release => {
                self.roll_back(ticket, AfterRollback::Release(Ending::ServerError))
            }
            Ok(mut plan) if self.transactional => {
                plan.statements.push(session.fence_statement(&ticket));
                let log = plan.log.into_iter().collect();
                self.state = State::CompletingInTransaction { ticket, answer: plan.answer, log, sweep_due: plan.sweep_due };
                Action::CompleteInTransaction(plan.statements)
            }
            Ok(plan) => {
                self.state = State::Completing {
                    ticket,
                    action: plan.action,
                    answer: plan.answer,
                    log: plan.log.into_iter().collect(),
                    sweep_due: plan.sweep_due,
                };
                Action::RunBatch(plan.statements)
            }
            Err(error) => internal_error(session, format!("the ticket cannot be completed: {error}")),
        }
    }
}

fn respond(send: Answer, log: Vec<LogLine>, outcome: Outcome) -> Action {
    Action::Respond(Reply { send, close: false, log, sweep: false, outcome })
}

/// An answer that ran nothing; the connection closes when the body was left unread.
fn rejected(rejection: Rejection) -> Action {
    let close = matches!(
        rejection.reason,
        RejectionReason::BodyTooLarge | RejectionReason::LengthRequired | RejectionReason::BodyIncomplete
    );
    let outcome = rejection.reason.outcome();
    Action::Respond(Reply { send: Answer::Core(rejection.response), close, log: vec![], sweep: false, outcome })
}

fn internal_error(session: &Session, what: String) -> Action {
    let log = vec![session.log_line(&LogEvent::InternalError(what))];
    respond(Answer::Core(responses::internal_error(session.config().profile)), log, Outcome::InternalError)
}

/// SPEC 9.1: the decision failed; nothing ran.
fn decision_failed(session: &Session, claim: &Claim, error: ProtocolError) -> Action {
    let outcome = match &error {
        ProtocolError::Ledger(LedgerError::Busy) => Outcome::LedgerBusy,
        ProtocolError::Ledger(LedgerError::OutcomeUnknown(_)) => Outcome::LedgerOutcomeUnknown,
        _ => Outcome::LedgerFailed,
    };
    let event = LogEvent::DecisionFailed { principal: claim.principal.clone(), key: claim.key.clone(), error: error.clone() };
    respond(Answer::Core(session.error_response(&error)), vec![session.log_line(&event)], outcome)
}

fn completed(
    session: &Session,
    ticket: Ticket,
    answer: Answer,
    mut log: Vec<LogLine>,
    sweep_due: bool,
    stored: CompletionOutcome,
) -> Action {
    let outcome = match stored {
        CompletionOutcome::Stored if ticket.generation > 1 => Outcome::TakenOver,
        CompletionOutcome::Stored => Outcome::Executed,
        CompletionOutcome::Released => Outcome::Released,
        CompletionOutcome::FencedOut => {
            log.push(session.fenced_out_log(&ticket));
            Outcome::FencedOut
        }
    };
    Action::Respond(Reply { send: answer, close: false, log, sweep: sweep_due, outcome })
}

/// SPEC 9.4: the caller still gets its answer; the row stays pending.
fn completion_failed(session: &Session, ticket: Ticket, answer: Answer, mut log: Vec<LogLine>, error: ProtocolError) -> Action {
    log.push(session.log_line(&LogEvent::CompletionFailed { ticket, error }));
    respond(answer, log, Outcome::CompletionFailed)
}

/// The end of a handler without a stored response: its release (or not)
/// logged; a raised handler's failure propagates, the others send the
/// handler's response.
fn abandoned(session: &Session, ticket: Ticket, reason: AbandonReason, detail: String, released: bool, attempted: bool) -> Action {
    let outcome = match (released, attempted) {
        (true, _) => Outcome::Released,
        (false, true) => Outcome::FencedOut,
        (false, false) => Outcome::Abandoned,
    };
    let log = vec![session.log_line(&LogEvent::Abandoned { ticket, reason, released, attempted, detail })];
    ended(session, reason, log, outcome)
}

/// A release batch that ran: how the exchange ends.
fn released_ending(session: &Session, ticket: Ticket, ending: Ending, released: bool) -> Action {
    match ending {
        Ending::Abandoned { reason, detail } => abandoned(session, ticket, reason, detail, released, true),
        Ending::ServerError if released => respond(Answer::Handler, vec![], Outcome::Released),
        // SPEC 6.2: a fenced-out owner is logged at error level, as the non-transactional 5xx release is.
        Ending::ServerError => respond(Answer::Handler, vec![crate::log::fenced_out_server_error_rolled_back(&ticket)], Outcome::FencedOut),
        Ending::RolledBack(why) => {
            let log = vec![session.log_line(&LogEvent::RolledBack { ticket, why, released })];
            respond(Answer::Core(responses::rolled_back(session.config(), released)), log, Outcome::RolledBack)
        }
        Ending::NotBegun(error) => not_begun(session, ticket, error, released, vec![]),
    }
}

/// A transactional handler that never ran: the ledger's answer, as for a
/// failed decision.
fn not_begun(session: &Session, ticket: Ticket, error: ProtocolError, released: bool, more: Vec<LogLine>) -> Action {
    let outcome = match &error {
        ProtocolError::Ledger(LedgerError::Busy) => Outcome::LedgerBusy,
        _ => Outcome::LedgerFailed,
    };
    let response = session.error_response(&error);
    let mut log = vec![session.log_line(&LogEvent::NotBegun { ticket, error, released })];
    log.extend(more);
    respond(Answer::Core(response), log, outcome)
}

/// The release batch failed (or answered with the wrong shape) after the
/// handler: as for a completion, the row stays pending until the TTL
/// (`completion-failed`, as a failed release of a 5xx is).
fn release_failed(session: &Session, ticket: Ticket, ending: Ending, error: ProtocolError) -> Action {
    let failed = session.log_line(&LogEvent::ReleaseFailed { ticket: ticket.clone(), error });
    match ending {
        Ending::Abandoned { reason, .. } => ended(session, reason, vec![failed], Outcome::CompletionFailed),
        Ending::ServerError => respond(Answer::Handler, vec![failed], Outcome::CompletionFailed),
        Ending::RolledBack(why) => {
            let log = vec![session.log_line(&LogEvent::RolledBack { ticket, why, released: false }), failed];
            respond(Answer::Core(responses::rolled_back(session.config(), false)), log, Outcome::RolledBack)
        }
        Ending::NotBegun(why) => not_begun(session, ticket, why, false, vec![failed]),
    }
}

/// A fenced-out transactional owner's answer: the current owner's stored
/// answer, a 409, or the failure to look it up; its writes were rolled back.
fn fenced_answer(session: &Session, ticket: &Ticket, decided: Result<Decision, ProtocolError>) -> Action {
    let mut log = vec![crate::log::fenced_out_rolled_back(ticket)];
    let send = match decided {
        Ok(Decision::Replay(response)) => response,
        Ok(Decision::Reject(rejection)) => rejection.response,
        Ok(other) => return internal_error(session, format!("a lookup alone decided {other:?}")),
        Err(error) => {
            let event = LogEvent::DecisionFailed { principal: ticket.principal.clone(), key: ticket.key.clone(), error: error.clone() };
            log.push(session.log_line(&event));
            session.error_response(&error)
        }
    };
    respond(Answer::Core(send), log, Outcome::FencedOut)
}

fn ended(session: &Session, reason: AbandonReason, log: Vec<LogLine>, outcome: Outcome) -> Action {
    match reason {
        AbandonReason::Raised => {
            Action::Propagate(Failure { log, outcome, response: responses::handler_failed(session.config().profile) })
        }
        AbandonReason::NothingChanged | AbandonReason::Declined => respond(Answer::Handler, log, outcome),
    }
}

impl Session {
    /// The reply for a request whose exchange cannot continue because the
    /// component itself failed (a trap): a 500, logged. Hosts ask for it
    /// before they need it (the failed component cannot be asked then).
    pub fn fault(&self) -> Reply {
        let what = "the idempotency component failed (it trapped) while handling this request; the request's outcome is unknown, and a fresh instance serves the next one";
        let log = vec![self.log_line(&LogEvent::InternalError(what.into()))];
        Reply { send: Answer::Core(responses::internal_error(self.config().profile)), close: false, log, sweep: false, outcome: Outcome::InternalError }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, OnServerError, Profile};
    use crate::types::{Header, LeaseState, LogLevel, ResponseBody, Value};
    use crate::Query;
    use alloc::string::ToString;

    const NOW: i64 = 1_767_225_600_000;

    fn session(config: Config) -> Session {
        Session::open(config).expect("valid config")
    }

    fn head(method: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: method.into(),
            path_and_query: "/orders".into(),
            headers: headers.iter().map(|(n, v)| Header::new(*n, *v)).collect(),
        }
    }

    fn keyed() -> RequestHead {
        head("POST", &[("Idempotency-Key", "k-1"), ("Content-Type", "application/json")])
    }

    #[test]
    fn the_policy_names_each_request_header_admission_and_the_fingerprint_read_once() {
        let names = |config: Config| session(config).policy().request_headers.clone();
        assert_eq!(names(Config::default()), ["idempotency-key", "content-length", "content-type", "x-api-version"]);
        let config = Config { fingerprint_headers: vec!["Content-Type".into(), "content-type".into(), "IDEMPOTENCY-KEY".into(), "X-Tenant".into()], ..Config::default() };
        assert_eq!(names(config), ["idempotency-key", "content-length", "content-type", "x-tenant"]);
    }

    #[test]
    fn the_policy_names_each_response_header_the_completion_reads_once() {
        let names = |config: Config| session(config).policy().response_headers.clone();
        assert_eq!(names(Config::default()), ["content-type", "location"]);
        let config = Config { replay_headers: vec!["Content-Type".into(), "content-type".into(), "X-Order-Id".into()], ..Config::default() };
        assert_eq!(names(config), ["content-type", "x-order-id"]);
        assert!(names(Config { replay_headers: Vec::new(), ..Config::default() }).is_empty());
    }

    fn started(s: &Session, head: &RequestHead) -> (ReadBody, Exchange) {
        match s.start(head, Some("acct"), false) {
            (Action::ReadBody(read), Some(exchange)) => (read, exchange),
            other => panic!("expected read-body, got {other:?}"),
        }
    }

    fn batch(action: Action) -> Vec<Statement> {
        match action {
            Action::RunBatch(statements) => statements,
            other => panic!("expected run-batch, got {other:?}"),
        }
    }

    fn reply(action: Action) -> Reply {
        match action {
            Action::Respond(reply) => reply,
            other => panic!("expected respond, got {other:?}"),
        }
    }

    /// The decision batch's results when the claim won generation 1, or the
    /// takeover a later one: the lookup reads the row this request owns.
    fn claimed(decision: &[Statement], generation: i64) -> Vec<StatementResult> {
        let won = StatementResult { rows: vec![], changes: 1 };
        let lost = StatementResult::default();
        let row = vec![
            decision[0].params[2].clone(),
            Value::Text("pending".into()),
            Value::Integer(generation),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Integer(NOW),
            Value::Integer(NOW),
        ];
        let lookup = StatementResult { rows: vec![row], changes: 0 };
        if generation == 1 { vec![won, lost, lookup] } else { vec![lost, won, lookup] }
    }

    fn lookup_rows(fingerprint: &str, status: &str, updated_at: i64) -> Vec<StatementResult> {
        lookup(fingerprint, status, updated_at)
    }

    fn lookup(fingerprint: &str, status: &str, updated_at: i64) -> Vec<StatementResult> {
        let row = vec![
            Value::Text(fingerprint.into()),
            Value::Text(status.into()),
            Value::Integer(1),
            if status == "completed" { Value::Integer(201) } else { Value::Null },
            if status == "completed" { Value::Text("{\"id\":1}".into()) } else { Value::Null },
            if status == "completed" { Value::Text("{\"content-type\":\"application/json\"}".into()) } else { Value::Null },
            Value::Integer(updated_at),
            Value::Integer(NOW - 5_000),
        ];
        vec![StatementResult::default(), StatementResult::default(), StatementResult { rows: vec![row], changes: 0 }]
    }

    fn answered(status: u16, body: &str) -> Event {
        Event::HandlerDone(HandlerResult::Answered(MutationResponse {
            status,
            headers: vec![Header::new("Content-Type", "application/json"), Header::new("X-Frame-Options", "DENY")],
            body: ResponseBody::Text(body.into()),
        }))
    }

    fn stored() -> Event {
        Event::BatchDone(vec![StatementResult { rows: vec![], changes: 1 }])
    }

    #[test]
    fn a_fresh_request_claims_runs_once_and_sends_the_handlers_own_response() {
        let s = session(Config::default());
        let (read, mut x) = started(&s, &keyed());
        assert_eq!(read.cap, 1024 * 1024);
        let decision = batch(x.step(&s, NOW, Event::Body(b"{}".to_vec())));
        assert_eq!(decision.iter().map(|st| st.query).collect::<Vec<_>>(), [Query::Claim, Query::Takeover, Query::Lookup]);
        assert_eq!(decision[0].params[2], Value::Text(digest(&read.prefix, b"{}")));
        let ticket = match x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1))) {
            Action::RunHandler(run) => {
                assert_eq!((run.renew_every_ms, run.transaction), (Some(10_000), false), "renew every third of the TTL");
                run.ticket
            }
            other => panic!("{other:?}"),
        };
        assert_eq!((ticket.key.as_str(), ticket.generation), ("k-1", 1));
        let completion = batch(x.step(&s, NOW + 5, answered(201, "{\"id\":1}")));
        assert_eq!(completion[0].query, Query::Complete);
        // Only the allowlist is stored; the caller gets every header the application set.
        assert_eq!(completion[0].params[2], Value::Text("{\"content-type\":\"application/json\"}".into()));
        let done = reply(x.step(&s, NOW + 6, stored()));
        assert_eq!((done.send, done.outcome, done.close, done.log.len()), (Answer::Handler, Outcome::Executed, false, 0));
        // Nothing more: an event after the final action is a host bug.
        assert_eq!(reply(x.step(&s, NOW, Event::Slept)).outcome, Outcome::InternalError);
    }

    #[test]
    fn a_duplicate_waits_then_replays_and_says_it_waited() {
        let s = session(Config { wait_ms: 1_000, ..Config::default() });
        let (read, mut x) = started(&s, &keyed());
        let fp = digest(&read.prefix, b"");
        batch(x.step(&s, NOW, Event::BodyHashed(fp.clone())));
        assert_eq!(x.step(&s, NOW, Event::BatchDone(lookup(&fp, "pending", NOW - 10))), Action::Sleep(10));
        let again = batch(x.step(&s, NOW + 10, Event::Slept));
        assert_eq!(again[0].params[3], Value::Integer(NOW + 10), "the decision is planned at the time it wakes");
        let done = reply(x.step(&s, NOW + 10, Event::BatchDone(lookup(&fp, "completed", NOW + 5))));
        assert_eq!(done.outcome, Outcome::ReplayedAfterWait);
        match done.send {
            Answer::Core(r) => assert_eq!((r.status, r.body.as_deref()), (201, Some("{\"id\":1}"))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_in_progress_409_suggests_a_short_retry_by_default() {
        let s = session(Config::default());
        let (read, mut x) = started(&s, &keyed());
        let fp = digest(&read.prefix, b"");
        batch(x.step(&s, NOW, Event::BodyHashed(fp.clone())));
        let done = reply(x.step(&s, NOW, Event::BatchDone(lookup(&fp, "pending", NOW - 10))));
        assert_eq!(done.outcome, Outcome::InProgress);
        match done.send {
            Answer::Core(r) => {
                assert_eq!(r.status, 409);
                assert!(r.headers.contains(&Header::new("retry-after", "1")), "{:?}", r.headers);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn body_problems_are_the_cores_answers_and_close_the_connection() {
        let s = session(Config { request_body_cap_bytes: 4, ..Config::default() });
        for (event, status, outcome, close) in [
            (Event::BodyTooLarge, 413, Outcome::BodyTooLarge, true),
            (Event::Body(b"12345".to_vec()), 413, Outcome::BodyTooLarge, true),
            (Event::BodyUnreadable(BodyProblem::LengthUnknown), 411, Outcome::LengthRequired, true),
            (Event::BodyUnreadable(BodyProblem::Incomplete), 400, Outcome::BodyIncomplete, true),
            (Event::BodyUnreadable(BodyProblem::Consumed), 500, Outcome::BodyUnavailable, false),
        ] {
            let (_, mut x) = started(&s, &keyed());
            let done = reply(x.step(&s, NOW, event));
            assert_eq!((done.outcome, done.close), (outcome, close));
            match done.send {
                Answer::Core(r) => assert_eq!(r.status, status),
                other => panic!("{other:?}"),
            }
            assert_eq!(done.log.len(), usize::from(outcome == Outcome::BodyUnavailable));
        }
        // A declared Content-Length over the cap never reaches read-body.
        let (action, exchange) = s.start(&head("POST", &[("Idempotency-Key", "k"), ("Content-Length", "5")]), Some("acct"), false);
        assert!(exchange.is_none());
        assert_eq!(reply(action).close, true);
    }

    #[test]
    fn a_raised_handler_propagates_and_a_declined_request_releases_its_key() {
        let s = session(Config::default());
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        match x.step(&s, NOW, Event::HandlerDone(HandlerResult::Raised("boom".into()))) {
            Action::Propagate(failure) => {
                assert_eq!(failure.outcome, Outcome::Abandoned);
                assert_eq!(failure.response.status, 500);
                assert!(failure.log[0].message.contains("boom"), "{:?}", failure.log);
            }
            other => panic!("{other:?}"),
        }
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        let release = batch(x.step(&s, NOW, Event::HandlerDone(HandlerResult::Declined)));
        assert_eq!(release[0].query, Query::Release);
        let done = reply(x.step(&s, NOW, Event::BatchDone(vec![StatementResult { rows: vec![], changes: 1 }])));
        assert_eq!((done.send, done.outcome), (Answer::Handler, Outcome::Released));
    }

    #[test]
    fn a_release_that_fails_after_the_handler_is_a_completion_failure() {
        let s = session(Config::default());
        for (result, feed) in [
            (HandlerResult::Declined, Event::BatchFailed(BatchError::PoolExhausted("pool".into()))),
            (HandlerResult::NothingChanged, Event::BatchDone(vec![])),
        ] {
            let (read, mut x) = started(&s, &keyed());
            let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
            x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
            batch(x.step(&s, NOW, Event::HandlerDone(result)));
            let done = reply(x.step(&s, NOW, feed));
            assert_eq!((done.send, done.outcome), (Answer::Handler, Outcome::CompletionFailed));
            assert!(done.log[0].message.contains("release failed"), "{:?}", done.log);
        }
        let s = session(Config { on_server_error: OnServerError::Release, ..Config::default() });
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        batch(x.step(&s, NOW, Event::HandlerDone(HandlerResult::Raised("boom".into()))));
        match x.step(&s, NOW, Event::BatchFailed(BatchError::Unreachable("down".into()))) {
            Action::Propagate(failure) => assert_eq!(failure.outcome, Outcome::CompletionFailed),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unstorable_response_is_a_500_that_names_the_cap_under_recipe() {
        let s = session(Config { body_cap_bytes: 4, ..Config::default() });
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        let completion = batch(x.step(&s, NOW, answered(201, "0123456789")));
        assert_eq!(completion[0].params[0], Value::Integer(500));
        let done = reply(x.step(&s, NOW, stored()));
        match &done.send {
            Answer::Core(r) => {
                assert_eq!(r.status, 500);
                let body = r.body.as_deref().unwrap_or_default();
                assert!(body.contains("executed") && body.contains("10 bytes") && body.contains("4 bytes"), "{body}");
                assert_eq!(completion[0].params[1], Value::Text(body.to_string()), "replays get the same 500");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(done.log.len(), 1);
        // ietf: the caller gets the handler's response; the row keeps no body.
        let s = session(Config { body_cap_bytes: 4, ..Config::for_profile(Profile::Ietf) });
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        let completion = batch(x.step(&s, NOW, answered(201, "0123456789")));
        assert_eq!((&completion[0].params[0], &completion[0].params[1]), (&Value::Integer(201), &Value::Null));
        assert_eq!(reply(x.step(&s, NOW, stored())).send, Answer::Handler);
    }

    #[test]
    fn failures_of_the_ledger_are_answered_and_logged_by_the_core() {
        let s = session(Config { on_server_error: OnServerError::Store, ..Config::default() });
        let (read, mut x) = started(&s, &keyed());
        batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        let done = reply(x.step(&s, NOW, Event::BatchFailed(BatchError::database("SQLITE_BUSY", "database is locked"))));
        assert_eq!((done.outcome, done.log.len()), (Outcome::LedgerBusy, 1));
        // After the handler ran, a failed completion still sends the handler's response.
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 2)));
        batch(x.step(&s, NOW, answered(201, "{}")));
        let done = reply(x.step(&s, NOW, Event::BatchFailed(BatchError::OutcomeUnknown("reset".into()))));
        assert_eq!((done.send, done.outcome, done.sweep), (Answer::Handler, Outcome::CompletionFailed, false));
        // A fenced-out completion (0 rows) is logged at error level.
        let (read, mut x) = started(&s, &keyed());
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        batch(x.step(&s, NOW, answered(201, "{}")));
        let done = reply(x.step(&s, NOW, Event::BatchDone(vec![StatementResult::default()])));
        assert_eq!(done.outcome, Outcome::FencedOut);
        assert!(done.log.iter().any(|l| l.message.contains("fenced out")));
    }

    /// A transactional exchange up to its completion inside the handler's transaction.
    fn transactional(s: &Session) -> (Exchange, Vec<Statement>) {
        let (read, mut x) = match s.start(&keyed(), Some("acct"), true) {
            (Action::ReadBody(read), Some(x)) => (read, x),
            other => panic!("{other:?}"),
        };
        let decision = batch(x.step(s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        match x.step(s, NOW, Event::BatchDone(claimed(&decision, 1))) {
            Action::RunHandler(run) => assert!(run.transaction),
            other => panic!("{other:?}"),
        }
        match x.step(s, NOW + 5, answered(201, "{\"id\":1}")) {
            Action::CompleteInTransaction(statements) => (x, statements),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_transactional_completion_commits_with_the_handlers_writes() {
        let s = session(Config::default());
        let (mut x, statements) = transactional(&s);
        assert_eq!(statements.iter().map(|st| st.query).collect::<Vec<_>>(), [Query::Complete, Query::Fence]);
        let results = vec![StatementResult { rows: vec![], changes: 1 }, StatementResult::default()];
        assert_eq!(x.step(&s, NOW + 6, Event::BatchDone(results)), Action::Commit);
        let done = reply(x.step(&s, NOW + 7, Event::Committed));
        assert_eq!((done.send, done.outcome), (Answer::Handler, Outcome::Executed));
    }

    #[test]
    fn a_fenced_transactional_owner_rolls_back_and_answers_with_the_new_owners_answer() {
        let s = session(Config::default());
        let (mut x, _) = transactional(&s);
        let fence = BatchError::database("1299", "NOT NULL constraint failed: idempotency_keys.status");
        assert_eq!(x.step(&s, NOW + 6, Event::BatchFailed(fence)), Action::Rollback);
        let lookup = batch(x.step(&s, NOW + 6, Event::RolledBack));
        assert_eq!(lookup.iter().map(|st| st.query).collect::<Vec<_>>(), [Query::Lookup]);
        let fp = match &lookup[0].params[..] {
            [Value::Text(_), Value::Text(_)] => digest(&s.fingerprint_prefix(&keyed()), b""),
            other => panic!("{other:?}"),
        };
        let mut completed = lookup_rows(&fp, "completed", NOW);
        let done = reply(x.step(&s, NOW + 7, Event::BatchDone(vec![completed.remove(2)])));
        assert_eq!(done.outcome, Outcome::FencedOut);
        match done.send {
            Answer::Core(r) => assert_eq!((r.status, r.body.as_deref()), (201, Some("{\"id\":1}")), "the new owner's stored answer"),
            other => panic!("{other:?}"),
        }
        assert!(done.log[0].message.contains("rolled back"), "{:?}", done.log);
    }

    #[test]
    fn a_transaction_that_cannot_begin_releases_the_key_and_answers_as_the_ledger_failed() {
        let s = session(Config::default());
        let running = |s: &Session| {
            let (read, mut x) = match s.start(&keyed(), Some("acct"), true) {
                (Action::ReadBody(read), Some(x)) => (read, x),
                other => panic!("{other:?}"),
            };
            let decision = batch(x.step(s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
            assert!(matches!(x.step(s, NOW, Event::BatchDone(claimed(&decision, 1))), Action::RunHandler(_)));
            x
        };
        // Busy: the release, then the busy 503; the handler never ran.
        let mut x = running(&s);
        let release = batch(x.step(&s, NOW, Event::BatchFailed(BatchError::PoolExhausted("pool".into()))));
        assert_eq!(release.iter().map(|st| st.query).collect::<Vec<_>>(), [Query::Release]);
        let done = reply(x.step(&s, NOW, Event::BatchDone(vec![StatementResult { rows: vec![], changes: 1 }])));
        assert_eq!(done.outcome, Outcome::LedgerBusy);
        assert!(matches!(&done.send, Answer::Core(r) if r.status == 503), "{:?}", done.send);
        assert!(done.log[0].message.contains("could not begin") && done.log[0].message.contains("was released"), "{:?}", done.log);
        // A BEGIN whose connection broke opened nothing: the 500 that says nothing ran, not "outcome unknown".
        let mut x = running(&s);
        batch(x.step(&s, NOW, Event::BatchFailed(BatchError::OutcomeUnknown("reset".into()))));
        let done = reply(x.step(&s, NOW, Event::BatchFailed(BatchError::Unreachable("down".into()))));
        assert_eq!(done.outcome, Outcome::LedgerFailed);
        assert!(matches!(&done.send, Answer::Core(r) if r.status == 500 && r.body.as_deref().is_some_and(|b| b.contains("not executed"))));
        assert_eq!(done.log.len(), 2, "the line for the transaction and the one for the failed release: {:?}", done.log);
        assert!(done.log[0].message.contains(&alloc::format!("a retry after {} ms", s.config().pending_ttl_ms)), "{:?}", done.log);
        // Not transactional: no transaction to begin, so a batch-failed while the handler runs is a host bug.
        let (read, mut x) = match s.start(&keyed(), Some("acct"), false) {
            (Action::ReadBody(read), Some(x)) => (read, x),
            other => panic!("{other:?}"),
        };
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        assert_eq!(reply(x.step(&s, NOW, Event::BatchFailed(BatchError::PoolExhausted("pool".into())))).outcome, Outcome::InternalError);
    }

    #[test]
    fn a_transaction_that_fails_is_rolled_back_and_its_key_released() {
        let s = session(Config::default());
        // A write failed (here the completion, busy): rollback, release, a 503 saying nothing changed.
        let (mut x, _) = transactional(&s);
        assert_eq!(x.step(&s, NOW, Event::BatchFailed(BatchError::database("SQLITE_BUSY", "database is locked"))), Action::Rollback);
        assert_eq!(batch(x.step(&s, NOW, Event::RolledBack))[0].query, Query::Release);
        let done = reply(x.step(&s, NOW, Event::BatchDone(vec![StatementResult { rows: vec![], changes: 1 }])));
        assert_eq!(done.outcome, Outcome::RolledBack);
        match &done.send {
            Answer::Core(r) => assert_eq!((r.status, r.headers.last()), (503, Some(&Header::new("retry-after", "1")))),
            other => panic!("{other:?}"),
        }
        // The completion's batch broke with an unknown outcome (on D1 that batch is the
        // commit): rollback, then the 503 saying the outcome is unknown, never "nothing changed".
        let (mut x, _) = transactional(&s);
        assert_eq!(x.step(&s, NOW, Event::BatchFailed(BatchError::OutcomeUnknown("reset".into()))), Action::Rollback);
        let done = reply(x.step(&s, NOW, Event::RolledBack));
        assert_eq!(done.outcome, Outcome::CompletionFailed);
        assert!(matches!(&done.send, Answer::Core(r) if r.status == 503 && r.body.as_deref().is_some_and(|b| b.contains("commit_outcome_unknown"))));
        assert!(done.log[0].message.contains("commit outcome unknown"), "{:?}", done.log);
        // The commit broke with an unknown outcome: the caller is told so (no release: it may have committed).
        let (mut x, _) = transactional(&s);
        let results = vec![StatementResult { rows: vec![], changes: 1 }, StatementResult::default()];
        assert_eq!(x.step(&s, NOW, Event::BatchDone(results.clone())), Action::Commit);
        let done = reply(x.step(&s, NOW, Event::CommitFailed(BatchError::OutcomeUnknown("reset".into()))));
        assert_eq!(done.outcome, Outcome::CompletionFailed);
        assert!(matches!(&done.send, Answer::Core(r) if r.status == 503 && r.body.as_deref().is_some_and(|b| b.contains("commit_outcome_unknown"))));
        // A commit the database refused committed nothing: rollback (SQLite keeps the
        // transaction open after a failed COMMIT), release, then the 503.
        let (mut x, _) = transactional(&s);
        x.step(&s, NOW, Event::BatchDone(results));
        assert_eq!(x.step(&s, NOW, Event::CommitFailed(BatchError::database("SQLITE_BUSY", "locked"))), Action::Rollback);
        assert_eq!(batch(x.step(&s, NOW, Event::RolledBack))[0].query, Query::Release);
        assert_eq!(reply(x.step(&s, NOW, Event::BatchDone(vec![StatementResult { rows: vec![], changes: 1 }]))).outcome, Outcome::RolledBack);
        // A transactional handler that raised: its writes rolled back, the key released, the failure propagates.
        let s = session(Config::default());
        let (read, mut x) = match s.start(&keyed(), Some("acct"), true) {
            (Action::ReadBody(read), Some(x)) => (read, x),
            other => panic!("{other:?}"),
        };
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        assert_eq!(x.step(&s, NOW, Event::HandlerDone(HandlerResult::Raised("boom".into()))), Action::Rollback);
        assert_eq!(batch(x.step(&s, NOW, Event::RolledBack))[0].query, Query::Release);
        match x.step(&s, NOW, Event::BatchDone(vec![StatementResult { rows: vec![], changes: 1 }])) {
            Action::Propagate(failure) => assert_eq!(failure.outcome, Outcome::Released),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_transactional_5xx_released_under_release_is_logged_when_fenced_out() {
        let s = session(Config { on_server_error: OnServerError::Release, ..Config::default() });
        let (read, mut x) = match s.start(&keyed(), Some("acct"), true) {
            (Action::ReadBody(read), Some(x)) => (read, x),
            other => panic!("{other:?}"),
        };
        let decision = batch(x.step(&s, NOW, Event::BodyHashed(digest(&read.prefix, b""))));
        x.step(&s, NOW, Event::BatchDone(claimed(&decision, 1)));
        assert_eq!(x.step(&s, NOW, answered(503, "down")), Action::Rollback);
        assert_eq!(batch(x.step(&s, NOW, Event::RolledBack))[0].query, Query::Release);
        let done = reply(x.step(&s, NOW, Event::BatchDone(vec![StatementResult::default()])));
        assert_eq!((done.send, done.outcome), (Answer::Handler, Outcome::FencedOut));
        assert!(done.log.len() == 1 && done.log[0].level == LogLevel::Error && done.log[0].message.contains("fenced out"), "{:?}", done.log);
    }

    #[test]
    fn a_renewal_keeps_the_lease_and_says_when_it_is_lost() {
        let s = session(Config::default());
        let ticket = Ticket { principal: "acct".into(), key: "k".into(), fingerprint: digest("x", b""), generation: 2, created_at: NOW };
        let renewal = s.plan_renewal(&ticket, NOW + 10_000).expect("valid ticket");
        assert_eq!(renewal[0].query, Query::Renew);
        assert_eq!(renewal[0].params[0], Value::Integer(NOW + 10_000));
        let held = s.renewed(&ticket, Ok(&[StatementResult { rows: vec![], changes: 1 }]));
        assert_eq!((held.state, held.log), (LeaseState::Held, None));
        let lost = s.renewed(&ticket, Ok(&[StatementResult::default()]));
        assert_eq!(lost.state, LeaseState::Lost);
        assert!(lost.log.is_some_and(|l| l.level == LogLevel::Error && l.message.contains("lease lost")));
        let unknown = s.renewed(&ticket, Err(&BatchError::Unreachable("down".into())));
        assert_eq!(unknown.state, LeaseState::Unknown);
        assert_eq!(Config { lease_renewal: false, ..Config::default() }.renew_every_ms(), None);
    }

    #[test]
    fn the_fence_is_recognised_in_both_dialects_and_nothing_else_is() {
        let sqlite = session(Config::default());
        assert!(sqlite.is_fence_violation(&BatchError::Database(crate::types::DatabaseError {
            code: None,
            message: "D1_ERROR: NOT NULL constraint failed: idempotency_keys.status: SQLITE_CONSTRAINT".into(),
        })));
        assert!(!sqlite.is_fence_violation(&BatchError::database("1299", "NOT NULL constraint failed: orders.status")));
        let pg = session(Config { dialect: crate::Dialect::Postgres, ..Config::default() });
        let message = "null value in column \"status\" of relation \"idempotency_keys\" violates not-null constraint";
        assert!(pg.is_fence_violation(&BatchError::database("23502", message)));
        // A server whose lc_messages is German (Debian's initdb takes the system locale).
        let german = "NULL-Wert in Spalte »status« von Relation »idempotency_keys« verletzt Not-Null-Constraint";
        assert!(pg.is_fence_violation(&BatchError::database("23502", german)));
        assert!(!pg.is_fence_violation(&BatchError::database("23502", "null value in column \"sku\" of relation \"orders\" violates not-null constraint")));
        assert!(!pg.is_fence_violation(&BatchError::database("23505", "duplicate key value violates unique constraint")));
    }

    #[test]
    fn set_cookie_is_never_a_replay_header() {
        let config = Config { replay_headers: vec!["content-type".into(), "Set-Cookie".into()], ..Config::default() };
        assert!(matches!(Session::open(config), Err(ProtocolError::InvalidConfig(m)) if m.contains("Set-Cookie")));
    }
}
