"""The cross-language race on one PostgreSQL ledger: Rust and Python
processes send the same keyed requests at the same moment; every key's
mutation runs exactly once, and every answer is the executor's response or a
409 (in progress).

    bindings/python/.venv/bin/python host-test/pg_race.py --rust-worker target/debug/pg-race-worker [--keys 200]
    bindings/python/.venv/bin/python host-test/pg_race.py --python-only          # 4 Python workers
    bindings/python/.venv/bin/python host-test/pg_race.py --rust-worker target/debug/pg-race-worker \
        --js-worker bindings/js/test/pg-race-worker.js                           # 2 Rust + 2 Python + 2 JS

Needs the Python venv (psycopg, idempotency_ledger) and a server
(--url, default $IDEMPOTENCY_PG_URL; scripts/postgres.sh run -- ... sets it).

The driver creates a fresh schema, migrates the ledger ONCE (Python
`Ledger.migrate`), creates `race_mutations(key, worker)`, starts 4 OS
processes (rust, python, rust, python; or 4 Python ones; with --js-worker a JS
process after each Python one, 6 in all, or 4 without --rust-worker), waits until each
is ready, creates the start file, waits for them, then checks:

- each key has exactly one row in race_mutations (one mutation per key);
- every process answered every key, in order, with 201 and exactly the
  executor's body, or 409; `executed` is claimed exactly by the executor;
- with Rust (JS) workers, at least one process of each language executed a key;
- every ledger row is completed, and a final replay of every key from Python
  returns the executor's body without running anything.

A worker is ready when it creates `<start-file>.ready.<name>` (every worker
does, once its ledger is connected); one that has not after --ready-timeout is
started anyway, and noted. (Idleness is no sign of readiness: on a loaded
machine a worker still loading the component gets no CPU for seconds.) Prints
a one-paragraph summary; exits 1 on any violation (each one printed), 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON_WORKER = ROOT / "bindings" / "python" / "tests" / "pg_race_worker.py"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Cross-language Idempotency-Key race on PostgreSQL")
    p.add_argument("--url", default=os.environ.get("IDEMPOTENCY_PG_URL", ""), help="PostgreSQL URL (default $IDEMPOTENCY_PG_URL)")
    p.add_argument("--rust-worker", help="path of the Rust pg-race-worker binary")
    p.add_argument("--python-only", action="store_true", help="4 Python workers (no Rust worker needed)")
    p.add_argument("--python-worker", default=str(PYTHON_WORKER), help="the Python worker script (run with this interpreter)")
    p.add_argument("--js-worker", help="the JS worker script (bindings/js/test/pg-race-worker.js), run with --node")
    p.add_argument("--node", default=shutil.which("node") or "node", help="the node binary for --js-worker (default: node on PATH)")
    p.add_argument("--keys", type=int, default=200, help="keys per run (default 200)")
    p.add_argument("--prefix", default="", help="key prefix (default: random)")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for the workers to get ready")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the workers may take after the start")
    p.add_argument("--keep-schema", action="store_true", help="leave the race schema in place for inspection")
    args = p.parse_args(argv)
    if not args.url:
        p.error("no PostgreSQL URL: pass --url or set IDEMPOTENCY_PG_URL (scripts/postgres.sh run -- ...)")
    if not args.python_only and not args.rust_worker and not args.js_worker:
        p.error("pass --rust-worker PATH and/or --js-worker PATH (or --python-only)")
    if args.python_only and args.js_worker:
        p.error("--python-only runs Python workers only; drop --js-worker")
    if args.js_worker and not os.path.isfile(args.js_worker):
        p.error(f"--js-worker {args.js_worker} is not a file")
    if args.rust_worker and not os.access(args.rust_worker, os.X_OK):
        p.error(f"--rust-worker {args.rust_worker} is not an executable file (build it first)")
    if args.keys < 1:
        p.error("--keys must be >= 1")
    return args


def _wait_ready(workers: list[dict[str, Any]], start_file: Path, timeout: float) -> list[str]:
    """Waits until every worker created its ready file; returns notes about
    the ones that had not by the timeout."""
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    while len(ready) < len(workers) and time.monotonic() < deadline:
        for w in workers:
            name = w["name"]
            if name in ready:
                continue
            if w["proc"].poll() is not None:
                raise SystemExit(f"pg_race: worker {name} exited with {w['proc'].returncode} before the start:\n{w['proc'].stderr.read()}")
            if Path(f"{start_file}.ready.{name}").exists():
                ready.add(name)
        time.sleep(0.02)
    return [f"{w['name']}: not ready after {timeout:.0f} s; started anyway" for w in workers if w["name"] not in ready]


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import psycopg
    from psycopg.conninfo import make_conninfo

    from idempotency_ledger import Ledger, MutationResponse

    schema = f"race_{uuid.uuid4().hex[:12]}"
    prefix = args.prefix or f"race-{uuid.uuid4().hex[:6]}"
    conninfo = make_conninfo(args.url, options=f"-c search_path={schema}")
    admin = psycopg.connect(args.url, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    violations: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="pg-race-"))
    try:
        with Ledger.postgres(conninfo, max_size=1) as ledger:
            ledger.migrate()  # once, before any worker starts
        admin.execute(f'CREATE TABLE "{schema}".race_mutations (key TEXT NOT NULL, worker TEXT NOT NULL)')

        if args.python_only:
            langs = ["python"] * 4
        else:
            pair = (["rust"] if args.rust_worker else []) + ["python"] + (["js"] if args.js_worker else [])
            langs = pair * 2
        start_file = tmp / "start"
        workers: list[dict[str, Any]] = []
        for i, lang in enumerate(langs, 1):
            name = f"{lang}-{i}"
            cli = ["--url", args.url, "--schema", schema, "--prefix", prefix, "--keys", str(args.keys), "--name", name,
                   "--start-file", str(start_file)]
            if lang == "rust":
                cmd = [args.rust_worker, *cli]
            elif lang == "js":
                cmd = [args.node, str(Path(args.js_worker).resolve()), *cli]
            else:
                cmd = [sys.executable, args.python_worker, *cli]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            workers.append({"name": name, "lang": lang, "proc": proc})
        notes = _wait_ready(workers, start_file, args.ready_timeout)
        started = time.monotonic()
        start_file.touch()
        outputs: dict[str, tuple[int, str, str]] = {}
        for w in workers:
            try:
                out, err = w["proc"].communicate(timeout=max(1.0, args.timeout - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                w["proc"].kill()
                out, err = w["proc"].communicate()
                violations.append(f"{w['name']} did not finish within {args.timeout:.0f} s")
            outputs[w["name"]] = (w["proc"].returncode, out, err)
        duration = time.monotonic() - started

        # ---- the database: exactly one mutation per key
        keys = [f"{prefix}-{k}" for k in range(args.keys)]
        executors: dict[str, list[str]] = defaultdict(list)
        for key, worker in admin.execute(f'SELECT key, worker FROM "{schema}".race_mutations').fetchall():
            executors[key].append(worker)
        for key in keys:
            if len(executors.get(key, [])) != 1:
                violations.append(f"{key}: {len(executors.get(key, []))} mutations ({executors.get(key, [])}), expected exactly 1")
        for key in set(executors) - set(keys):
            violations.append(f"unexpected mutation row for key {key!r}")
        mutations = sum(len(v) for v in executors.values())

        # ---- every process's every answer
        lang_of = {w["name"]: w["lang"] for w in workers}
        tally: Counter[str] = Counter()
        executed_by: Counter[str] = Counter()
        for w in workers:
            name = w["name"]
            code, out, err = outputs[name]
            if code != 0:
                violations.append(f"{name} exited with {code}: {err.strip()[-500:]}")
            lines = [line for line in out.splitlines() if line.strip()]
            if len(lines) != len(keys):
                violations.append(f"{name} printed {len(lines)} lines for {len(keys)} keys")
            for k, line in enumerate(lines):
                try:
                    rec = json.loads(line)
                except ValueError:
                    violations.append(f"{name}: not a JSON line: {line[:200]!r}")
                    continue
                key = keys[k] if k < len(keys) else None
                if set(rec) != {"worker", "lang", "key", "status", "body", "executed"}:
                    violations.append(f"{name}: line {k} has fields {sorted(rec)}")
                    continue
                if (rec["worker"], rec["lang"], rec["key"]) != (name, lang_of[name], key):
                    violations.append(f"{name}: line {k} is {rec['worker']}/{rec['lang']}/{rec['key']}, expected {name}/{lang_of[name]}/{key}")
                    continue
                owners = executors.get(key, [])
                owner = owners[0] if len(owners) == 1 else None
                expected_body = json.dumps({"order": key, "by": owner}, separators=(",", ":")) if owner else None
                if rec["executed"]:
                    executed_by[name] += 1
                    if owner != name:
                        violations.append(f"{name} claims it executed {key}, but race_mutations says {owners}")
                elif owner == name:
                    violations.append(f"{name} ran the mutation for {key} but did not report executed")
                if rec["status"] == 201 and rec["body"] == expected_body:
                    tally["executed" if rec["executed"] else "replayed"] += 1
                elif rec["status"] == 409:
                    tally["409"] += 1
                    if rec["executed"]:
                        violations.append(f"{name}: 409 for {key} although it executed it")
                else:
                    violations.append(f"{name}: {key} answered {rec['status']} {rec['body'][:200]!r}, expected 201 {expected_body!r} or 409")
        by_lang = Counter({lang: sum(n for w, n in executed_by.items() if lang_of[w] == lang) for lang in ("rust", "python", "js")})
        if not args.python_only:
            for lang in sorted(set(langs)):
                if by_lang[lang] == 0:
                    violations.append(f"no {lang} process executed any key (the race did not mix the languages)")

        # ---- the ledger rows, and a final replay of every key from Python
        states = Counter(r[0] for r in admin.execute(f'SELECT status FROM "{schema}".idempotency_keys').fetchall())
        if states != Counter({"completed": len(keys)}):
            violations.append(f"ledger rows by status: {dict(states)}, expected {len(keys)} completed")
        replays = 0
        with Ledger.postgres(conninfo, max_size=1) as ledger:
            for k, key in enumerate(keys):
                ran: list[str] = []

                def must_not_run(key: str = key) -> MutationResponse:
                    ran.append(key)
                    return MutationResponse(500, [], "the replay ran the mutation")

                r = ledger.handle("race", "POST", "/orders", [("Idempotency-Key", key), ("content-type", "application/json")],
                                  f'{{"sku":"k{k}"}}'.encode(), must_not_run)
                owners = executors.get(key, [])
                expected = json.dumps({"order": key, "by": owners[0]}, separators=(",", ":")) if len(owners) == 1 else None
                if ran or r.outcome != "replayed" or r.status != 201 or r.body.decode() != expected:
                    violations.append(f"final replay of {key}: {r.outcome} {r.status} {r.body[:200]!r}, expected 201 {expected!r}")
                else:
                    replays += 1

        workers_desc = " + ".join(f"{langs.count(lang)} {name}" for lang, name in (("rust", "Rust"), ("python", "Python"), ("js", "JS")) if langs.count(lang))
        per_worker = ", ".join(f"{w['name']} {executed_by[w['name']]}" for w in workers)
        print(
            f"pg race: {len(keys)} keys x {len(workers)} processes ({workers_desc}) on one PostgreSQL ledger in {duration:.2f} s: "
            f"{mutations} mutations (exactly one per key: {'yes' if mutations == len(keys) and not any(len(v) != 1 for v in executors.values()) else 'NO'}), "
            f"executed by rust {by_lang['rust']} / python {by_lang['python']} / js {by_lang['js']} ({per_worker}); "
            f"{tally['replayed']} concurrent replays with the executor's body, {tally['409']} 409 in-progress; "
            f"final Python replay of {replays}/{len(keys)} keys returned the executor's body; "
            f"{len(violations)} violation(s)."
        )
        for note in notes:
            print(f"pg race: note: {note}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not args.keep_schema:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()
    for v in violations[:50]:
        print(f"pg race: VIOLATION: {v}", file=sys.stderr)
    if len(violations) > 50:
        print(f"pg race: ... and {len(violations) - 50} more violations", file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
