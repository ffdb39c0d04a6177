//! Races and fencing with real threads, each with its own connection to one
//! SQLite file (WAL, busy timeout), through the real component.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use idempotency_ledger::wit::{BatchError, StatementResult};
use idempotency_ledger::{
    Dialect, Handled, LedgerPool, ManualClock, MutationResponse, Outcome, Request, Settings, SqlBackend, SqlStatement,
};
use idempotency_ledger_host_test::{runtime, Opener, TestDb, T0};

/// Opens this thread's ledger and waits at `barrier`, also when opening
/// failed (then it panics after the wait): a thread that died before the
/// barrier would leave the others waiting there forever, hanging the suite
/// instead of failing it.
fn open_at_barrier(opener: &Opener, clock: ManualClock, barrier: &Barrier) -> idempotency_ledger::Ledger {
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| opener.ledger(clock)));
    barrier.wait();
    opened.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The retention `settings` resolve to (the component's default unless set).
fn retention_ms(settings: &Settings) -> u64 {
    runtime().resolve(settings, Dialect::Sqlite).expect("valid settings").retention_ms
}

fn order(key: &str) -> Request {
    Request::new("POST", "/orders")
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(br#"{"sku":"A-1","qty":2}"#.to_vec())
}

#[test]
fn sixteen_threads_same_request_exactly_one_execution() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 4;
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    for round in 0..ROUNDS {
        let key = format!("race-{round}");
        let executions = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (opener, clock, barrier, executions, key) =
                    (db.opener(), clock.clone(), barrier.clone(), executions.clone(), key.clone());
                thread::spawn(move || {
                    let mut ledger = open_at_barrier(&opener, clock, &barrier);
                    ledger
                        .handle("acct-1", &order(&key), |_| {
                            let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
                            // Hold the reservation a while so the others collide with it.
                            thread::sleep(Duration::from_millis(if i % 2 == 0 { 30 } else { 5 }));
                            Ok::<_, String>(
                                MutationResponse::json(201, format!(r#"{{"order":"o_{n}","by":{i}}}"#))
                                    .header("Location", format!("/orders/o_{n}")),
                            )
                        })
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        let results: Vec<Handled> = handles.into_iter().map(|h| h.join().expect("thread").expect("handled")).collect();
        assert_eq!(executions.load(Ordering::SeqCst), 1, "round {round}: exactly one execution");
        let executed: Vec<&Handled> = results.iter().filter(|h| h.outcome == Outcome::Executed).collect();
        assert_eq!(executed.len(), 1, "round {round}: one owner");
        let winner = &executed[0].response;
        let location = winner.header("location").expect("the winner's Location").to_string();
        for h in &results {
            match h.outcome {
                Outcome::Executed => {}
                Outcome::Replayed => {
                    // The winner's status and body, with its replay headers only.
                    assert_eq!((h.response.status, &h.response.body), (winner.status, &winner.body), "replays carry the winner's response");
                    assert_eq!(h.response.headers, vec![("content-type".into(), "application/json".into()), ("location".into(), location.clone())]);
                }
                Outcome::InProgress => {
                    assert_eq!(h.response.status, 409);
                    assert_eq!(h.response.header("retry-after"), Some("1"), "the default in-progress hint");
                }
                other => panic!("round {round}: unexpected outcome {other:?}"),
            }
        }
    }
    let rows = db.rows();
    assert_eq!(rows.len(), ROUNDS);
    assert!(rows.iter().all(|r| r["status"] == "completed" && r["generation"] == 1));
}

#[test]
fn many_keys_in_parallel_each_execute_once() {
    const THREADS: usize = 8;
    const KEYS: usize = 40;
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let executions = Arc::new(Mutex::new(vec![0u32; KEYS]));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (opener, clock, barrier, executions) = (db.opener(), clock.clone(), barrier.clone(), executions.clone());
            thread::spawn(move || {
                let mut ledger = open_at_barrier(&opener, clock, &barrier);
                let mut bodies = Vec::new();
                for k in 0..KEYS {
                    let key = format!("k-{}", (k + t * 5) % KEYS);
                    let index = (k + t * 5) % KEYS;
                    let h = ledger
                        .handle("acct-1", &order(&key), |_| {
                            executions.lock().expect("lock")[index] += 1;
                            Ok::<_, String>(MutationResponse::json(201, format!(r#"{{"key":"{key}"}}"#)))
                        })
                        .expect("handled");
                    if h.outcome != Outcome::InProgress {
                        assert_eq!(h.response.body_text(), Some(format!(r#"{{"key":"{key}"}}"#).as_str()), "no mixed-up answers");
                    }
                    bodies.push(h);
                }
                bodies.len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("thread"), KEYS);
    }
    assert!(executions.lock().expect("lock").iter().all(|&n| n == 1), "every key executed exactly once");
}

#[test]
fn stalled_owner_is_taken_over_and_its_late_completion_is_fenced_out() {
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let (entered_tx, entered_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let owner_a = {
        let (opener, clock) = (db.opener(), clock.clone());
        thread::spawn(move || {
            let mut ledger = opener.ledger(clock);
            ledger.handle("acct-1", &order("slow"), |_| {
                entered_tx.send(()).expect("signal");
                resume_rx.recv().expect("resume"); // the injected stall
                Ok::<_, String>(MutationResponse::json(201, r#"{"order":"from-A"}"#))
            })
        })
    };
    entered_rx.recv().expect("A is inside its mutation");
    let mut ledger_b = db.ledger(&clock);
    let early = ledger_b.handle("acct-1", &order("slow"), |_| Ok::<_, String>(MutationResponse::text(200, "never")));
    assert_eq!(early.expect("handled").outcome, Outcome::InProgress);
    clock.advance(Duration::from_millis(30_001)); // A stalls past the TTL
    let b = ledger_b
        .handle("acct-1", &order("slow"), |_| Ok::<_, String>(MutationResponse::json(201, r#"{"order":"from-B"}"#)))
        .expect("B handled");
    assert_eq!((b.outcome, b.ticket.as_ref().map(|t| t.generation)), (Outcome::TakenOver, Some(2)), "B takes over and completes");
    resume_tx.send(()).expect("resume A");
    let a = owner_a.join().expect("A thread").expect("A handled");
    assert_eq!((a.outcome, a.ticket.as_ref().map(|t| t.generation)), (Outcome::FencedOut, Some(1)), "A's completion is fenced out");
    assert_eq!(a.response.body_text(), Some(r#"{"order":"from-A"}"#), "A's caller still gets A's response");
    let replay = ledger_b
        .handle("acct-1", &order("slow"), |_| Ok::<_, String>(MutationResponse::text(200, "never")))
        .expect("replay");
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(replay.response.body_text(), Some(r#"{"order":"from-B"}"#), "replays serve B's response");
    let rows = db.rows();
    assert_eq!((rows[0]["generation"].as_i64(), rows[0]["status"].as_str()), (Some(2), Some("completed")));
}

#[test]
fn swept_and_reclaimed_row_fences_out_the_original_owner() {
    // An owner that stalls past the retention: its row is swept, a new
    // request claims the key again at generation 1. The old owner's
    // completion must not land on the new row.
    let db = TestDb::new();
    let clock = ManualClock::new(T0);
    let [mut a, mut b] = db.ledgers(&clock);
    let result = a.handle("acct-1", &order("k"), |_| {
        clock.advance(Duration::from_millis(86_400_001));
        assert_eq!(b.sweep().expect("sweep").deleted, 1);
        let newer = b
            .handle("acct-1", &order("k"), |_| Err::<MutationResponse, _>("still running".to_string()))
            .expect_err("B's mutation fails, leaving its fresh claim pending");
        assert_eq!((newer.outcome, newer.ticket.as_ref().map(|t| t.generation)), (Outcome::Abandoned, Some(1)));
        Ok::<_, String>(MutationResponse::json(201, r#"{"order":"from-A"}"#))
    });
    let a = result.expect("A handled");
    assert_eq!(a.outcome, Outcome::FencedOut);
    let rows = db.rows();
    assert_eq!(rows[0]["status"], "pending", "B's reservation is untouched");
    assert_eq!(rows[0]["created_at"].as_i64(), Some(T0 + 86_400_001));
}

#[test]
fn a_pool_shared_by_threads_executes_each_key_once() {
    let db = TestDb::new();
    let pool = db.opener().ledger_pool(ManualClock::new(T0));
    let executions = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (pool, executions, barrier) = (pool.clone(), executions.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for k in 0..10 {
                    let h = pool
                        .with(|ledger| {
                            ledger.handle("acct-1", &order(&format!("pool-{k}")), |_| {
                                executions.fetch_add(1, Ordering::SeqCst);
                                thread::sleep(Duration::from_millis(2));
                                Ok::<_, String>(MutationResponse::json(201, format!(r#"{{"k":{k}}}"#)))
                            })
                        })
                        .expect("a ledger")
                        .expect("handled");
                    assert!(matches!(h.outcome, Outcome::Executed | Outcome::Replayed | Outcome::InProgress), "{:?}", h.outcome);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    assert_eq!(executions.load(Ordering::SeqCst), 10, "ten keys, ten executions");
    assert!(pool.idle() >= 1 && pool.idle() <= 8, "connections are reused, at most one per concurrent caller");
    assert_eq!(pool.sweep().expect("sweep"), 0);
}

/// A real backend whose batches on the sweeper thread wait for `release`.
struct SweepGate {
    inner: Box<dyn SqlBackend>,
    reached: mpsc::Sender<()>,
    release: Arc<(Mutex<bool>, std::sync::Condvar)>,
    swept: Arc<AtomicUsize>,
}

impl SqlBackend for SweepGate {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
        if thread::current().name() != Some("idempotency-sweeper") {
            return self.inner.execute_batch(statements);
        }
        let _ = self.reached.send(());
        let (open, wake) = &*self.release;
        let mut open = open.lock().expect("gate");
        while !*open {
            open = wake.wait(open).expect("gate");
        }
        drop(open);
        let results = self.inner.execute_batch(statements);
        self.swept.fetch_add(1, Ordering::SeqCst);
        results
    }

    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }
}

#[test]
fn closing_a_pool_waits_for_its_background_sweep_and_stops_the_sweeper() {
    let db = TestDb::new();
    let opener = db.opener();
    let (reached, sweep_started) = mpsc::channel();
    let release = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let swept = Arc::new(AtomicUsize::new(0));
    let (gate, done) = (release.clone(), swept.clone());
    let reached = Mutex::new(reached);
    let pool = LedgerPool::with_backends(
        move || {
            Ok(Box::new(SweepGate {
                inner: opener.backend(),
                reached: reached.lock().expect("sender").clone(),
                release: gate.clone(),
                swept: done.clone(),
            }) as Box<dyn SqlBackend>)
        },
        Settings { sweep_every: Some(1), ..Settings::default() },
        ManualClock::new(T0),
    )
    .expect("pool");
    let handled = pool.handle("acct-1", &order("swept"), |_| Ok::<_, String>(MutationResponse::json(201, "{}"))).expect("handled");
    assert!(handled.outcome == Outcome::Executed && handled.sweep_due);
    sweep_started.recv_timeout(Duration::from_secs(30)).expect("a background sweep started");

    let closer = {
        let pool = pool.clone();
        thread::spawn(move || pool.close())
    };
    thread::sleep(Duration::from_millis(300));
    assert!(!closer.is_finished(), "close() returned while the sweep was still running");
    *release.0.lock().expect("gate") = true;
    release.1.notify_all();
    closer.join().expect("close");
    assert!(swept.load(Ordering::SeqCst) >= 1, "the sweep batch finished before close() returned");
    assert_eq!(pool.idle(), 0, "close() drops the idle connections");

    // Closed: requests still run, due sweeps no longer start a sweeper.
    let after = pool.handle("acct-1", &order("after"), |_| Ok::<_, String>(MutationResponse::json(201, "{}"))).expect("handled");
    assert!(after.sweep_due);
    assert!(sweep_started.recv_timeout(Duration::from_millis(300)).is_err(), "no sweep after close()");
}

/// A real backend that records the thread of every batch.
struct ThreadWatch {
    inner: Box<dyn SqlBackend>,
    threads: Arc<Mutex<Vec<thread::ThreadId>>>,
}

impl SqlBackend for ThreadWatch {
    fn execute_batch(&mut self, statements: &[SqlStatement]) -> Result<Vec<StatementResult>, BatchError> {
        self.threads.lock().expect("threads").push(thread::current().id());
        self.inner.execute_batch(statements)
    }

    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }
}

#[test]
fn a_pool_that_sweeps_on_the_caller_sweeps_before_handle_returns() {
    let db = TestDb::new();
    let opener = db.opener();
    let threads = Arc::new(Mutex::new(Vec::new()));
    let clock = ManualClock::new(T0);
    let seen = threads.clone();
    let config = Settings { sweep_every: Some(1), ..Settings::default() };
    let retention = retention_ms(&config);
    let pool = LedgerPool::with_backends(
        move || Ok(Box::new(ThreadWatch { inner: opener.backend(), threads: seen.clone() }) as Box<dyn SqlBackend>),
        config,
        clock.clone(),
    )
    .expect("pool")
    .sweep_on_caller();
    let create = |_: &Request| Ok::<_, String>(MutationResponse::json(201, "{}"));
    assert!(pool.handle("acct-1", &order("old"), create).expect("handled").sweep_due);
    clock.advance(Duration::from_millis(retention + 1));
    assert!(pool.handle("acct-1", &order("new"), create).expect("handled").sweep_due);
    let keys: Vec<String> = db.rows().iter().map(|r| r["key"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(keys, ["new"], "the expired row was swept before handle() returned");
    let here = thread::current().id();
    assert!(threads.lock().expect("threads").iter().all(|t| *t == here), "every batch ran on the calling thread");
}

#[test]
fn an_async_ledger_waits_for_its_background_sweeps_at_shutdown() {
    use idempotency_ledger::{AsyncLedger, AsyncSqlite, Runtime};
    let db = TestDb::sqlite();
    let clock = ManualClock::new(T0);
    let config = Settings { sweep_every: Some(1), ..Settings::default() }; // every execution asks for a sweep
    let retention = retention_ms(&config);
    // One thread: the spawned sweep runs only when this task yields.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let ledger = AsyncLedger::new(Runtime::shared().expect("runtime"), AsyncSqlite::open(&db.path).expect("sqlite"), config, clock.clone())
            .await
            .expect("ledger");
        ledger.sweeps_done().await; // none spawned: resolves at once
        // The row to expire, written by a blocking ledger (which never sweeps by itself).
        let mut writer = db.opener().ledger(clock.clone());
        writer.handle("acct-1", &order("old"), |_| Ok::<_, String>(MutationResponse::json(201, "{}"))).expect("handled");
        clock.advance(Duration::from_millis(retention + 1));
        let create = |_: &Request| async { Ok::<_, String>(MutationResponse::json(201, "{}")) };
        assert!(ledger.handle("acct-1", &order("new"), create).await.expect("handled").sweep_due);
        ledger.clone().sweeps_done().await; // a clone waits for the same sweeps
        let keys: Vec<String> = db.rows().iter().map(|r| r["key"].as_str().unwrap_or_default().to_string()).collect();
        assert_eq!(keys, ["new"], "the expired row was swept before sweeps_done() resolved");
    });
}
