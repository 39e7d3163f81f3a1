"""API key management (scope admin). The same store as ``rollplan keys``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, status

from .. import auth, schemas
from ..storage.models import ApiKey
from .deps import AUTH_RESPONSES, RESPONSES, SessionDep, require_admin

router = APIRouter(prefix="/v1/keys", dependencies=[Depends(require_admin)], responses=AUTH_RESPONSES, tags=["keys"])

KeyIdPath = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$", description="The key's public id (12 hex characters).")]


def key_out(row: ApiKey) -> schemas.KeyOut:
    return schemas.KeyOut(
        key_id=row.key_id,
        name=row.name,
        scope=row.scope,
        run_ids=row.run_ids,
        runs_prefix=row.runs_prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


@router.post("", response_model=schemas.KeyCreated, status_code=status.HTTP_201_CREATED, responses=RESPONSES)
def create_key(body: schemas.KeyIn, session: SessionDep) -> schemas.KeyCreated:
    """Create a key. The response holds the key itself, once; only its hash is stored."""
    row, key = auth.create_key(session, body.scope, name=body.name, run_ids=body.run_ids, runs_prefix=body.runs_prefix)
    session.commit()
    return schemas.KeyCreated(**key_out(row).model_dump(), key=key)


@router.get("", response_model=schemas.KeyPage, responses=RESPONSES)
def list_keys(session: SessionDep, include_revoked: bool = True) -> schemas.KeyPage:
    """Every key (never the key itself, nor its hash)."""
    return schemas.KeyPage(items=[key_out(r) for r in auth.list_keys(session, include_revoked=include_revoked)])


@router.delete("/{key_id}", response_model=schemas.KeyOut, responses=RESPONSES)
def revoke_key(key_id: KeyIdPath, session: SessionDep) -> schemas.KeyOut:
    """Revoke a key (at once, on every replica). Revoking again is harmless."""
    row = auth.revoke_key(session, key_id)
    session.commit()
    return key_out(row)
