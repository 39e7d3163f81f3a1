"""Strategies: named compositions of an estimator, a selection rule and a
rollout allocator. Each has a pydantic ``Params`` model (validated: a bad value
is a 422) and a ``plan`` that is pure and vectorised over the pool.

A strategy never keeps state of its own: everything it reads is in the
``PoolState``, which is derived from the reward log, so a plan depends only on
(the log, the request, the seed) — the same after a restart.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from . import allocation
from .pool import PoolState


@dataclass(frozen=True)
class PlanRequest:
    batch_size: int
    rollout_budget: int
    min_rollouts: int
    max_rollouts: int
    step: int


@dataclass(frozen=True)
class PlanDecision:
    ordinals: np.ndarray  # int64, distinct, in rank order
    rollouts: np.ndarray  # int64, same length, sums to the budget
    predicted_pass_rate: np.ndarray  # float64


class StrategyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


def plan_rng(run_id: str, step: int, strategy: str) -> np.random.Generator:
    """The generator for one plan: seeded by run, step and strategy, nothing global."""
    digest = hashlib.blake2b(f"{run_id}\x00{step}\x00{strategy}".encode(), digest_size=16).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))


class Strategy:
    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[StrategyParams]] = StrategyParams

    def __init__(self, params: StrategyParams) -> None:
        self.params = params

    def pool_options(self) -> dict:
        """Estimator hyperparameters the run's PoolState is built with."""
        return {}

    def make_pool(self) -> PoolState:
        return PoolState(**self.pool_options())

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        raise NotImplementedError


class Uniform(Strategy):
    name = "uniform"
    description = "Plain random sampling without replacement; equal rollouts per prompt."

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        chosen = rng.choice(pool.size, size=req.batch_size, replace=False).astype(np.int64)
        rollouts = allocation.equal(req.batch_size, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, pool.predicted_pass_rate(chosen))


class BetaParams(StrategyParams):
    forgetting: float = Field(
        0.5, gt=0.0, le=1.0, description="λ: weight kept by old evidence at each new observation (MoPPS: 0.5)."
    )
    prior_strength: float = Field(
        2.0, gt=0.0, le=1e6, description="Pseudo-counts of the prior Beta (2 with mean 0.5 = Beta(1,1))."
    )
    candidate_multiplier: float = Field(
        16.0, ge=1.0, le=1e6, description="Candidate pool size as a multiple of the batch (MoPPS: 16)."
    )
    thompson: bool = Field(True, description="Score a Thompson sample (True) or the posterior mean.")


class BetaThompson(Strategy):
    name = "beta"
    description = (
        "MoPPS: per-prompt Beta posterior with forgetting, Thompson-sampled over a random candidate "
        "pool; picks the prompts with the highest probability of an informative group "
        "1 − pⁿ − (1−p)ⁿ; equal rollouts per prompt."
    )
    Params = BetaParams

    def pool_options(self) -> dict:
        p: BetaParams = self.params  # type: ignore[assignment]
        return {"forgetting": p.forgetting, "prior_strength": p.prior_strength}

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p: BetaParams = self.params  # type: ignore[assignment]
        B = req.batch_size
        n_cand = min(pool.size, max(B, int(np.ceil(p.candidate_multiplier * B))))
        if n_cand < pool.size:
            cand = rng.choice(pool.size, size=n_cand, replace=False).astype(np.int64)
        else:
            cand = np.arange(pool.size, dtype=np.int64)
        a, b = pool.posterior(cand)
        theta = rng.beta(a, b) if p.thompson else a / (a + b)
        n = req.rollout_budget / B
        score = 1.0 - theta**n - (1.0 - theta) ** n
        if B < cand.size:
            top = np.argpartition(-score, B - 1)[:B]
        else:
            top = np.arange(cand.size)
        # Rank order: best first; ties broken by ordinal so the order is reproducible.
        top = top[np.lexsort((cand[top], -score[top]))]
        chosen = cand[top]
        rollouts = allocation.equal(B, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, a[top] / (a[top] + b[top]))


class Default(BetaThompson):
    name = "default"
    description = "The project's best general-purpose strategy. Currently: " + BetaThompson.description


REGISTRY: dict[str, type[Strategy]] = {s.name: s for s in (Default, Uniform, BetaThompson)}


def build(name: str, params: dict | None) -> Strategy:
    """Build a strategy; raises KeyError for an unknown name, pydantic's
    ValidationError for bad parameters."""
    cls = REGISTRY[name]
    return cls(cls.Params.model_validate(params or {}))
