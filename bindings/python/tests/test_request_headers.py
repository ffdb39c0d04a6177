"""Only the request headers the core reads (its `request-headers`) cross
into it: the ledger names them, the ASGI middleware converts only those,
and the answers are the ones all the headers would have given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from idempotency_ledger import Ledger
from idempotency_ledger.asgi import IdempotencyMiddleware

from test_asgi_body_first import Handler, Recording, call

# What a typical API client sends besides the headers the core reads.
OTHERS = [
    (b"host", b"api.example.com"),
    (b"user-agent", b"example-client/1.4.2"),
    (b"accept", b"application/json"),
    (b"authorization", b"Bearer abc.def.ghi"),
    (b"x-request-id", b"5f0c6f4e-8f0b-4bde-9a3e-1c2d3e4f5a6b"),
    (b"cookie", b"session=" + b"x" * 4000),
]


class Headers(Recording):
    """The ledger, noting the headers each exchange started with."""

    def __init__(self, path: Path, **settings: Any) -> None:
        super().__init__(path, **settings)
        self.heads: list[list[tuple[str, str]]] = []

    def start(self, principal: Any, method: Any, path_and_query: Any, headers: Any, **kwargs: Any) -> Any:
        self.heads.append(list(headers))
        return super().start(principal, method, path_and_query, headers, **kwargs)


def test_the_ledger_names_the_key_the_length_and_the_fingerprinted_headers(tmp_path: Path) -> None:
    default = Ledger(tmp_path / "a.sqlite")
    assert default._native.request_headers == ["idempotency-key", "content-length", "content-type", "x-api-version"]
    custom = Ledger(tmp_path / "b.sqlite", fingerprint_headers=["Content-Type", "X-Tenant", "idempotency-key"])
    assert custom._native.request_headers == ["idempotency-key", "content-length", "content-type", "x-tenant"]
    assert custom._read_headers == frozenset({b"idempotency-key", b"content-length", b"content-type", b"x-tenant"})


def test_asgi_converts_only_the_headers_the_core_reads_and_answers_as_with_all(tmp_path: Path) -> None:
    ledger = Headers(tmp_path / "ledger.sqlite", fingerprint_headers=["content-type", "x-tenant"])
    ledger.migrate()
    middleware = IdempotencyMiddleware(Handler(), ledger=ledger, principal=lambda scope: "acct", include=["/orders"])
    body = b'{"sku":"A-1"}'
    read = [(b"Idempotency-Key", b"k-1"), (b"content-type", b"application/json"), (b"X-Tenant", b"t-1"), (b"content-length", str(len(body)).encode())]

    first = call(middleware, [body], OTHERS + read)
    replay = call(middleware, [body], read + OTHERS[:2])
    other_tenant = call(middleware, [body], [(b"x-tenant", b"t-2") if n.lower() == b"x-tenant" else (n, v) for n, v in read] + OTHERS)

    assert (first[0], replay[0], other_tenant[0]) == (201, 201, 409)
    assert replay[2] == first[2]
    # The fingerprinted header in any case reached the core; nothing else did.
    assert [sorted(n.lower() for n, _ in head) for head in ledger.heads] == [["content-length", "content-type", "idempotency-key", "x-tenant"]] * 3


def test_wsgi_converts_only_the_headers_the_core_reads_and_answers_as_with_all(tmp_path: Path) -> None:
    import io

    from idempotency_ledger.wsgi import IdempotencyWSGIMiddleware, wsgi_headers

    ledger = Headers(tmp_path / "ledger.sqlite", fingerprint_headers=["content-type", "x-tenant"])
    ledger.migrate()
    ran: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        ran.append(environ["wsgi.input"].read())
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"order":"o_1"}']

    middleware = IdempotencyWSGIMiddleware(app, ledger=ledger, principal=lambda environ: "acct", include=["/orders"])
    body = b'{"sku":"A-1"}'

    def call(tenant: str) -> tuple[str, bytes]:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "QUERY_STRING": "", "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)), "HTTP_IDEMPOTENCY_KEY": "k-1", "HTTP_X_TENANT": tenant, "HTTP_HOST": "api.example.com",
            "HTTP_USER_AGENT": "example-client/1.4.2", "HTTP_AUTHORIZATION": "Bearer abc", "HTTP_COOKIE": "session=" + "x" * 4000,
            "wsgi.input": io.BytesIO(body), "SERVER_NAME": "localhost", "SERVER_PORT": "80", "wsgi.url_scheme": "http",
        }
        status: list[str] = []
        out = b"".join(middleware(environ, lambda s, h, exc_info=None: status.append(s)))
        return status[0], out

    assert wsgi_headers({"HTTP_HOST": "h", "HTTP_IDEMPOTENCY_KEY": "k", "CONTENT_TYPE": ""}, {"idempotency-key", "content-type"}) == [("idempotency-key", "k")]
    first, replay, other_tenant = call("t-1"), call("t-1"), call("t-2")
    assert [first[0][:3], replay[0][:3], other_tenant[0][:3]] == ["201", "201", "409"]
    assert replay[1] == first[1] and len(ran) == 1
    assert [sorted(n for n, _ in head) for head in ledger.heads] == [["content-length", "content-type", "idempotency-key", "x-tenant"]] * 3
