"""Reports: a trainer's rewards for a step's groups.

A report is validated (its size before the run's lock; its prompts and rewards against the
run's state under it), fingerprinted (a re-sent report must be identical), written with its
event at the run's next log position in one transaction, and after commit folded into this
process's state (``StateStore.advance``) — the one event, built once, that storage wrote.
All-or-nothing: a refused report stores nothing; an acknowledged one is in the log.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from . import schemas
from .config import Settings
from .errors import Conflict, Invalid, RunNotFound, TooLarge, item_errors
from .log.events import ReportEvent
from .log.state import RunState
from .scheduling.cost import cost_or_none, group_cost
from .storage import repository as repo
from .storage.models import Run
from .store import StateStore


def group_abs_advantage(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Mean |advantage| of each group with std-normalised (GRPO) advantages; 0 when all equal."""
    scale = max(1.0, float(np.abs(flat).max()))  # |A| is scale-free; keep the squares finite
    flat, sums = flat / scale, sums / scale
    mu = sums / lengths
    dev = flat - np.repeat(mu, lengths)
    mad = np.add.reduceat(np.abs(dev), starts) / lengths
    sd = np.sqrt(np.add.reduceat(dev * dev, starts) / lengths)
    return np.where(sd > 1e-12, mad / np.where(sd > 1e-12, sd, 1.0), 0.0)


def report_hash(
    step: int,
    plan_id: str | None,
    prompt_ids: list[str],
    lengths: np.ndarray,
    flat: np.ndarray,
    costs: tuple[list[list[int] | None], list[list[bool] | None]] | None = None,
) -> str:
    """Fingerprint of a report's content (a re-sent report must match it): step, plan,
    prompt ids in order, group sizes and the rewards' exact float64 bits; and, when any
    group gives them, each group's tokens and truncation flags (so the fingerprint of a
    report without them is the one earlier versions stored)."""
    h = hashlib.sha256(b"rollplan-report-v2\0")
    h.update(json.dumps([step, plan_id, prompt_ids], separators=(",", ":")).encode())
    h.update(lengths.astype("<i8").tobytes())
    h.update(flat.astype("<f8").tobytes())
    if costs is not None:
        h.update(b"\0cost\0" + json.dumps(list(costs), separators=(",", ":")).encode())
    return h.hexdigest()


def legacy_report_hash(body: schemas.ResultsIn) -> str:
    """The fingerprint stored by versions before ``report_hash`` (checked only when the
    new one differs, so a report acknowledged before an upgrade still deduplicates)."""
    return hashlib.sha256(
        json.dumps(
            [body.step, body.plan_id, [[g.prompt_id, g.rewards] for g in body.results]], separators=(",", ":")
        ).encode()
    ).hexdigest()


