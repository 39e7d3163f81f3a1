"""Per-run pool state: plain numpy arrays indexed by a prompt's ordinal.

Nothing here does I/O. Every update is a handful of array expressions over the
reported groups; every read is vectorised over the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .beta import BetaPosterior
from .util import occurrence_rank  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Observations:
    """A batch of reported prompt groups, in the order they were committed."""

    ordinals: np.ndarray  # int64, prompt ordinal of each group
    n: np.ndarray  # int64, rollouts in the group
    successes: np.ndarray  # float64, sum of rewards normalised to [0, 1]
    step: np.ndarray  # int64, the policy step that produced the group
    informative: np.ndarray  # bool, rewards not all equal

    def __len__(self) -> int:
        return int(self.ordinals.shape[0])

    @classmethod
    def concat(cls, parts: list[Observations]) -> Observations:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))


def _grow(a: np.ndarray, size: int, fill) -> np.ndarray:
    if a.shape[0] >= size:
        return a
    out = np.full(max(size, 2 * a.shape[0], 1024), fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


PRIOR_EPS = 1e-3


@dataclass
class PoolState:
    """Statistics every strategy can read, plus the estimators' own arrays."""

    forgetting: float = 0.5
    prior_strength: float = 2.0
    size: int = 0
    # Capacity-doubled buffers; the live part is [:size].
    _domain: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    _prior: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    _rollouts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _reward_sum: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    _last_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    beta: BetaPosterior = field(init=False)

    def __post_init__(self) -> None:
        self.beta = BetaPosterior(self.forgetting)

    # -- views on the live part -------------------------------------------------
    @property
    def domain(self) -> np.ndarray:
        return self._domain[: self.size]

    @property
    def prior_pass_rate(self) -> np.ndarray:
        """The client-supplied prior pass rate, NaN where none was given."""
        return self._prior[: self.size]

    @property
    def rollouts(self) -> np.ndarray:
        return self._rollouts[: self.size]

    @property
    def groups(self) -> np.ndarray:
        return self._groups[: self.size]

    @property
    def reward_sum(self) -> np.ndarray:
        """Sum of rewards mapped onto [0, 1] (fractional successes)."""
        return self._reward_sum[: self.size]

    @property
    def last_step(self) -> np.ndarray:
        return self._last_step[: self.size]

    # -- changes ----------------------------------------------------------------
    def set_prompts(self, ordinals: np.ndarray, domain: np.ndarray, prior: np.ndarray) -> None:
        """Add prompts (ordinals ≥ size) or change their domain / prior."""
        if ordinals.size == 0:
            return
        new_size = max(self.size, int(ordinals.max()) + 1)
        self._domain = _grow(self._domain, new_size, 0)
        self._prior = _grow(self._prior, new_size, np.nan)
        self._rollouts = _grow(self._rollouts, new_size, 0)
        self._groups = _grow(self._groups, new_size, 0)
        self._reward_sum = _grow(self._reward_sum, new_size, 0.0)
        self._last_step = _grow(self._last_step, new_size, -1)
        self.beta.grow(new_size)
        self.size = new_size
        self._domain[ordinals] = domain
        self._prior[ordinals] = prior

    def observe(self, obs: Observations) -> None:
        if len(obs) == 0:
            return
        o = obs.ordinals
        np.add.at(self._rollouts, o, obs.n)
        np.add.at(self._groups, o, 1)
        np.add.at(self._reward_sum, o, obs.successes)
        np.maximum.at(self._last_step, o, obs.step)
        self.beta.update(o, obs.n, obs.successes)

    # -- reads ------------------------------------------------------------------
    def prior_mean(self, idx: np.ndarray | slice = slice(None)) -> np.ndarray:
        p = self.prior_pass_rate[idx]
        # A prior of exactly 0 or 1 would make a Beta parameter 0 (not a distribution:
        # Thompson sampling raised and the plan was a 500); keep it strictly inside.
        return np.clip(np.where(np.isnan(p), 0.5, p), PRIOR_EPS, 1.0 - PRIOR_EPS)

    def posterior(self, idx: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Beta(α, β) of the pass rate of the prompts at ``idx``."""
        m = self.prior_mean(idx)
        a0 = self.prior_strength * m
        b0 = self.prior_strength * (1.0 - m)
        return self.beta.posterior(self.size, idx, a0, b0)

    def predicted_pass_rate(self, idx: np.ndarray | slice = slice(None)) -> np.ndarray:
        a, b = self.posterior(idx)
        return a / (a + b)
