"""The SQL of the data-quality view (``service/quality.py``): the run's reward log, one row
per reported group (prompt ordinal, step, rollouts, reward sum), read in bounded chunks in
log order up to a log position. Read only; nothing here decides anything."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from .models import Result

CHUNK = 100_000  # groups per statement: what the view holds of the log at once


def log_extent(s: Session, run_pk: int, upto: int) -> tuple[int, int, int]:
    """(groups, first step, last step) of the run's reward log up to log position ``upto``
    (groups 0 and steps 0 for an empty log)."""
    g, lo, hi = s.execute(
        select(func.count(), func.min(Result.step), func.max(Result.step)).where(
            Result.run_pk == run_pk, Result.report_seq <= upto
        )
    ).one()
    return int(g or 0), int(lo or 0), int(hi or 0)


def log_chunks(
    s: Session, run_pk: int, upto: int, chunk: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The run's groups up to log position ``upto`` in log order, ``chunk`` (default
    ``CHUNK``) at a time (keyset pages on the primary key): (prompt ordinal, step, rollouts,
    reward sum on the run's scale)."""
    chunk = chunk or CHUNK
    after: tuple[int, int] | None = None
    while True:
        q = select(Result.report_seq, Result.position, Result.prompt_ordinal, Result.step, Result.n, Result.reward_sum)
        q = q.where(Result.run_pk == run_pk, Result.report_seq <= upto)
        if after is not None:
            q = q.where(tuple_(Result.report_seq, Result.position) > tuple_(*after))
        rows = s.execute(q.order_by(Result.report_seq, Result.position).limit(chunk)).all()
        if not rows:
            return
        seq, pos, ordinal, step, n, rsum = (np.asarray(c) for c in zip(*rows))
        yield ordinal.astype(np.int64), step.astype(np.int64), n.astype(np.float64), rsum.astype(np.float64)
        if len(rows) < chunk:
            return
        after = (int(seq[-1]), int(pos[-1]))
