//! Lease renewal for the async ledger (docs/SPEC.md 10.1), as the blocking
//! side does it (`transaction.rs`): one task per ledger (and runtime, below)
//! renews the leases of every running handler, so starting and stopping one
//! (every fresh request, renewal on) is a map insert and remove, not a task
//! spawned and aborted (a spawn from outside the runtime, or beside idle
//! workers, wakes another thread; most handlers end long before their first
//! renewal). Each renewal runs as a task of its own, so one waiting for a
//! lock delays no other.
//!
//! Adding a lease never wakes the task: it wakes at least every quarter of
//! the shortest interval, and a lease is due three quarters of an interval
//! after it started (or was last renewed), so each renewal runs between
//! three quarters of an interval and a whole one after the last. With no
//! lease left the task ends; the next lease starts another.
//!
//! A ledger used from several runtimes has one task on each, renewing the
//! leases of the requests that runtime serves, as the task spawned per
//! request did: a lease never waits on a runtime nobody drives (a
//! current-thread runtime between two `block_on` calls).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{wit, BoxFuture, Ticket};

/// Renews one ticket's lease on the ledger's backend (`None`: the component
/// could not be asked; tried again at the next interval).
pub(crate) type AsyncRenewer = Arc<dyn Fn(Ticket) -> BoxFuture<'static, Option<wit::Lease>> + Send + Sync>;

/// The leases of one ledger's running handlers, and the task that renews them.
pub(crate) struct Renewals {
    renewer: AsyncRenewer,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next: u64,
    leases: HashMap<u64, Lease>,
    /// The renewing task on each runtime that has leases.
    tasks: HashMap<Id, JoinHandle<()>>,
}

struct Lease {
    /// The runtime of the request that holds it: its task renews it.
    runtime: Id,
    ticket: Ticket,
    every: Duration,
    due: Instant,
    /// A renewal of it is running.
    in_flight: bool,
    lost: watch::Sender<bool>,
}

/// When a lease renewed (or started) at `now` is next due.
fn due_after(now: Instant, every: Duration) -> Instant {
    now + every - every / 4
}

