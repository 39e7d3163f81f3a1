"""Baselines: the curricula built into two RL trainers, as strategies, so a run can be
compared with what its users would otherwise pick.

- ``prime_rl``: prime-rl's ``difficulty_pool`` task sampler (PrimeIntellect-ai/prime-rl
  ``src/prime_rl/orchestrator/curriculum/samplers/pool.py``, ``DifficultyPoolSampler``) and,
  with ``sampler: buffer``, the difficulty pools of its earlier ``[orchestrator.buffer]``
  (``src/prime_rl/orchestrator/buffer.py``, up to v0.5).
- ``open_instruct``: AllenAI Open-Instruct's ``no_resampling_pass_rate`` over its shuffled
  epochs (allenai/open-instruct ``open_instruct/data_loader.py``: ``process_group``,
  ``HFDataLoader``).

Both trainers also drop groups whose rewards are all equal before the update
(prime-rl ``filter_zero_advantages``, Open-Instruct ``filter_zero_std_samples``, both on by
default). That happens in the trainer after the rollouts are spent, so it saves none, and
both trainers update their sampler state *before* the filter: every reported group counts
here, a zero-variance one included. The math and the exact sources: ``docs/methods/baselines.md``.

The state each needs (a prompt's latest group mean and its difficulty pool, a sticky
"retired" flag) is kept by the trackers below, updated from the committed reports in commit
order (the order in which the trainers observe finished groups), so it is a pure function of
the reward log. Neither depends on when prompts were registered relative to reports.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from . import allocation, selection
from .base import PlanDecision, PlanRequest, Strategy, StrategyParams
from .pool import Observations, PoolState
from .util import grow

__all__ = ["DifficultyPool", "LatestGroupMean", "OpenInstruct", "PrimeRL", "Retirement"]

ACTIVE, RETIRED_EASY, RETIRED_HARD = 0, 1, 2
UNSEEN = -1


def _mean_of_groups(obs: Observations) -> tuple[np.ndarray, np.ndarray]:
    """(ordinals, mean reward on [0, 1]) of the report's groups with at least one rollout, in order."""
    keep = obs.n > 0
    return obs.ordinals[keep], obs.successes[keep] / obs.n[keep]


def _last_occurrence(o: np.ndarray) -> np.ndarray:
    """Index of the last element of each distinct value of ``o`` (a fancy assignment with repeated
    indices does not promise which value is kept)."""
    rev = o[::-1]
    _, first_in_rev = np.unique(rev, return_index=True)
    return o.size - 1 - first_in_rev


# -- trackers ----------------------------------------------------------------------------
class LatestGroupMean:
    """prime-rl ``DifficultyPoolSampler.observe``: each prompt's latest group-mean reward and the
    pool it falls in. Pools are sorted by threshold; a prompt is in the first pool whose (inclusive)
    threshold is at least its latest mean, or in the last pool when it is above every threshold.
    ``pool_`` is −1 for a prompt without a group yet."""

    def __init__(self, thresholds: np.ndarray) -> None:
        self.thresholds = np.asarray(thresholds, np.float64)  # ascending
        self.latest_ = np.zeros(0, np.float32)  # shown only
        self.pool_ = np.zeros(0, np.int8)

    def grow(self, size: int, n_domains: int) -> None:
        self.latest_ = grow(self.latest_, size, np.nan)
        self.pool_ = grow(self.pool_, size, UNSEEN)

    def pool_of(self, mean: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.thresholds, mean, side="left")  # first threshold ≥ mean
        return np.minimum(k, self.thresholds.size - 1).astype(np.int8)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        o, mean = _mean_of_groups(obs)
        if o.size == 0:
            return
        last = _last_occurrence(o)  # a later group of the same prompt replaces an earlier one
        o, mean = o[last], mean[last]
        self.latest_[o] = mean
        self.pool_[o] = self.pool_of(mean)

    def inspect(self) -> dict:
        return {}


