"""The prompts of a run: bulk upserts (validate, write the prompts and their event at the
run's next log position, fold it) and the reads the API answers — every estimate the
strategy's (prediction, interval, state), read from the state a plan would see now."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from . import inspection, schemas
from .config import Settings
from .errors import Invalid, NotFound, RunNotFound, TooLarge, item_errors
from .inspection import STATES, state_codes
from .log.events import PromptsEvent
from .log.state import RunState
from .runs import Runs
from .scheduling.pool import PoolState
from .storage import repository as repo
from .storage.db import write_session
from .storage.models import Prompt, Run
from .store import StateStore

WARM_START_MAX_STRENGTH = 20.0


def warm_start_seed(pool: PoolState, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prior pass rate, strength) ``warm_start_from`` gives the source pool's prompts ``o``
    (rolled out there): their Beta posterior's mean and its mass α+β, capped."""
    a, b = pool.posterior(o)
    return a / (a + b), np.minimum(a + b, WARM_START_MAX_STRENGTH)


# The fields whose change is an event of the log (the fold reads them).
SCHED = frozenset({"domain", "prior_pass_rate", "prior_strength", "text", "embedding"})
NEW_FIELDS = ("domain", "tags", "prior_pass_rate", "text", "embedding")


def check_prompts(settings: Settings, items: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a request over the size limit, with a text over the length limit, or naming one
    id twice (before taking the run's lock)."""
    if len(items) > settings.max_prompts_per_request:
        raise TooLarge(
            f"prompts: {len(items)} items exceed the limit of {settings.max_prompts_per_request} "
            "per request; split the upload into chunks"
        )
    if any("text" in p for p in items):
        limit = settings.max_text_chars
        too_long = [
            (i, p["id"], f"text longer than {limit} characters")
            for i, p in enumerate(items)
            if p.get("text") is not None and len(p["text"]) > limit
        ]
        if too_long:
            raise Invalid(f"prompts[{too_long[0][0]}].text: {too_long[0][2]}", errors=item_errors("prompts", too_long))
    ids = [p["id"] for p in items]
    if len(set(ids)) < len(ids):
        seen: dict[str, int] = {}
        dups = []
        for i, pid in enumerate(ids):
            if pid in seen:
                dups.append((i, pid, f"duplicate of prompts[{seen[pid]}] in the same request"))
            seen[pid] = i
        raise Invalid(f"prompts[{dups[0][0]}].id: {dups[0][2]}", errors=item_errors("prompts", dups))


def update_rows(
    run_pk: int, version: int, items: Sequence[Mapping[str, Any]], upd_at: np.ndarray, upd_ords: np.ndarray
):
    """The rows of the prompts an upsert updates (only the fields each sent), and the ordinals
    of those that set a scheduling field, ascending (the order the log is read back in)."""
    rows: list[dict[str, Any]] = []
    for i, o in zip(upd_at.tolist(), upd_ords.tolist()):
        row = {"run_pk": run_pk, "ordinal": o, "version": version, **items[i]}
        del row["id"]
        rows.append(row)
    is_sched = np.fromiter((not SCHED.isdisjoint(items[i]) for i in upd_at.tolist()), bool, upd_at.size)
    return rows, np.sort(upd_ords[is_sched], kind="stable")


def prompts_event(
    seq: int,
    sched_ords: np.ndarray,
    stored: dict[int, tuple[Any, ...]],
    new_ords: np.ndarray,
    cols: dict[str, list[Any]],
    priors: np.ndarray,
    strengths: np.ndarray,
) -> PromptsEvent:
    """The upsert's event, in ordinal order: every update that set a scheduling field, with
    the fields as stored after this upsert (all older prompts), then every created prompt."""
    after = [stored[o] for o in sched_ords.tolist()]
    n_upd, none = int(sched_ords.size), [None] * int(new_ords.size)
    return PromptsEvent(
        seq=seq,
        ordinals=np.concatenate([sched_ords, new_ords]),
        ids=[None] * n_upd + cols["id"],
        domains=[a[0] for a in after] + list(cols.get("domain", none)),
        priors=np.concatenate([np.array([a[1] for a in after], dtype=np.float64).reshape(n_upd), priors]),
        strengths=np.concatenate([np.array([a[2] for a in after], dtype=np.float64).reshape(n_upd), strengths]),
        texts=[a[3] for a in after] + list(cols.get("text", none)),
        embeddings=[a[4] for a in after] + list(cols.get("embedding", none)),
    )


class Prompts:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], store: StateStore, runs: Runs) -> None:
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.runs = runs

    # -- upserts ------------------------------------------------------------------------
    def upsert_prompts(self, run_id: str, body: schemas.PromptsIn | list[schemas.PromptRow]) -> schemas.PromptsAck:
        """Create or update prompts. ``body``: the validated request (``PromptsIn``) or
        its prompts as dicts holding the fields sent (``PromptRow``, the route's fast
        path). Column-wise: no Python object per prompt beyond the parsed dicts."""
        items = body if isinstance(body, list) else [p.model_dump(exclude_unset=True) for p in body.prompts]
        check_prompts(self.settings, items)
        ids = [p["id"] for p in items]
        sent: set[str] = set().union(*items)  # the fields any prompt of the request sets
        with write_session(self.sessions, run_id) as s:
            run = repo.run_by_id(s, run_id)
            if run is None:
                raise RunNotFound(run_id)
            state = self.store.state(s, run)
            version = run.prompt_version + 1
            found = state.lookup(ids)
            new_at, upd_at = np.flatnonzero(found < 0), np.flatnonzero(found >= 0)
            k, first = int(new_at.size), run.n_prompts
            new_ords = np.arange(first, first + k, dtype=np.int64)
            # The new prompts column by column (None: not sent, NULL), in request order.
            every = k == len(items)
            new_items = items if every else [items[i] for i in new_at.tolist()]
            cols: dict[str, list[Any]] = {"id": ids if every else [ids[i] for i in new_at.tolist()]}
            cols.update({name: [p.get(name) for p in new_items] for name in NEW_FIELDS if name in sent})
            priors = np.array(cols.get("prior_pass_rate", [None] * k), dtype=np.float64)
            strengths = np.full(k, np.nan)
            if k and run.settings.get("warm_start_from"):
                self._warm_start_priors(s, run.settings["warm_start_from"], cols["id"], priors, strengths)
                cols["prior_pass_rate"] = repo.nullable(priors)
                cols["prior_strength"] = repo.nullable(strengths)
            upd_rows, sched_ords = update_rows(run.pk, version, items, upd_at, found[upd_at])
            repo.insert_prompts(s, run.pk, first, version, cols)
            stored = repo.update_prompts(s, upd_rows)
            run.n_prompts += k
            run.prompt_version = version
            event = None
            if k or sched_ords.size:
                event = prompts_event(repo.take_seq(s, run), sched_ords, stored, new_ords, cols, priors, strengths)
                repo.insert_prompt_events(s, run.pk, event.seq, event, int(sched_ords.size))
        if event is not None:
            self.store.advance(state, event)
        return schemas.PromptsAck(created=k, updated=len(upd_rows))

    def _warm_start_priors(
        self, s: Session, source_id: str, ids: list[str], priors: np.ndarray, strengths: np.ndarray
    ) -> None:
        """Seed new prompts without a client prior from the source run's posterior (in place)."""
        source = repo.run_by_id(s, source_id)
        if source is None:
            return
        src = self.store.state(s, source)
        todo = np.flatnonzero(np.isnan(priors))
        with src.read() as pool:
            o = src.lookup([ids[i] for i in todo.tolist()])
            known = np.flatnonzero(o >= 0)
            known = known[pool.groups[o[known]] > 0]
            priors[todo[known]], strengths[todo[known]] = warm_start_seed(pool, o[known])

    # -- reads --------------------------------------------------------------------------
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
