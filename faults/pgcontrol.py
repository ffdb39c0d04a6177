"""The PostgreSQL server the harness runs against (scripts/postgres.sh's
throwaway one, IDEMPOTENCY_PG_URL): connections through psycopg, the
servers' URLs, pg_ctl on its data directory, and terminating backends."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

# Errors that mean the harness's own session went away (the faults it injects
# hit it too): reconnect and retry. 08 connection exception, 57 operator
# intervention (admin shutdown, terminated backend).
RECONNECT_CLASSES = ("08", "57")


def admin_url() -> Optional[str]:
    """The server itself: the harness's own sessions (checks, row locks,
    pg_terminate_backend) never go through a pooler. scripts/pgbouncer.sh
    run sets IDEMPOTENCY_PG_DIRECT_URL to it; otherwise IDEMPOTENCY_PG_URL."""
    return os.environ.get("IDEMPOTENCY_PG_DIRECT_URL") or os.environ.get("IDEMPOTENCY_PG_URL") or None


def servers_url() -> Optional[str]:
    """What the example servers connect to: IDEMPOTENCY_PG_URL (a pooler in
    front of the server when scripts/pgbouncer.sh run set one)."""
    return os.environ.get("IDEMPOTENCY_PG_URL") or None


def pooler() -> Optional[str]:
    """The pool mode of the pooler the servers go through (transaction,
    session), or None when they talk to the server directly."""
    return os.environ.get("IDEMPOTENCY_PG_POOLER") or None


def connect(url: str, *, dbname: Optional[str] = None, application_name: str = "faults-harness", autocommit: bool = True) -> psycopg.Connection[Any]:
    """A psycopg connection to `url` (another database when `dbname`). The
    throwaway server trusts loopback; sslmode is libpq's default (prefer)."""
    extra: dict[str, Any] = {"application_name": application_name, "connect_timeout": 30}
    if dbname is not None:
        extra["dbname"] = dbname
    return psycopg.connect(url, autocommit=autocommit, **extra)


def should_reconnect(e: BaseException) -> bool:
    if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError, OSError)):
        code = getattr(e, "sqlstate", None)
        return code is None or code.startswith(RECONNECT_CLASSES)
    return False


def url_for(url: str, database: str, port: Optional[int] = None) -> str:
    """`url` naming another database (and, with `port`, another port on
    127.0.0.1: the TCP proxy), for the example servers (they take URLs)."""
    parts = urlsplit(url)
    parts = parts._replace(path="/" + database)
    if port is not None:
        userinfo = parts.netloc.rpartition("@")[0]
        parts = parts._replace(netloc=(userinfo + "@" if userinfo else "") + f"127.0.0.1:{port}")
    return parts.geturl()


def port_of(url: str) -> int:
    return int(conninfo_to_dict(url).get("port") or 5432)


def bindir() -> Optional[Path]:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parts[-3].split(".")], reverse=True)
    if found:
        return found[0].parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def datadir() -> Path:
    """scripts/postgres.sh's data directory (PG_DIR, default /tmp/idempotency-ledger-pg-$PG_PORT)."""
    url = admin_url()
    port = port_of(url) if url else 25432
    return Path(os.environ.get("PG_DIR") or f"/tmp/idempotency-ledger-pg-{port}")


def server_log() -> Path:
    return datadir() / "server.log"


def pg_ctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    found = bindir()
    if found is None:
        raise RuntimeError("pg_ctl not found")
    argv = [str(found / "pg_ctl"), "-D", str(datadir() / "data"), *args]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--"] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def create_database(url: str, name: str) -> None:
    with connect(url) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(url: str, name: str) -> None:
    try:
        with connect(url) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    except (OSError, psycopg.Error):
        pass