class Retirement:
    """A prompt leaves sampling for good once a group's mean reward is ≥ ``easy`` (code 1) or
    ≤ ``hard`` (code 2); either may be None (off). ``per_report``: the mean is taken over all of the
    prompt's rollouts in the report (prime-rl's buffer averaged per ``update`` call), else per group
    (Open-Instruct's ``process_group``). The first crossing decides the code; later groups change
    nothing. ``retired_`` is 0 for prompts still sampled."""

    def __init__(self, easy: float | None, hard: float | None, per_report: bool) -> None:
        self.easy, self.hard, self.per_report = easy, hard, per_report
        self.retired_ = np.zeros(0, np.int8)

    def grow(self, size: int, n_domains: int) -> None:
        self.retired_ = grow(self.retired_, size, ACTIVE)

    def observe(self, pool: PoolState, obs: Observations) -> None:
        if self.easy is None and self.hard is None:
            return
        keep = obs.n > 0
        o, n, s = obs.ordinals[keep], obs.n[keep], obs.successes[keep]
        if o.size == 0:
            return
        if self.per_report:
            o, inv = np.unique(o, return_inverse=True)
            mean = np.bincount(inv, weights=s) / np.bincount(inv, weights=n)
        else:
            mean = s / n
        code = np.zeros(o.size, np.int8)
        if self.easy is not None:
            code[mean >= self.easy] = RETIRED_EASY
        if self.hard is not None:
            code[(code == ACTIVE) & (mean <= self.hard)] = RETIRED_HARD
        hit = code != ACTIVE
        o, code = o[hit], code[hit]
        _, first = np.unique(o, return_index=True)  # the first crossing of each prompt
        o, code = o[first], code[first]
        new = self.retired_[o] == ACTIVE
        self.retired_[o[new]] = code[new]

    def inspect(self) -> dict:
        return {}


# -- sampling helpers ----------------------------------------------------------------------
def _weighted_by_class(cls: np.ndarray, weight: np.ndarray, B: int, rng: np.random.Generator) -> np.ndarray:
    """B distinct ordinals drawn one after another without replacement, each with probability
    proportional to the weight ``weight[cls[i]]`` of its class (classes are small integers).

    Exact and O(size + B·classes): the class of each draw comes from the Gumbel top-k trick
    (top B of log wᵢ + Gᵢ over all prompts = successive draws ∝ w without replacement), where
    the top m Gumbels of a class of n equal-weight prompts are generated directly as
    −log of the m smallest of n Exp(1) (Rényi: E₍ⱼ₎ = Σ_{i≤j} Xᵢ/(n−i+1)); the prompts of a class
    are then a uniform sample of it. When fewer than B prompts have a positive weight, the rest
    of the batch is drawn uniformly from the zero-weight ones."""
    counts = np.bincount(cls, minlength=weight.size)
    live = np.flatnonzero((weight > 0) & (counts > 0))
    take = int(min(B, counts[live].sum()))
    keys, owner = [], []
    for c in live:  # a loop over classes, not prompts
        m = int(min(take, counts[c]))
        e = np.cumsum(rng.exponential(size=m) / (counts[c] - np.arange(m)))
        with np.errstate(divide="ignore"):
            keys.append(np.log(weight[c]) - np.log(e))
        owner.append(np.full(m, c, np.int64))
    out = np.empty(B, np.int64)
    if take:
        seq = np.concatenate(owner)[selection.top_k(np.concatenate(keys), take)]  # class of each draw
        for c in np.unique(seq):
            slots = np.flatnonzero(seq == c)
            out[slots] = rng.choice(np.flatnonzero(cls == c), size=slots.size, replace=False)
    if take < B:
        rest = np.flatnonzero(weight[cls] <= 0)
        out[take:] = rng.choice(rest, size=B - take, replace=False)
    return out


def _uniform_active(active: np.ndarray, B: int, rng: np.random.Generator) -> np.ndarray:
    """B distinct ordinals uniformly from the active ones; retired ones at random after them
    only when fewer than B are active (the trainers would stop there)."""
    idx = np.flatnonzero(active)
    if idx.size >= B:
        return rng.choice(idx, size=B, replace=False).astype(np.int64)
    rest = np.flatnonzero(~active)
    return np.concatenate([rng.permutation(idx), rng.choice(rest, size=B - idx.size, replace=False)]).astype(np.int64)


def _equal(req: PlanRequest) -> np.ndarray:
    return allocation.equal(req.batch_size, req.rollout_budget, req.min_rollouts, req.max_rollouts)


# -- prime-rl --------------------------------------------------------------------------------
PoolName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class DifficultyPool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(
        ge=0.0,
        le=1.0,
        description="Inclusive maximum latest group-mean reward (on the run's reward range mapped "
        "onto [0, 1]) of a prompt in this pool.",
    )
    weight: float = Field(
        ge=0.0,
        le=1e6,
        allow_inf_nan=False,
        description="Relative per-prompt sampling weight; 0 takes the pool out of sampling.",
    )


def default_pools() -> dict[str, DifficultyPool]:
    """prime-rl ``default_difficulty_pools``."""
    return {
        "hard": DifficultyPool(threshold=0.25, weight=0.2),
        "normal": DifficultyPool(threshold=0.75, weight=1.0),
        "easy": DifficultyPool(threshold=1.0, weight=0.2),
    }


