"""The SQL of the API key store (``service/auth.py``, ``rollplan keys``, ``/v1/keys``)
and of what a bound key may see of the runs."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ColumnElement, Connection, false, or_, select
from sqlalchemy.orm import Session

from .models import ApiKey, Run

_ANY_KEY = select(ApiKey.pk).limit(1)


def any_key(conn: Connection) -> bool:
    """Whether the table holds a key (revoked ones count): one indexed probe on a plain
    connection, no ORM session (it runs on every request while auth is off)."""
    return conn.execute(_ANY_KEY).first() is not None


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
