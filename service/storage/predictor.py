"""The SQL of the learned predictor: its persisted versions (``predictor_models``) and
what its background trainer reads of a run (``service/predictor/trainer.py``,
``GET /v1/runs/{run_id}/predictor``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from .models import PredictorModel, Prompt, Result, Run


def latest_version(s: Session, run_pk: int) -> PredictorModel | None:
    """The run's latest persisted version (with its blob), or None."""
    return s.scalar(
        select(PredictorModel).where(PredictorModel.run_pk == run_pk).order_by(PredictorModel.version.desc()).limit(1)
    )


def versions(s: Session, run_pk: int) -> Sequence[Any]:
    """Every version of the run in order, without blobs: rows of (version, created_at, metrics)."""
    return s.execute(
        select(PredictorModel.version, PredictorModel.created_at, PredictorModel.metrics)
        .where(PredictorModel.run_pk == run_pk)
        .order_by(PredictorModel.version)
    ).all()


def add_version(s: Session, run_pk: int, blob: bytes, metrics: dict[str, Any]) -> int:
    """Store a new version (the next number after the run's latest); returns its number.
    Call it inside the run's ``write_session`` (the lock makes the number unique)."""
    last = s.scalar(select(func.max(PredictorModel.version)).where(PredictorModel.run_pk == run_pk))
    version = (last or 0) + 1
    s.add(PredictorModel(run_pk=run_pk, version=version, blob=blob, metrics=metrics))
    return version


def run_by_pk(s: Session, run_pk: int) -> Run | None:
    return s.get(Run, run_pk)


def prompts_since(s: Session, run_pk: int, version: int) -> Sequence[Any]:
    """The prompts written after the run's prompt version ``version``, by ordinal: rows of
    (ordinal, domain, text, embedding, version)."""
    return s.execute(
        select(Prompt.ordinal, Prompt.domain, Prompt.text, Prompt.embedding, Prompt.version)
        .where(Prompt.run_pk == run_pk, Prompt.version > version)
        .order_by(Prompt.ordinal)
    ).all()


def groups_upto(s: Session, run_pk: int, report_seq: int) -> Sequence[Row[int, int, int, float, int]]:
    """Every reported group up to report ``report_seq`` in commit order: rows of
    (report_seq, prompt_ordinal, n, reward_sum, step)."""
    return s.execute(
        select(Result.report_seq, Result.prompt_ordinal, Result.n, Result.reward_sum, Result.step)
        .where(Result.run_pk == run_pk, Result.report_seq <= report_seq)
        .order_by(Result.report_seq, Result.position)
    ).all()