class PrimeRLParams(StrategyParams):
    sampler: Literal["difficulty_pool", "buffer"] = Field(
        "difficulty_pool",
        description="difficulty_pool: prime-rl's curriculum sampler (main since Aug 2026): every prompt keeps being "
        "sampled, weighted by the pool of its latest group mean. buffer: the difficulty pools of prime-rl's "
        "[orchestrator.buffer] (≤ v0.5): a prompt whose group mean reaches easy_threshold or falls to "
        "hard_threshold leaves sampling for good; the rest are sampled uniformly.",
    )
    pools: dict[PoolName, DifficultyPool] = Field(
        default_factory=default_pools,
        min_length=1,
        max_length=16,
        description="difficulty_pool: named pools, each with an inclusive reward threshold and a per-prompt weight "
        "(prime-rl: hard ≤ 0.25 weight 0.2, normal ≤ 0.75 weight 1, easy ≤ 1 weight 0.2); a prompt above every "
        "threshold is in the highest one; a prompt without a group yet has weight 1.",
    )
    easy_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="buffer: a group mean ≥ this retires the prompt as easy (prime-rl: unset, i.e. never; its docs "
        "use 0.95).",
    )
    hard_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="buffer: a group mean ≤ this retires the prompt as hard (prime-rl: unset, i.e. never; its docs "
        "use 0.05).",
    )

    @model_validator(mode="after")
    def _check(self) -> PrimeRLParams:
        if self.sampler == "difficulty_pool":
            if self.easy_threshold is not None or self.hard_threshold is not None:
                raise ValueError("easy_threshold / hard_threshold apply only with sampler: buffer")
            thresholds = [p.threshold for p in self.pools.values()]
            if len(set(thresholds)) != len(thresholds):
                raise ValueError("difficulty pool thresholds must be unique")
            if not any(p.weight > 0 for p in self.pools.values()):
                raise ValueError("at least one difficulty pool must have a positive weight")
            if "unseen" in self.pools:
                raise ValueError("'unseen' is reserved for prompts without a group yet")
        else:
            if self.pools != default_pools():  # (the defaults are accepted: a stored spec lists every field)
                raise ValueError("pools apply only with sampler: difficulty_pool")
            if (
                self.easy_threshold is not None
                and self.hard_threshold is not None
                and not self.easy_threshold > self.hard_threshold
            ):
                raise ValueError("easy_threshold must be greater than hard_threshold")
        return self

    def ordered_pools(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(names, thresholds, weights) sorted by threshold."""
        items = sorted(self.pools.items(), key=lambda kv: kv[1].threshold)
        return (
            [k for k, _ in items],
            np.array([v.threshold for _, v in items], np.float64),
            np.array([v.weight for _, v in items], np.float64),
        )


class PrimeRL(Strategy[PrimeRLParams]):
    name = "prime_rl"
    description = (
        "prime-rl's difficulty_pool curriculum (baseline): each prompt is put in a named pool by its latest "
        "group-mean reward (hard ≤ 0.25, normal ≤ 0.75, easy above) and drawn with that pool's per-prompt weight "
        "(0.2 / 1 / 0.2; 1 while unseen); `sampler: buffer` is its earlier buffer, which retires prompts past "
        "easy_threshold / hard_threshold for good. Equal rollouts per prompt. Its zero-advantage filter is "
        "trainer-side and saves no rollouts."
    )
    Params = PrimeRLParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        if p.sampler == "difficulty_pool":
            pool.trackers["difficulty_pool"] = LatestGroupMean(p.ordered_pools()[1])
        else:
            pool.trackers["buffer"] = Retirement(p.easy_threshold, p.hard_threshold, per_report=True)
        return pool

    def _weights(self) -> np.ndarray:
        """Weight of each class: unseen (class 0), then the pools in threshold order."""
        return np.r_[1.0, self.params.ordered_pools()[2]]

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        p = self.params
        if p.sampler == "difficulty_pool":
            cls = pool.tracker("difficulty_pool", LatestGroupMean).pool_[: pool.size].astype(np.int64) + 1
            chosen = _weighted_by_class(cls, self._weights(), req.batch_size, rng)
        else:
            active = pool.tracker("buffer", Retirement).retired_[: pool.size] == ACTIVE
            chosen = _uniform_active(active, req.batch_size, rng)
        return PlanDecision(chosen, _equal(req), pool.predicted_pass_rate(chosen))

    def prompt_estimates(self, pool: PoolState, idx: np.ndarray, step: int) -> dict[str, np.ndarray]:
        p = self.params
        if p.sampler == "buffer":
            return {"retired": pool.tracker("buffer", Retirement).retired_[idx].astype(np.float64)}
        tr = pool.tracker("difficulty_pool", LatestGroupMean)
        k = tr.pool_[idx].astype(np.int64)
        return {
            "difficulty_pool": k.astype(np.float64),  # index in threshold order, −1 before the first group
            "sampling_weight": self._weights()[k + 1],
            "latest_group_mean": np.where(k >= 0, np.nan_to_num(tr.latest_[idx]), -1.0),
        }

    def inspect(self, pool: PoolState, domains: list[str | None] | None = None) -> dict:
        p = self.params
        if p.sampler == "buffer":
            r = np.bincount(pool.tracker("buffer", Retirement).retired_[: pool.size], minlength=3)
            return {"difficulty_pools": {"normal": int(r[0]), "easy": int(r[1]), "hard": int(r[2])}}
        names = p.ordered_pools()[0]
        cls = pool.tracker("difficulty_pool", LatestGroupMean).pool_[: pool.size].astype(np.int64) + 1
        c = np.bincount(cls, minlength=len(names) + 1)
        return {"difficulty_pools": {"unseen": int(c[0]), **{n: int(c[i + 1]) for i, n in enumerate(names)}}}


# -- Open-Instruct ------------------------------------------------------------------------------
class OpenInstructParams(StrategyParams):
    no_resampling_pass_rate: float | None = Field(
        0.875,
        gt=0.0,
        le=1.0,
        description="A prompt whose group's pass rate (its mean reward over the maximum) reaches this is never "
        "sampled again. Open-Instruct's default is unset (off); its OLMo 3 RL recipes use 0.875 (7 of 8). "
        "null: plain shuffled epochs.",
    )


class OpenInstruct(Strategy[OpenInstructParams]):
    name = "open_instruct"
    description = (
        "Open-Instruct's no_resampling_pass_rate (baseline): shuffled epochs over the prompts (each one once per "
        "pass, in random order), and a prompt whose latest group reached a pass rate of 0.875 is taken out for "
        "the rest of training. Equal rollouts per prompt. Its zero-std filter is trainer-side and saves no rollouts."
    )
    Params = OpenInstructParams

    def make_pool(self) -> PoolState:
        p = self.params
        pool = PoolState()
        pool.trackers["no_resampling"] = Retirement(p.no_resampling_pass_rate, None, per_report=False)
        return pool

    def plan(self, pool: PoolState, req: PlanRequest, rng: np.random.Generator) -> PlanDecision:
        """Shuffled epochs without a plan log: in an epoch every active prompt is drawn once, so the
        prompts not yet drawn in the current epoch are exactly the active ones with the fewest groups.
        Take the B active prompts with the fewest reported groups, ties at random, in random order
        (those of the current pass first)."""
        B = req.batch_size
        active = pool.tracker("no_resampling", Retirement).retired_[: pool.size] == ACTIVE
        groups = pool.groups
        per_level = np.cumsum(np.bincount(groups[active]))  # active prompts with ≤ g groups, for each g
        if per_level.size == 0 or per_level[-1] < B:  # fewer than B active: all of them, then retired ones
            chosen = _uniform_active(active, B, rng)
        else:
            level = int(np.searchsorted(per_level, B))  # the fewest groups g with ≥ B active prompts at ≤ g
            below = np.flatnonzero(active & (groups < level))
            tied = np.flatnonzero(active & (groups == level))
            # The rest of the current pass in random order, then the head of the next one.
            head = tied[rng.choice(tied.size, size=B - below.size, replace=False)]
            below = below[np.lexsort((rng.random(below.size), groups[below]))]  # fewest groups first
            chosen = np.concatenate([below, head]).astype(np.int64)
        return PlanDecision(chosen, _equal(req), pool.predicted_pass_rate(chosen))

    def prompt_estimates(self, pool: PoolState, idx: np.ndarray, step: int) -> dict[str, np.ndarray]:
        return {"retired": pool.tracker("no_resampling", Retirement).retired_[idx].astype(np.float64)}

    def inspect(self, pool: PoolState, domains: list[str | None] | None = None) -> dict:
        active = pool.tracker("no_resampling", Retirement).retired_[: pool.size] == ACTIVE
        n_active = int(active.sum())
        return {
            "no_resampled_prompts": pool.size - n_active,
            "active_prompts": n_active,
            "epoch": int(pool.groups[active].min()) if n_active else None,
        }