def rewards_json(flat: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Each group's rewards as JSON text. Verifiable rewards take few distinct values,
    so each value is formatted once and groups are joined from the tokens."""
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    vals, inv = np.unique(flat, return_inverse=True)
    if len(vals) > 256:
        values = flat.tolist()
        return [json.dumps(values[a:b]) for a, b in zip(starts, ends)]
    tokens = [json.dumps(v) for v in vals.tolist()]
    toks = [tokens[k] for k in inv.ravel().tolist()]
    return ["[" + ", ".join(toks[a:b]) + "]" for a, b in zip(starts, ends)]


@dataclass
class Groups:
    """A report's groups, summarised column-wise before the run's lock is taken."""

    prompt_ids: list[str]
    lengths: np.ndarray  # int64, rollouts per group
    flat: np.ndarray  # float64, every reward in order
    sums: np.ndarray
    gmin: np.ndarray
    gmax: np.ndarray
    abs_adv: np.ndarray
    cost: np.ndarray | None  # (G, 6), ``cost.group_cost``
    body_hash: str
    texts: list[str]  # each group's rewards as JSON

    @classmethod
    def of(cls, settings: Settings, body: schemas.ResultsIn) -> Groups:
        """Sizes checked against the limits (413), sums, extremes, |advantage|, cost,
        fingerprint and the rewards' JSON — all before the lock."""
        groups = body.results
        if len(groups) > settings.max_results_per_report:
            raise TooLarge(
                f"results: {len(groups)} groups exceed the limit of {settings.max_results_per_report} "
                "per report; split it into several reports with distinct report_ids"
            )
        rewards = [g.rewards for g in groups]
        prompt_ids = [g.prompt_id for g in groups]
        lengths = np.fromiter(map(len, rewards), dtype=np.int64, count=len(groups))
        if lengths.max() > settings.max_rewards_per_group:
            i = int(np.argmax(lengths > settings.max_rewards_per_group))
            raise TooLarge(
                f"results[{i}].rewards: {int(lengths[i])} rewards exceed the limit of "
                f"{settings.max_rewards_per_group} per group"
            )
        flat = np.fromiter(chain.from_iterable(rewards), dtype=np.float64, count=int(lengths.sum()))
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        # Rewards far outside any reward_range (refused under the lock) may overflow these
        # sums: no warning for that.
        with np.errstate(over="ignore", invalid="ignore"):
            sums = np.add.reduceat(flat, starts)
            gmax = np.maximum.reduceat(flat, starts)
            gmin = np.minimum.reduceat(flat, starts)
            abs_adv = group_abs_advantage(flat, starts, lengths, sums)
        tokens = [g.tokens for g in groups]
        truncated = [g.truncated for g in groups]
        cost = group_cost(lengths, tokens, truncated, flat)
        costs = None if cost is None else (tokens, truncated)
        body_hash = report_hash(body.step, body.plan_id, prompt_ids, lengths, flat, costs)
        return cls(prompt_ids, lengths, flat, sums, gmin, gmax, abs_adv, cost, body_hash, rewards_json(flat, lengths))

    def check(self, s: Session, state: RunState, run: Run, body: schemas.ResultsIn) -> np.ndarray:
        """The groups' ordinals in the run, once every prompt is known, every reward in the
        run's ``reward_range`` and the plan (if named) the run's; else ``Invalid``."""
        lo, hi = run.settings["reward_range"]
        ordinals = state.lookup(self.prompt_ids)
        bad = [(int(i), self.prompt_ids[i], "unknown prompt id") for i in np.flatnonzero(ordinals < 0)]
        bad += [
            (int(i), self.prompt_ids[i], f"reward outside the run's reward_range [{lo}, {hi}]")
            for i in np.flatnonzero((self.gmin < lo) | (self.gmax > hi))
        ]
        if bad:
            bad.sort()
            raise Invalid(
                f"results[{bad[0][0]}]: {bad[0][2]} ({len(bad)} invalid items in all); nothing was stored",
                errors=item_errors("results", bad),
            )
        if body.plan_id is not None and not repo.plan_in_run(s, body.plan_id, run.pk):
            raise Invalid(
                f"plan_id: no plan {body.plan_id!r} in run {run.id!r}",
                errors=[{"loc": "body.plan_id", "msg": "unknown plan"}],
            )
        return ordinals


class Reports:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], store: StateStore, metrics: Any = None):
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.metrics = metrics

    def report(self, run_id: str, body: schemas.ResultsIn) -> schemas.ResultsAck:
        g = Groups.of(self.settings, body)
        # The run's lock and the report's context in one round trip (PostgreSQL).
        read = repo.report_context_sql(run_id, body.report_id, body.step)
        fallback = lambda s: repo.report_context(s, run_id, body.report_id, body.step)  # noqa: E731
        with repo.locked_context(self.sessions, run_id, read, fallback) as (s, row):
            if row is None:
                raise RunNotFound(run_id)
            run, prior_groups, prior_hash, reported_step, step_known = row
            if prior_hash is not None:
                if prior_hash != g.body_hash and prior_hash != legacy_report_hash(body):
                    raise Conflict(
                        f"report_id {body.report_id!r} was already used for a different report; "
                        "a re-sent report must be identical, a new one needs a new report_id"
                    )
                return schemas.ResultsAck(accepted=prior_groups, duplicate=True)
            state = self.store.state(s, run, touch=False)
            ordinals = g.check(s, state, run, body)
            event = ReportEvent(
                run.log_seq + 1,
                body.step,
                ordinals,
                g.lengths,
                g.sums,
                g.gmax != g.gmin,
                g.abs_adv,
                cost_or_none(g.cost),
            )
            # Recorded with the rows (export, inspection): steps the run's reports had
            # moved past this one's at commit. The fold decides its own down-weight.
            staleness = 0 if reported_step is None else max(0, int(reported_step) - body.step)
            self.store.speculate(state, event)  # the fold's work, beside the write
            repo.insert_report(
                s, run, event, body.report_id, g.body_hash, body.plan_id, staleness, g.texts, bool(step_known)
            )
        if self.metrics is not None:
            self.metrics.observe_ingest(len(g.prompt_ids), int(g.lengths.sum()))
        self.store.advance(state, event, run)
        return schemas.ResultsAck(accepted=len(g.prompt_ids), duplicate=False)
