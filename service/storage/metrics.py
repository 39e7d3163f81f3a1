"""The SQL of the Prometheus per-run gauges (``service/metrics.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import Run


def run_counters(s: Session, limit: int) -> list[Any]:
    """The ``runs`` table's counters of the ``limit`` most recently created runs: rows of
    (run id, prompts, rollouts, informative rollouts, plans)."""
    return list(
        s.execute(
            select(Run.id, Run.n_prompts, Run.n_rollouts, Run.n_informative_rollouts, Run.n_plans)
            .order_by(Run.created_at.desc(), Run.pk.desc())
            .limit(limit)
        ).all()
    )
