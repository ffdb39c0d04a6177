"""Failover under load: the primary goes away, a streaming replica is
promoted, and the endpoint the servers connect to is switched to it (the way
a managed database's endpoint behaves).

Topology, per scenario and from scratch: a throwaway primary
(scripts/postgres.sh start, its own port), a streaming replica of it
(scripts/pg-replica.sh start: pg_basebackup, synchronous replication on or
off), a switchable TCP proxy (proxy.py) in front of the primary, and one
example server whose DATABASE_URL names the proxy.

- kill: under load, `pg_ctl stop -m immediate` on the primary (its
  connections die with it), an outage (failure detection), `pg_ctl promote`
  on the replica, the proxy switched to it. Checked: while the primary is
  gone every answer is a documented 5xx and nothing executes (the server's
  count does not move: no claim can commit); after the switch the server
  answers 201 again by itself (no restart) and no 5xx after a grace; after
  the TTL every key sent is retried: an acknowledged key (a 201 answered at
  any time) must replay its answer; with synchronous replication a fresh
  execution of an acknowledged key is a violation (0 re-executions); with
  asynchronous replication they are counted (the window). In the
  exactly-once mode (orders in the ledger's database, committed with the
  completion) the new primary's `orders` table is counted per key: 0
  duplicates and 0 acknowledged orders missing either way.
- readonly: a switchover where the old primary stays up, read-only
  (`default_transaction_read_only = on` and a reload: its sessions keep their
  connections, writes fail with SQLSTATE 25006), the replica is promoted and
  the proxy switched for new connections only: the servers' pooled
  connections still point at the read-only server. Checked: the server drops
  them and reconnects (no 5xx after a grace), and nothing executes while no
  server accepts writes.
- multihost: no proxy; DATABASE_URL names both servers
  (`host1:port1,host2:port2`, `target_session_attrs=read-write`): the
  primary killed, the replica promoted; the driver's next connection must
  find the writable one.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pgcontrol
from answers import Answer, documented_5xx, payload, post_order
from ledgers import PgLedger
from orders import OrdersMode, check_orders
from proxy import Proxy
from report import Report
from servers import ROOT, Host, Server

DATABASE = "failover"
TRANSACTIONAL = OrdersMode(True)


@dataclass
class Pair:
    """A throwaway primary and its streaming replica."""

    primary_port: int
    replica_port: int
    sync: bool
    log: list[str] = field(default_factory=list)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMPOTENCY_PG_")}
        env.update(PG_PORT=str(self.primary_port), PG_PRIMARY_PORT=str(self.primary_port), REPLICA_PORT=str(self.replica_port),
                   SYNC="on" if self.sync else "off")
        return env

    def _script(self, *argv: str) -> str:
        r = subprocess.run([str(ROOT / "scripts" / argv[0]), *argv[1:]], env=self._env(), capture_output=True, text=True, timeout=180)
        self.log.append(f"{' '.join(argv)}: {r.returncode} {r.stderr.strip()[-300:]}")
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r.stdout.strip()

    @property
    def primary_dir(self) -> Path:
        return Path(f"/tmp/idempotency-ledger-pg-{self.primary_port}")

    def url(self, port: int, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/{database}"

    def start(self) -> None:
        self._script("postgres.sh", "start")
        self._script("pg-replica.sh", "start")

    def kill_primary(self) -> None:
        """`pg_ctl stop -m immediate`: the server and its connections end
        without a checkpoint (what WAL the replica has not received is lost)."""
        bindir = pgcontrol.bindir()
        assert bindir is not None
        argv = [str(bindir / "pg_ctl"), "-D", str(self.primary_dir / "data"), "-m", "immediate", "-w", "stop"]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        self.log.append(f"pg_ctl stop -m immediate: {r.returncode}")
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed: {r.stdout}{r.stderr}")

    def promote(self) -> None:
        self._script("pg-replica.sh", "promote")

    def stop(self) -> None:
        for script in ("pg-replica.sh", "postgres.sh"):
            try:
                self._script(script, "stop")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.log.append(str(e))


@dataclass
class Sent:
    key: str
    body: bytes
    answer: Optional[Answer]
    failure: Optional[str]
    sent: float
    received: float


class Load:
    """`clients` threads posting fresh keys (each key once) until stopped."""

    def __init__(self, port: int, clients: int, tag: str) -> None:
        self.port = port
        self.tag = tag
        self.history: list[Sent] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, i: int) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            key = f"{self.tag}-{i}-{n}-{random.getrandbits(32):08x}"
            body = payload(self.tag, ref=key)
            sent = time.time()
            try:
                a: Optional[Answer] = post_order(self.port, key, body, timeout=30)
                failure = None
            except OSError as e:
                a, failure = None, f"{type(e).__name__}: {e}"
            with self.lock:
                self.history.append(Sent(key, body, a, failure, sent, time.time()))
            if a is not None and a.status >= 500:
                time.sleep(0.02)  # a client backs off a little on a 5xx

    def stop(self) -> list[Sent]:
        self.stopping.set()
        for t in self.threads:
            t.join(60)
        with self.lock:
            return list(self.history)


def _documented(a: Answer, transactional: bool) -> bool:
    """answers.documented_5xx, and in the transactional mode the 500
    `idempotency_handler_failed` of docs/SPEC.md's error table: the handler's
    transaction could not begin (the database was gone), so the handler never
    ran and the core released the key (bindings/rust/src/nonblocking.rs
    answers a failed `begin` as a handler failure)."""
    if documented_5xx(a, transactional=transactional):
        return True
    return transactional and (a.status, a.error) == (500, "idempotency_handler_failed")


def _fresh(a: Optional[Answer]) -> bool:
    return a is not None and a.status == 201 and not a.replayed


def _count(server: Server) -> Optional[int]:
    try:
        return server.count(timeout=10)
    except (OSError, RuntimeError, ValueError):
        return None


def scenario(host: Host, kind: str, sync: bool, orders: bool, report: Report, *, ports: tuple[int, int], ttl_ms: int, clients: int,
             warm_s: float, outage_s: float, after_s: float, grace_s: float, logs: Path) -> dict[str, Any]:
    """One failover (kind: kill, readonly, multihost) of one host; see the module's doc."""
    name = f"{host.name} {kind} sync={'on' if sync else 'off'}{' exactly-once' if orders else ''}"
    pair = Pair(ports[0], ports[1], sync)
    figures: dict[str, Any] = {"kind": kind, "sync": sync, "exactly_once": orders}
    proxy: Optional[Proxy] = None
    server: Optional[Server] = None
    try:
        pair.start()
        pgcontrol.create_database(pair.url(pair.primary_port), DATABASE)
        if kind == "multihost":
            url = (f"postgresql://postgres@127.0.0.1:{pair.primary_port},127.0.0.1:{pair.replica_port}/{DATABASE}"
                   "?target_session_attrs=read-write&connect_timeout=5")
        else:
            proxy = Proxy(pair.primary_port)
            url = pair.url(proxy.port, DATABASE)
        env = {"IDEMPOTENCY_REPLAY_HEADER": "Idempotency-Replayed", "IDEMPOTENCY_PENDING_TTL_MS": str(ttl_ms)}
        if orders:
            env.update(TRANSACTIONAL.env())
        server = Server(host, url, env, logs).start()
        load = Load(server.port, clients, f"fo{random.getrandbits(16):04x}")
        time.sleep(warm_s)

        # The fault.
        t_fault = time.time()
        if kind == "readonly":
            with pgcontrol.connect(pair.url(pair.primary_port)) as c:
                c.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                c.execute("SELECT pg_reload_conf()")
        else:
            pair.kill_primary()
        t_down = time.time()
        time.sleep(min(0.3, outage_s / 2))
        count_down = _count(server)
        time.sleep(max(outage_s - 0.3, 0.0))
        count_before_switch = _count(server)
        t_promote = time.time()
        pair.promote()
        if proxy is not None:
            # kill: the old server is gone (its connections too); readonly:
            # the pooled connections stay on the read-only server.
            proxy.switch(pair.replica_port, cut=kind == "kill")
            t_switch = time.time()
        else:
            # multihost: the URL already names the replica; it takes writes
            # from some moment while `pg_ctl promote` runs.
            t_switch = t_promote
        time.sleep(after_s)
        history = load.stop()
        t_end = time.time()

        # While no server accepted writes: documented 5xx only, nothing executed.
        during = [s for s in history if s.sent >= t_down and s.received < t_switch]
        bad = [s for s in during if s.answer is None or not _documented(s.answer, orders)]
        report.check(not bad, f"{name}: {len(bad)} answers while the primary was gone were not a documented 5xx: "
                              f"{[(s.answer.brief() if s.answer else s.failure) for s in bad[:3]]}")
        if not orders:
            # (With the orders in the database the count needs the database;
            # the orders table is checked below.)
            report.check(count_down is not None and count_down == count_before_switch,
                         f"{name}: the server's count moved from {count_down} to {count_before_switch} while no server accepted writes")

        # Recovery by itself: 201s after the switch, no 5xx after the grace.
        after = [s for s in history if s.sent >= t_switch]
        first_ok = min((s.received for s in after if _fresh(s.answer)), default=None)
        late_5xx = [s for s in after if s.sent >= t_switch + grace_s and (s.answer is None or s.answer.status >= 500)]
        report.check(first_ok is not None, f"{name}: no 201 in the {after_s:.0f} s after the switch (the server did not recover by itself)")
        report.check(not late_5xx, f"{name}: {len(late_5xx)} 5xx or failed requests more than {grace_s:.0f} s after the switch: "
                                   f"{[(s.answer.brief() if s.answer else s.failure) for s in late_5xx[:3]]}")
        five = [s for s in history if s.answer is not None and s.answer.status >= 500]
        undocumented = [s for s in five if not _documented(s.answer, orders)]  # type: ignore[arg-type]
        report.check(not undocumented, f"{name}: undocumented 5xx: {[s.answer.brief() for s in undocumented[:3] if s.answer]}")
        figures.update({
            "requests": len(history),
            "answered_201": sum(1 for s in history if _fresh(s.answer)),
            "answered_5xx": len(five),
            "answers_5xx_by_error": _tally(f"{s.answer.status} {s.answer.error}" for s in five if s.answer),
            "no_answer": sum(1 for s in history if s.answer is None),
            "fault_to_switch_s": round(t_switch - t_fault, 2),
            "recovery_after_switch_s": None if first_ok is None else round(first_ok - t_switch, 3),
            "load_s": round(t_end - t_fault + warm_s, 1),
        })

        # Every key again after the TTL: acknowledged answers must replay.
        time.sleep(ttl_ms / 1000 + 0.5)
        acked: dict[str, Answer] = {}
        for s in history:
            if s.answer is not None and s.answer.status == 201 and s.key not in acked:
                acked[s.key] = s.answer
        acked_before_fault = {s.key for s in history if s.answer is not None and s.answer.status == 201 and s.received < t_fault}
        re_run: list[str] = []
        wrong: list[str] = []
        executed_by_retry = 0
        tally_lock = threading.Lock()

        def settle(s: Sent) -> None:
            nonlocal executed_by_retry
            first = post_order(server.port, s.key, s.body, timeout=30)
            second = post_order(server.port, s.key, s.body, timeout=30)
            with tally_lock:
                if _fresh(first):
                    executed_by_retry += 1
                    if s.key in acked:
                        re_run.append(s.key)
                ok_second = second.status == 201 and second.replayed and (first.status != 201 or second.body == first.body)
                if not ok_second:
                    wrong.append(f"{s.key}: retries answered {first.brief()} then {second.brief()}")
                elif s.key in acked and not _fresh(first) and first.body != acked[s.key].body:
                    wrong.append(f"{s.key}: replayed {first.brief()}, first answered {acked[s.key].brief()}")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(settle, history))
        report.check(not wrong, f"{name}: {len(wrong)} keys did not settle on their answer: {wrong[:3]}")
        # A 201 answered before the fault had its completion committed (the
        # hosts answer after the completion batch returns). One answered after
        # the fault began may have lost its completion to it (SPEC 9.4: the
        # caller still gets its answer, the row stays pending, a retry after
        # the TTL runs it again): not a replication loss.
        lost_acks = [k for k in re_run if k in acked_before_fault]
        if sync:
            report.check(not lost_acks, f"{name}: {len(lost_acks)} keys acknowledged before the fault executed again after the failover "
                                        f"with synchronous replication: {[_when(s, t_fault, t_switch) for s in history if s.key in lost_acks][:3]}")
        # Where the re-runs came from: generation 2 on the new primary = the
        # claim survived, its completion did not; 1 = the claim was lost too.
        generations: dict[str, int] = {}
        if re_run:
            reader = PgLedger(pair.url(pair.replica_port), DATABASE, create=False)
            try:
                for r in reader.rows_for([("alice", k) for k in re_run]):
                    generations[f"generation {r.generation}"] = generations.get(f"generation {r.generation}", 0) + 1
            finally:
                reader.close()
        if sync:
            # A committed claim that did not survive the failover: only an
            # asynchronous replica loses commits.
            report.check(generations.get("generation 1", 0) == 0,
                         f"{name}: {generations.get('generation 1')} keys ran again at generation 1 (their committed claim was lost) with synchronous replication")
        figures.update({
            "keys": len(history),
            "acknowledged": len(acked),
            "acknowledged_before_fault": len(acked_before_fault),
            "acknowledged_re_executed": len(re_run),
            "acknowledged_before_fault_re_executed": len(lost_acks),
            "acknowledged_during_fault_re_executed": len(re_run) - len(lost_acks),
            "re_executed_rows": generations,
            # Commits the failover lost (an asynchronous replica had not received them).
            "claims_lost_with_the_primary": generations.get("generation 1", 0),
            "executed_by_the_retries": executed_by_retry,
        })
        count = _count(server)
        figures["server_count"] = count
        if orders:
            ledger = PgLedger(pair.url(pair.replica_port), DATABASE, create=False)
            try:
                sent = {("alice", s.key) for s in history}
                figures["orders"] = check_orders(report, ledger, TRANSACTIONAL, sent, {("alice", k) for k in acked}, name,
                                                 server_count=count, sent=sent)
            finally:
                ledger.close()
        else:
            fresh = sum(1 for s in history if _fresh(s.answer)) + executed_by_retry
            # Executions beyond the fresh answers: handlers whose completion
            # the fault destroyed (the claim had committed).
            figures["executions_without_fresh_answer"] = None if count is None else count - fresh
            report.check(count is not None and count >= fresh, f"{name}: the server counts {count} executions for {fresh} fresh answers")
        code = server.stop()
        report.check(code == 0, f"{name}: SIGTERM exit code {code}")
        return figures
    except Exception:
        if server is not None:
            print(f"--- {host.name} server log ---\n{server.log_tail(40)}", flush=True)
        print("\n".join(pair.log), flush=True)
        raise
    finally:
        if server is not None and server.alive():
            server.kill()
        if proxy is not None:
            proxy.close()
        pair.stop()


def _when(s: Sent, t_fault: float, t_switch: float) -> str:
    """A request's times relative to the fault and the switch, and its answer."""
    return (f"{s.key} sent {s.sent - t_fault:+.3f} s / answered {s.received - t_fault:+.3f} s from the fault "
            f"(switch at {t_switch - t_fault:+.3f} s): {s.answer.brief() if s.answer else s.failure}")


def _tally(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def summary_line(host: str, f: dict[str, Any]) -> str:
    return (f"{host:<7} {f['kind']:<9} {'on' if f['sync'] else 'off':<4} {'yes' if f['exactly_once'] else 'no':<4} "
            f"{f.get('requests', 0):>7} {f.get('answered_5xx', 0):>5} {f.get('recovery_after_switch_s')!s:>9} "
            f"{f.get('acknowledged', 0):>6} {f.get('acknowledged_before_fault_re_executed', 0):>15}+{f.get('acknowledged_during_fault_re_executed', 0):<4} "
            f"{json.dumps((f.get('orders') or {}).get('duplicate_orders', '-'))!s:>6}")
