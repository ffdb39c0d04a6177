"""A minimal PostgreSQL client (protocol 3.0, simple queries) on the standard
library, for the harness: reading ledger rows, holding a row lock in a
session of its own, terminating backends, creating and dropping databases.

Plain TCP (the throwaway server of scripts/postgres.sh accepts it from
127.0.0.1 with trust auth); cleartext and md5 passwords are supported, SCRAM
is not (the harness never needs it).
"""

from __future__ import annotations

import hashlib
import socket
import struct
from typing import Optional
from urllib.parse import unquote, urlsplit


class PgError(Exception):
    def __init__(self, fields: dict[str, str]) -> None:
        self.code = fields.get("C", "")
        self.message = fields.get("M", "")
        super().__init__(f"{self.message} ({self.code})")


def parse_url(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5432,
        "user": unquote(parts.username or "postgres"),
        "password": unquote(parts.password) if parts.password else None,
        "database": unquote(parts.path.lstrip("/")) or "postgres",
    }


def url_with_database(url: str, database: str) -> str:
    """`url` with another database name (query kept)."""
    parts = urlsplit(url)
    return parts._replace(path="/" + database).geturl()


def literal(value: object) -> str:
    """A SQL literal (standard_conforming_strings is on)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if "\0" in text:
        raise ValueError("NUL in a SQL literal")
    return "'" + text.replace("'", "''") + "'"


class Connection:
    def __init__(self, url: str, *, database: Optional[str] = None, timeout: float = 30.0, application_name: str = "faults-harness") -> None:
        params = parse_url(url)
        self.user = str(params["user"])
        self.password = params["password"]
        self.database = database or str(params["database"])
        self.sock = socket.create_connection((str(params["host"]), int(params["port"])), timeout=timeout)  # type: ignore[arg-type]
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.backend_pid: Optional[int] = None
        body = b""
        for k, v in (("user", self.user), ("database", self.database), ("application_name", application_name), ("client_encoding", "UTF8")):
            body += k.encode() + b"\0" + v.encode() + b"\0"
        body += b"\0"
        payload = struct.pack("!I", 196608) + body
        self.sock.sendall(struct.pack("!I", len(payload) + 4) + payload)
        self._startup()

    # ------------------------------------------------------------- wire

    def _recv_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("PostgreSQL closed the connection")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _message(self) -> tuple[bytes, bytes]:
        head = self._recv_exact(5)
        kind, length = head[:1], struct.unpack("!I", head[1:])[0]
        return kind, self._recv_exact(length - 4)

    def _send(self, kind: bytes, payload: bytes) -> None:
        self.sock.sendall(kind + struct.pack("!I", len(payload) + 4) + payload)

    @staticmethod
    def _fields(payload: bytes) -> dict[str, str]:
        fields = {}
        for part in payload.split(b"\0"):
            if part:
                fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
        return fields

    def _startup(self) -> None:
        while True:
            kind, payload = self._message()
            if kind == b"R":
                code = struct.unpack("!I", payload[:4])[0]
                if code == 0:
                    continue
                if code == 3:
                    self._send(b"p", (self.password or "").encode() + b"\0")
                elif code == 5:
                    salt = payload[4:8]
                    inner = hashlib.md5(((self.password or "") + self.user).encode()).hexdigest()
                    outer = "md5" + hashlib.md5(inner.encode() + salt).hexdigest()
                    self._send(b"p", outer.encode() + b"\0")
                else:
                    raise ConnectionError(f"unsupported PostgreSQL authentication method {code}")
            elif kind == b"K":
                self.backend_pid = struct.unpack("!I", payload[:4])[0]
            elif kind == b"E":
                raise PgError(self._fields(payload))
            elif kind == b"Z":
                return

    # ------------------------------------------------------------- API

    def query(self, sql: str) -> list[list[Optional[str]]]:
        """Runs one simple query (may hold several statements); the rows of
        the last statement that returned rows. Raises PgError."""
        self._send(b"Q", sql.encode("utf-8") + b"\0")
        rows: list[list[Optional[str]]] = []
        current: list[list[Optional[str]]] = []
        error: Optional[PgError] = None
        while True:
            kind, payload = self._message()
            if kind == b"T":
                current = []
            elif kind == b"D":
                count = struct.unpack("!H", payload[:2])[0]
                pos, row = 2, []
                for _ in range(count):
                    n = struct.unpack("!i", payload[pos : pos + 4])[0]
                    pos += 4
                    if n < 0:
                        row.append(None)
                    else:
                        row.append(payload[pos : pos + n].decode("utf-8"))
                        pos += n
                current.append(row)
            elif kind == b"C":
                if current:
                    rows = current
                current = []
            elif kind == b"E":
                error = PgError(self._fields(payload))
            elif kind == b"Z":
                if error is not None:
                    raise error
                return rows
            # N (notice), S (parameter status), I (empty query): ignored

    def close(self) -> None:
        try:
            self._send(b"X", b"")
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
