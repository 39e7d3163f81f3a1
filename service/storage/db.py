"""Engine and session set-up for SQLite (embedded default) and PostgreSQL.

Write transactions take a per-run lock first, so that reports and plans of one
run are decided one at a time, whichever process or replica serves them:
PostgreSQL: ``pg_advisory_xact_lock`` (works before any row exists, frees itself
at commit); SQLite: ``BEGIN IMMEDIATE`` takes the database write lock up front.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ..config import Settings

if TYPE_CHECKING:
    import psycopg

_SQLITE_BEGIN = "sqlite_begin"


def make_engine(settings: Settings) -> Engine:
    url = settings.database_url
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every test
            # Let SQLAlchemy emit BEGIN itself (pysqlite's own handling is off).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql(conn.get_execution_options().get(_SQLITE_BEGIN, "BEGIN"))

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    options = pg_options(settings)
    connect_args = {} if options is None else {"options": options}
    return create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        # No pre-ping (a round trip per request): a connection found dead by the
        # transaction's first statement is replaced and the statement retried once
        # (``write_session``); elsewhere the disconnect answers a retryable 503.
        pool_timeout=30,
        connect_args=connect_args,
    )


def pg_options(settings: Settings) -> str | None:
    """The PostgreSQL session options of every connection the service opens: a statement
    timeout that bounds every statement, waits for the run's advisory lock included, so no
    request hangs on a stuck transaction (the API answers 503 instead)."""
    if settings.db_statement_timeout_s > 0:
        return f"-c statement_timeout={int(settings.db_statement_timeout_s * 1000)}"
    return None


def ping(session: Session) -> None:
    """``SELECT 1``: raises when the database does not answer (``/readyz``)."""
    session.execute(text("SELECT 1"))


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def run_lock_key(run_id: str) -> int:
    """A stable signed 64-bit key for the run's advisory lock."""
    return int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "big", signed=True)


_SQLITE_WRITERS: dict[str, threading.Lock] = {}
_SQLITE_WRITERS_GUARD = threading.Lock()


def _sqlite_writer_lock(url: str) -> threading.Lock:
    with _SQLITE_WRITERS_GUARD:
        return _SQLITE_WRITERS.setdefault(url, threading.Lock())


def literal(value: Any) -> str:
    """``value`` as a PostgreSQL literal (ints, strings: the statements built here)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"no literal for {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    if "\0" in value:
        raise ValueError("a NUL byte has no PostgreSQL literal")
    # standard_conforming_strings is on (PostgreSQL's default since 9.1): only ' is special.
    return "'" + value.replace("'", "''") + "'"


def _begin_locked(session: Session, run_id: str, read: str | None) -> tuple | None:
    """Take the run's lock as the transaction's first statement; on PostgreSQL with
    ``read``, a query sent in the same round trip, run after the lock is granted (its
    own statement, so its snapshot sees every transaction that held the lock before).

    On PostgreSQL the transaction's BEGIN travels in that round trip too: the connection
    is in autocommit for the driver (psycopg sends no BEGIN of its own, a round trip
    before every transaction), and ``SELECT pg_advisory_xact_lock(k); BEGIN; read`` opens
    the server's transaction block itself — a lock taken before a BEGIN in one simple
    query belongs to the block BEGIN opens (PostgreSQL's protocol: the statements before
    it are retroactively included), so it is held to COMMIT. Commit and rollback end it
    as before: psycopg sends COMMIT / ROLLBACK whenever the server is in a transaction."""
    bind = session.get_bind()
    if bind.dialect.name == "sqlite":
        session.connection(execution_options={_SQLITE_BEGIN: "BEGIN IMMEDIATE"})
        return None
    key = run_lock_key(run_id)
    conn = session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    # No parameters: psycopg sends the statements as one simple query (one round trip).
    res = conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({key}); BEGIN" + ("" if read is None else f"; {read}"))
    cur = res.cursor
    if cur is None or not cur.nextset():  # pragma: no cover - the statements were sent together
        raise RuntimeError("the locked transaction did not begin")
    row = None
    if read is not None:
        if not cur.nextset():  # pragma: no cover
            raise RuntimeError("the locked read returned no result")
        row = cur.fetchone()
    res.close()
    return row


@contextmanager
def _locked_session(factory: sessionmaker[Session], run_id: str, read: str | None) -> Iterator[tuple[Session, Any]]:
    for attempt in (0, 1):
        session = factory()
        try:
            row = _begin_locked(session, run_id, read)
        except DBAPIError as e:
            session.close()
            # A pooled connection that died idle (PostgreSQL restarted): nothing was
            # done yet, so the first statement is retried once on a fresh connection.
            if attempt == 0 and e.connection_invalidated:
                continue
            raise
        except BaseException:
            session.close()
            raise
        break
    with session:
        try:
            yield session, row
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def write_session(factory: sessionmaker[Session], run_id: str) -> Iterator[Session]:
    """A transaction that holds the run's lock from its first statement to commit."""
    with ExitStack() as stack:
        if factory.kw["bind"].dialect.name == "sqlite":
            # Writers of this process queue on a lock first: SQLite's own busy
            # handler polls with sleeps, which under many concurrent writers gave
            # multi-second tail latencies. BEGIN IMMEDIATE still guards against
            # other processes.
            stack.enter_context(_sqlite_writer_lock(str(factory.kw["bind"].url)))
        session, _ = stack.enter_context(_locked_session(factory, run_id, None))
        yield session


@contextmanager
def locked_read_session(factory: sessionmaker[Session], run_id: str, read: str) -> Iterator[tuple[Session, Any]]:
    """``write_session`` whose lock comes, on PostgreSQL, with the first row of ``read``
    (SQL text with its values inlined, see ``literal``) in the same round trip; on
    SQLite the row is None (BEGIN IMMEDIATE already serialises: read it after)."""
    with ExitStack() as stack:
        if factory.kw["bind"].dialect.name == "sqlite":
            stack.enter_context(_sqlite_writer_lock(str(factory.kw["bind"].url)))
            read = None  # type: ignore[assignment]
        yield stack.enter_context(_locked_session(factory, run_id, read))


def _copy_text(value) -> str:
    """A value in PostgreSQL COPY text format (our values: numbers, booleans, ids, JSON)."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return repr(value)
    s = str(value)
    if "\\" in s or "\t" in s or "\n" in s or "\r" in s:
        s = s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return s


def copy_text(session: Session, table: str, columns: tuple[str, ...], data: str) -> None:
    """PostgreSQL ``COPY ... FROM STDIN`` of rows already in COPY text format."""
    raw = session.connection().connection.dbapi_connection
    if raw is None:  # only after the pooled connection is closed or invalidated
        raise RuntimeError("copy_text: the session's DBAPI connection is closed")
    # Called only on PostgreSQL, whose driver here is psycopg 3 (COPY needs its cursor.copy).
    dbapi = cast("psycopg.Connection[Any]", raw)
    with dbapi.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as cp:
        cp.write(data)


def bulk_insert(session: Session, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert many rows in one round trip: COPY on PostgreSQL, one executemany on SQLite.
    JSON columns take already-serialised text."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
        copy_text(session, table, columns, "".join("\t".join(map(_copy_text, r)) + "\n" for r in rows))
        return
    marks = ", ".join("?" * len(columns))
    session.connection().exec_driver_sql(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
