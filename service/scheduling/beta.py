"""Beta–Bernoulli posterior of each prompt's pass rate, with forgetting.

MoPPS (thu-rllab/MoPPS ``recipe/ours/mopps.py``) updates, after a group with
success rate s over n rollouts,

    α ← λ·α + (1−λ)·α₀ + s·n,      β ← λ·β + (1−λ)·β₀ + (1−s)·n

with α₀ = β₀ = 1. Unrolled, α = α₀ + Eα where the *evidence* Eα ← λ·Eα + s·n.
We store only the evidence, so the prior (α₀, β₀) — which may come from a
client-supplied prior pass rate, or later from a domain prior — is applied at
read time and can change without replaying the log. With α₀ = β₀ = 1 this is
exactly MoPPS. Continuous rewards in [0, 1] enter as fractional successes.
"""

from __future__ import annotations

import numpy as np

from .util import grow


class BetaPosterior:
    def __init__(self, forgetting: float) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0, 1]")
        self.forgetting = float(forgetting)
        self.ev_success_ = np.zeros(0, np.float64)
        self.ev_failure_ = np.zeros(0, np.float64)

    def grow(self, size: int) -> None:
        self.ev_success_ = grow(self.ev_success_, size, 0.0)
        self.ev_failure_ = grow(self.ev_failure_, size, 0.0)

    def update_unique(self, ordinals: np.ndarray, n: np.ndarray, successes: np.ndarray) -> None:
        """One group each for distinct ordinals."""
        lam = self.forgetting
        self.ev_success_[ordinals] = lam * self.ev_success_[ordinals] + successes
        self.ev_failure_[ordinals] = lam * self.ev_failure_[ordinals] + (n - successes)

    def posterior(
        self, size: int, idx: np.ndarray | slice, a0: np.ndarray, b0: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(α, β) for the prompts at ``idx`` of the live part ``[:size]``."""
        return a0 + self.ev_success_[:size][idx], b0 + self.ev_failure_[:size][idx]
