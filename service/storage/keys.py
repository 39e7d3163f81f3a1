"""The SQL of the API key store (``service/auth.py``, ``rollplan keys``, ``/v1/keys``)
and of what a bound key may see of the runs."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, false, or_, select
from sqlalchemy.orm import Session

from .models import ApiKey, Run

_ANY_KEY = select(ApiKey.pk).limit(1)


def any_key(conn: Connection) -> bool:
    """Whether the table holds a key (revoked ones count): one indexed probe on a plain
    connection, no ORM session (it runs on every request while auth is off)."""
    return conn.execute(_ANY_KEY).first() is not None


class SQLiteKeyProbe:
    """``any_key`` for an SQLite file, on a connection of its own: a read of a local file
    (microseconds, no network), so the server runs it on its event loop, without a hand-off
    to a thread and without SQLAlchemy's pool on every request while auth is off. Each call
    steps its statement to the end (``fetchall``), so no read transaction stays open between
    requests to hold back the write-ahead log's checkpoints."""

    def __init__(self, path: str) -> None:
        # No busy wait (timeout 0): a database locked by a writer (a file not in WAL mode yet)
        # raises at once, and the caller falls back to the pooled probe off the event loop.
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=0)
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            return bool(self._conn.execute("SELECT 1 FROM api_keys LIMIT 1").fetchall())

    async def any_key(self) -> bool:
        return self()

    async def aclose(self) -> None:
        with self._lock:
            self._conn.close()


class ProbeBusy(Exception):
    """The probe's one connection is in use: the caller asks the pooled probe instead."""


class PostgresKeyProbe:
    """``any_key`` for PostgreSQL on an asynchronous connection of its own, awaited on the
    event loop: one round trip, no hand-off to a thread and no pooled connection's checkout
    and reset. Connected at first use; a connection that fails is dropped (the next call
    connects again) and the error raised, for the caller to fall back to the pooled probe.

    Nothing queues on it: a call that finds the connection in use raises ``ProbeBusy`` at once
    (the pooled probe answers that request, in parallel, as before), so a slow database
    delays one request, not every one behind it. The connection bounds its own statements
    (2 s) and connects within 2 s, with TCP keepalives, so a stuck probe fails soon."""

    def __init__(self, params: dict[str, Any]) -> None:
        self._params = {
            "connect_timeout": 2,
            "application_name": "rollplan-key-probe",
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 2,
            **params,
            "autocommit": True,
            "options": " ".join(x for x in (params.get("options"), "-c statement_timeout=2000") if x),
        }
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def any_key(self) -> bool:
        import psycopg

        if self._lock.locked():
            raise ProbeBusy
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await psycopg.AsyncConnection.connect(**self._params)
                cur = await self._conn.execute("SELECT 1 FROM api_keys LIMIT 1")
                return bool(await cur.fetchall())
            except BaseException:
                await self._drop()
                raise

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # closing a broken connection: nothing more to do
                pass

    async def aclose(self) -> None:
        """Close the connection, without waiting for a probe in flight (it then fails)."""
        await self._drop()


KeyProbe = SQLiteKeyProbe | PostgresKeyProbe


def sqlite_key_probe(url: str) -> SQLiteKeyProbe | None:
    """The probe of an SQLite database file (``sqlite:///path``); None for another database,
    an in-memory one (a second connection would see another database), a URI filename
    (``file:…``, ``uri=true``: left to the pool's own connections) or a file that cannot be
    opened now (the pooled probe answers, or the API's 503)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    db = u.database or ""
    if u.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:") or u.query:
        return None
    try:
        return SQLiteKeyProbe(db)
    except sqlite3.Error:
        return None


def key_probe(engine: Engine, options: str | None = None) -> KeyProbe | None:
    """The event-loop probe for ``engine``'s database: ``sqlite_key_probe``, or on PostgreSQL
    a ``PostgresKeyProbe`` with the connection parameters the engine's dialect gives its own
    connections (host lists, sockets, quoting as the engine has them) and the service's
    session ``options`` (``db.pg_options``, as the engine's ``connect_args``); None for
    another database."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return sqlite_key_probe(url.render_as_string(hide_password=False))
    if url.get_backend_name() == "postgresql":
        _, params = engine.dialect.create_connect_args(url)
        params = {k: v for k, v in params.items() if k != "context"}  # the engine's own adapters
        if options is not None:
            params["options"] = options
        return PostgresKeyProbe(params)
    return None


def key_by_id(s: Session, key_id: str) -> ApiKey | None:
    return s.scalar(select(ApiKey).where(ApiKey.key_id == key_id))


def add_key(s: Session, **fields: Any) -> ApiKey:
    """Store a key row (flushed, with its defaults read back)."""
    row = ApiKey(**fields)
    s.add(row)
    s.flush()
    s.refresh(row)
    return row


def list_keys(s: Session, *, include_revoked: bool = True) -> list[ApiKey]:
    q = select(ApiKey).order_by(ApiKey.pk)
    if not include_revoked:
        q = q.where(ApiKey.revoked_at.is_(None))
    return list(s.scalars(q))


def mark_revoked(s: Session, row: ApiKey) -> None:
    row.revoked_at = datetime.now(timezone.utc)
    s.flush()


def runs_visible(run_ids: frozenset[str] | None, runs_prefix: str | None) -> ColumnElement[bool]:
    """A WHERE clause on ``Run.id``: the runs named in ``run_ids`` or starting with
    ``runs_prefix`` (none when neither is given)."""
    clauses: list[ColumnElement[bool]] = []
    if run_ids:
        clauses.append(Run.id.in_(sorted(run_ids)))
    if runs_prefix is not None:
        clauses.append(Run.id.startswith(runs_prefix, autoescape=True))
    return or_(*clauses) if clauses else false()
