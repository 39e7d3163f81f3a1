"""A run's eval metrics: the trainer's own measurements (eval accuracy, loss, ...) per step,
sent in batches by ``POST /v1/runs/{run_id}/metrics`` and read back by ``GET``.

Stored in ``run_metrics`` (one row per run, name and step), written under the run's lock
in one transaction: a 200 means the values are committed. Idempotent: a re-sent batch
finds its values stored and changes nothing; a different value for a (name, step) that
holds one replaces it (a trainer resumed from a checkpoint evaluates that step again) and
counts a revision. Metrics are not events of the scheduling fold (no strategy reads
them); the dashboard draws them against the run's steps, rollouts and wall time.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from .config import Settings
from .errors import Invalid, RunNotFound, TooLarge, item_errors
from .storage import repository as repo
from .storage import run_metrics as store
from .storage.db import write_session


class RunMetrics:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions

    def post(self, run_id: str, entries: list[dict[str, Any]]) -> dict[str, int]:
        """Store ``entries`` (``{"step", "values": {name: number}}``, validated by the
        schema); answers the counts of values created, updated and unchanged."""
        cfg = self.settings
        if len(entries) > cfg.max_metric_entries:
            raise TooLarge(
                f"metrics: {len(entries)} entries exceed the limit of {cfg.max_metric_entries} per request; "
                "send them in several requests"
            )
        total = sum(len(e["values"]) for e in entries)
        if total > cfg.max_metric_values:
            raise TooLarge(
                f"metrics: {total} values exceed the limit of {cfg.max_metric_values} per request; "
                "send them in several requests"
            )
        points: dict[tuple[str, int], float] = {}
        bad: list[tuple[int, str, str]] = []
        first_at: dict[tuple[str, int], int] = {}
        for i, e in enumerate(entries):
            for name, value in e["values"].items():
                key = (name, e["step"])
                if key in points and points[key] != value:
                    bad.append(
                        (i, name, f"a different value for {name!r} at step {e['step']} in metrics[{first_at[key]}]")
                    )
                first_at.setdefault(key, i)
                points[key] = float(value)
        if bad:
            raise Invalid(
                f"metrics[{bad[0][0]}].values.{bad[0][1]}: {bad[0][2]}; nothing was stored",
                errors=item_errors("metrics", bad),
            )
        created = updated = 0
        with write_session(self.sessions, run_id) as s:
            run = repo.run_by_id(s, run_id)
            if run is None:
                raise RunNotFound(run_id)
            steps = sorted({st for _, st in points})
            stored = store.stored_values(s, run.pk, steps)
            new = [
                {"run_pk": run.pk, "name": n, "step": st, "value": v}
                for (n, st), v in points.items()
                if (n, st) not in stored
            ]
            changed = [(n, st, v) for (n, st), v in points.items() if (n, st) in stored and stored[(n, st)] != v]
            if new:
                store.insert_values(s, new)
            for n, st, v in changed:
                store.replace_value(s, run.pk, n, st, v)
            created, updated = len(new), len(changed)
        return {"accepted": len(points), "created": created, "updated": updated,
                "unchanged": len(points) - created - updated}  # fmt: skip

    def names(self, s: Session, run_pk: int) -> list[str]:
        return store.names(s, run_pk)

    def page(
        self, s: Session, run_pk: int, names: list[str] | None, after: int | None, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Up to ``limit`` steps with metrics (after step ``after``), each with its values
        (of ``names``, or all) and the time its latest value was written."""
        steps = store.steps_page(s, run_pk, names, after, limit + 1)
        nxt = steps[limit - 1] if len(steps) > limit else None
        steps = steps[:limit]
        if not steps:
            return [], None
        by_step: dict[int, dict[str, Any]] = {st: {"step": st, "values": {}, "time": None} for st in steps}
        for st, n, v, at in store.values_between(s, run_pk, names, steps[0], steps[-1]):
            item = by_step[st]
            item["values"][n] = v
            if item["time"] is None or at > item["time"]:
                item["time"] = at
        return [by_step[st] for st in steps], nxt