impl Renewals {
    pub(crate) fn new(renewer: AsyncRenewer) -> Arc<Renewals> {
        Arc::new(Renewals { renewer, state: Mutex::new(State::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts renewing `ticket`'s lease every `every`, from the runtime this
    /// is called on: its id (for [`Renewals::remove`]) and a watch that turns
    /// true when a renewal finds the lease lost.
    pub(crate) fn add(self: &Arc<Self>, ticket: Ticket, every: Duration) -> (u64, watch::Receiver<bool>) {
        let (lost, watch) = watch::channel(false);
        let runtime = Handle::current().id();
        let mut state = self.lock();
        let id = state.next;
        state.next += 1;
        state.leases.insert(id, Lease { runtime, ticket, every, due: due_after(Instant::now(), every), in_flight: false, lost });
        // No task on this runtime, or one that ended with it.
        if state.tasks.get(&runtime).is_none_or(JoinHandle::is_finished) {
            let task = tokio::spawn(self.clone().run(runtime));
            state.tasks.insert(runtime, task);
        }
        (id, watch)
    }

    /// Stops renewing a lease (the handler ended): a renewal of it in
    /// progress still ends, and its result is ignored (SPEC 10.1).
    pub(crate) fn remove(&self, id: u64) {
        self.lock().leases.remove(&id);
    }

    /// Starts the renewals of `runtime`'s leases that are due, then sleeps
    /// until the next one is due, or a quarter interval; ends when that
    /// runtime has no lease left.
    async fn run(self: Arc<Self>, runtime: Id) {
        loop {
            let wait = {
                let mut state = self.lock();
                if !state.leases.values().any(|lease| lease.runtime == runtime) {
                    state.tasks.remove(&runtime);
                    return;
                }
                let now = Instant::now();
                let mut wait = Duration::MAX;
                for (&id, lease) in state.leases.iter_mut().filter(|(_, lease)| lease.runtime == runtime) {
                    wait = wait.min(lease.every / 4);
                    if lease.in_flight {
                        continue;
                    }
                    if lease.due <= now {
                        lease.in_flight = true;
                        let (renewals, ticket) = (self.clone(), lease.ticket.clone());
                        tokio::spawn(async move {
                            let lease = (renewals.renewer)(ticket).await;
                            renewals.renewed(id, lease);
                        });
                    } else {
                        wait = wait.min(lease.due - now);
                    }
                }
                wait
            };
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }

    /// A renewal's result: the next one is due an interval later; a lost
    /// lease is told to the handler and renewed no more.
    fn renewed(&self, id: u64, lease: Option<wit::Lease>) {
        let mut state = self.lock();
        let Some(entry) = state.leases.get_mut(&id) else { return };
        entry.in_flight = false;
        entry.due = due_after(Instant::now(), entry.every);
        if lease.is_some_and(|l| l.state == wit::LeaseState::Lost) {
            let _ = entry.lost.send(true);
            state.leases.remove(&id);
        }
    }

    /// How many leases are being renewed (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().leases.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn ticket(key: &str) -> Ticket {
        Ticket { principal: "p".into(), key: key.into(), fingerprint: "f".into(), generation: 1, created_at: 0 }
    }

    /// A renewer that counts its calls per key and answers `state`.
    fn counting(state: wit::LeaseState) -> (AsyncRenewer, Arc<Mutex<HashMap<String, usize>>>) {
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let seen = counts.clone();
        let renewer: AsyncRenewer = Arc::new(move |ticket: Ticket| {
            *seen.lock().unwrap().entry(ticket.key.clone()).or_insert(0) += 1;
            Box::pin(async move { Some(wit::Lease { state, log: None }) })
        });
        (renewer, counts)
    }

    fn count(counts: &Mutex<HashMap<String, usize>>, key: &str) -> usize {
        counts.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    #[tokio::test(start_paused = true)]
    async fn each_lease_is_renewed_within_its_interval_until_removed() {
        let (renewer, counts) = counting(wit::LeaseState::Held);
        let renewals = Renewals::new(renewer);
        let every = Duration::from_millis(400);
        let (a, _) = renewals.add(ticket("a"), every);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (b, _) = renewals.add(ticket("b"), every);
        // a: due at 300 ms; b: at 450 ms.
        tokio::time::sleep(Duration::from_millis(260)).await;
        assert_eq!((count(&counts, "a"), count(&counts, "b")), (1, 0), "at 410 ms");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!((count(&counts, "a"), count(&counts, "b")), (1, 1), "at 560 ms");
        // Over 4 s, each renewed between every 300 and every 400 ms.
        tokio::time::sleep(Duration::from_millis(4_000)).await;
        for key in ["a", "b"] {
            let n = count(&counts, key);
            assert!((11..=15).contains(&n), "{key}: {n} renewals in 4.56 s");
        }
        renewals.remove(a);
        let before = count(&counts, "a");
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        assert_eq!(count(&counts, "a"), before, "no renewal after the handler ended");
        assert!(count(&counts, "b") > 15, "the other lease is still renewed");
        renewals.remove(b);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(renewals.lock().tasks.is_empty(), "the task ends once no lease is left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_ends_before_its_first_renewal_costs_no_renewal() {
        let (renewer, counts) = counting(wit::LeaseState::Held);
        let renewals = Renewals::new(renewer);
        for i in 0..100 {
            let (id, _) = renewals.add(ticket(&format!("k{i}")), Duration::from_millis(10_000));
            tokio::time::sleep(Duration::from_millis(10)).await;
            renewals.remove(id);
        }
        assert_eq!(renewals.len(), 0);
        tokio::time::sleep(Duration::from_millis(20_000)).await;
        assert!(counts.lock().unwrap().is_empty(), "{counts:?}");
        // A lease added after the task ended is renewed by a new one.
        let (_id, _) = renewals.add(ticket("late"), Duration::from_millis(400));
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(count(&counts, "late"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_is_told_once_and_renewed_no_more() {
        let (renewer, counts) = counting(wit::LeaseState::Lost);
        let renewals = Renewals::new(renewer);
        let (_id, mut lost) = renewals.add(ticket("gone"), Duration::from_millis(400));
        tokio::time::timeout(Duration::from_secs(1), lost.wait_for(|lost| *lost)).await.expect("told").expect("open");
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        assert_eq!(count(&counts, "gone"), 1);
        assert_eq!(renewals.len(), 0);
    }

    /// A lease taken on a runtime nobody drives at the moment (a
    /// current-thread runtime between two `block_on` calls) does not hold up
    /// the leases of requests on another runtime.
    #[test]
    fn each_runtime_renews_the_leases_of_its_own_requests() {
        let (renewer, counts) = counting(wit::LeaseState::Held);
        let renewals = Renewals::new(renewer);
        let idle = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _parked = idle.block_on(async { renewals.add(ticket("parked"), Duration::from_millis(40)) });
        let busy = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let _served = busy.block_on(async { renewals.add(ticket("served"), Duration::from_millis(40)) });
        std::thread::sleep(Duration::from_millis(400));
        assert!(count(&counts, "served") >= 4, "{counts:?}");
        assert_eq!(count(&counts, "parked"), 0, "its runtime was not driven");
        // Driven again, it renews its own.
        idle.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
        assert!(count(&counts, "parked") >= 1, "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_renewal_is_not_started_twice_and_delays_no_other() {
        let started = Arc::new(AtomicUsize::new(0));
        let seen = started.clone();
        let renewer: AsyncRenewer = Arc::new(move |ticket: Ticket| {
            seen.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if ticket.key == "slow" {
                    tokio::time::sleep(Duration::from_millis(5_000)).await;
                }
                Some(wit::Lease { state: wit::LeaseState::Held, log: None })
            })
        });
        let renewals = Renewals::new(renewer);
        renewals.add(ticket("slow"), Duration::from_millis(400));
        renewals.add(ticket("fast"), Duration::from_millis(400));
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        // slow: one renewal, still running; fast: about every 300-400 ms.
        let n = started.load(Ordering::SeqCst);
        assert!((8..=12).contains(&n), "{n} renewals started");
    }
}
