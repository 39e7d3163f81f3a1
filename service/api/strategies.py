"""``GET /v1/strategies``: the strategies this server has, with their parameter schemas."""

from __future__ import annotations

from .. import schemas
from ..scheduling import strategies as strat
from .deps import v1_router

router = v1_router()


@router.get("/strategies", response_model=list[schemas.StrategyInfo], tags=["strategies"])
def list_strategies() -> list[schemas.StrategyInfo]:
    """Every registered strategy with its description and parameter schema."""
    return [
        schemas.StrategyInfo(name=cls.name, description=cls.description, params_schema=cls.Params.model_json_schema())
        for cls in strat.REGISTRY.values()
    ]
