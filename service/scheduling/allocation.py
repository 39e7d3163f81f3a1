"""Rollout allocators: split a total budget over the chosen prompts, each within
[min_rollouts, max_rollouts], summing exactly to the budget."""

from __future__ import annotations

import numpy as np


def check_budget(batch_size: int, budget: int, lo: int, hi: int) -> str | None:
    """Why a budget cannot be split, or None when it can."""
    if budget < batch_size * lo:
        return f"rollout_budget {budget} is below batch_size × min_rollouts = {batch_size * lo}"
    if budget > batch_size * hi:
        return f"rollout_budget {budget} is above batch_size × max_rollouts = {batch_size * hi}"
    return None


def equal(batch_size: int, budget: int, lo: int, hi: int) -> np.ndarray:
    """budget // B each; the remainder goes one each to the first (highest-ranked) items."""
    base, rem = divmod(budget, batch_size)
    out = np.full(batch_size, base, dtype=np.int64)
    out[:rem] += 1
    assert lo <= out.min() and out.max() <= hi and out.sum() == budget
    return out
