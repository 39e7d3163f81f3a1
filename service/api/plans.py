"""Plans: which prompts to roll out at a step and how many rollouts each, and the
two-phase extension of a plan (``service/plans.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Response, status

from .. import schemas
from .deps import RESPONSES, EngineDep, RunIdPath, v1_router

router = v1_router()


@router.post(
    "/runs/{run_id}/plans",
    response_model=schemas.PlanOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": schemas.PlanOut, "description": "The stored plan of this step"}, **RESPONSES},
    tags=["plans"],
)
def create_plan(run_id: RunIdPath, body: schemas.PlanIn, engine: EngineDep, response: Response):
    """Which prompts to roll out at a step, and how many rollouts each. The same step
    asked again returns the same stored plan (200); with a different body, 409."""
    created, plan = engine.plan(run_id, body)
    # Serialised by the engine in the PlanOut shape; answered without re-validating every item.
    return Response(
        plan.to_json(),
        status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        media_type="application/json",
    )


@router.post(
    "/runs/{run_id}/plans/{plan_id}/extend",
    response_model=schemas.ExtendOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": schemas.ExtendOut, "description": "The stored extension"}, **RESPONSES},
    tags=["plans"],
)
def extend_plan(
    run_id: RunIdPath,
    plan_id: Annotated[str, Path(max_length=64)],
    body: schemas.ExtendIn,
    engine: EngineDep,
    response: Response,
):
    """Two-phase plans (Pilot-Commit): after the pilot rewards of a plan are reported
    (with its `plan_id`), add up to `extra_budget` rollouts to the prompts whose pilot pass
    rate is in [0.125, 0.75], split to minimise the variance Σ p(1−p)/n given the pilot
    counts (Neyman-style), each prompt within `max_rollouts`. Once per plan; the same call
    again returns it (200)."""
    created, out = engine.extend(run_id, plan_id, body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return out
