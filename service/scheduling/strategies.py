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
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from . import allocation
from .hmm import SolveStateHMM
from .irt import SkillDifficultyModel, prior_logit
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
    hierarchical: bool = Field(
        False,
        description="Shrink prompts with little history toward their domain's pass-rate distribution "
        "(empirical Bayes) instead of Beta(1,1).",
    )


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
        return {"forgetting": p.forgetting, "prior_strength": p.prior_strength, "hierarchical": p.hierarchical}

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p: BetaParams = self.params  # type: ignore[assignment]
        B = req.batch_size
        cand = candidates(pool.size, B, p.candidate_multiplier, rng)
        a, b = pool.posterior(cand)
        theta = rng.beta(a, b) if p.thompson else a / (a + b)
        n = req.rollout_budget / B
        score = 1.0 - theta**n - (1.0 - theta) ** n
        top = top_k(score, B, cand)
        chosen = cand[top]
        rollouts = allocation.equal(B, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, a[top] / (a[top] + b[top]))


class SkillTracker:
    """Adapts the item-response model to the pool's observations."""

    def __init__(self, model: SkillDifficultyModel, staleness_decay: float) -> None:
        self.model = model
        self.staleness_decay = staleness_decay

    def grow(self, size: int, n_domains: int) -> None:
        self.model.grow(size, n_domains)

    def move_domain(self, o, old_d, new_d) -> None:
        self.model.move_domain(o, old_d, new_d)

    def observe(self, pool: PoolState, obs) -> None:
        o = obs.ordinals
        w = self.staleness_decay ** obs.staleness.astype(np.float64)
        self.model.observe(o, pool.domain[o], w * obs.n, w * obs.successes, obs.step, prior_logit(pool.prior_pass_rate[o]))


class FrontierParams(StrategyParams):
    skill_drift: float = Field(0.02, ge=0.0, le=10.0, description="Variance added to a domain's skill per step.")
    difficulty_drift: float = Field(
        0.002, ge=0.0, le=10.0, description="Variance added to a prompt's difficulty per step unseen."
    )
    candidate_multiplier: float = Field(64.0, ge=1.0, le=1e6, description="Candidate pool as a multiple of the batch.")
    thompson: bool = Field(
        False, description="Score a Thompson draw, or (default, better on the benchmark) the predictive mean."
    )


class Frontier(Strategy):
    name = "frontier"
    description = (
        "Rollplan's item-response model: pass rate = σ(skill of the prompt's domain − prompt difficulty); "
        "the skill is re-estimated from every report (tracking the policy's drift), the difficulty per prompt "
        "(stable, shrunk to its domain's distribution when unseen); Thompson-sampled; picks the highest "
        "probability of an informative group; equal rollouts."
    )
    Params = FrontierParams

    def make_pool(self) -> PoolState:
        p: FrontierParams = self.params  # type: ignore[assignment]
        pool = PoolState()
        model = SkillDifficultyModel(skill_drift=p.skill_drift, difficulty_drift=p.difficulty_drift)
        pool.trackers["skill"] = SkillTracker(model, pool.staleness_decay)
        return pool

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p: FrontierParams = self.params  # type: ignore[assignment]
        model: SkillDifficultyModel = pool.trackers["skill"].model  # type: ignore[attr-defined]
        B = req.batch_size
        cand = candidates(pool.size, B, p.candidate_multiplier, rng)
        d = pool.domain[cand]
        pl = prior_logit(pool.prior_pass_rate[cand])
        step = max(req.step, pool.step)
        theta = model.sample(cand, d, pl, step, rng) if p.thompson else model.predict(cand, d, pl, step)
        n = req.rollout_budget / B
        top = top_k(1.0 - theta**n - (1.0 - theta) ** n, B, cand)
        chosen = cand[top]
        rollouts = allocation.equal(B, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, model.predict(chosen, pool.domain[chosen], pl[top], step))


def candidates(size: int, batch: int, multiplier: float, rng: np.random.Generator) -> np.ndarray:
    """A uniform candidate pool of ``multiplier × batch`` prompts (all when the pool is small)."""
    n = min(size, max(batch, int(np.ceil(multiplier * batch))))
    if n < size:
        return rng.choice(size, size=n, replace=False).astype(np.int64)
    return np.arange(size, dtype=np.int64)


def top_k(score: np.ndarray, k: int, key: np.ndarray) -> np.ndarray:
    """Indices of the k highest scores, best first; ties broken by ``key``."""
    top = np.argpartition(-score, k - 1)[:k] if k < score.size else np.arange(score.size)
    return top[np.lexsort((key[top], -score[top]))]


class HMMTracker:
    """Adapts the DPS solving-state HMM to the pool's observations."""

    def __init__(self, hmm: SolveStateHMM) -> None:
        self.hmm = hmm

    def grow(self, size: int, n_domains: int) -> None:
        self.hmm.grow(size, n_domains)

    def observe(self, pool: PoolState, obs) -> None:
        o = obs.ordinals
        self.hmm.observe(o, obs.n, obs.successes, obs.step, pool.domain[o])


class DPSParams(StrategyParams):
    forgetting: float = Field(0.7, gt=0.0, le=1.0, description="λ of the transition counts (DPS: 0.7 math).")
    emission: Literal["exact", "binomial"] = Field(
        "exact", description="exact: the group's state is observed (DPS); binomial: the group is evidence (ours)."
    )
    pooled: bool = Field(False, description="Share transition counts across a domain's prompts (ours).")
    candidate_multiplier: float = Field(16.0, ge=1.0, le=1e6, description="Candidate pool (DPS: 8–32× the batch).")


class DPS(Strategy):
    name = "dps"
    description = (
        "Dynamics-Predictive Sampling: a 3-state HMM (unsolved / partially solved / solved) per prompt with "
        "Dirichlet transition counts and forward filtering; prompts not rolled out are predicted forward "
        "without spending rollouts; picks the highest predicted P(partially solved) from a candidate pool."
    )
    Params = DPSParams

    def make_pool(self) -> PoolState:
        p: DPSParams = self.params  # type: ignore[assignment]
        pool = PoolState()
        pool.trackers["hmm"] = HMMTracker(SolveStateHMM(p.forgetting, p.emission, p.pooled))
        return pool

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p: DPSParams = self.params  # type: ignore[assignment]
        hmm: SolveStateHMM = pool.trackers["hmm"].hmm  # type: ignore[attr-defined]
        B = req.batch_size
        cand = candidates(pool.size, B, p.candidate_multiplier, rng)
        belief = hmm.beliefs(cand, max(req.step, pool.step + 1))
        # Ties (e.g. never-seen prompts, all uniform) broken at random, not by ordinal.
        top = top_k(belief[:, 1], B, rng.permutation(cand.size))
        chosen = cand[top]
        rollouts = allocation.equal(B, req.rollout_budget, req.min_rollouts, req.max_rollouts)
        return PlanDecision(chosen, rollouts, pool.predicted_pass_rate(chosen))


class Default(BetaThompson):
    name = "default"
    description = "The project's best general-purpose strategy. Currently: " + BetaThompson.description


REGISTRY: dict[str, type[Strategy]] = {s.name: s for s in (Default, Uniform, BetaThompson, Frontier, DPS)}


def build(name: str, params: dict | None) -> Strategy:
    """Build a strategy; raises KeyError for an unknown name, pydantic's
    ValidationError for bad parameters."""
    cls = REGISTRY[name]
    return cls(cls.Params.model_validate(params or {}))
