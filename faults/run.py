#!/usr/bin/env python3
"""The fault and load harness for the three example servers.

    python3 faults/run.py short   --db sqlite|postgres [--hosts rust,python,node]
    python3 faults/run.py crash   --host H --db D [--rounds N]
    python3 faults/run.py dbfaults --host H --db D [--fault-seconds S]
    python3 faults/run.py soak    --host H --db D --minutes M [--clients C] [--procs P]
    python3 faults/run.py contract --host H --db D

PostgreSQL runs need IDEMPOTENCY_PG_URL (scripts/postgres.sh run -- ...).
Each run prints its figures and writes them as JSON under target/faults/;
the exit code is 1 when anything was violated. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import crash  # noqa: E402
import dbfaults  # noqa: E402
import load  # noqa: E402
from common import (  # noqa: E402
    REPLAY_HEADER,
    ROOT,
    Ledger,
    PgLedger,
    Proxy,
    Report,
    Server,
    SqliteLedger,
    Workdir,
    hosts,
    payload,
    pg_admin_url,
    pgwire,
    post_order,
    random_key,
)

RESULTS = ROOT / "target" / "faults"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Context:
    """One host on one kind of database, with fresh databases on demand."""

    def __init__(self, host: str, db: str, workdir: Workdir, ttl_ms: int, server_env: Optional[dict[str, str]] = None) -> None:
        self.host = hosts()[host]
        self.server_env = server_env or {}
        self.db = db
        self.workdir = workdir
        self.ttl = ttl_ms
        self.ledgers: list[Ledger] = []
        self.proxies: list[Proxy] = []
        self.servers: list[Server] = []
        if db == "postgres" and not pg_admin_url():
            raise SystemExit("error: IDEMPOTENCY_PG_URL is not set (run inside scripts/postgres.sh run -- ...)")

    def env(self, ttl: Optional[int] = None) -> dict[str, str]:
        env = {"IDEMPOTENCY_REPLAY_HEADER": REPLAY_HEADER, **self.server_env}
        if ttl:
            env["IDEMPOTENCY_PENDING_TTL_MS"] = str(ttl)
        return env

    def ledger(self, tag: str) -> Ledger:
        if self.db == "sqlite":
            led: Ledger = SqliteLedger(self.workdir.path / f"{tag}.sqlite")
        else:
            led = PgLedger(pg_admin_url() or "", f"faults_{self.host.name}_{tag}_{random.getrandbits(24):06x}".lower().replace("-", "_"))
        self.ledgers.append(led)
        return led

    def server(self, database: str, ttl: Optional[int] = None, user: Optional[str] = None) -> Server:
        s = Server(self.host, database, self.env(ttl), self.workdir.logs, user=user)
        self.servers.append(s)
        return s

    def close(self) -> None:
        for s in self.servers:
            if s.alive():
                s.kill()
        for p in self.proxies:
            p.close()
        for led in self.ledgers:
            led.close()


# ---------------------------------------------------------------- commands


def contract(ctx: Context, report: Report) -> dict[str, Any]:
    """The shared example-server contract, briefly (what the faults rely on)."""
    led = ctx.ledger("contract")
    srv = ctx.server(led.url()).start()
    name = f"{ctx.host.name}/{ctx.db} contract"
    report.check(srv.count() == 0, f"{name}: the count does not start at 0")
    a = post_order(srv.port, "c-1", b'{"sku":"A"}', principal=None)
    report.check(a.status == 401, f"{name}: no bearer token got {a.brief()}")
    report.check(srv.count() == 0, f"{name}: a 401 executed")
    checked = 0
    for size in (0, 20_000):
        key = random_key("contract")
        body = payload("contract", size)
        first = post_order(srv.port, key, body)
        ok = first.status == 201 and not first.replayed and first.headers.get("content-type", "").startswith("application/json")
        if ok:
            v = first.json()
            ok = v.get("request") == json.loads(body) and first.headers.get("location") == f"/orders/{v.get('id')}"
        report.check(ok, f"{name}: a valid {len(body)}-byte order got {first.brief()} (expected 201 echoing the request)")
        again = post_order(srv.port, key, body)
        report.check(again.status == first.status and again.body == first.body and again.replayed, f"{name}: the retry of a {len(body)}-byte order got {again.brief()}")
        checked += 2
    report.check(srv.count() == 2, f"{name}: {srv.count()} executions for 2 orders")
    code = srv.stop()
    report.check(code == 0, f"{name}: SIGTERM exit code {code}")
    return {"requests": checked + 1}


def crashes(ctx: Context, report: Report, rounds: int, load_seconds: float) -> dict[str, Any]:
    led = ctx.ledger("crash")
    proxy = None
    url = led.url()
    if isinstance(led, PgLedger):
        proxy = Proxy(int(pgwire.parse_url(led.admin_url)["port"]))
        ctx.proxies.append(proxy)
        url = led.url(port=proxy.port)
    srv = ctx.server(url, ctx.ttl).start()
    figures = crash.run(srv, led, report, ctx.ttl, rounds, load_seconds, proxy)
    code = srv.stop()
    report.check(code == 0, f"{ctx.host.name}/{ctx.db} crash: SIGTERM exit code {code}")
    figures["kills"] = srv.kills
    return figures


def faults(ctx: Context, report: Report, timing: dbfaults.Timing, clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def factory(database: str, user: Optional[str] = None) -> Server:
        return ctx.server(database, ctx.ttl, user)

    if ctx.db == "sqlite":
        out["sqlite-full"] = dbfaults.sqlite_full(factory, ctx.workdir.path, report, ctx.ttl, timing, clients)
        out["sqlite-readonly"] = dbfaults.sqlite_readonly(factory, ctx.workdir.path, report, ctx.ttl, timing, clients)
        out["sqlite-readonly-open"] = dbfaults.sqlite_readonly_open(factory, ctx.workdir.path, report, ctx.ttl, timing, clients)
    else:
        led = ctx.ledger("restart")
        assert isinstance(led, PgLedger)
        out["pg-restart"] = dbfaults.pg_restart(factory, led, report, ctx.ttl, timing, clients)
        led = ctx.ledger("terminate")
        assert isinstance(led, PgLedger)
        out["pg-terminate"] = dbfaults.pg_terminate(factory, led, report, ctx.ttl, timing, clients)
    return out


def soak(ctx: Context, report: Report, seconds: float, clients: int, procs: int, age_every: float) -> dict[str, Any]:
    led = ctx.ledger("soak")
    srv = ctx.server(led.url()).start()
    figures = load.run_load(srv, led, seconds, clients, procs, report, seed=random.randrange(1 << 20), age_every=age_every)
    g = figures.get("rss_growth") or {}
    if g and seconds >= 120:
        # Flat: after warm-up the RSS grows by no more than 20 MiB or 20 %.
        report.check(g["growth_mib"] <= max(20.0, 0.2 * g["after_warmup_mib"]), f"{ctx.host.name}/{ctx.db} soak: RSS grew {g}")
    code = srv.stop()
    report.check(code == 0, f"{ctx.host.name}/{ctx.db} soak: SIGTERM exit code {code}")
    return figures


# ---------------------------------------------------------------- driver


def run_one(name: str, host: str, db: str, fn: Callable[[Context, Report], dict[str, Any]], ttl: int, server_env: Optional[dict[str, str]] = None) -> tuple[Report, dict[str, Any]]:
    report = Report(f"{name} {host}/{db}")
    workdir = Workdir(f"{name}-{host}-{db}")
    ctx = Context(host, db, workdir, ttl, server_env)
    figures: dict[str, Any] = {}
    began = time.time()
    try:
        figures = fn(ctx, report)
    except Exception as e:  # noqa: BLE001 - reported as a failure with its trace
        report.check(False, f"{name} {host}/{db} raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
        for s in ctx.servers:
            if s.log_tail():
                say(f"--- {s.host.name} server log (port {s.port}) ---\n{s.log_tail(40)}")
    finally:
        ctx.close()
        figures["wall_seconds"] = round(time.time() - began, 1)
        workdir.cleanup(keep=not report.ok)
    return report, figures


def write(command: str, results: list[tuple[str, str, str, Report, dict[str, Any]]], args: argparse.Namespace) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = f"{command}-{args.host or 'all'}-{args.db}"
    path = RESULTS / f"{stamp}-{tag}.json"
    doc = {
        "command": " ".join(["python3", "faults/run.py"] + sys.argv[1:]),
        "started": stamp,
        "git": os.popen(f"git -C {ROOT} rev-parse --short HEAD 2>/dev/null").read().strip(),
        # Servers run from the working tree: what differed from HEAD there.
        "uncommitted": os.popen(f"git -C {ROOT} status --porcelain -- bindings guest wit Cargo.lock 2>/dev/null").read().split("\n")[:40],
        "runs": [{"part": part, "host": host, "db": db, **report.as_dict(), "figures": figures} for part, host, db, report, figures in results],
    }
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def summarize(results: list[tuple[str, str, str, Report, dict[str, Any]]]) -> bool:
    ok = True
    print(f"{'part':<10} {'host':<7} {'db':<9} {'checks':>7} {'violations':>10} {'seconds':>8}")
    for part, host, db, report, figures in results:
        print(f"{part:<10} {host:<7} {db:<9} {report.checks:>7} {len(report.violations):>10} {figures.get('wall_seconds', 0):>8}")
        ok = ok and report.ok
    for part, host, db, report, figures in results:
        for v in report.violations[:20]:
            print(f"  VIOLATION {part} {host}/{db}: {v}")
        if len(report.violations) > 20:
            print(f"  ... and {len(report.violations) - 20} more")
    return ok


def short_parallel(args: argparse.Namespace, selected: list[str]) -> int:
    """`short` with the hosts side by side (separate processes, databases and
    ports); PostgreSQL's restarts hit every server on it, so those faults
    run afterwards, one host at a time."""
    import subprocess

    began = time.time()
    children = []
    for host in selected:
        argv = [sys.executable, __file__, "short", "--db", args.db, "--host", host, "--ttl-ms", str(args.ttl_ms), "--seed", str(random.getrandbits(30))]
        if args.db == "postgres":
            argv.append("--no-pg-faults")
        children.append((host, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    ok = True
    for host, child in children:
        out, _ = child.communicate()
        print(f"---- {host}/{args.db} ----\n{out}", flush=True)
        ok = ok and child.returncode == 0
    if args.db == "postgres":
        for host in selected:
            argv = [sys.executable, __file__, "dbfaults", "--db", "postgres", "--host", host, "--ttl-ms", str(args.ttl_ms),
                    "--cycles", "1", "--fault-seconds", "1", "--outage-seconds", "1", "--clients", "4"]
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            print(f"---- {host}/postgres faults ----\n{r.stdout}", flush=True)
            ok = ok and r.returncode == 0
    print(f"short {args.db}: {'ok' if ok else 'FAILED'} in {time.time() - began:.0f} s")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["short", "crash", "dbfaults", "soak", "contract"])
    p.add_argument("--host", choices=["rust", "python", "node"])
    p.add_argument("--hosts", default="rust,python,node")
    p.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    p.add_argument("--ttl-ms", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--load-seconds", type=float, default=1.5, help="crash round E: load before the kill")
    p.add_argument("--fault-seconds", type=float, default=2.0)
    p.add_argument("--cycles", type=int, default=3, help="dbfaults: fault cycles per fault kind")
    p.add_argument("--outage-seconds", type=float, default=2.0)
    p.add_argument("--jobs", type=int, default=3, help="short: hosts run side by side (the PostgreSQL faults stay one at a time)")
    p.add_argument("--no-pg-faults", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--clients", type=int, default=0)
    p.add_argument("--procs", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0)
    p.add_argument("--minutes", type=float, default=0)
    p.add_argument("--age-every", type=float, default=0, help="soak: seconds between ageing a batch of completed rows past the retention")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE", help="more environment for the servers (e.g. NODE_OPTIONS=--max-old-space-size=64)")
    args = p.parse_args()
    random.seed(args.seed or time.time_ns())
    selected = [args.host] if args.host else args.hosts.split(",")
    results: list[tuple[str, str, str, Report, dict[str, Any]]] = []

    def add(part: str, host: str, fn: Callable[[Context, Report], dict[str, Any]], ttl: int = args.ttl_ms) -> None:
        say(f"== {part} {host}/{args.db}")
        report, figures = run_one(part, host, args.db, fn, ttl, dict(kv.split("=", 1) for kv in args.server_env))
        say(f"   {part} {host}/{args.db}: {report.checks} checks, {len(report.violations)} violations, {figures.get('wall_seconds')} s")
        results.append((part, host, args.db, report, figures))

    if args.command == "short" and len(selected) > 1 and args.jobs > 1:
        return short_parallel(args, selected)
    short_timing = dbfaults.Timing(warm=0.5, fault=1.0, after=1.5, cycles=1, outage=1.0)
    long_timing = dbfaults.Timing(warm=1.0, fault=args.fault_seconds, after=2.0, cycles=args.cycles, outage=args.outage_seconds)
    for host in selected:
        if args.command in ("short", "contract"):
            add("contract", host, contract)
        if args.command in ("short", "crash"):
            add("crash", host, lambda c, r: crashes(c, r, args.rounds, args.load_seconds))
        if args.command == "dbfaults" or (args.command == "short" and not (args.no_pg_faults and args.db == "postgres")):
            timing = short_timing if args.command == "short" else long_timing
            add("dbfaults", host, lambda c, r: faults(c, r, timing, args.clients or (4 if args.command == "short" else 6)))
        if args.command == "short":
            add("load", host, lambda c, r: soak(c, r, args.seconds or 4, args.clients or 8, args.procs or 1, args.age_every or 1.0))
        if args.command == "soak":
            seconds = args.minutes * 60 or args.seconds or 60
            add("soak", host, lambda c, r: soak(c, r, seconds, args.clients or 12, args.procs or 2, args.age_every or 30.0))
    path = write(args.command, results, args)
    ok = summarize(results)
    print(f"figures: {path.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
