"""``GET /v1/runs/{run_id}/data-quality``: prompts that look broken, always solved or noisy,
with their evidence and a confidence (``service/quality.py``), as JSON pages or as a
CSV / JSON Lines download of every finding."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from .. import quality
from .cursors import _decode_cursor, _encode_cursor
from .deps import EngineDep, SessionDep, require_key
from .v1 import RESPONSES, Cursor, RunIdPath

_OFFSET = re.compile(r"^[0-9]{1,9}$")
router = APIRouter(prefix="/v1/runs/{run_id}", dependencies=[Depends(require_key)], tags=["inspection"])

COLUMNS = (
    "prompt_id", "domain", "kind", "confidence", "groups", "rollouts", "passes", "all_pass_groups",
    "all_fail_groups", "last_step", "predicted_pass_rate",
)  # fmt: skip


class Finding(BaseModel):
    prompt_id: str
    domain: str | None
    kind: Literal["broken", "solved", "noisy"] = Field(
        description="broken: never passed (wrong label or unverifiable answer?); solved: always passed "
        "(a candidate to drop); noisy: both all-pass and all-fail groups, more than its pass rate explains."
    )
    confidence: float = Field(description="How sure the run's own estimates are of the kind, in [0, 1].")
    groups: int
    rollouts: int
    passes: float = Field(description="Sum of rewards mapped onto [0, 1] (successes).")
    all_pass_groups: int
    all_fail_groups: int
    last_step: int | None
    predicted_pass_rate: float = Field(description="The strategy's predicted pass rate.")


class QualityPage(BaseModel):
    counts: dict[str, int] = Field(description="Findings of each kind at this confidence, before the filters.")
    criteria: dict[str, float | int]
    items: list[Finding]
    next_cursor: str | None = None


def _findings(state, kind, domain, min_rollouts, min_confidence, sort, order):
    f = quality.find(state, min_rollouts=min_rollouts, min_confidence=min_confidence)
    ords, kinds, conf = f.ordinals, f.kind, f.confidence
    names = state.domain_names()
    keep = np.ones(ords.size, bool)
    if kind is not None:
        keep &= kinds == quality.KINDS.index(kind)
    if domain is not None:
        code = state.domain_codes.get(domain)
        keep &= np.zeros(ords.size, bool) if code is None else quality.evidence(state, ords)["domain"] == code
    ords, kinds, conf = ords[keep], kinds[keep], conf[keep]
    ev = quality.evidence(state, ords)
    key = {"confidence": conf, "rollouts": ev["rollouts"], "last_step": ev["last_step"]}[sort]
    order_idx = np.lexsort((ords, -key if order == "desc" else key))
    rows = []
    for i in order_idx.tolist():
        last = int(ev["last_step"][i])
        rows.append({
            "prompt_id": state.ids[int(ords[i])],
            "domain": names[int(ev["domain"][i])],
            "kind": quality.KINDS[int(kinds[i])],
            "confidence": float(conf[i]),
            "groups": int(ev["groups"][i]),
            "rollouts": int(ev["rollouts"][i]),
            "passes": float(ev["passes"][i]),
            "all_pass_groups": int(ev["all_pass_groups"][i]),
            "all_fail_groups": int(ev["all_fail_groups"][i]),
            "last_step": last if last >= 0 else None,
            "predicted_pass_rate": float(ev["predicted_pass_rate"][i]),
        })  # fmt: skip
    return f.counts, rows


DOWNLOADS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "JSON: a page of findings. format=csv / jsonl: every finding, one per line, columns "
        + ", ".join(COLUMNS)
        + ".",
        "content": {"text/csv": {"schema": {"type": "string"}}, "application/x-ndjson": {"schema": {"type": "string"}}},
    }
}


@router.get("/data-quality", response_model=QualityPage, responses={**DOWNLOADS, **RESPONSES})
def data_quality(
    run_id: RunIdPath,
    engine: EngineDep,
    session: SessionDep,
    kind: Annotated[Literal["broken", "solved", "noisy"] | None, Query()] = None,
    domain: Annotated[str | None, Query(max_length=200)] = None,
    min_rollouts: Annotated[int, Query(ge=1, le=1_000_000, description="Evidence needed to list a prompt.")] = 16,
    min_confidence: Annotated[float, Query(ge=0, le=1)] = 0.9,
    sort: Annotated[Literal["confidence", "rollouts", "last_step"], Query()] = "confidence",
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    format: Annotated[
        Literal["json", "csv", "jsonl"], Query(description="csv / jsonl: every finding, streamed.")
    ] = "json",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
):
    """Prompts a user may want to fix or drop: never passed (likely wrong labels or
    unverifiable answers), always passed (no gradient left), reward that flips (a noisy
    verifier), each with its evidence and a confidence from the run's own estimates."""
    run = engine.get_run(session, run_id)
    state = engine.context(session, run)
    counts, rows = _findings(state, kind, domain, min_rollouts, min_confidence, sort, order)
    criteria = {"min_rollouts": min_rollouts, "min_confidence": min_confidence}
    if format == "json":
        raw = _decode_cursor(cursor, _OFFSET)
        start = int(raw) if raw is not None else 0
        page = rows[start : start + limit]
        nxt = _encode_cursor(start + limit) if start + limit < len(rows) else None
        return {"counts": counts, "criteria": criteria, "items": page, "next_cursor": nxt}

    def lines() -> Iterator[str]:
        if format == "jsonl":
            for r in rows:
                yield json.dumps(r, separators=(",", ":")) + "\n"
            return
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(["" if r[c] is None else r[c] for c in COLUMNS])
        yield buf.getvalue()

    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    filename = f"{run_id}-data-quality.{format}"
    return StreamingResponse(
        lines(), media_type=media, headers={"Content-Disposition": f'attachment; filename="{filename}"'}
    )
