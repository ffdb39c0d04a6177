"""Database faults under load: the example server keeps serving while its
database fails, and recovers by itself when the database does.

- sqlite-full: the database file on a small tmpfs the harness fills with a
  filler file (ENOSPC: SQLITE_FULL), then frees again.
- sqlite-readonly: `chattr +i` on the database file and its WAL (on ext4,
  writes through descriptors already open fail with EPERM), then `chattr -i`.
- pg-restart: `pg_ctl restart -m fast` on scripts/postgres.sh's data
  directory, then `pg_ctl stop -m immediate`, an outage, and a start.
- pg-terminate: pg_terminate_backend on every connection of the server,
  repeatedly.

During a fault every request either succeeds or fails closed with a
documented 5xx (SPEC 9.1: 503 busy, 503 outcome unknown, 500); afterwards
(past a short grace) nothing fails. Then every key is retried after the TTL
(so any reservation a lost completion left pending is taken over, exactly
once) and retried again (a replay): no row is left pending, no key ran more
often than its generation, the server's count equals the executions seen.
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import load
from answers import ORDER_NOT_WRITTEN, post_order
from ledgers import Ledger, PgLedger, SqliteLedger
from orders import OrdersMode, check_orders
from pgcontrol import pg_ctl, server_log
from report import Report
from servers import Server, StartError


def tmpfs_available(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        return False
    subprocess.run(["umount", str(path)], capture_output=True)
    return True


def chattr_available(dir: Path) -> bool:
    probe = dir / "chattr-probe"
    probe.write_bytes(b"x")
    try:
        fd = os.open(probe, os.O_RDWR)
        try:
            if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
                return False
            try:
                os.write(fd, b"y")
                return False  # immutable does not stop writes on this filesystem
            except OSError:
                return True
            finally:
                subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
        probe.unlink(missing_ok=True)


class Timing:
    """Seconds of load before the first fault, of each fault, after each
    fault; how many fault cycles; the PostgreSQL outage."""

    def __init__(self, warm: float = 1.0, fault: float = 2.0, after: float = 2.0, cycles: int = 1, outage: float = 2.0) -> None:
        self.warm, self.fault, self.after, self.cycles, self.outage = warm, fault, after, cycles, outage


class FaultRun:
    """Load on `server` while `inject` runs between `warm` and the recovery."""

    def __init__(self, name: str, server: Server, ledger: Ledger, report: Report, ttl_ms: int, clients: int = 6, seed: int = 11, payload_size: int = 200,
                 orders: Optional[OrdersMode] = None) -> None:
        self.orders = orders
        self.name = name
        self.server = server
        self.ledger = ledger
        self.report = report
        self.ttl = ttl_ms
        self.faults = load.Faults()
        self.faults.ttl_ms = ttl_ms
        self.model = load.Model(seed, f"{name}-{seed}", dict(load.DEFAULT_MIX, _delayed_share=0.05), (20, 100), payload_size, ref=orders is not None)
        self.clients = clients
        self.seed = seed

    def check(self, ok: bool, message: str) -> bool:
        mode = f" {self.orders.name}" if self.orders is not None else ""
        return self.report.check(ok, f"{self.server.host.name}/{self.name}{mode}: {message}")

    def run(self, inject: Callable[["FaultRun", int], None], timing: "Timing", grace: float) -> dict[str, Any]:
        srv = self.server
        self.faults.grace = grace
        count_base = srv.count()
        stop = threading.Event()
        threads = [load.Client(self.model, srv.port, stop, self.seed * 100 + i, timeout=60) for i in range(self.clients)]
        for t in threads:
            t.start()
        time.sleep(timing.warm)
        for cycle in range(timing.cycles):
            inject(self, cycle)
            time.sleep(timing.after)
        stop.set()
        for t in threads:
            t.join(90)
        self.check(srv.alive(), f"the server died:\n{srv.log_tail()}")
        if not srv.alive():
            return {}
        # Reconcile: past the TTL, every key retried (a pending reservation is
        # taken over once), then retried again (a replay).
        ids = [(ks.principal, ks.key) for ks in self.model.keys]
        pending = [r for r in self.ledger.rows_for(ids) if r.status == "pending"]
        until = max([r.updated_at / 1000 + self.ttl / 1000 + 0.05 for r in pending] + [max(e for _, e in self.faults.windows) + grace])
        if until > time.time():
            time.sleep(until - time.time())
        orders = self.orders
        transactional = orders is not None and orders.transactional

        def stored_failure(a: Any) -> bool:
            # With orders in the database, an insert the fault broke is the
            # handler's own 500 order_not_written, stored like any answer (SPEC 9.3).
            return orders is not None and (a.status, a.error) == ORDER_NOT_WRITTEN

        for ks, a in load.retry_all(self.model, srv.port, self.model.keys):
            if a is not None:
                self.check(a.status == 201 or (a.status == 409 and a.error == "idempotency_key_reused") or (stored_failure(a) and a.replayed),
                           f"{ks.principal}/{ks.key}: the first retry after the fault got {a.brief()}")
        second = load.retry_all(self.model, srv.port, self.model.keys)
        for ks, a in second:
            if a is not None:
                self.check((a.status == 201 and a.replayed) or (a.status == 409 and a.error == "idempotency_key_reused") or (stored_failure(a) and a.replayed),
                           f"{ks.principal}/{ks.key}: the second retry got {a.brief()}")
        pending_ids = {(r.principal, r.key) for r in self.ledger.rows_for(ids) if r.status == "pending"}
        for ks, a in load.retry_reuse_claims(self.model, srv.port, second, pending_ids):
            if a is not None:
                self.check(a.status == 201 and a.replayed, f"{ks.principal}/{ks.key}: the second retry of the payload that claimed it got {a.brief()}")
        sub = Report(self.report.name)
        tally = load.check_keys(self.model.keys, sub, faults=self.faults, transactional=transactional, orders=orders is not None)
        for v in sub.violations + self.model.violations:
            self.check(False, v)
        self.report.checks += sub.checks
        executions = srv.count() - count_base
        if orders is None:
            self.check(executions == tally["fresh"], f"the server counted {executions} executions, the clients saw {tally['fresh']} fresh answers")
        rows = {(r.principal, r.key): r for r in self.ledger.rows_for(ids)}
        pending = [r for r in rows.values() if r.status != "completed"]
        self.check(not pending, f"{len(pending)} rows left pending after every key was retried past the TTL: {pending[:2]}")
        took_over = 0
        for ks in self.model.keys:
            fresh = [r for r in ks.recs if r.status == 201 and not r.replayed]
            row = rows.get((ks.principal, ks.key))
            if row is None:
                self.check(not fresh, f"{ks.principal}/{ks.key}: executed, no row")
                continue
            took_over += row.generation > 1
            self.check(len(fresh) <= row.generation, f"{ks.principal}/{ks.key}: executed {len(fresh)} times at generation {row.generation}")
        order_figures = None
        if orders is None:
            self.check(len(rows) == tally["executed_keys"], f"{len(rows)} rows for {tally['executed_keys']} executed keys")
        else:
            # Orders are counted, not executions: the count is the table's
            # rows (an insert can commit without its answer arriving).
            answered = {(ks.principal, ks.key) for ks in self.model.keys if any(r.status == 201 for r in ks.recs)}
            with_201 = {k for k, r in rows.items() if r.response_status == 201}
            self.check(with_201 == answered, f"{len(with_201)} rows store a 201, {len(answered)} keys were answered 201: {sorted(with_201 ^ answered)[:3]}")
            failed = [r for k, r in rows.items() if k not in with_201]
            self.check(all(r.response_status == 500 and '"order_not_written"' in (r.response_body or "") for r in failed),
                       f"rows storing neither a 201 nor the server's order_not_written: {failed[:2]}")
            order_figures = check_orders(self.report, self.ledger, orders, ids, answered, f"{srv.host.name}/{self.name} {orders.name}",
                                         server_count=srv.count(), sent=set(ids))
            order_figures["stored_order_not_written"] = len(failed)
        # What the fault did, as the clients saw it.
        during = [r for ks in self.model.keys for r in ks.recs if self.faults.during(r.sent, r.received)]
        kinds: dict[str, int] = {}
        for r in during:
            label = "ok" if r.status in (201, 409) else f"{r.status} {r.error}"
            kinds[label] = kinds.get(label, 0) + 1
        fault_end = max(e for _, e in self.faults.windows)
        fails_after = [r.received - fault_end for ks in self.model.keys for r in ks.recs if r.status >= 500 and r.received > fault_end]
        ok_after = [r.received - fault_end for ks in self.model.keys for r in ks.recs if r.status == 201 and not r.replayed and r.sent > fault_end]
        return {
            "requests": sum(len(ks.recs) for ks in self.model.keys),
            "keys": len(self.model.keys),
            "faults_injected": len(self.faults.windows),
            "fault_seconds": round(sum(e - s for s, e in self.faults.windows), 1),
            "answers_during_fault": kinds,
            "last_5xx_after_recovery_s": round(max(fails_after), 2) if fails_after else None,
            "first_execution_after_recovery_s": round(min(ok_after), 2) if ok_after else None,
            "executions": executions,
            "takeovers_in_reconcile": took_over,
            "tally": tally,
            **({"orders": order_figures, "mode": orders.name} if orders is not None else {}),
        }


# ---------------------------------------------------------------- the faults


@contextmanager
def serving(server: Server, report: Report, fault: str) -> Iterator[Server]:
    """The started server for one fault: stopped with SIGTERM once the fault
    is done (its exit code checked), killed if anything failed before."""
    try:
        yield server
        code = server.stop()
        report.check(code == 0, f"{server.host.name}/{fault}: SIGTERM exit code {code}")
    finally:
        if server.alive():
            server.kill()


TMPFS_MIB = 256


def sqlite_full(server_factory: Callable[[str], Server], workdir: Path, report: Report, ttl_ms: int, timing: Timing, clients: int, orders: Optional[OrdersMode] = None) -> dict[str, Any]:
    mnt = workdir / "full"
    if not tmpfs_available(mnt):
        report.note("sqlite-full not run: cannot mount a tmpfs here (PRAGMA max_page_count is per connection, so the harness cannot impose it on the server)")
        return {"not_run": "no tmpfs"}
    # Room for the ledger's own growth under load (2 KB payloads, thousands of
    # keys a second from the fastest server): the fault is the filler, never
    # the ledger filling the disk by itself (checked after each cycle).
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(mnt)], check=True)
    try:
        ledger = SqliteLedger(mnt / "ledger.sqlite")
        with serving(server_factory(ledger.url()).start(), report, "sqlite-full") as server:
            run = FaultRun("sqlite-full", server, ledger, report, ttl_ms, clients=clients, payload_size=2000, orders=orders)
            filler = mnt / "filler"
            fills = {"bytes": 0, "enospc_writes": 0}

            def inject(r: FaultRun, cycle: int) -> None:
                start = time.time()
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    for size in (1 << 20, 65536, 4096, 512, 1):
                        chunk = b"\0" * size
                        while True:
                            try:
                                fills["bytes"] += os.write(fd, chunk)
                            except OSError as e:
                                if e.errno != errno.ENOSPC:
                                    raise
                                break
                finally:
                    os.close(fd)
                time.sleep(timing.fault)
                filler.unlink()
                r.faults.add(start, time.time())
                st = os.statvfs(mnt)
                free_mib = st.f_bavail * st.f_frsize / 1048576
                report.check(free_mib >= TMPFS_MIB / 4, f"sqlite-full: only {free_mib:.0f} MiB free after the filler was deleted: the ledger filled the {TMPFS_MIB} MiB tmpfs by itself (a harness sizing problem, not a fault that ends)")

            figures = run.run(inject, timing, grace=1.0)
            figures["filled_mib"] = round(fills["bytes"] / 1048576, 1)
            figures["how"] = f"tmpfs of {TMPFS_MIB} MiB filled by a filler file (ENOSPC), then the filler deleted"
            return figures
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def sqlite_readonly(server_factory: Callable[[str], Server], workdir: Path, report: Report, ttl_ms: int, timing: Timing, clients: int, orders: Optional[OrdersMode] = None) -> dict[str, Any]:
    d = workdir / "ro"
    d.mkdir(exist_ok=True)
    if not chattr_available(d):
        report.note("sqlite-readonly not run: chattr +i does not stop writes on this filesystem")
        return {"not_run": "no chattr +i"}
    ledger = SqliteLedger(d / "ledger.sqlite")
    files = [str(ledger.path), str(ledger.path) + "-wal"]
    try:
        with serving(server_factory(ledger.url()).start(), report, "sqlite-readonly") as server:
            run = FaultRun("sqlite-readonly", server, ledger, report, ttl_ms, clients=clients, orders=orders)

            def inject(r: FaultRun, cycle: int) -> None:
                start = time.time()
                subprocess.run(["chattr", "+i", *files], check=True)
                try:
                    time.sleep(timing.fault)
                finally:
                    subprocess.run(["chattr", "-i", *files], check=True)
                r.faults.add(start, time.time())

            figures = run.run(inject, timing, grace=1.0)
            figures["how"] = "chattr +i on the database file and its -wal (ext4: writes through open descriptors fail with EPERM), then chattr -i"
            return figures
    finally:
        subprocess.run(["chattr", "-i", *files], capture_output=True)


def sqlite_readonly_open(server_factory: Callable[..., Server], workdir: Path, report: Report, ttl_ms: int, timing: Timing, clients: int) -> dict[str, Any]:
    """A server started as an unprivileged user on a file it cannot write
    (SQLite opens it read-only: SQLITE_READONLY), then the file made
    writable. Does the running server recover, or only a restarted one?"""
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        report.note("sqlite-readonly-open not run: no user nobody")
        return {"not_run": "no user nobody"}
    if os.geteuid() != 0:
        report.note("sqlite-readonly-open not run: needs root to start the server as nobody")
        return {"not_run": "not root"}
    d = workdir / "ro-open"
    d.mkdir(exist_ok=True)
    os.chmod(workdir, 0o755)
    ledger = SqliteLedger(d / "ledger.sqlite")
    # A ledger with completed keys, written by a server that could.
    setup = server_factory(ledger.url()).start()
    model = load.Model(5, "ro-open", dict(load.DEFAULT_MIX, _delayed_share=0.0), (20, 100), 200)
    first = [model.new_key() for _ in range(20)]
    client = load.Client(model, setup.port, threading.Event(), 5)
    for ks in first:
        client.send("fresh", ks, ks.body)
    report.check(setup.stop() == 0, "sqlite-readonly-open: the setup server did not exit 0")
    for f in d.iterdir():
        os.chown(f, 0, 0)
        os.chmod(f, 0o644)
    os.chown(d, 0, 0)
    os.chmod(d, 0o755)
    server = server_factory(ledger.url(), user="nobody")
    name = f"{server.host.name}/sqlite-readonly-open"
    figures: dict[str, Any] = {"how": "the server run as nobody on a root-owned 0644 file in a 0755 directory, then chown nobody"}
    try:
        try:
            server.start()
            refused = None
        except StartError as e:
            refused = e
        if refused is not None:
            # Failing closed at start: a non-zero exit (not a crash) with a message.
            report.check(refused.returncode is not None and refused.returncode > 0, f"{name}: the server died with {refused.returncode} at start")
            said = [line for line in server.log_tail(60).splitlines() if "readonly" in line.lower() or "read-only" in line.lower() or "read only" in line.lower()]
            report.check(bool(said), f"{name}: the server exited without saying the database is read-only:\n{server.log_tail(10)}")
            figures["at_start"] = f"refused to start: exit {refused.returncode}: {said[0].strip()[:160] if said else ''}"
        else:
            answers: dict[str, int] = {}
            for ks in first[:5] + [model.new_key() for _ in range(5)]:
                a = post_order(server.port, ks.key, ks.body, principal=ks.principal)
                label = f"{a.status} {a.error or ''}".strip()
                answers[label] = answers.get(label, 0) + 1
                report.check(a.status >= 500 and load.documented_5xx_rec(load.Rec("ro", a, a.sent, a.received)), f"{name}: on a file it cannot write, got {a.brief()}")
            report.check(server.count() == 0, f"{name}: something ran on a read-only ledger")
            figures["at_start"] = f"started; every protected request answered {answers}"
        # The file becomes writable for the server's user.
        os.chown(d, nobody.pw_uid, nobody.pw_gid)
        for f in d.iterdir():
            os.chown(f, nobody.pw_uid, nobody.pw_gid)
        if refused is not None:
            server.start()
            figures["after_chown"] = "started"
        else:
            window = max(timing.fault, 3.0)
            began = time.time()
            recovered = None
            probe = model.new_key()
            while time.time() < began + window:
                a = post_order(server.port, probe.key, probe.body, principal=probe.principal)
                if a.status == 201:
                    recovered = round(time.time() - began, 2)
                    break
                report.check(load.documented_5xx_rec(load.Rec("ro", a, a.sent, a.received)), f"{name}: got {a.brief()}")
                time.sleep(0.2)
            if recovered is None:
                report.note(f"{name}: the running server did not recover within {window} s once the file was writable (its SQLite handle was opened read-only); a restart does")
                report.check(server.stop() == 0, f"{name}: SIGTERM exit code")
                server.restart()
                figures["after_chown"] = f"no recovery within {window} s (the connection stays read-only); recovered by a restart"
            else:
                figures["after_chown"] = f"recovered after {recovered} s"
        # Every key now: the first 20 replay their answers, the others run once.
        for ks in first:
            a = post_order(server.port, ks.key, ks.body, principal=ks.principal)
            report.check(a.status == 201 and a.replayed and ks.first is not None and load.signature(a) == ks.first.sig, f"{name}: {ks.key} does not replay its answer: {a.brief()}")
        figures["replayed_after"] = len(first)
        code = server.stop()
        report.check(code == 0, f"{name}: SIGTERM exit code {code}")
        return figures
    finally:
        if server.alive():
            server.kill()


def pg_restart(server_factory: Callable[[str], Server], ledger: PgLedger, report: Report, ttl_ms: int, timing: Timing, clients: int, orders: Optional[OrdersMode] = None) -> dict[str, Any]:
    with serving(server_factory(ledger.url()).start(), report, "pg-restart") as server:
        run = FaultRun("pg-restart", server, ledger, report, ttl_ms, clients=clients, orders=orders)
        log: list[str] = []

        def inject(r: FaultRun, cycle: int) -> None:
            start = time.time()
            if cycle % 2 == 0:
                # A crash of the database: stop -m immediate, an outage, a start (with recovery).
                p = pg_ctl("-m", "immediate", "-w", "stop")
                log.append(f"stop -m immediate: rc {p.returncode}")
                time.sleep(timing.outage)
                p = pg_ctl("-w", "-t", "60", "-l", str(server_log()), "restart")
                log.append(f"start after {timing.outage}s down: rc {p.returncode}")
            else:
                p = pg_ctl("-m", "fast", "-w", "-t", "60", "-l", str(server_log()), "restart")
                log.append(f"restart -m fast: rc {p.returncode}")
            r.check(p.returncode == 0, f"pg_ctl failed: {p.stdout} {p.stderr}")
            r.faults.add(start, time.time())

        figures = run.run(inject, timing, grace=5.0)
        figures["how"] = "cycles alternating pg_ctl stop -m immediate + an outage + pg_ctl restart (crash recovery), and pg_ctl restart -m fast"
        figures["pg_ctl"] = log
        return figures


def pg_terminate(server_factory: Callable[[str], Server], ledger: PgLedger, report: Report, ttl_ms: int, timing: Timing, clients: int, orders: Optional[OrdersMode] = None) -> dict[str, Any]:
    with serving(server_factory(ledger.url()).start(), report, "pg-terminate") as server:
        run = FaultRun("pg-terminate", server, ledger, report, ttl_ms, clients=clients, orders=orders)
        killed = {"backends": 0, "rounds": 0}

        def inject(r: FaultRun, cycle: int) -> None:
            start = time.time()
            end = start + timing.fault
            while time.time() < end:
                killed["backends"] += ledger.terminate_server_backends()
                killed["rounds"] += 1
                time.sleep(random.uniform(0.05, 0.3))
            r.faults.add(start, time.time())

        figures = run.run(inject, timing, grace=3.0)
        figures["how"] = "pg_terminate_backend on every connection of the server, every 50-300 ms"
        figures["backends_terminated"] = killed["backends"]
        return figures
