"""What every part of the harness shares: the three example servers as real
processes, a loopback HTTP client, the ledger's rows read directly (SQLite
read-only, PostgreSQL through pgwire), a TCP proxy that can hold a flight,
and the checker that collects violations.

Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import string
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pgwire

ROOT = Path(__file__).resolve().parents[1]
REPLAY_HEADER = "Idempotency-Replayed"

# ---------------------------------------------------------------- hosts


@dataclass(frozen=True)
class Host:
    name: str
    argv: tuple[str, ...]
    cwd: Path
    # better-sqlite3 runs on Node's main thread: a batch waiting on SQLite's
    # busy timeout blocks the whole event loop (GET /orders/count included).
    blocks_on_sqlite_lock: bool = False


def rust_binary() -> Path:
    """`make serve-rust` runs target/release/examples/serve; FAULTS_RUST_PROFILE=debug
    uses the debug build `make test-rust` already made (CI time)."""
    profile = os.environ.get("FAULTS_RUST_PROFILE", "release")
    return ROOT / "target" / profile / "examples" / "serve"


def hosts() -> dict[str, Host]:
    node = shutil.which("node") or "node"
    return {
        "rust": Host("rust", (str(rust_binary()),), ROOT),
        "python": Host("python", (str(ROOT / "bindings/python/.venv/bin/python"), "examples/server.py"), ROOT / "bindings/python"),
        "node": Host("node", (node, "examples/node/server.js"), ROOT / "bindings/js", blocks_on_sqlite_lock=True),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StartError(RuntimeError):
    def __init__(self, message: str, returncode: Optional[int]) -> None:
        super().__init__(message)
        self.returncode = returncode


class Server:
    """One example server process we hold the PID of. `restart()` starts a
    new process on the same database and port."""

    def __init__(self, host: Host, database: str, env: dict[str, str], log_dir: Path, *, user: Optional[str] = None) -> None:
        self.host = host
        self.database = database
        self.env = dict(env)
        self.port = free_port()
        self.log_dir = log_dir
        self.user = user
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0
        self.kills = 0
        self.start_seconds: list[float] = []
        self.log_path = log_dir / f"{host.name}-{self.port}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "Server":
        env = {**os.environ, "PORT": str(self.port), "DATABASE_URL": self.database, **self.env}
        env.pop("IDEMPOTENCY_PG_URL", None)
        argv = list(self.host.argv)
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            argv = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--"] + argv
        log = open(self.log_path, "ab")
        log.write(f"\n==== start {self.starts + 1} (port {self.port}, database {self.database}) ====\n".encode())
        log.flush()
        began = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=self.host.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.starts += 1
        deadline = began + timeout
        while True:
            if self.proc.poll() is not None:
                raise StartError(f"{self.host.name} server exited with {self.proc.returncode} at start:\n{self.log_tail()}", self.proc.returncode)
            try:
                status, _ = get_count_raw(self.port, timeout=0.5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.host.name} server did not answer within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.02)
        self.start_seconds.append(time.monotonic() - began)
        return self

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def restart(self) -> "Server":
        return self.start()

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """SIGTERM; the exit code (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_kib(self) -> Optional[int]:
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def main_thread_syscall(self) -> Optional[int]:
        """The syscall the main thread is blocked in (/proc/PID/syscall), or None if running."""
        try:
            with open(f"/proc/{self.pid}/syscall") as f:
                first = f.read().split()[0]
            return None if first == "running" else int(first)
        except (OSError, ValueError, IndexError):
            return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def count(self, timeout: float = 5.0) -> int:
        status, body = get_count_raw(self.port, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"GET /orders/count answered {status}")
        return int(json.loads(body)["count"])


# ---------------------------------------------------------------- HTTP


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names; repeats joined by ", "
    body: bytes
    sent: float  # time.time() before the request
    received: float

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get(REPLAY_HEADER.lower()) == "true"

    @property
    def error(self) -> Optional[str]:
        if self.status < 300:
            return None
        try:
            value = self.json()
        except ValueError:
            return None
        if isinstance(value, dict):
            return value.get("error") or value.get("code")
        return None

    def brief(self) -> str:
        return f"{self.status} {self.body[:160]!r}"


def get_count_raw(port: int, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/orders/count")
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def post_order(
    port: int,
    key: Optional[str],
    body: bytes,
    *,
    principal: Optional[str] = "alice",
    delay_ms: Optional[int] = None,
    timeout: float = 60.0,
    conn: Optional[http.client.HTTPConnection] = None,
    extra: Optional[dict[str, str]] = None,
) -> Answer:
    """POST /orders. Raises OSError / http.client exceptions when no answer came."""
    path = "/orders" if delay_ms is None else f"/orders?delay_ms={delay_ms}"
    headers = {"Content-Type": "application/json"}
    if principal is not None:
        headers["Authorization"] = f"Bearer {principal}"
    if key is not None:
        headers["Idempotency-Key"] = key
    if extra:
        headers.update(extra)
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    sent = time.time()
    try:
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        received = time.time()
        hdrs: dict[str, str] = {}
        for name, value in r.getheaders():
            n = name.lower()
            hdrs[n] = f"{hdrs[n]}, {value}" if n in hdrs else value
        if r.getheader("connection", "").lower() == "close" and not own:
            c.close()
        return Answer(r.status, hdrs, data, sent, received)
    finally:
        if own:
            c.close()


class Background:
    """A request in a thread: `.answer` or `.failure` once joined."""

    def __init__(self, fn: Callable[[], Answer]) -> None:
        self.answer: Optional[Answer] = None
        self.failure: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Answer]) -> None:
        try:
            self.answer = fn()
        except BaseException as e:  # noqa: BLE001 - recorded, examined by the scenario
            self.failure = e

    def join(self, timeout: Optional[float] = None) -> "Background":
        self.thread.join(timeout)
        return self

    def done(self) -> bool:
        return not self.thread.is_alive()


