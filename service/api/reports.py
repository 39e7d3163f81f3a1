"""Reports: the rewards of rolled-out groups, ``POST /v1/runs/{run_id}/results``
(``service/reports.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from .. import schemas
from .deps import RESPONSES, EngineDep, RunIdPath, json_body, json_body_openapi, v1_router

router = v1_router()


ResultsBody = Annotated[schemas.ResultsIn, Depends(json_body(schemas.ResultsIn, limit="max_report_bytes"))]


@router.post(
    "/runs/{run_id}/results",
    response_model=schemas.ResultsAck,
    responses=RESPONSES,
    tags=["results"],
    openapi_extra=json_body_openapi(schemas.ResultsIn),
)
def report_results(run_id: RunIdPath, body: ResultsBody, engine: EngineDep):
    """Report the rewards of rolled-out groups. All-or-nothing; idempotent by `report_id`;
    a 200 means the rewards are committed."""
    return engine.report(run_id, body)
