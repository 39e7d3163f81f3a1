"""API keys: scopes, run bindings, hashing, and the key store.

A key looks like ``rpk_<key_id>_<secret>``: ``key_id`` (12 hex characters) is
public and finds the row; ``secret`` is 32 random bytes. Only the SHA-256 of the
whole key is stored: the key is high-entropy random, not a password, so a slow
hash would add nothing. The stored hash is compared with
``hmac.compare_digest``, and an unknown key_id is compared against a dummy hash,
so the time taken does not tell a caller which keys exist.

Scopes are ordered: ``read`` < ``write`` < ``admin`` (a write key can read; an
admin key can do anything, including managing keys). A key may be bound to a
list of run ids and/or a run-id prefix (a project); a bound key cannot read or
write any other run and does not see it in listings. Admin keys are never bound
(an admin key could otherwise mint itself an unbound one).

Keys from ``ROLLPLAN_API_KEYS`` are unbound admin keys (backward compatible).
Auth is on when any key exists, in the environment or in the table — revoked
keys count, so revoking the last key never opens the server.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Literal, cast

from sqlalchemy import ColumnElement, Connection
from sqlalchemy.orm import Session

from .errors import Forbidden, Invalid, NotFound
from .storage import keys as store
from .storage.models import ApiKey

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")
_RANK = {s: i for i, s in enumerate(SCOPES)}

KEY_PREFIX = "rpk_"
_KEY_RE = re.compile(r"^rpk_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_DUMMY_HASH = hashlib.sha256(b"rollplan-no-such-key").hexdigest()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> tuple[str, str]:
    """A new (key_id, key)."""
    key_id = secrets.token_hex(6)
    return key_id, f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


@dataclass(frozen=True)
class Principal:
    """Who is calling, and what it may touch."""

    scope: Scope
    key_id: str | None = None  # None: an environment key or no auth
    run_ids: frozenset[str] | None = None
    runs_prefix: str | None = None

    @property
    def bound(self) -> bool:
        return self.run_ids is not None or self.runs_prefix is not None

    def has_scope(self, needed: Scope) -> bool:
        return _RANK[self.scope] >= _RANK[needed]

    def may_access(self, run_id: str) -> bool:
        if not self.bound:
            return True
        if self.run_ids is not None and run_id in self.run_ids:
            return True
        return self.runs_prefix is not None and run_id.startswith(self.runs_prefix)

    def check(self, needed: Scope, run_id: str | None = None) -> None:
        if not self.has_scope(needed):
            raise Forbidden(f"this API key has scope {self.scope!r}; this call needs {needed!r}")
        if run_id is not None and not self.may_access(run_id):
            raise Forbidden(f"this API key is not allowed to access run {run_id!r}")

    def run_filter(self) -> ColumnElement[bool] | None:
        """A WHERE clause on ``Run.id`` limiting a listing to the runs this key may see."""
        return store.runs_visible(self.run_ids, self.runs_prefix) if self.bound else None


NO_AUTH = Principal(scope="admin")


def _principal(row: ApiKey) -> Principal:
    return Principal(
        # Stored only by create_key, after validate_binding checked it is one of SCOPES.
        scope=cast(Scope, row.scope),
        key_id=row.key_id,
        run_ids=frozenset(row.run_ids) if row.run_ids is not None else None,
        runs_prefix=row.runs_prefix,
    )


def any_key_stored(conn: Connection) -> bool:
    """Whether a key was ever made (revoked ones count: revoking the last key never
    opens the server)."""
    return store.any_key(conn)


def verify(s: Session, key: str) -> Principal | None:
    """The principal of a stored, unrevoked key, or None."""
    m = _KEY_RE.match(key)
    row = store.key_by_id(s, m.group(1)) if m else None
    ok = hmac.compare_digest(hash_key(key).encode(), (row.key_hash if row is not None else _DUMMY_HASH).encode())
    if not ok or row is None or row.revoked_at is not None:
        return None
    return _principal(row)


# -- the key store (used by the CLI and the /v1/keys endpoints) ------------------------
def validate_binding(scope: str, run_ids: list[str] | None, runs_prefix: str | None) -> None:
    if scope not in SCOPES:
        raise Invalid(
            f"scope: must be one of {', '.join(SCOPES)}, got {scope!r}",
            errors=[{"loc": "scope", "msg": "unknown scope"}],
        )
    if scope == "admin" and (run_ids is not None or runs_prefix is not None):
        raise Invalid(
            "an admin key cannot be bound to runs (it could create an unbound key); use scope write or read",
            errors=[{"loc": "scope", "msg": "admin keys are unbound"}],
        )
    for i, r in enumerate(run_ids or []):
        if not _RUN_ID_RE.match(r):
            raise Invalid(
                f"run_ids[{i}]: {r!r} is not a run id ([A-Za-z0-9._:-], 1–200 chars)",
                errors=[{"loc": f"run_ids[{i}]", "msg": "not a run id"}],
            )
    if runs_prefix is not None and not _RUN_ID_RE.match(runs_prefix):
        raise Invalid(
            f"runs_prefix: {runs_prefix!r} can never match a run id; run ids use [A-Za-z0-9._:-], "
            "so end a project prefix with ':' or '.', e.g. 'team-a:'",
            errors=[{"loc": "runs_prefix", "msg": "not a run-id prefix"}],
        )


def create_key(
    s: Session,
    scope: str,
    *,
    name: str | None = None,
    run_ids: list[str] | None = None,
    runs_prefix: str | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key; returns the row and the key itself (shown once, never stored)."""
    validate_binding(scope, run_ids, runs_prefix)
    key_id, key = generate_key()
    row = store.add_key(
        s,
        key_id=key_id,
        key_hash=hash_key(key),
        name=name,
        scope=scope,
        run_ids=sorted(set(run_ids)) if run_ids is not None else None,
        runs_prefix=runs_prefix,
    )
    return row, key


def list_keys(s: Session, *, include_revoked: bool = True) -> list[ApiKey]:
    return store.list_keys(s, include_revoked=include_revoked)


def revoke_key(s: Session, key_id: str) -> ApiKey:
    row = store.key_by_id(s, key_id)
    if row is None:
        raise NotFound(f"no API key with id {key_id!r}")
    if row.revoked_at is None:
        store.mark_revoked(s, row)
    return row


ENV_ADMIN = Principal(scope="admin", key_id="env")
