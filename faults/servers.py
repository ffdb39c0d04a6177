"""The three example servers as real processes: how each is started, the
process the harness holds the PID of (start, SIGKILL, restart, SIGTERM, its
RSS and log), and the run's working directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from answers import get_count_raw

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Host:
    name: str
    argv: tuple[str, ...]
    cwd: Path
    # The ledger's SQLite batches run on the server's event loop (Node's
    # better-sqlite3; the Python ASGI middleware on a Ledger(path) file, its
    # default): a batch waiting on SQLite's busy timeout blocks the whole
    # loop (GET /orders/count included).
    blocks_on_sqlite_lock: bool = False


def rust_binary() -> Path:
    """`make serve-rust` runs target/release/examples/serve; FAULTS_RUST_PROFILE=debug
    uses the debug build `make test-rust` already made (CI time). FAULTS_RUST_SERVE
    names another binary outright (a branch's build in another worktree)."""
    explicit = os.environ.get("FAULTS_RUST_SERVE")
    if explicit:
        return Path(explicit).resolve()
    profile = os.environ.get("FAULTS_RUST_PROFILE", "release")
    return ROOT / "target" / profile / "examples" / "serve"


def hosts() -> dict[str, Host]:
    node = shutil.which("node") or "node"
    return {
        "rust": Host("rust", (str(rust_binary()),), ROOT),
        "python": Host("python", (str(ROOT / "bindings/python/.venv/bin/python"), "examples/server.py"), ROOT / "bindings/python", blocks_on_sqlite_lock=True),
        "node": Host("node", (node, "examples/node/server.js"), ROOT / "bindings/js", blocks_on_sqlite_lock=True),
    }


HOST_NAMES = ("rust", "python", "node")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on `port` (Linux:
    /proc/net/tcp{,6} and the process's descriptors). Where /proc cannot be
    read, any listener counts as the process's."""
    inodes = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    if not readable:
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[len("socket:["):-1] in inodes:
            return True
    return False


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
        """Starts the server and waits until it answers on its port. Its first
        start takes another free port when something else took this one
        between `free_port` and the server's bind (a restart keeps its port)."""
        first = self.starts == 0
        for attempt in range(3):
            try:
                return self._start(timeout)
            except StartError as error:
                message = str(error).lower()
                taken = "address already in use" in message or "eaddrinuse" in message
                if not (taken and first) or attempt == 2:
                    raise
                self.starts -= 1  # that process never served
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> "Server":
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
                # Another process on the port (it was taken meanwhile) is not this server.
                if status == 200 and listens(self.proc.pid, self.port):
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

    def wait_exit(self, timeout: float) -> Optional[int]:
        """The exit status of a process that ends by itself (None if it did not)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
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

    def first_log_line(self) -> str:
        """The first line the server wrote in its latest start (the contract's
        line naming the address, database and settings)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        start = text.rfind("\n==== start ")
        lines = text[start:].splitlines()[2:] if start >= 0 else text.splitlines()
        return next((line for line in lines if line.strip()), "")

    def count(self, timeout: float = 5.0) -> int:
        status, body = get_count_raw(self.port, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"GET /orders/count answered {status}: {body[:200]!r}")
        return int(json.loads(body)["count"])


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
