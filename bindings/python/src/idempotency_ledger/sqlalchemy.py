"""SQLAlchemy sessions for transactional handlers (what FastAPI apps use):
the handler gets a `Session` bound to a connection of your engine, inside a
transaction whose last statements are the core's fenced completion, so the
handler's writes commit with the stored answer or not at all (docs/SPEC.md
10.2).

    from sqlalchemy import create_engine
    from idempotency_ledger.asgi import IdempotencyMiddleware
    from idempotency_ledger.sqlalchemy import SessionTransactions, ledger_for, session_of

    engine = create_engine("postgresql+psycopg://app@db/app")   # or sqlite:///app.sqlite
    ledger = ledger_for(engine)                                  # the ledger on the same database
    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=..., include=["/orders"],
                       transactional=["/orders"], transactions=SessionTransactions(engine))

    @app.post("/orders")
    def create_order(request: Request):
        session = session_of(request)          # bound to the request's transaction
        session.add(Order(...))                # flushed before the completion; never commit it yourself
        return {...}

The session joins the transaction with `join_transaction_mode=
"create_savepoint"`: a `session.commit()` in the handler releases a
savepoint instead of committing, and a `session.rollback()` rolls back to
it; the transaction itself commits (or rolls back) as the exchange says.
Sync engines and sessions (an `AsyncSession` cannot be driven from the
ledger's worker thread). On SQLite the transaction starts with an explicit
`BEGIN` (pysqlite would otherwise start it only at the first write, and a
savepoint outside it would commit on release).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from ._ledger import Ledger
from ._native import BatchFailure
from ._transaction import database_failure, format_placeholders

__all__ = ["SessionTransaction", "SessionTransactions", "ledger_for", "session_of"]

Statement = tuple[str, Sequence[Any]]

#: Where the middlewares put the handler's transaction (a `HandlerTransaction`).
TRANSACTION_KEY = "idempotency.transaction"


def _dialect(engine: Engine) -> str:
    name = engine.dialect.name
    if name == "sqlite":
        return "sqlite"
    if name == "postgresql":
        return "postgres"
    raise TypeError(f"the ledger speaks SQLite and PostgreSQL; this engine is {name}")


def ledger_for(engine: Engine, **settings: Any) -> Ledger:
    """A ledger on the same database as `engine` (its SQLite file, or its
    PostgreSQL server through the extension's own pool, from the engine's
    URL: put connection parameters such as `sslmode` or `options` in the
    URL, not in `connect_args`), migrated when it is SQLite (on PostgreSQL
    run `ledger.migrate()` at deploy time)."""
    url = engine.url
    if _dialect(engine) == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ValueError("the ledger needs a SQLite file (an in-memory database is not shared between connections)")
        ledger = Ledger(url.database, **settings)
        ledger.migrate()
        return ledger
    return Ledger.postgres(_postgres_url(url), **settings)


def _postgres_url(url: Any) -> str:
    """The engine's URL as libpq reads it: `postgresql://`, every part
    percent-encoded (SQLAlchemy writes a space in a query value as `+`,
    which libpq and the extension read as a plus sign)."""
    from urllib.parse import quote

    auth = ""
    if url.username:
        auth = quote(url.username, safe="") + (":" + quote(url.password, safe="") if url.password else "") + "@"
    host = url.host or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{url.port}" if url.port else ""
    query = "&".join(
        f"{quote(name, safe='')}={quote(value, safe='')}"
        for name, values in url.query.items()
        for value in (values if isinstance(values, tuple) else (values,))
    )
    return f"postgresql://{auth}{host}{port}/{quote(url.database or '', safe='')}" + (f"?{query}" if query else "")


class SessionTransaction:
    """One request's transaction on a connection of `engine`, with `session`
    bound to it (a transaction object: `begin`, `execute`, `commit`,
    `rollback`; see `idempotency_ledger._transaction`)."""

    def __init__(self, engine: Engine, session_factory: Optional[Callable[..., Session]] = None) -> None:
        self.engine = engine
        self.dialect = _dialect(engine)
        self._factory = session_factory
        self.connection: Optional[Connection] = None
        self.session: Optional[Session] = None
        self._transaction: Any = None

    def begin(self) -> None:
        try:
            connection = self.engine.connect()
        except SQLAlchemyError as error:
            raise database_failure(error) from error
        try:
            self._transaction = connection.begin()
            if self.dialect == "sqlite" and not connection.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
                connection.exec_driver_sql("BEGIN")
        except SQLAlchemyError as error:
            connection.close()
            raise database_failure(error) from error
        self.connection = connection
        make = self._factory or Session
        self.session = make(bind=connection, join_transaction_mode="create_savepoint")

    def execute(self, statements: Sequence[Statement]) -> list[tuple[list[Any], int]]:
        connection, session = self.connection, self.session
        if connection is None or session is None:
            raise BatchFailure("host", None, "no transaction is open")
        paramstyle = self.engine.dialect.paramstyle
        results: list[tuple[list[Any], int]] = []
        try:
            session.flush()  # the handler's pending writes, before the completion
            for sql, params in statements:
                if self.dialect == "postgres" and paramstyle in ("format", "pyformat"):
                    sql, params = format_placeholders(sql, params, "postgres")
                elif not (self.dialect == "sqlite" and paramstyle == "qmark") and paramstyle != "numeric_dollar":
                    raise BatchFailure("host", None, f"the ledger cannot write its statements in the {paramstyle} paramstyle")
                result = connection.exec_driver_sql(sql, tuple(params))
                rows = [tuple(row) for row in result.fetchall()] if result.returns_rows else []
                verb = sql.lstrip()[:6].upper()
                results.append((rows, 0 if verb == "SELECT" else max(result.rowcount, 0)))
        except DBAPIError as error:
            raise database_failure(error) from error
        except SQLAlchemyError as error:
            raise BatchFailure("host", None, f"{type(error).__name__}: {error}") from error
        return results

    def commit(self) -> None:
        if self._transaction is None:
            raise BatchFailure("host", None, "no transaction is open")
        try:
            self._transaction.commit()
        except DBAPIError as error:
            failure = database_failure(error, broken="outcome-unknown")
            if error.connection_invalidated or failure.args[0] != "database":
                self._close()  # the connection broke: the transaction is gone with it
            raise failure from error
        self._close()

    def rollback(self) -> None:
        try:
            if self._transaction is not None and self._transaction.is_active:
                self._transaction.rollback()
        except SQLAlchemyError:
            pass  # the server rolls back when the connection goes
        finally:
            self._close()

    def _close(self) -> None:
        session, connection = self.session, self.connection
        self.session = self.connection = self._transaction = None
        try:
            if session is not None:
                session.close()
        finally:
            if connection is not None:
                connection.close()


class SessionTransactions:
    """The middlewares' `transactions=`: a `SessionTransaction` on `engine`
    for each transactional request (`session_factory`: your sessionmaker,
    called with `bind` and `join_transaction_mode`)."""

    def __init__(self, engine: Engine, session_factory: Optional[Callable[..., Session]] = None) -> None:
        _dialect(engine)
        self.engine = engine
        self.session_factory = session_factory

    def __call__(self, request: Any = None) -> SessionTransaction:
        return SessionTransaction(self.engine, self.session_factory)


def session_of(request_or_scope: Any) -> Session:
    """The Session of this request's transaction (a Starlette/FastAPI
    request, an ASGI scope or a WSGI environ)."""
    scope = getattr(request_or_scope, "scope", request_or_scope)
    transaction = scope.get(TRANSACTION_KEY) if hasattr(scope, "get") else None
    session = getattr(transaction, "session", None)
    if session is None:
        raise LookupError("no transaction is open for this request: is its route transactional (transactional=...) with transactions=SessionTransactions(engine)?")
    return session  # type: ignore[no-any-return]