def random_key(prefix: str, n: int = 12) -> str:
    return prefix + "-" + "".join(random.choice(string.ascii_letters + string.digits) for _ in range(n))


def payload(tag: str, size: int = 0) -> bytes:
    value: dict[str, Any] = {"sku": tag, "qty": random.randint(1, 9)}
    if size:
        value["pad"] = "x" * size
    return json.dumps(value, separators=(",", ":")).encode()


# ---------------------------------------------------------------- ledgers


@dataclass
class Row:
    principal: str
    key: str
    fingerprint: str
    status: str
    generation: int
    response_status: Optional[int]
    response_body: Optional[str]
    response_headers: Optional[str]
    created_at: int
    updated_at: int


COLUMNS = "principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at"


def _row(values: Any) -> Row:
    p, k, f, s, g, rs, rb, rh, c, u = values
    return Row(p, k, f, s, int(g), None if rs is None else int(rs), rb, rh, int(c), int(u))


class Ledger:
    """The database a server runs on, and the harness's view of its rows."""

    kind = ""

    def url(self) -> str:
        raise NotImplementedError

    def rows(self) -> list[Row]:
        raise NotImplementedError

    def row(self, principal: str, key: str) -> Optional[Row]:
        for r in self.rows_for([(principal, key)]):
            return r
        return None

    def rows_for(self, ids: list[tuple[str, str]]) -> list[Row]:
        wanted = set(ids)
        return [r for r in self.rows() if (r.principal, r.key) in wanted]

    def count(self) -> int:
        return len(self.rows())

    def backdate(self, ids: list[tuple[str, str]], by_ms: int) -> int:
        """Moves rows' updated_at back (past the retention, for the sweep)."""
        raise NotImplementedError

    def stats(self) -> tuple[int, int]:
        """(rows, rows not completed), counted by the database."""
        rows = self.rows()
        return len(rows), sum(1 for r in rows if r.status != "completed")

    def close(self) -> None:
        pass


