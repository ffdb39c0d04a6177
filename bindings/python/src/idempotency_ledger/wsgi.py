"""WSGI middleware (Flask, Django, any PEP 3333 app).

    app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, ledger=ledger, principal=lambda environ: ...)

Unprotected methods go straight to the app. A protected request's body is
read once (raw bytes, for the fingerprint) and handed to the app through a
fresh `wsgi.input`; the app's response is buffered so it can be stored, and
the client gets the core's shaped response, exactly what a retry replays.
Safe under threaded WSGI servers: the `Ledger` gives each thread its own
Store, instance and sqlite3 connection.

The path and query are taken verbatim from `RAW_URI` / `REQUEST_URI` when the
server provides them (gunicorn, uWSGI); otherwise they are rebuilt from
`SCRIPT_NAME` + `PATH_INFO` (re-quoted) and `QUERY_STRING`.
"""

from __future__ import annotations

import http
import io
import logging
import threading
from typing import Any, Callable, Iterable, Iterator, Optional
from urllib.parse import quote

from ._ledger import Ledger, _attach_ticket
from ._types import IdempotencyError, MutationResponse, Result

log = logging.getLogger("idempotency_ledger")

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
PrincipalFn = Callable[[Environ], Optional[str]]

_NO_CONTENT_LENGTH = frozenset({204, 304})


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


def _read_body(environ: Environ) -> bytes:
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    length = environ.get("CONTENT_LENGTH") or ""
    try:
        n = int(length)
    except ValueError:
        n = -1
    if n >= 0:
        return bytes(stream.read(n)) if n else b""
    # No length: a server that supports it (wsgi.input_terminated) ends the stream.
    if environ.get("wsgi.input_terminated"):
        return bytes(stream.read())
    return b""


def _status_line(status: int) -> str:
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _send(start_response: StartResponse, result: Any) -> list[tuple[str, str]]:
    headers = [(n, v) for n, v in result.headers if n.lower() != "content-length"]
    if result.status not in _NO_CONTENT_LENGTH and result.status >= 200:
        headers.append(("Content-Length", str(len(result.body))))
    start_response(_status_line(result.status), headers)
    return headers


class _Body:
    """The response iterable; runs `on_close` after the server sent it."""

    def __init__(self, body: bytes, on_close: Optional[Callable[[], None]] = None) -> None:
        self._body = body
        self._on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        yield self._body

    def close(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()


class IdempotencyWSGIMiddleware:
    """Idempotency-Key protection for a WSGI app.

    ledger: a `Ledger` (migrated) shared by all requests and threads.
    principal: `principal(environ) -> str | None` from your auth layer (never
    a client header). None sends the request to the app untouched.
    sweep_every: one bounded sweep after every N-th protected request, once
    its response was sent (0 disables).
    """

    def __init__(self, app: Any, *, ledger: Ledger, principal: PrincipalFn, sweep_every: int = 100) -> None:
        if not callable(principal):
            raise TypeError("principal must be a callable taking the WSGI environ")
        self.app = app
        self.ledger = ledger
        self.principal = principal
        self.sweep_every = int(sweep_every)
        self._count = 0
        self._count_lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = wsgi_path_and_query(environ)
        headers = wsgi_headers(environ)
        try:
            admission = self.ledger.admit(method, path, headers)
        except IdempotencyError as error:  # fail closed: nothing runs
            log.error("[idempotency] request not classified: %s", error)
            response = self.ledger.error_response(error)
            _send(start_response, response)
            return [response.body]
        if admission.kind == "pass-through":
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        principal = self.principal(environ)
        if principal is None:  # unauthenticated: untouched, the app's auth answers
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        if admission.kind == "reject":
            assert admission.response is not None
            _send(start_response, admission.response)
            return [admission.response.body]
        body = _read_body(environ)

        def run_app() -> MutationResponse:
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

            iterable = self.app(environ, capture)
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

        begun = self.ledger.begin(principal, method, path, headers, body, admission)
        if begun.result is not None:
            result: Result = begun.result
        elif begun.pass_through:  # not reachable with the same settings; kept for safety
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        else:
            ticket = begun.ticket
            assert ticket is not None
            try:
                produced = run_app()
            except BaseException as error:
                _attach_ticket(error, ticket)
                log.warning(
                    "[idempotency] app raised for principal=%r key=%r generation=%d; the row stays pending",
                    ticket.principal, ticket.key, ticket.generation,
                )
                raise
            result = self.ledger.finish(ticket, produced)
        _send(start_response, result)
        return _Body(result.body, self._sweep_callback())

    def _sweep_callback(self) -> Optional[Callable[[], None]]:
        if self.sweep_every <= 0:
            return None
        with self._count_lock:
            self._count += 1
            due = self._count % self.sweep_every == 0
        if not due:
            return None

        def sweep() -> None:
            try:
                self.ledger.sweep()
            except Exception:
                log.exception("[idempotency] sweep failed")

        return sweep
