"""Prompts with their estimates, as the API answers them: every estimate is the
strategy's (prediction, interval, state), read from the state a plan would see now."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from . import inspection
from .config import Settings
from .errors import NotFound
from .inspection import STATES, state_codes
from .runs import Runs
from .runstate import RunState
from .states import StateStore
from .storage import repository as repo
from .storage.models import Prompt, Run


class Reads:
    def __init__(self, settings: Settings, store: StateStore, runs: Runs) -> None:
        self.settings = settings
        self.store = store
        self.runs = runs

    def prompt_rows(self, state: RunState, rows: list[Prompt]) -> list[dict[str, Any]]:
        """Prompt rows joined with the strategy's estimates (vectorised over the page): the
        prediction, its interval and the state all come from the strategy's model; the
        per-prompt Beta posterior is shown under its own name."""
        if not rows:
            return []
        o = np.fromiter((r.ordinal for r in rows), dtype=np.int64, count=len(rows))
        with state.read() as pool:
            a, b = pool.posterior(o)
            step = pool.step + 1
            pred = state.strategy.predict(pool, o, step)
            ci_lo, ci_hi = state.strategy.interval(pool, o, step)
            extras = state.strategy.prompt_estimates(pool, o, step)
            n = pool.rollouts[o]
            g = pool.groups[o]
            rs = pool.reward_sum[o]
            last = pool.last_step[o]
            cost = pool.cost_estimates(o) if pool.cost.active else None
        lo, hi = state.reward_range
        states = state_codes(n, pred)
        out = []
        for i, r in enumerate(rows):
            ni = int(n[i])
            out.append(
                {
                    "id": r.id,
                    "domain": r.domain,
                    "tags": r.tags,
                    "prior_pass_rate": r.prior_pass_rate,
                    "rollouts": ni,
                    "groups": int(g[i]),
                    "mean_reward": float(lo + (hi - lo) * rs[i] / ni) if ni else None,
                    "predicted_pass_rate": float(pred[i]),
                    "pass_rate_interval": (float(ci_lo[i]), float(ci_hi[i])),
                    "posterior": {"alpha": float(a[i]), "beta": float(b[i])},
                    "last_step": int(last[i]) if last[i] >= 0 else None,
                    "state": STATES[states[i]],
                    "strategy_estimates": {k: float(v[i]) for k, v in extras.items()},
                    "cost": None if cost is None else {k: float(v[i]) for k, v in cost.items()},
                }
            )
        return out

    def list_prompts(
        self,
        session: Session,
        run_id: str,
        *,
        cursor_ordinal: int,
        sort_after,
        limit: int,
        domain: str | None,
        sort: str,
        descending: bool,
        filters: dict[str, Any],
    ):
        """A page of prompts with their estimates: (rows, next ordinal or None, next sort key or None)."""
        run = self.runs.get_run(session, run_id)
        state = self.store.state(session, run)
        if sort != "ordinal" or descending or any(v is not None for v in filters.values()):
            ords, nxt_key = inspection.select_prompts(
                state, sort=sort, descending=descending, domain=domain, after=sort_after, limit=limit, **filters
            )
            by_ord = repo.prompt_rows(session, run.pk, ords)
            return self.prompt_rows(state, [by_ord[o] for o in ords]), None, nxt_key
        rows = repo.prompts_page(session, run.pk, cursor_ordinal, limit + 1, domain)
        nxt = rows[limit - 1].ordinal if len(rows) > limit else None
        return self.prompt_rows(state, rows[:limit]), nxt, None

    def prompt(self, session: Session, run_id: str, prompt_id: str) -> tuple[Run, RunState, Prompt, dict[str, Any]]:
        run = self.runs.get_run(session, run_id)
        state = self.store.state(session, run)
        row = repo.prompt_by_id(session, run.pk, prompt_id)
        if row is None:
            raise NotFound(f"prompt {prompt_id!r} is not in run {run_id!r}")
        out = self.prompt_rows(state, [row])[0]
        out["text"] = row.text
        return run, state, row, out

    def prompt_detail(self, session: Session, run_id: str, prompt_id: str, history_limit: int | None) -> dict[str, Any]:
        run, _, row, out = self.prompt(session, run_id, prompt_id)
        cap = min(history_limit or self.settings.max_history, self.settings.max_history)
        out["embedding"] = row.embedding
        out["history"] = repo.history(session, run.pk, row.ordinal, limit=cap)
        out["history_total"] = len(out["history"])
        if out["history_total"] == cap:
            out["history_total"] = repo.history_count(session, run.pk, row.ordinal)
        return out
