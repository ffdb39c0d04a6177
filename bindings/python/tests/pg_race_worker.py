"""One Python process of the cross-language PostgreSQL race (host-test/pg_race.py).

    python pg_race_worker.py --url URL --schema SCHEMA --prefix PREFIX --keys N --name NAME --start-file PATH

The Rust worker (`pg-race-worker`) takes the same arguments and prints the
same lines. Each worker builds its ledger and its own mutation connection,
creates `<start-file>.ready.<name>` (so the driver knows it is ready), waits
for the start file (polling every 1 ms), then for k in 0..N in order handles
`POST /orders` with `Idempotency-Key: {prefix}-{k}` as principal `race`
(`content-type: application/json`, body `{"sku":"k{k}"}`). The mutation
inserts `(key, name)` into `race_mutations` (autocommit), sleeps 5 ms and
returns 201 `{"order":"{key}","by":"{name}"}`. One JSON line per request on
stdout: {"worker", "lang", "key", "status", "body", "executed"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from idempotency_ledger import Ledger, MutationResponse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--start-file", required=True)
    args = parser.parse_args(argv)

    conninfo = make_conninfo(args.url, options=f"-c search_path={args.schema}", application_name=f"pg-race-{args.name}")
    # The Rust crate's pool (one connection: this worker sends one request at
    # a time). A loaded 2-core box must not turn the race into 503s: wait
    # long for row locks.
    ledger = Ledger.postgres(conninfo, max_size=1, busy_timeout_ms=30_000)
    mutations = psycopg.connect(conninfo, autocommit=True)
    # Connected and the component instantiated before the start line: a
    # sweep at time 0 is a real batch that deletes nothing.
    ledger.sweep(now=0)

    with open(f"{args.start_file}.ready.{args.name}", "w"):
        pass
    while not os.path.exists(args.start_file):
        time.sleep(0.001)

    out = sys.stdout
    for k in range(args.keys):
        key = f"{args.prefix}-{k}"
        ran = False

        def mutation(key: str = key) -> MutationResponse:
            nonlocal ran
            ran = True
            mutations.execute("INSERT INTO race_mutations (key, worker) VALUES (%s, %s)", (key, args.name))
            time.sleep(0.005)
            return MutationResponse(201, [("content-type", "application/json")], json.dumps({"order": key, "by": args.name}, separators=(",", ":")))

        r = ledger.handle(
            "race", "POST", "/orders",
            [("Idempotency-Key", key), ("content-type", "application/json")],
            f'{{"sku":"k{k}"}}'.encode(), mutation,
        )
        line: dict[str, Any] = {
            "worker": args.name, "lang": "python", "key": key, "status": r.status,
            "body": r.body.decode("utf-8", "replace"), "executed": ran and r.outcome in ("executed", "taken-over"),
        }
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    out.flush()
    mutations.close()
    ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