class SqliteLedger(Ledger):
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path

    def url(self) -> str:
        return str(self.path)

    def _connect(self) -> sqlite3.Connection:
        # Read-only: the harness never writes the server's file (except backdate).
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)

    def rows(self) -> list[Row]:
        if not self.path.exists():
            return []
        for attempt in range(50):
            conn = self._connect()
            try:
                return [_row(v) for v in conn.execute(f"SELECT {COLUMNS} FROM idempotency_keys")]
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return []
                if attempt == 49:
                    raise
                time.sleep(0.1)
            finally:
                conn.close()
        return []

    def rows_for(self, ids: list[tuple[str, str]]) -> list[Row]:
        if not ids:
            return []
        conn = self._connect()
        try:
            out = []
            for p, k in ids:
                for v in conn.execute(f"SELECT {COLUMNS} FROM idempotency_keys WHERE principal = ? AND key = ?", (p, k)):
                    out.append(_row(v))
            return out
        finally:
            conn.close()

    def count(self) -> int:
        return self.stats()[0]

    def stats(self) -> tuple[int, int]:
        if not self.path.exists():
            return 0, 0
        conn = self._connect()
        try:
            total, pending = conn.execute("SELECT count(*), count(*) FILTER (WHERE status <> 'completed') FROM idempotency_keys").fetchone()
            return int(total), int(pending)
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return 0, 0
            raise
        finally:
            conn.close()

    def backdate(self, ids: list[tuple[str, str]], by_ms: int) -> int:
        # The one write the harness makes to a SQLite ledger: the example
        # servers take no retention setting, so rows are aged past the
        # default 24 h instead, for the servers' own sweeps to delete.
        conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            n = 0
            for p, k in ids:
                n += conn.execute("UPDATE idempotency_keys SET updated_at = updated_at - ? WHERE principal = ? AND key = ? AND status = 'completed'", (by_ms, p, k)).rowcount
            conn.execute("COMMIT")
            return n
        finally:
            conn.close()


class PgLedger(Ledger):
    """A fresh database on the PostgreSQL server of IDEMPOTENCY_PG_URL."""

    kind = "postgres"

    def __init__(self, admin_url: str, name: str, create: bool = True) -> None:
        self.admin_url = admin_url
        self.name = name
        if create:
            with pgwire.Connection(admin_url) as c:
                c.query(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                c.query(f'CREATE DATABASE "{name}"')
        self._conn: Optional[pgwire.Connection] = None
        self.lock = threading.Lock()

    def url(self, port: Optional[int] = None) -> str:
        url = pgwire.url_with_database(self.admin_url, self.name)
        if port is not None:
            params = pgwire.parse_url(url)
            url = url.replace(f"{params['host']}:{params['port']}", f"127.0.0.1:{port}", 1)
        return url

    def connect(self, application_name: str = "faults-harness") -> pgwire.Connection:
        return pgwire.Connection(self.admin_url, database=self.name, application_name=application_name)

    def query(self, sql: str) -> list[list[Optional[str]]]:
        with self.lock:
            for attempt in range(3):
                try:
                    if self._conn is None:
                        self._conn = self.connect()
                    return self._conn.query(sql)
                except (OSError, ConnectionError, pgwire.PgError) as e:
                    # The harness's own session may be a victim of the faults it injects.
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if isinstance(e, pgwire.PgError) and not e.code.startswith(("57", "08")):
                        raise
                    if attempt == 2:
                        raise
                    time.sleep(0.5)
        return []

    def rows(self) -> list[Row]:
        try:
            return [_row(v) for v in self.query(f"SELECT {COLUMNS} FROM idempotency_keys")]
        except pgwire.PgError as e:
            if e.code == "42P01":  # no table yet
                return []
            raise

    def rows_for(self, ids: list[tuple[str, str]]) -> list[Row]:
        if not ids:
            return []
        out = []
        for i in range(0, len(ids), 200):
            cond = " OR ".join(f"(principal = {pgwire.literal(p)} AND key = {pgwire.literal(k)})" for p, k in ids[i : i + 200])
            out += [_row(v) for v in self.query(f"SELECT {COLUMNS} FROM idempotency_keys WHERE {cond}")]
        return out

    def count(self) -> int:
        return self.stats()[0]

    def stats(self) -> tuple[int, int]:
        try:
            total, pending = self.query("SELECT count(*), count(*) FILTER (WHERE status <> 'completed') FROM idempotency_keys")[0]
        except pgwire.PgError as e:
            if e.code == "42P01":
                return 0, 0
            raise
        return int(total or 0), int(pending or 0)

    def backdate(self, ids: list[tuple[str, str]], by_ms: int) -> int:
        n = 0
        for i in range(0, len(ids), 200):
            cond = " OR ".join(f"(principal = {pgwire.literal(p)} AND key = {pgwire.literal(k)})" for p, k in ids[i : i + 200])
            rows = self.query(f"UPDATE idempotency_keys SET updated_at = updated_at - {int(by_ms)} WHERE status = 'completed' AND ({cond}) RETURNING 1")
            n += len(rows)
        return n

    def terminate_server_backends(self) -> int:
        rows = self.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = {pgwire.literal(self.name)} AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND application_name NOT LIKE 'faults-%'"
        )
        return int(rows[0][0] or 0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            with pgwire.Connection(self.admin_url) as c:
                c.query(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except (OSError, ConnectionError, pgwire.PgError):
            pass


def pg_admin_url() -> Optional[str]:
    return os.environ.get("IDEMPOTENCY_PG_URL") or None


def pg_bindir() -> Optional[Path]:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parts[-3].split(".")], reverse=True)
    if found:
        return found[0].parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def pg_datadir() -> Path:
    """scripts/postgres.sh's data directory (PG_DIR, default /tmp/idempotency-ledger-pg-$PG_PORT)."""
    url = pg_admin_url() or ""
    port = pgwire.parse_url(url)["port"] if url else 25432
    return Path(os.environ.get("PG_DIR") or f"/tmp/idempotency-ledger-pg-{port}")


