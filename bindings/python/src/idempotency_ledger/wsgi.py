"""WSGI middleware (Flask, Django, any PEP 3333 app).

    app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, ledger=ledger, principal=lambda environ: ...)

Requests whose method the core does not protect (and paths outside
`include` / inside `exclude`) go straight to the app. For a protected
request the principal comes from `principal(environ)` (None: the core's
401); the core admits it (a `Content-Length` over the request body cap is
its 413 before the body is read); `wsgi.input` is read in chunks and reading
stops as soon as the cap is passed (the core's 413); the app gets the body
through a fresh `wsgi.input`; its response is buffered so it can be stored,
and the client gets the core's shaped response, exactly what a retry
replays. Safe under threaded servers: the ledger lends each thread its own
connection and component instance.

The path and query are taken verbatim from `RAW_URI` / `REQUEST_URI` when the
server provides them (gunicorn, uWSGI); otherwise they are rebuilt from
`SCRIPT_NAME` + `PATH_INFO` (re-quoted) and `QUERY_STRING`.
"""

from __future__ import annotations

import io
import logging
from typing import Any, Callable, Iterable, Optional, Sequence, Union
from urllib.parse import quote

from ._http import NOTHING_CHANGED, RouteSpec, Routes, mark_nothing_changed, status_line
from ._ledger import Ledger
from ._types import IdempotencyError, MutationResponse, Response, Result

log = logging.getLogger("idempotency_ledger")

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
PrincipalFn = Callable[[Environ], Optional[str]]
CHUNK = 64 * 1024

__all__ = ["IdempotencyWSGIMiddleware", "mark_nothing_changed", "read_capped", "wsgi_headers", "wsgi_path_and_query"]


def wsgi_path_and_query(environ: Environ) -> str:
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw)
    path = quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""), safe="/;=,:@!$&'()*+~", encoding="latin-1")
    query = environ.get("QUERY_STRING", "")
    return path + ("?" + query if query else "")


def wsgi_headers(environ: Environ) -> list[tuple[str, str]]:
    headers = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers.append((name[5:].replace("_", "-").lower(), str(value)))
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH") and value != "":
            headers.append((name.replace("_", "-").lower(), str(value)))
    return headers


_TOO_LARGE = object()


def read_capped(stream: Any, content_length: Optional[int], terminated: bool, cap: int) -> Any:
    """Reads the body in chunks: the bytes, or _TOO_LARGE as soon as more than
    `cap` bytes were read (the rest is never read)."""
    if stream is None:
        return b""
    if content_length is None and not terminated:
        return b""  # no length and a server that does not end the stream: nothing to read safely
    chunks: list[bytes] = []
    total = 0
    remaining = content_length
    while remaining is None or remaining > 0:
        want = CHUNK if remaining is None else min(CHUNK, remaining)
        chunk = stream.read(want)
        if not chunk:
            break
        total += len(chunk)
        if total > cap:
            return _TOO_LARGE
        chunks.append(bytes(chunk))
        if remaining is not None:
            remaining -= len(chunk)
    return b"".join(chunks)


def _content_length(environ: Environ) -> Optional[int]:
    try:
        n = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
    return n if n >= 0 else None


def _send(start_response: StartResponse, response: Union[Result, Response], null_body: frozenset[int] = frozenset()) -> list[bytes]:
    body = b"" if response.status in null_body else response.body
    headers = [(n, v) for n, v in response.headers if n.lower() != "content-length"]
    if response.status not in (204, 304) and response.status >= 200:
        headers.append(("Content-Length", str(len(body))))
    start_response(status_line(response.status), headers)
    return [body]


def run_wsgi_app(app: Any, environ: Environ, body: bytes) -> MutationResponse:
    """Runs a WSGI app on `body` and buffers its response."""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    captured: dict[str, Any] = {}
    written: list[bytes] = []

    def capture(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None and captured:
            raise exc_info[1].with_traceback(exc_info[2])
        captured["status"] = status
        captured["headers"] = response_headers
        return written.append

    iterable = app(environ, capture)
    try:
        chunks = [bytes(chunk) for chunk in iterable]
    finally:
        close = getattr(iterable, "close", None)
        if close is not None:
            close()
    if "status" not in captured:
        raise RuntimeError("the WSGI app returned without calling start_response")
    status = int(str(captured["status"]).split(" ", 1)[0])
    return MutationResponse(status, list(captured["headers"]), b"".join(written + chunks))


class IdempotencyWSGIMiddleware:
    """Idempotency-Key protection for a WSGI app.

    ledger: a `Ledger` (migrated) shared by all requests and threads.
    principal: `principal(environ) -> str | None` from your auth layer (never
    a client header); None gets the core's 401.
    include / exclude: path prefixes, regexes or callables selecting the
    protected routes (default: every route).
    """

    def __init__(
        self,
        app: Any,
        *,
        ledger: Ledger,
        principal: PrincipalFn,
        include: Optional[Sequence[RouteSpec]] = None,
        exclude: Optional[Sequence[RouteSpec]] = None,
    ) -> None:
        if not callable(principal):
            raise TypeError("principal must be a callable taking the WSGI environ")
        self.app = app
        self.ledger = ledger
        self.principal = principal
        self.routes = Routes(include, exclude)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        ledger = self.ledger
        method = environ.get("REQUEST_METHOD", "GET")
        if method.upper() not in ledger.protected_methods or not self.routes(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")):
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        principal = self.principal(environ)
        path = wsgi_path_and_query(environ)
        headers = wsgi_headers(environ)
        try:
            admission = ledger.admit(method, path, headers, principal)
        except IdempotencyError as error:  # a bad principal: fail closed
            log.error("[idempotency] request not admitted: %s", error)
            return _send(start_response, ledger.error_response(error))
        if admission.kind == "pass-through":
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        if admission.kind == "reject":
            assert admission.response is not None
            return _send(start_response, admission.response)
        body = read_capped(environ.get("wsgi.input"), _content_length(environ), bool(environ.get("wsgi.input_terminated")), ledger.request_body_cap_bytes)
        if body is _TOO_LARGE:
            return _send(start_response, ledger.body_too_large())
        begun = ledger.begin(principal, method, path, headers, body)
        if begun.result is not None:
            return _send(start_response, begun.result)
        if begun.pass_through:
            environ["wsgi.input"] = io.BytesIO(body)
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        ticket = begun.ticket
        assert ticket is not None
        try:
            produced = run_wsgi_app(self.app, environ, body)
        except BaseException as error:
            ledger.abandon(ticket, error)
            raise
        if environ.get(NOTHING_CHANGED):
            ledger.abandon(ticket, None, nothing_changed=True)
            raw = produced.body.encode("utf-8") if isinstance(produced.body, str) else bytes(produced.body)
            return _send(start_response, Response(produced.status, list(produced.headers), raw), ledger.null_body_statuses)
        return _send(start_response, ledger.finish(ticket, produced))

