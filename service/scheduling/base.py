"""What every strategy shares: the request and decision types, the parameters' base
model, the per-plan generator, the allocators' dispatch, the ``Strategy`` base class
and the registry of strategies by name (``strategies`` registers the built-in ones,
``baselines`` the reproduced baselines)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar, Generic, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import stats as scipy_stats

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


ALLOCATORS = ("equal", "greedy_informative", "neyman", "inverse_success", "knapsack")
Allocator = Literal["equal", "greedy_informative", "neyman", "inverse_success", "knapsack"]


def allocate(kind: str, p: np.ndarray, req: PlanRequest) -> np.ndarray:
    """Split the plan's budget over the chosen prompts (in rank order) with ``kind``."""
    B, budget, lo, hi = p.size, req.rollout_budget, req.min_rollouts, req.max_rollouts
    if kind == "equal":
        return allocation.equal(B, budget, lo, hi)
    fn = {
        "greedy_informative": allocation.greedy_informative,
        "neyman": allocation.neyman,
        "inverse_success": allocation.inverse_success,
        "knapsack": allocation.knapsack,
    }[kind]
    return np.asarray(fn(np.clip(p, 1e-6, 1 - 1e-6), budget, lo, hi), np.int64)


P = TypeVar("P", bound="StrategyParams")


class Strategy(Generic[P]):
    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[StrategyParams]] = StrategyParams

    def __init__(self, params: P) -> None:
        self.params: P = params

    def make_pool(self) -> PoolState:
        """The run's pool state, with the estimators and trackers this strategy reads."""
        return PoolState()

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        raise NotImplementedError

    def predict(self, pool: PoolState, idx: np.ndarray, step: int) -> np.ndarray:
        """Predicted pass rates (for plans, calibration and the API)."""
        return pool.predicted_pass_rate(idx)

    def interval(
        self, pool: PoolState, idx: np.ndarray, step: int, level: float = 0.9
    ) -> tuple[np.ndarray, np.ndarray]:
        """Central credible interval of the pass rate under the model ``predict`` uses
        (here the per-prompt Beta posterior, whose mean ``predict`` is)."""
        a, b = pool.posterior(idx)
        q = (1.0 - level) / 2.0
        return scipy_stats.beta.ppf(q, a, b), scipy_stats.beta.ppf(1.0 - q, a, b)

    def prompt_estimates(self, pool: PoolState, idx: np.ndarray, step: int) -> dict[str, np.ndarray]:
        """Per-prompt estimates of this strategy's own model, for the API (arrays over idx)."""
        return {}

    def inspect(self, pool: PoolState, domains: list[str | None] | None = None) -> dict:
        """The strategy's run-level state, for the API (bandit weights …): the merged
        ``inspect()`` of the pool's trackers; ``{}`` when it has none. With ``domains``
        (the name of each domain code), a tracker's per-domain lists (its ``per_domain``
        keys) become objects keyed by domain name ("(none)" for prompts without one)."""
        out: dict = {}
        for t in pool.trackers.values():
            part = t.inspect()
            if domains is not None:
                for key in getattr(t, "per_domain", ()):
                    if isinstance(part.get(key), list):
                        part[key] = {("(none)" if n is None else n): v for n, v in zip(domains, part[key])}
            out.update(part)
        return out

    def extend(
        self,
        pool: PoolState,
        ordinals: np.ndarray,
        pilot_n: np.ndarray,
        pilot_k: np.ndarray,
        extra: int,
        hi: np.ndarray,
    ) -> np.ndarray:
        """Extra rollouts per plan prompt after its pilot (Pilot-Commit): prompts whose
        pilot pass rate is in [0.125, 0.75] are kept, the rest (too easy, unsolved,
        not reported) get none. The extra budget goes to the kept ones to minimise the
        variance of the gradient estimate Σ σᵢ²/nᵢ, σᵢ² = pᵢ(1−pᵢ) at ``predict`` (which
        includes the pilot) and nᵢ = pilot + extra: greedy on the marginal gains
        σᵢ²/(n(n+1)), which decrease in n, so greedy is optimal (Neyman allocation given
        the pilot counts). Each prompt stays within its remaining room ``hi``.
        Returns an int64 array summing to min(extra, total room of the kept)."""
        out = np.zeros(ordinals.size, np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(pilot_n > 0, pilot_k / np.maximum(pilot_n, 1), np.nan)
        keep = np.flatnonzero((rate >= 0.125) & (rate <= 0.75) & (hi > 0))
        if keep.size == 0 or extra <= 0:
            return out
        room = hi[keep]
        budget = int(min(extra, room.sum()))
        p = np.clip(self.predict(pool, ordinals[keep], pool.step + 1), 1e-6, 1 - 1e-6)
        cap = int(room.max())
        n = pilot_n[keep][:, None] + np.arange(cap)[None, :]
        gains = (p * (1 - p))[:, None] / np.maximum(n * (n + 1), 1)
        gains = np.where(np.arange(cap)[None, :] < room[:, None], gains, -np.inf)
        flat = np.argsort(-gains, axis=None, kind="stable")[:budget]
        np.add.at(out, keep[flat // cap], 1)
        return out
