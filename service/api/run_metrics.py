"""``POST /v1/runs/{run_id}/metrics`` and ``GET /v1/runs/{run_id}/metrics``: the run's eval
metrics (``service/run_metrics.py``)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field, StringConstraints

from .. import schemas
from .cursors import _decode_cursor, _encode_cursor
from .deps import (
    RESPONSES,
    Cursor,
    EngineDep,
    RunIdPath,
    SessionDep,
    SettingsDep,
    json_body,
    json_body_openapi,
    require_key,
)

router = APIRouter(prefix="/v1/runs/{run_id}", dependencies=[Depends(require_key)], tags=["metrics"])

# Metric names as trainers write them: ``eval_loss``, ``eval/accuracy``,
# ``val-core/openai/gsm8k/reward/mean@4``. No spaces, quotes or control characters.
METRIC_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+=%()\[\]-]{0,199}$"
MetricName = Annotated[str, StringConstraints(pattern=METRIC_NAME_PATTERN, min_length=1, max_length=200)]
# A number: an int or a float (not a bool or a string), finite.
MetricValue = Annotated[float, Field(strict=True, allow_inf_nan=False)]
MAX_NAMES_PER_ENTRY = 1000


class MetricEntry(schemas.Strict):
    step: schemas.Step = Field(description="The trainer step the values were measured at.")
    values: Annotated[dict[MetricName, MetricValue], Field(min_length=1, max_length=MAX_NAMES_PER_ENTRY)] = Field(
        description=f"name → finite number; 1–{MAX_NAMES_PER_ENTRY} names of 1–200 characters "
        "[A-Za-z0-9_.:/@+=%()[]-] (the first a letter, digit or _).",
        # The document states the rule for every key (pydantic's patternProperties alone
        # would let keys that miss the pattern through with any value).
        json_schema_extra={
            "additionalProperties": False,
            "propertyNames": {"pattern": METRIC_NAME_PATTERN, "minLength": 1, "maxLength": 200},
        },
    )


class MetricsIn(schemas.Strict):
    metrics: list[MetricEntry] = Field(
        ...,
        min_length=1,
        description="At most the server's max_metric_entries entries and max_metric_values values in all (413 above).",
    )


class MetricsAck(BaseModel):
    accepted: int = Field(description="Distinct (name, step) values in the request.")
    created: int = Field(description="Values stored for the first time.")
    updated: int = Field(description="Values that replaced a different stored value.")
    unchanged: int = Field(description="Values already stored as sent (a re-sent batch).")


class MetricStep(BaseModel):
    step: int
    values: dict[str, float]
    time: schemas.UtcDatetime | None = Field(description="When the step's latest value was written.")


class MetricPage(schemas.Page):
    names: list[str] = Field(description="Every metric name of the run, sorted.")
    items: list[MetricStep] = Field(description="Steps with at least one value, in step order.")


MetricsBody = Annotated[MetricsIn, Depends(json_body(MetricsIn, limit="max_report_bytes"))]
_STEP_RE = re.compile(r"^[0-9]{1,15}$")
StepLimit = Annotated[int, Query(ge=1, le=10_000, description="Steps per page (at most 10000).")]


@router.post(
    "/metrics",
    response_model=MetricsAck,
    responses=RESPONSES,
    openapi_extra=json_body_openapi(MetricsIn),
)
def post_metrics(run_id: RunIdPath, body: MetricsBody, engine: EngineDep):
    """Store eval metrics of the run: a batch of `{step, values: {name: number}}`. All or
    nothing; idempotent (a re-sent batch changes nothing); a new value for a stored (name,
    step) replaces it. A 200 means the values are committed."""
    return engine.run_metrics.post(run_id, [e.model_dump() for e in body.metrics])


@router.get("/metrics", response_model=MetricPage, responses=RESPONSES)
def get_metrics(
    run_id: RunIdPath,
    engine: EngineDep,
    session: SessionDep,
    settings: SettingsDep,
    name: Annotated[
        list[MetricName] | None, Query(max_length=100, description="Only these metrics (repeat the parameter).")
    ] = None,
    limit: StepLimit = 1000,
    cursor: Cursor = None,
):
    """The run's eval metrics by step, paged by step."""
    run = engine.get_run(session, run_id)
    raw = _decode_cursor(cursor, _STEP_RE)
    items, nxt = engine.run_metrics.page(session, run.pk, name, None if raw is None else int(raw), limit)
    return {
        "names": engine.run_metrics.names(session, run.pk),
        "items": items,
        "next_cursor": None if nxt is None else _encode_cursor(nxt),
    }