def pg_ctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("pg_ctl not found")
    argv = [str(bindir / "pg_ctl"), "-D", str(pg_datadir() / "data"), *args]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--"] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------- TCP proxy


class Proxy:
    """A TCP proxy on loopback. `hold = True` stops forwarding what clients
    send (it is buffered); `release_held()` forwards it, `drop_held()`
    discards it. Byte-transparent, so TLS passes through."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.hold = False
        self.held_bytes = 0
        self.held_flights = 0
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket, list[bytes]]] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            held: list[bytes] = []
            with self.lock:
                self.pairs.append((client, server, held))
            threading.Thread(target=self._pump, args=(client, server, held, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, held, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, held: list[bytes], upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    with self.lock:
                        if self.hold:
                            held.append(data)
                            self.held_bytes += len(data)
                            self.held_flights += 1
                            continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            if upstream:
                with self.lock:
                    held.clear()  # a client that went away never delivers what was held

    def drop_held(self) -> None:
        with self.lock:
            for _, _, held in self.pairs:
                held.clear()
            self.hold = False

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            for c, s, _ in self.pairs:
                for sock in (c, s):
                    try:
                        sock.close()
                    except OSError:
                        pass


# ---------------------------------------------------------------- checking


@dataclass
class Report:
    """Violations and figures of one run."""

    name: str
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    checks: int = 0

    def check(self, ok: bool, message: str) -> bool:
        self.checks += 1
        if not ok:
            self.violations.append(message)
            print(f"  VIOLATION [{self.name}] {message}", file=sys.stderr, flush=True)
        return ok

    def note(self, message: str) -> None:
        self.notes.append(message)
        print(f"  note [{self.name}] {message}", file=sys.stderr, flush=True)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "checks": self.checks, "violations": self.violations, "notes": self.notes, "figures": self.figures}


SPEC_ERRORS = {
    "idempotency_ledger_unavailable": {500, 503},
    "idempotency_ledger_outcome_unknown": {503},
}


def documented_5xx(a: Answer) -> bool:
    """SPEC 9.1: 503 busy (Retry-After: 1), 503 outcome unknown, 500 io/other."""
    if a.status not in (500, 503):
        return False
    code = a.error
    if code not in SPEC_ERRORS or a.status not in SPEC_ERRORS[code]:
        return False
    if a.status == 503 and "retry-after" not in a.headers:
        return False
    return True


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


class Workdir:
    """A temporary directory for databases and logs (kept when FAULTS_KEEP=1 or a run failed)."""

    def __init__(self, name: str) -> None:
        base = Path(os.environ.get("FAULTS_TMP") or tempfile.gettempdir())
        self.path = Path(tempfile.mkdtemp(prefix=f"faults-{name}-", dir=base))
        self.logs = self.path / "logs"
        self.logs.mkdir()

    def cleanup(self, keep: bool) -> None:
        if keep or os.environ.get("FAULTS_KEEP") == "1":
            print(f"  (kept {self.path})", file=sys.stderr)
            return
        shutil.rmtree(self.path, ignore_errors=True)
