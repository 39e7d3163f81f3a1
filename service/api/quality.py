"""``GET /v1/runs/{run_id}/data-quality``: prompts that look like wrong labels, too hard
for now, always solved, noisy or learned, with their evidence and a confidence
(``service/quality.py``), as JSON pages or as a CSV / JSON Lines download of every
finding."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from .. import quality
from ..errors import Invalid
from .cursors import _decode_cursor, _encode_cursor
from .deps import RESPONSES, Cursor, EngineDep, RunIdPath, SessionDep, require_key
from .downloads import download

_OFFSET = re.compile(r"^[0-9]{1,9}$")
router = APIRouter(prefix="/v1/runs/{run_id}", dependencies=[Depends(require_key)], tags=["inspection"])

COLUMNS = (
    "prompt_id", "domain", "kind", "confidence", "groups", "rollouts", "passes", "all_pass_groups",
    "all_fail_groups", "last_group_mean", "last_step", "predicted_pass_rate",
)  # fmt: skip
Kind = Literal["broken", "solved", "noisy", "too_hard", "learned"]
Sort = Literal[
    "confidence", "rollouts", "last_step", "groups", "passes", "predicted_pass_rate", "prompt_id", "domain", "kind",
]  # fmt: skip


class Finding(BaseModel):
    prompt_id: str
    domain: str | None
    kind: Kind = Field(
        description="broken: a wrong label (or an answer the verifier cannot check): never passed where prompts "
        "of its domain at its estimated difficulty pass; too_hard: never passed, as a real prompt of its domain "
        "would now (too hard for now, not wrong); solved: always passed (a candidate to drop); noisy: outcomes "
        "inconsistent at a stable level (a noisy verifier?); learned: its outcomes changed once from failing to "
        "passing (the policy learned it; not noisy)."
    )
    confidence: float = Field(description="How sure the run's own estimates are of the kind, in [0, 1].")
    groups: int
    rollouts: int
    passes: float = Field(description="Sum of rewards mapped onto [0, 1] (successes).")
    all_pass_groups: int
    all_fail_groups: int
    last_group_mean: float = Field(description="Mean reward of its last group, on [0, 1].")
    last_step: int | None
    predicted_pass_rate: float = Field(description="The strategy's predicted pass rate.")


class QualityPage(BaseModel):
    counts: dict[str, int] = Field(description="Findings of each kind at this confidence, before the filters.")
    criteria: dict[str, float | int]
    model: Literal["log", "strategy", "beta"] = Field(
        description="Whose stuck/solved posterior the confidences are: log (the view's own): each group of the "
        "run's reward log weighed against how prompts of its domain passed at that group's step; strategy / beta "
        "(the pool's counts against the strategy's latent classes or an empirical-Bayes Beta test) where a "
        "caller of service/quality.py gives no log."
    )
    items: list[Finding]
    next_cursor: str | None = None


def _findings(state, kind, domain, min_rollouts, min_confidence, sort, order, log=None):
    code = None
    if domain is not None:
        code = state.domain_codes.get(domain)
        if code is None:
            known = [n if len(n) <= 40 else n[:40] + "…" for n in state.domain_names() if n is not None]
            listed = ", ".join(map(repr, known[:20])) + (" …" if len(known) > 20 else "")
            raise Invalid(f"domain {domain[:80]!r} is not a domain of this run; its domains: {listed or 'none'}")
    f = quality.find(state, min_rollouts=min_rollouts, min_confidence=min_confidence, log=log)
    ords, kinds, conf = f.ordinals, f.kind, f.confidence
    names = state.domain_names()
    keep = np.ones(ords.size, bool)
    if kind is not None:
        keep &= kinds == quality.KINDS.index(kind)
    if code is not None:
        keep &= quality.evidence(state, ords)["domain"] == code
    ords, kinds, conf = ords[keep], kinds[keep], conf[keep]
    ev = quality.evidence(state, ords)
    if sort in ("prompt_id", "domain", "kind"):
        labels = {
            "prompt_id": state.ids.take(ords),
            "domain": ["" if names[int(c)] is None else str(names[int(c)]) for c in ev["domain"].tolist()],
            "kind": [quality.KINDS[int(c)] for c in kinds.tolist()],
        }[sort]
        key = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)[1].astype(np.float64)
    else:
        key = {
            "confidence": conf,
            "rollouts": ev["rollouts"],
            "last_step": ev["last_step"],
            "groups": ev["groups"],
            "passes": ev["passes"],
            "predicted_pass_rate": ev["predicted_pass_rate"],
        }[sort].astype(np.float64)
    order_idx = np.lexsort((ords, -key if order == "desc" else key))
    ids = state.ids.take(ords[order_idx])
    rows = []
    for j, i in enumerate(order_idx.tolist()):
        last = int(ev["last_step"][i])
        rows.append({
            "prompt_id": ids[j],
            "domain": names[int(ev["domain"][i])],
            "kind": quality.KINDS[int(kinds[i])],
            "confidence": float(conf[i]),
            "groups": int(ev["groups"][i]),
            "rollouts": int(ev["rollouts"][i]),
            "passes": float(ev["passes"][i]),
            "all_pass_groups": int(ev["all_pass_groups"][i]),
            "all_fail_groups": int(ev["all_fail_groups"][i]),
            "last_group_mean": round(float(ev["last_group_mean"][i]), 4),
            "last_step": last if last >= 0 else None,
            "predicted_pass_rate": float(ev["predicted_pass_rate"][i]),
        })  # fmt: skip
    return f.counts, rows, f.model


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
    kind: Annotated[Kind | None, Query()] = None,
    domain: Annotated[
        str | None, Query(max_length=200, description="A domain of the run (422 if it has none such).")
    ] = None,
    min_rollouts: Annotated[
        int, Query(ge=1, le=1_000_000, description="Rollouts a prompt needs to be listed (default 1: one group).")
    ] = 1,
    min_confidence: Annotated[
        float,
        Query(
            ge=0,
            le=1,
            description="Least probability of the kind (default 0.5: more likely than not). 0 lists every prompt "
            "whose evidence allows a kind (never or always passed; or 3+ groups with passes and fails).",
        ),
    ] = quality.DEFAULT_MIN_CONFIDENCE,
    sort: Annotated[Sort, Query()] = "confidence",
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    format: Annotated[
        Literal["json", "csv", "jsonl", "ndjson"],
        Query(description="csv / jsonl (also named ndjson): every finding, streamed."),
    ] = "json",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
):
    """Prompts a user may want to fix or drop: wrong labels (never passed where prompts like
    them pass), too hard for now (never passed, as prompts of their level do), always
    passed (no gradient left), noisy (outcomes inconsistent at a stable level) and learned
    (failing, then passing), each with its evidence and a confidence from the run's own
    model (``service/quality.py``)."""
    run = engine.get_run(session, run_id)
    state = engine.context(session, run)
    log = quality.store_log(session, state)
    counts, rows, model = _findings(state, kind, domain, min_rollouts, min_confidence, sort, order, log)
    criteria = {"min_rollouts": min_rollouts, "min_confidence": min_confidence}
    if format == "json":
        raw = _decode_cursor(cursor, _OFFSET)
        start = int(raw) if raw is not None else 0
        page = rows[start : start + limit]
        nxt = _encode_cursor(start + limit) if start + limit < len(rows) else None
        return {"counts": counts, "criteria": criteria, "model": model, "items": page, "next_cursor": nxt}
    return download(rows, COLUMNS, format, f"{run_id}-data-quality")
