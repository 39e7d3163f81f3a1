"""The events of a run's log, as the reducer (``state.RunState.apply``) folds them and as
storage writes and reads them back. Every write of a run takes the next position of its
log: prompt upserts, reports, plans and plan extensions (seals), strategy changes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PromptsEvent:
    """Prompts created or whose scheduling fields changed, with the values written."""

    seq: int
    ordinals: np.ndarray  # int64
    ids: list[str | None]  # the id of a created prompt (None: an update)
    domains: list[str | None]
    priors: np.ndarray  # float64, NaN: none
    strengths: np.ndarray  # float64, NaN: none
    # The text and embedding as written (None: none; the list None: not carried).
    texts: list[str | None] | None = None
    embeddings: list[Any] | None = None


@dataclass(frozen=True)
class ReportEvent:
    seq: int
    step: int
    ordinals: np.ndarray  # int64
    n: np.ndarray  # int64
    reward_sum: np.ndarray  # float64, on the run's reward scale
    informative: np.ndarray  # bool
    abs_adv: np.ndarray  # float64
    # (G, 6) float64, the groups' completion tokens and truncations (``cost.COST_FIELDS``);
    # None when the report gave none (``cost.cost_or_none``: the same event live and replayed).
    cost: np.ndarray | None = None


@dataclass(frozen=True)
class SealEvent:
    """A plan or a plan extension: the state it reads is sealed at this position. A plan of
    step t (``step``) seals the pending reports of steps ≤ t − 2 only: a prefetching trainer
    asks the plan of t while the reports of t − 1 may still be arriving from its ranks, and
    those must not be split; the plan reads them from a copy. ``step`` None (an extension,
    which reads its pilot reports): seal everything."""

    seq: int
    step: int | None = None


@dataclass(frozen=True)
class StrategyEvent:
    seq: int
    step: int
    spec: dict[str, Any]


Event = PromptsEvent | ReportEvent | SealEvent | StrategyEvent


def spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))
