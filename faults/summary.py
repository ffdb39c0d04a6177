#!/usr/bin/env python3
"""Markdown rows from the harness's JSON figures (target/faults/*.json):
the newest soak, crash and dbfaults run per host and database.

    python3 faults/summary.py [files...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def n(x: Any) -> str:
    return f"{x:,}".replace(",", " ") if isinstance(x, int) else str(x)


def load(paths: list[Path]) -> dict[tuple[str, str, str], dict[str, Any]]:
    newest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in sorted(paths):
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            key = (run["part"], run["host"], run["db"])
            newest[key] = {**run, "command": doc["command"], "git": doc.get("git"), "file": path.name}
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
    """The make target that reruns what faults/run.py ran."""
    argv = r["command"].split()
    opt = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--")}
    if r["part"] == "soak":
        env = f" SERVER_ENV={opt['--server-env']}" if "--server-env" in opt else ""
        return f"make soak HOST={r['host']} DB={r['db']} MINUTES={opt.get('--minutes', 10)}{env}"
    return f"make faults HOST={r['host']} DB={r['db']}" + (f" ROUNDS={opt['--rounds']}" if "--rounds" in opt else f" CYCLES={opt.get('--cycles', 3)}")


def commands(*runs: dict[str, Any] | None) -> str:
    return "<br>".join(f"`{make_command(r)}` ({r['part']}, at {r['git']})" for r in runs if r)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
