"""The SQL of a run's eval metrics (``run_metrics``; ``service/run_metrics.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from .models import RunMetric

_CHUNK = 500  # steps per IN list


def stored_values(s: Session, run_pk: int, steps: list[int]) -> dict[tuple[str, int], float]:
    """The stored value of every (name, step) of the run at ``steps``."""
    stored: dict[tuple[str, int], float] = {}
    for lo in range(0, len(steps), _CHUNK):
        chunk = steps[lo : lo + _CHUNK]
        q = select(RunMetric.name, RunMetric.step, RunMetric.value).where(
            RunMetric.run_pk == run_pk, RunMetric.step.in_(chunk)
        )
        stored.update({(n, st): v for n, st, v in s.execute(q)})
    return stored


def insert_values(s: Session, rows: list[dict[str, Any]]) -> None:
    """New rows (``run_pk``, ``name``, ``step``, ``value``), in one executemany."""
    s.execute(insert(RunMetric), rows)


def replace_value(s: Session, run_pk: int, name: str, step: int, value: float) -> None:
    """A new value for a stored (name, step): counted as a revision, timestamped now."""
    s.execute(
        update(RunMetric)
        .where(RunMetric.run_pk == run_pk, RunMetric.name == name, RunMetric.step == step)
        .values(value=value, revisions=RunMetric.revisions + 1, updated_at=func.now())
    )


def names(s: Session, run_pk: int) -> list[str]:
    """The run's metric names, sorted."""
    return list(s.scalars(select(RunMetric.name).where(RunMetric.run_pk == run_pk).distinct().order_by(RunMetric.name)))


def steps_page(s: Session, run_pk: int, names: list[str] | None, after: int | None, limit: int) -> list[int]:
    """Up to ``limit`` steps (in order, after ``after``) with a value of ``names`` (or any)."""
    q = select(RunMetric.step).where(RunMetric.run_pk == run_pk)
    if names:
        q = q.where(RunMetric.name.in_(names))
    if after is not None:
        q = q.where(RunMetric.step > after)
    return list(s.scalars(q.distinct().order_by(RunMetric.step).limit(limit)))


def values_between(s: Session, run_pk: int, names: list[str] | None, first: int, last: int) -> Sequence[Any]:
    """The values of ``names`` (or all) at steps ``first … last``, by step and name: rows
    of (step, name, value, updated_at)."""
    rows = select(RunMetric.step, RunMetric.name, RunMetric.value, RunMetric.updated_at).where(
        RunMetric.run_pk == run_pk, RunMetric.step >= first, RunMetric.step <= last
    )
    if names:
        rows = rows.where(RunMetric.name.in_(names))
    return s.execute(rows.order_by(RunMetric.step, RunMetric.name)).all()
