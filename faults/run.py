#!/usr/bin/env python3
"""The fault and load harness for the three example servers.

    python3 faults/run.py short   --db sqlite|postgres [--hosts rust,python,node]
    python3 faults/run.py crash   --host H --db D [--rounds N]
    python3 faults/run.py dbfaults --host H --db D [--fault-seconds S]
    python3 faults/run.py soak    --host H --db D --minutes M [--clients C] [--procs P]
    python3 faults/run.py renewal --host H --db D [--seconds S] [--renewal-ttl-ms T]
    python3 faults/run.py contract --host H --db D
    python3 faults/run.py exactly-once --host H --db D [--modes transactional,plain] [--rounds N]
    python3 faults/run.py failover --host H --sync on|off [--kinds kill,readonly,multihost] [--orders both]

PostgreSQL runs need IDEMPOTENCY_PG_URL (scripts/postgres.sh run -- ...).
Each run prints its figures and writes them as JSON under target/faults/;
the exit code is 1 when anything was violated. Runs on the Python package's
venv (bindings/python/.venv/bin/python: psycopg, pinned there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import crash  # noqa: E402
import dbfaults  # noqa: E402
import exactly_once  # noqa: E402
import failover  # noqa: E402
import load  # noqa: E402
from answers import REPLAY_HEADER, Background, payload, post_order, random_key  # noqa: E402
from ledgers import Ledger, PgLedger, SqliteLedger  # noqa: E402
from pgcontrol import admin_url as pg_admin_url  # noqa: E402
from pgcontrol import port_of  # noqa: E402
from proxy import Proxy  # noqa: E402
from report import Report  # noqa: E402
from servers import ROOT, Server, Workdir, hosts  # noqa: E402

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

    def env(self, ttl: Optional[int] = None, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        env = {"IDEMPOTENCY_REPLAY_HEADER": REPLAY_HEADER, **(extra or {}), **self.server_env}
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

    def server(self, database: str, ttl: Optional[int] = None, user: Optional[str] = None, extra: Optional[dict[str, str]] = None) -> Server:
        s = Server(self.host, database, self.env(ttl, extra), self.workdir.logs, user=user)
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
    """The shared example-server contract (the servers' READMEs): what the
    faults rely on, and what a deployment behind a pooler must keep."""
    led = ctx.ledger("contract")
    cap = 32_768
    srv = ctx.server(led.url(), extra={"IDEMPOTENCY_MAX_BODY_BYTES": str(cap)}).start()
    name = f"{ctx.host.name}/{ctx.db} contract"
    sent = 0

    def post(key: Optional[str], body: bytes, **kw: Any) -> Any:
        nonlocal sent
        sent += 1
        return post_order(srv.port, key, body, **kw)

    report.check(srv.count() == 0, f"{name}: the count does not start at 0")
    if ctx.server_env.get("IDEMPOTENCY_PREPARED_STATEMENTS") == "1":
        # Each server names the setting in its first line (prepared_statements=true/True, "preparedStatements":true).
        report.check(re.search(r'prepared_?statements"?[=:](true|True)', srv.first_log_line(), re.IGNORECASE) is not None,
                     f"{name}: IDEMPOTENCY_PREPARED_STATEMENTS=1 is not in force: {srv.first_log_line()[:300]}")
    a = post("c-1", b'{"sku":"A"}', principal=None)
    report.check(a.status == 401 and a.error == "unauthorized", f"{name}: no bearer token got {a.brief()}")
    report.check(srv.count() == 0, f"{name}: a 401 executed")
    expected = 0
    firsts = {}
    for size in (0, 20_000):
        key = random_key("contract")
        body = payload("contract", size)
        first = post(key, body)
        ok = first.status == 201 and not first.replayed and first.headers.get("content-type", "").startswith("application/json")
        if ok:
            v = first.json()
            ok = v.get("request") == json.loads(body) and first.headers.get("location") == f"/orders/{v.get('id')}"
        report.check(ok, f"{name}: a valid {len(body)}-byte order got {first.brief()} (expected 201 echoing the request)")
        again = post(key, body)
        report.check(again.status == first.status and again.body == first.body and again.replayed
                     and again.headers.get("location") == first.headers.get("location"),
                     f"{name}: the retry of a {len(body)}-byte order got {again.brief()}")
        expected += 1
        firsts[size] = (key, body, first)
    key, body, first = firsts[0]
    reuse = post(key, payload("other"))
    report.check(reuse.status == 409 and reuse.error == "idempotency_key_reused", f"{name}: the key with another payload got {reuse.brief()}")
    other = post(key, body, principal="bob")
    report.check(other.status == 201 and not other.replayed and other.order_id() not in (None, first.order_id()),
                 f"{name}: the same key under another principal got {other.brief()} (keys are scoped by principal)")
    expected += 1
    big = post(random_key("contract"), payload("big", cap + 1000))
    report.check(big.status == 413 and big.error == "idempotency_request_too_large", f"{name}: a body over the cap got {big.brief()}")
    # A refused request creates nothing and releases its key: the corrected retry runs.
    fix = random_key("contract-fix")
    bad_json = post(fix, b"{not json")
    report.check(bad_json.status == 400 and bad_json.error == "invalid_json", f"{name}: a body that is not JSON got {bad_json.brief()}")
    conn_path_delay = _post_path(srv.port, "/orders?delay_ms=soon", fix, b"{}")
    sent += 1
    report.check(conn_path_delay.status == 400 and conn_path_delay.error == "invalid_delay_ms", f"{name}: delay_ms=soon got {conn_path_delay.brief()}")
    fixed = post(fix, payload("fixed"))
    report.check(fixed.status == 201 and not fixed.replayed, f"{name}: the corrected retry after two 400s got {fixed.brief()}")
    expected += 1
    report.check(srv.count() == expected, f"{name}: {srv.count()} executions, expected {expected}")
    # 20 concurrent duplicates of a slow request: one execution, the others
    # 409 in progress (or the replay, once the first answered).
    burst_key = random_key("contract-burst")
    burst_body = payload("burst")
    answers = [Background(lambda: post_order(srv.port, burst_key, burst_body, delay_ms=300)) for _ in range(20)]
    got = [b.join(60).answer for b in answers]
    sent += len(answers)
    statuses = sorted(a.status if a else 0 for a in got)
    fresh = [a for a in got if a is not None and a.status == 201 and not a.replayed]
    report.check(len(fresh) == 1 and set(statuses) <= {201, 409}, f"{name}: 20 concurrent duplicates answered {statuses} ({len(fresh)} fresh)")
    report.check(all(a.error == "idempotency_key_in_progress" for a in got if a is not None and a.status == 409),
                 f"{name}: a concurrent duplicate's 409 was not in progress: {[a.brief() for a in got if a is not None and a.status == 409][:2]}")
    expected += 1
    report.check(srv.count() == expected, f"{name}: {srv.count()} executions after the burst, expected {expected}")
    rows = led.rows()
    report.check(len(rows) == expected and all(r.status == "completed" for r in rows), f"{name}: ledger rows {[(r.key, r.status) for r in rows]}")
    code = srv.stop()
    report.check(code == 0, f"{name}: SIGTERM exit code {code}")
    return {"requests": sent, "executions": expected}


def _post_path(port: int, path: str, key: str, body: bytes) -> Any:
    """A POST to another path (a malformed query) with a bearer token and a key."""
    import http.client

    from answers import Answer

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    sent = time.time()
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json", "Authorization": "Bearer alice", "Idempotency-Key": key})
        r = c.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read(), sent, time.time())
    finally:
        c.close()


def crashes(ctx: Context, report: Report, rounds: int, load_seconds: float) -> dict[str, Any]:
    led = ctx.ledger("crash")
    proxy = None
    url = led.url()
    if isinstance(led, PgLedger):
        proxy = Proxy(port_of(led.url()))
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


#: The load of `renewal`: most operations duplicates of a key in flight, and
#: half the fresh keys slow handlers.
RENEWAL_MIX = {"fresh": 0.3, "dup": 0.5, "retry": 0.1, "reuse": 0.1, "_delayed_share": 0.5}


def renewal(ctx: Context, report: Report, seconds: float, clients: int, ttl_ms: int) -> dict[str, Any]:
    """Live owners past the TTL under load (docs/SPEC.md 10.1): the server
    with a pending TTL of `ttl_ms`, half its fresh keys handlers that run two
    to four TTLs, and duplicates of the keys in flight. Each such handler
    outlives its lease unless the server renews it; a duplicate arriving
    after the TTL would then take the key over and run it again, which the
    load's model counts as a double execution. With
    `--server-env IDEMPOTENCY_LEASE_RENEWAL=off` this run reports them."""
    led = ctx.ledger("renewal")
    srv = ctx.server(led.url(), ttl=ttl_ms).start()
    figures = load.run_load(srv, led, seconds, clients, 1, report, seed=random.randrange(1 << 20), mix=RENEWAL_MIX, delay_range=(2 * ttl_ms, 4 * ttl_ms))
    slow, met = figures["by_kind"].get("delayed", 0), figures["tally"].get("in_progress", 0)
    # Without handlers past the TTL and duplicates meeting them the run proves nothing.
    report.check(slow >= 10 and met >= 20, f"{ctx.host.name}/{ctx.db} renewal: too little overlap to test renewal ({slow} handlers past the TTL, {met} duplicates answered in progress)")
    code = srv.stop()
    report.check(code == 0, f"{ctx.host.name}/{ctx.db} renewal: SIGTERM exit code {code}")
    return {**figures, "ttl_ms": ttl_ms, "handlers_past_ttl": slow, "duplicates_in_progress": met}


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
    tag = f"{command}-{args.host or 'all'}-{args.db}" + ("" if command != "short" or args.parts == ",".join(SHORT_PARTS) else "-" + args.parts.replace(",", "-"))
    path = RESULTS / f"{stamp}-{tag}.json"
    python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable
    doc = {
        "command": " ".join([python, "faults/run.py"] + sys.argv[1:]),
        # Where the servers came from when not from this working tree's builds.
        "env": {k: os.environ[k] for k in ("FAULTS_RUST_SERVE", "FAULTS_RUST_PROFILE", "IDEMPOTENCY_PG_POOLER") if os.environ.get(k)},
        "started": stamp,
        "git": os.popen(f"git -C {ROOT} rev-parse --short HEAD 2>/dev/null").read().strip(),
        # Servers run from the working tree: what differed from HEAD there.
        "uncommitted": os.popen(f"git -C {ROOT} status --porcelain -- bindings guest wit Cargo.lock faults 2>/dev/null").read().split("\n")[:40],
        "runs": [{"part": part, "host": host, "db": db, **report.as_dict(), "figures": figures} for part, host, db, report, figures in results],
    }
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def summarize(results: list[tuple[str, str, str, Report, dict[str, Any]]]) -> bool:
    ok = True
    print(f"{'part':<12} {'host':<7} {'db':<9} {'checks':>7} {'violations':>10} {'seconds':>8}")
    for part, host, db, report, figures in results:
        print(f"{part:<12} {host:<7} {db:<9} {report.checks:>7} {len(report.violations):>10} {figures.get('wall_seconds', 0):>8}")
        ok = ok and report.ok
    for part, host, db, report, figures in results:
        for v in report.violations[:20]:
            print(f"  VIOLATION {part} {host}/{db}: {v}")
        if len(report.violations) > 20:
            print(f"  ... and {len(report.violations) - 20} more")
    return ok


def failovers(args: argparse.Namespace) -> int:
    """`failover`: each kind on a fresh primary + replica pair of its own
    (failover.py); needs no IDEMPOTENCY_PG_URL."""
    ports = tuple(int(p) for p in args.pg_ports.split(","))
    assert len(ports) == 2
    sync = args.sync == "on"
    results: list[tuple[str, str, str, Report, dict[str, Any]]] = []
    selected = [args.host] if args.host else args.hosts.split(",")
    modes = {"plain": [False], "exactly-once": [True], "both": [False, True]}[args.orders]
    for host in selected:
        for kind in args.kinds.split(","):
            for orders in (modes if kind == "kill" else [False]):
                if kind == "multihost" and host == "node":
                    say("== failover node multihost: skipped (node-postgres takes one host per URL; see bindings/js/README.md)")
                    continue
                part = f"failover-{kind}" + ("-eo" if orders else "")
                say(f"== {part} {host} sync={args.sync}")
                report = Report(f"{part} {host}")
                workdir = Workdir(f"{part}-{host}")
                began = time.time()
                figures: dict[str, Any] = {}
                try:
                    figures = failover.scenario(hosts()[host], kind, sync, orders, report, ports=ports, ttl_ms=args.ttl_ms, clients=args.clients or 6,
                                                warm_s=args.warm_seconds, outage_s=args.outage_seconds, after_s=args.after_seconds,
                                                grace_s=args.grace_seconds, logs=workdir.logs)
                except Exception as e:  # noqa: BLE001 - reported as a failure with its trace
                    report.check(False, f"{part} {host} raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
                figures["wall_seconds"] = round(time.time() - began, 1)
                workdir.cleanup(keep=not report.ok)
                say(f"   {part} {host}: {report.checks} checks, {len(report.violations)} violations, {figures['wall_seconds']} s")
                results.append((part, host, "postgres", report, figures))
    args.db = f"postgres-sync-{args.sync}"
    path = write("failover", results, args)
    ok = summarize(results)
    print(f"\n{'host':<7} {'kind':<9} {'sync':<4} {'eo':<4} {'requests':>7} {'5xx':>5} {'recover_s':>9} {'acked':>6} {'re-run before+during':>20} {'dup':>6}")
    for part, host, _, _, f in results:
        if "kind" in f:
            print(failover.summary_line(host, f))
    print(f"figures: {path.relative_to(ROOT)}")
    return 0 if ok else 1


SHORT_PARTS = ("contract", "crash", "dbfaults", "load", "renewal", "exactly-once")
FAULTS_BY_DB = {"sqlite": ["sqlite-full", "sqlite-readonly"], "postgres": ["pg-restart", "pg-terminate"]}


def eo_plans(args: argparse.Namespace) -> dict[str, exactly_once.Plan]:
    """The exactly-once parts to run. `short` (in make test-faults): the
    transactional mode's crash points, one database fault (pg-terminate
    touches only its own database, so hosts can run side by side) and a stall
    with renewal on and off; the plain mode's exit after the write and a
    stall without renewal (the duplicates of the old behaviour). The
    `exactly-once` command: every round, fault and stall in each mode."""
    if args.command == "short":
        return {
            "transactional": exactly_once.Plan({"X", "H", "R", "E"}, 1, ["sqlite-full" if args.db == "sqlite" else "pg-terminate"], [True, False]),
            "plain": exactly_once.Plan({"X"}, 1, [], [False]),
        }
    return {m: exactly_once.Plan(set(exactly_once.ROUNDS), args.rounds, FAULTS_BY_DB[args.db], [True, False]) for m in args.modes.split(",")}


def eo_table(results: list[tuple[str, str, str, Report, dict[str, Any]]]) -> None:
    """The exactly-once figures: orders per key, per host, database and mode."""
    rows = [(host, db, f) for part, host, db, _, f in results if part == "exactly-once"]
    if not rows:
        return
    print(f"\n{'exactly-once':<13} {'host':<7} {'db':<9} {'mode':<14} {'keys':>6} {'orders':>7} {'duplicates':>10} {'acked missing':>13} {'stall':<40}")
    for host, db, f in rows:
        if not f.get("supported"):
            support = f.get("support") or {}
            print(f"{'':<13} {host:<7} {db:<9} {'-':<14} {support.get('orders_in_database', 'not probed')}")
            continue
        for mode in exactly_once.MODES:
            part = f.get(mode)
            if part is None:
                continue
            if "not_supported" in part:
                print(f"{'':<13} {host:<7} {db:<9} {mode:<14} not supported: {part['not_supported']}")
                continue
            figs = [part["crash"]["orders"]] + [x["orders"] for x in (part.get("faults") or {}).values() if isinstance(x, dict) and x.get("orders")]
            figs += [x["check"] for x in part.get("stall", {}).values() if x.get("check")]
            total = exactly_once.merge(figs)
            stalls = "; ".join(f"renewal {k}: {x.get('takeovers', '?')} takeover, {x.get('orders', '?')} order(s)" if "not_supported" not in x else f"renewal {k}: not supported"
                               for k, x in part.get("stall", {}).items())
            print(f"{'':<13} {host:<7} {db:<9} {mode:<14} {total.get('keys', 0):>6} {total.get('orders', 0):>7} {total.get('duplicate_orders', 0):>10} "
                  f"{total.get('acknowledged_missing', 0):>13} {stalls:<40}")


def short_parallel(args: argparse.Namespace, selected: list[str]) -> int:
    """`short` with the hosts side by side (separate processes, databases and
    ports); PostgreSQL's restarts hit every server on it, so those faults
    run afterwards, one host at a time."""
    import subprocess

    began = time.time()
    children = []
    # The exactly-once part mostly waits out TTLs: it runs beside the others.
    groups = [p for p in (",".join(x for x in args.parts.split(",") if x != "exactly-once"), "exactly-once" if "exactly-once" in args.parts.split(",") else "") if p]
    for host in selected:
        for parts in groups:
            argv = [sys.executable, __file__, "short", "--db", args.db, "--host", host, "--ttl-ms", str(args.ttl_ms), "--seed", str(random.getrandbits(30)), "--parts", parts]
            argv += [f"--server-env={kv}" for kv in args.server_env]
            if args.db == "postgres":
                argv.append("--no-pg-faults")
            children.append((f"{host}/{args.db} {parts}", subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    ok = True
    for name, child in children:
        out, _ = child.communicate()
        print(f"---- {name} ----\n{out}", flush=True)
        ok = ok and child.returncode == 0
    if args.db == "postgres" and "dbfaults" in args.parts.split(","):
        for host in selected:
            argv = [sys.executable, __file__, "dbfaults", "--db", "postgres", "--host", host, "--ttl-ms", str(args.ttl_ms),
                    "--cycles", "1", "--fault-seconds", "1", "--outage-seconds", "1", "--clients", "4"]
            argv += [f"--server-env={kv}" for kv in args.server_env]
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            print(f"---- {host}/postgres faults ----\n{r.stdout}", flush=True)
            ok = ok and r.returncode == 0
    print(f"short {args.db}: {'ok' if ok else 'FAILED'} in {time.time() - began:.0f} s")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["short", "crash", "dbfaults", "soak", "renewal", "contract", "exactly-once", "failover"])
    p.add_argument("--host", choices=["rust", "python", "node"])
    p.add_argument("--hosts", default="rust,python,node")
    p.add_argument("--db", choices=["sqlite", "postgres"], default=None)
    p.add_argument("--ttl-ms", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--load-seconds", type=float, default=1.5, help="crash round E: load before the kill")
    p.add_argument("--fault-seconds", type=float, default=2.0)
    p.add_argument("--cycles", type=int, default=3, help="dbfaults: fault cycles per fault kind")
    p.add_argument("--outage-seconds", type=float, default=2.0)
    p.add_argument("--jobs", type=int, default=3, help="short: hosts run side by side (the PostgreSQL faults stay one at a time)")
    p.add_argument("--no-pg-faults", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parts", default=",".join(SHORT_PARTS), help=f"short: which parts ({', '.join(SHORT_PARTS)})")
    p.add_argument("--clients", type=int, default=0)
    p.add_argument("--procs", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0)
    p.add_argument("--minutes", type=float, default=0)
    p.add_argument("--age-every", type=float, default=0, help="soak: seconds between ageing a batch of completed rows past the retention")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="transactional,plain",
                   help="exactly-once: transactional (IDEMPOTENCY_TRANSACTIONAL=1) and/or plain (orders committed on their own: duplicates measured)")
    p.add_argument("--renewal-ttl-ms", type=int, default=400, help="renewal: the servers' pending TTL (their handlers run 2 to 4 times as long)")
    p.add_argument("--stall-ttl-ms", type=int, default=1000, help="exactly-once: the TTL of the stall probes (the handler runs 2.2 times as long)")
    p.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE", help="more environment for the servers (e.g. NODE_OPTIONS=--max-old-space-size=64)")
    p.add_argument("--sync", choices=["on", "off"], default="on", help="failover: synchronous replication to the replica")
    p.add_argument("--kinds", default="kill,readonly,multihost", help="failover: kill (primary gone), readonly (old primary read-only, pooled connections kept), multihost (host=a,b URL)")
    p.add_argument("--orders", choices=["plain", "exactly-once", "both"], default="both", help="failover kill: the plain servers, the exactly-once mode (ORDERS_IN_DATABASE=1 IDEMPOTENCY_TRANSACTIONAL=1), or both")
    p.add_argument("--pg-ports", default="25435,25436", help="failover: the primary's and the replica's ports")
    p.add_argument("--warm-seconds", type=float, default=2.0)
    p.add_argument("--after-seconds", type=float, default=6.0, help="failover: load after the switch")
    p.add_argument("--grace-seconds", type=float, default=3.0, help="failover: no 5xx for requests sent this long after the switch")
    args = p.parse_args()
    random.seed(args.seed or time.time_ns())
    if args.command == "failover":
        return failovers(args)
    if args.db is None:
        p.error("--db is required")
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
    parts = set(args.parts.split(","))
    unknown = parts - set(SHORT_PARTS)
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}")
    short = {part: args.command == "short" and part in parts for part in SHORT_PARTS}
    for host in selected:
        if args.command == "contract" or short["contract"]:
            add("contract", host, contract)
        if args.command == "crash" or short["crash"]:
            add("crash", host, lambda c, r: crashes(c, r, args.rounds, args.load_seconds))
        if args.command == "dbfaults" or (short["dbfaults"] and not (args.no_pg_faults and args.db == "postgres")):
            timing = short_timing if args.command == "short" else long_timing
            add("dbfaults", host, lambda c, r: faults(c, r, timing, args.clients or (4 if args.command == "short" else 6)))
        if short["load"]:
            add("load", host, lambda c, r: soak(c, r, args.seconds or 4, args.clients or 8, args.procs or 1, args.age_every or 1.0))
        if args.command == "renewal" or short["renewal"]:
            add("renewal", host, lambda c, r: renewal(c, r, args.seconds or (5 if args.command == "short" else 30), args.clients or 8, args.renewal_ttl_ms))
        if args.command == "exactly-once" or short["exactly-once"]:
            plans = eo_plans(args)
            timing = short_timing if args.command == "short" else long_timing
            add("exactly-once", host, lambda c, r: exactly_once.run(c, r, plans, load_seconds=1.0 if args.command == "short" else args.load_seconds,
                                                                   timing=timing, clients=args.clients or 4, stall_ttl=args.stall_ttl_ms))
        if args.command == "soak":
            seconds = args.minutes * 60 or args.seconds or 60
            add("soak", host, lambda c, r: soak(c, r, seconds, args.clients or 12, args.procs or 2, args.age_every or 30.0))
    path = write(args.command, results, args)
    ok = summarize(results)
    eo_table(results)
    print(f"figures: {path.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
