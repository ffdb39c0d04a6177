#!/usr/bin/env python3
"""Markdown rows from the harness's JSON figures (target/faults/*.json):
the newest soak, crash and dbfaults run per host and database, then the
newest exactly-once run per host and database (orders counted per key).

    python3 faults/summary.py [files...]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def n(x: Any) -> str:
    return f"{x:,}".replace(",", " ") if isinstance(x, int) else str(x)


def load(paths: list[Path]) -> dict[tuple[str, str, str], dict[str, Any]]:
    newest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in sorted(paths, key=lambda p: p.name):
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            key = (run["part"], run["host"], run["db"])
            newest[key] = {**run, "command": doc["command"], "git": doc.get("git"), "env": doc.get("env") or {}, "file": path.name}
    return newest


def soak_cell(r: dict[str, Any]) -> str:
    f = r["figures"]
    lat = f["latency_ms"]
    g = f.get("rss_growth") or {}
    per_min = [v for _, v in f.get("throughput_per_minute", [])]
    rng = f", {min(per_min):.0f}-{max(per_min):.0f}/s per minute" if per_min else ""
    return (
        f"{f['seconds'] / 60:.0f} min, {f['clients']} clients: {n(f['requests'])} requests ({f['throughput_rps']:.0f}/s{rng}); "
        f"p50 {lat['p50']} ms, p99 {lat['p99']} ms; "
        f"RSS {g.get('after_warmup_mib')} → {g.get('end_mib')} MiB after warm-up, peak {f['rss_peak_mib']} MiB"
    )


def nothing_lost(r: dict[str, Any]) -> str:
    f = r["figures"]
    t = f["tally"]
    return (
        f"{n(f['executions_counted'])} executions counted = {n(t['fresh'])} fresh answers for {n(t['executed_keys'])} keys; "
        f"{n(t['replays'])} replays identical; 5xx {t['5xx']}; rows {n(f['rows_after'])} (+{n(f['aged_rows_swept'])} aged past the retention, all swept), 0 pending"
    )


def bad_inputs(r: dict[str, Any]) -> str:
    t = r["figures"]["tally"]
    return f"{n(t['reused'])} reuses with another payload (409), {n(t['in_progress'])} duplicates in flight (409 in progress)"


def crash_cell(r: dict[str, Any]) -> str:
    f = r["figures"]
    t = f["tally"]
    e_keys = sum(e["keys"] for e in f["e"])
    e_replays = sum(e["tally"]["replays"] for e in f["e"])
    e_pending = sum(e["pending_at_restart"] for e in f["e"])
    e_answered = sum(e["answered_before_kill"] for e in f["e"])
    return (
        f"{t['kills']} SIGKILLs ({f['rounds']}× rounds A, B, E): {t['takeovers']} takeovers (generation + 1), {t['in_ttl_409']} in-TTL retries answered 409 and ran nothing, "
        f"{t['replays_checked'] + e_replays} replays compared with the first answer ({t['replays_checked']} byte for byte in A/B); "
        f"under load (E) {e_keys} keys, {e_answered} answered before the kill and replayed after it, {e_pending} left pending by the kill and taken over once; "
        f"{t['lost_completions']} completions lost to the kill in A/B and taken over once; "
        + (f"{t['orphan_completions_committed']} completions committed by PostgreSQL after the kill; " if r["db"] == "postgres" else "")
        + f"{n(f['executions_counted'])} executions counted across restarts"
    )


def faults_cell(r: dict[str, Any]) -> str:
    parts = []
    for name, f in r["figures"].items():
        if not isinstance(f, dict):
            continue
        if "not_run" in f:
            parts.append(f"{name}: not run ({f['not_run']})")
        elif "answers_during_fault" in f:
            bad = {k: v for k, v in f["answers_during_fault"].items() if k != "ok"}
            parts.append(
                f"{name} ×{f.get('faults_injected', 1)} ({f['fault_seconds']} s): {n(f['requests'])} requests, "
                + ", ".join(f"{v} × {k}" for k, v in bad.items())
                + f"; {f['takeovers_in_reconcile']} takeovers after the TTL; {n(f['executions'])} executions for {n(f['keys'])} keys"
            )
        elif "at_start" in f:
            start = f["at_start"].split(":")[0] if f["at_start"].startswith("refused") else f["at_start"]
            parts.append(f"{name}: {start}, saying the file is read-only; {f['after_chown']} once writable")
    return "; ".join(parts)


def faults_survived(crash: dict[str, Any] | None, dbfaults: dict[str, Any] | None) -> str:
    cells = []
    if crash:
        cells.append(crash_cell(crash) + f" ({len(crash['violations'])} violations)")
    if dbfaults:
        cells.append(faults_cell(dbfaults) + f" ({len(dbfaults['violations'])} violations)")
    return "<br>".join(cells) or "not run"


def make_command(r: dict[str, Any]) -> str:
    """The make target that reruns what faults/run.py ran (the run.py command
    itself when the Rust server was not the release build make faults uses)."""
    argv = r["command"].split()
    opt = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--")}
    env = " ".join(f"{k}={v}" for k, v in (r.get("env") or {}).items()) if r["host"] == "rust" else ""
    if env and r["part"] in ("crash", "dbfaults"):
        pg = "./scripts/postgres.sh run -- " if r["db"] == "postgres" else ""
        extra = f" --rounds {opt['--rounds']}" if "--rounds" in opt else f" --cycles {opt.get('--cycles', 3)}"
        return f"{env} {pg}bindings/python/.venv/bin/python faults/run.py {r['part']} --host {r['host']} --db {r['db']}{extra}"
    if r["part"] == "soak":
        env = f" SERVER_ENV={opt['--server-env']}" if "--server-env" in opt else ""
        return f"make soak HOST={r['host']} DB={r['db']} MINUTES={opt.get('--minutes', 10)}{env}"
    return f"make faults HOST={r['host']} DB={r['db']}" + (f" ROUNDS={opt['--rounds']}" if "--rounds" in opt else f" CYCLES={opt.get('--cycles', 3)}")


def commands(*runs: dict[str, Any] | None) -> str:
    return "<br>".join(f"`{make_command(r)}` ({r['part']}, at {r['git']})" for r in runs if r)


ROUND_NAMES = {"X": "exit after the write (X-Exit-After-Write)", "H": "SIGKILL with the completion held back", "W": "SIGKILL when the write shows",
               "R": "SIGKILL at a random instant in the handler", "E": "SIGKILL under load"}


def eo_orders(f: dict[str, Any]) -> str:
    dup = f.get("duplicate_orders", 0)
    return f"{n(f.get('keys', 0))} keys, {n(f.get('orders', 0))} orders, **{dup} duplicate{'s' if dup != 1 else ''}**, {f.get('acknowledged_missing', 0)} acknowledged missing"


def eo_crash_cell(c: dict[str, Any]) -> str:
    rounds = ", ".join(f"{r} ({ROUND_NAMES.get(r, r)})" for r in c["rounds"])
    t = dict(c.get("tally", {}))
    for k, v in c.get("outcomes", {}).items():  # older runs told each E round as an outcome
        m = re.match(r"E: (\d+) keys, (\d+) pending", k)
        if m:
            t["e_keys"] = t.get("e_keys", 0) + int(m.group(1)) * v
            t["e_pending_at_restart"] = t.get("e_pending_at_restart", 0) + int(m.group(2)) * v
    outcomes = "; ".join(f"{k}" + (f" ×{v}" if v > 1 else "") for k, v in sorted(c.get("outcomes", {}).items()) if not k.startswith("E:"))
    load = f"; E: {n(t['e_keys'])} keys under load, {t.get('e_pending_at_restart', 0)} pending at the restarts" if "e_keys" in t else ""
    return (f"{c.get('repeat', 1)}× {rounds}: {t.get('kills', 0)} SIGKILLs, {c.get('exits_after_write', 0)} exits after the write, "
            f"{t.get('takeovers', 0)} takeovers; {outcomes}{load}; {eo_orders(c['orders'])}")


def eo_faults_cell(fs: dict[str, Any]) -> str:
    parts = []
    for name, f in fs.items():
        if not isinstance(f, dict) or "not_run" in f:
            parts.append(f"{name}: not run ({f.get('not_run') if isinstance(f, dict) else f})")
            continue
        bad = ", ".join(f"{v} × {k}" for k, v in f.get("answers_during_fault", {}).items() if k != "ok")
        parts.append(f"{name} ×{f.get('faults_injected', 1)} ({f.get('fault_seconds')} s): {n(f.get('requests', 0))} requests, {bad}; {f.get('takeovers_in_reconcile', 0)} takeovers after the TTL; "
                     + eo_orders(f.get("orders") or {}) + (f"; {f['orders'].get('stored_order_not_written')} stored 500 order_not_written" if (f.get("orders") or {}).get("stored_order_not_written") else ""))
    return "<br>".join(parts) or "not run"


def eo_stall_cell(st: dict[str, Any]) -> str:
    out = []
    for setting, f in st.items():
        if "not_supported" in f:
            out.append(f"renewal {setting}: not supported ({f['not_supported']})")
            continue
        retry = (f.get("retry") or "").split(" ")[0]
        first = (f.get("first") or "").split(" ")[0]
        out.append(f"renewal {setting} (TTL {f.get('ttl_ms')} ms, handler {f.get('delay_ms')} ms): {'renewed' if f.get('renewed_during_stall') else 'not renewed'}, "
                   f"the retry got {retry}, the stalled owner {first}; {f.get('takeovers')} takeover, {f.get('orders')} order{'s' if f.get('orders') != 1 else ''}")
    return "<br>".join(out) or "not run"


def eo_command(r: dict[str, Any]) -> str:
    argv = r["command"].split()
    serve = r["env"].get("FAULTS_RUST_SERVE")
    env = f"FAULTS_RUST_SERVE={serve} " if serve and r["host"] == "rust" else ""
    if "exactly-once" in argv:
        opt = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--")}
        extra = "".join(f" {k} {v}" for k, v in opt.items() if k in ("--rounds", "--cycles", "--modes"))
        pg = "./scripts/postgres.sh run -- " if r["db"] == "postgres" else ""
        return f"`{env}{pg}bindings/python/.venv/bin/python faults/run.py exactly-once --host {r['host']} --db {r['db']}{extra}` (at {r['git']})"
    return f"`{env}make test-faults` (short, at {r['git']})"


def eo_table(runs: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    eo = {(h, d): r for (part, h, d), r in runs.items() if part == "exactly-once"}
    if not eo:
        return
    print()
    print("| host | database | mode | crash points | database faults | stall past the TTL | reproduce |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (host, db), r in sorted(eo.items(), key=lambda kv: (kv[0][0] != "rust", kv[0][0] != "python", kv[0][1] != "sqlite", kv[0])):
        f = r["figures"]

        def verdict(mode: str) -> str:
            # A violation naming the other mode belongs to that mode's row.
            other = "plain" if mode == "transactional" else "transactional"
            mine = [v for v in r["violations"] if f" {other}:" not in v and f" {other} " not in v]
            kinds: dict[str, int] = {}
            for v in mine:
                kind = v.rsplit(": ", 1)[-1].split("\n")[0][:120]
                kinds[kind] = kinds.get(kind, 0) + 1
            return "" if not mine else f" **{len(mine)} violations: " + "; ".join(f"{c} × {k}" for k, c in kinds.items()) + "**"

        if not f.get("supported"):
            print(f"| {host} | {db} | | not supported: {(f.get('support') or {}).get('orders_in_database')}{verdict('')} | | | {eo_command(r)} |")
            continue
        for mode in ("transactional", "plain"):
            m = f.get(mode)
            if m is None:
                continue
            if "not_supported" in m:
                print(f"| {host} | {db} | {mode} | not supported: {m['not_supported']} | | | {eo_command(r)} |")
                continue
            print(f"| {host} | {db} | {mode} | {eo_crash_cell(m['crash'])}{verdict(mode)} | {eo_faults_cell(m.get('faults') or {})} | {eo_stall_cell(m.get('stall') or {})} | {eo_command(r)} |")


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "target" / "faults").glob("*.json"))
    runs = load(paths)
    print("| host | database | load held | faults survived | bad inputs tried | nothing lost | reproduce |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    pairs = sorted({(host, db) for (_, host, db) in runs}, key=lambda hd: (hd[0] != "rust", hd[0] != "python", hd[1] != "sqlite", hd))
    for host, db in pairs:
        soak, crash, dbf = (runs.get((part, host, db)) for part in ("soak", "crash", "dbfaults"))
        if not soak:
            continue
        verdict = "" if not soak["violations"] else " **VIOLATIONS: " + "; ".join(soak["violations"]) + "**"
        print(
            f"| {host} | {db} | {soak_cell(soak)}{verdict} | {faults_survived(crash, dbf)} | {bad_inputs(soak)} | "
            f"{nothing_lost(soak)} | {commands(soak, crash, dbf)} |"
        )
    # Crash and fault runs without a soak of their own (a rerun at depth).
    lone = [(h, d) for h, d in pairs if not runs.get(("soak", h, d))]
    if lone:
        print()
        print("| host | database | faults survived | reproduce |")
        print("| --- | --- | --- | --- |")
        for host, db in lone:
            crash, dbf = runs.get(("crash", host, db)), runs.get(("dbfaults", host, db))
            if crash or dbf:
                print(f"| {host} | {db} | {faults_survived(crash, dbf)} | {commands(crash, dbf)} |")
    eo_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
