"""The write paths that grow the log: reports and prompt upserts.

Each validates its request (before taking the run's lock where it can), writes its
event at the run's next log position in one transaction, and after commit folds the
event into this process's state (``StateStore.advance``). All-or-nothing: a refused
request stores nothing.
"""

from __future__ import annotations

import hashlib
import json
from itertools import chain
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from . import schemas
from .config import Settings
from .errors import Conflict, Invalid, RunNotFound, TooLarge, item_errors
from .runstate import PromptsEvent, ReportEvent
from .scheduling.cost import cost_or_none, group_cost
from .states import StateStore
from .storage import repository as repo
from .storage.db import locked_read_session, write_session

WARM_START_MAX_STRENGTH = 20.0


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


class Ingest:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], store: StateStore, metrics: Any = None):
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.metrics = metrics

    # -- reports ----------------------------------------------------------------------
    def report(self, run_id: str, body: schemas.ResultsIn) -> schemas.ResultsAck:
        cfg = self.settings
        groups = body.results
        if len(groups) > cfg.max_results_per_report:
            raise TooLarge(
                f"results: {len(groups)} groups exceed the limit of {cfg.max_results_per_report} "
                "per report; split it into several reports with distinct report_ids"
            )
        rewards = [g.rewards for g in groups]
        prompt_ids = [g.prompt_id for g in groups]
        lengths = np.fromiter(map(len, rewards), dtype=np.int64, count=len(groups))
        if lengths.max() > cfg.max_rewards_per_group:
            i = int(np.argmax(lengths > cfg.max_rewards_per_group))
            raise TooLarge(
                f"results[{i}].rewards: {int(lengths[i])} rewards exceed the limit of "
                f"{cfg.max_rewards_per_group} per group"
            )
        flat = np.fromiter(chain.from_iterable(rewards), dtype=np.float64, count=int(lengths.sum()))
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        # Rewards far outside any reward_range (refused below, once the run is read) may
        # overflow these sums: no warning for that.
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
        texts = rewards_json(flat, lengths)  # formatted before taking the run's lock

        # The run's lock and the report's context in one round trip (PostgreSQL).
        read = repo.report_context_sql(run_id, body.report_id, body.step)
        with locked_read_session(self.sessions, run_id, read) as (s, pg_row):
            if pg_row is not None or repo.is_postgres(s):
                row = repo.context_of_row(s, pg_row)
            else:
                row = repo.report_context(s, run_id, body.report_id, body.step)
            if row is None:
                raise RunNotFound(run_id)
            run, prior_groups, prior_hash, reported_step, step_known = row
            if prior_hash is not None:
                if prior_hash != body_hash and prior_hash != legacy_report_hash(body):
                    raise Conflict(
                        f"report_id {body.report_id!r} was already used for a different report; "
                        "a re-sent report must be identical, a new one needs a new report_id"
                    )
                return schemas.ResultsAck(accepted=prior_groups, duplicate=True)
            lo, hi = run.settings["reward_range"]
            state = self.store.state(s, run)
            ordinals = state.lookup(prompt_ids)
            bad = [(int(i), groups[i].prompt_id, "unknown prompt id") for i in np.flatnonzero(ordinals < 0)]
            bad += [
                (int(i), groups[i].prompt_id, f"reward outside the run's reward_range [{lo}, {hi}]")
                for i in np.flatnonzero((gmin < lo) | (gmax > hi))
            ]
            if bad:
                bad.sort()
                raise Invalid(
                    f"results[{bad[0][0]}]: {bad[0][2]} ({len(bad)} invalid items in all); nothing was stored",
                    errors=item_errors("results", bad),
                )
            if body.plan_id is not None and not repo.plan_in_run(s, body.plan_id, run.pk):
                raise Invalid(
                    f"plan_id: no plan {body.plan_id!r} in run {run_id!r}",
                    errors=[{"loc": "body.plan_id", "msg": "unknown plan"}],
                )
            seq = run.log_seq + 1
            informative = gmax != gmin
            # Recorded with the rows (export, inspection): steps the run's reports had
            # moved past this one's at commit. The fold decides its own down-weight.
            staleness = 0 if reported_step is None else max(0, int(reported_step) - body.step)
            repo.insert_report(
                s,
                run,
                seq,
                body.report_id,
                body_hash,
                body.step,
                body.plan_id,
                ordinals,
                lengths,
                sums,
                informative,
                abs_adv,
                staleness,
                texts,
                bool(step_known),
                cost,
            )
        if self.metrics is not None:
            self.metrics.observe_ingest(len(groups), int(lengths.sum()))
        self.store.advance(
            state, ReportEvent(seq, body.step, ordinals, lengths, sums, informative, abs_adv, cost_or_none(cost))
        )
        self.store.warm(state)
        if self.store.on_state is not None:
            self.store.on_state(state, run)
        return schemas.ResultsAck(accepted=len(groups), duplicate=False)

    # -- prompts ------------------------------------------------------------------------
    def upsert_prompts(self, run_id: str, body: schemas.PromptsIn | list[schemas.PromptRow]) -> schemas.PromptsAck:
        """Create or update prompts. ``body``: the validated request (``PromptsIn``) or
        its prompts as dicts holding the fields sent (``PromptRow``, the route's fast
        path). Column-wise: no Python object per prompt beyond the parsed dicts."""
        items = body if isinstance(body, list) else [p.model_dump(exclude_unset=True) for p in body.prompts]
        cfg = self.settings
        if len(items) > cfg.max_prompts_per_request:
            raise TooLarge(
                f"prompts: {len(items)} items exceed the limit of {cfg.max_prompts_per_request} "
                "per request; split the upload into chunks"
            )
        ids = [p["id"] for p in items]
        sent: set[str] = set().union(*items)  # the fields any prompt of the request sets
        if "text" in sent:
            limit = cfg.max_text_chars
            too_long = [
                (i, p["id"], f"text longer than {limit} characters")
                for i, p in enumerate(items)
                if p.get("text") is not None and len(p["text"]) > limit
            ]
            if too_long:
                raise Invalid(
                    f"prompts[{too_long[0][0]}].text: {too_long[0][2]}", errors=item_errors("prompts", too_long)
                )
        if len(set(ids)) < len(ids):
            seen: dict[str, int] = {}
            dups = []
            for i, pid in enumerate(ids):
                if pid in seen:
                    dups.append((i, pid, f"duplicate of prompts[{seen[pid]}] in the same request"))
                seen[pid] = i
            raise Invalid(f"prompts[{dups[0][0]}].id: {dups[0][2]}", errors=item_errors("prompts", dups))

        with write_session(self.sessions, run_id) as s:
            run = repo.run_by_id(s, run_id)
            if run is None:
                raise RunNotFound(run_id)
            state = self.store.state(s, run)
            version = run.prompt_version + 1
            found = state.lookup(ids)
            new_at = np.flatnonzero(found < 0)
            upd_at = np.flatnonzero(found >= 0)
            first = run.n_prompts
            new_ords = np.arange(first, first + new_at.size, dtype=np.int64)
            k = new_at.size
            # The new prompts column by column (None: not sent, NULL), in request order.
            every = k == len(items)
            new_items = items if every else [items[i] for i in new_at.tolist()]
            cols: dict[str, list[Any]] = {"id": ids if every else [ids[i] for i in new_at.tolist()]}
            for name in ("domain", "tags", "prior_pass_rate", "text", "embedding"):
                if name in sent:
                    cols[name] = [p.get(name) for p in new_items]
            none: list[Any] = [None] * k
            domains = cols.get("domain", none)
            priors = np.array(cols.get("prior_pass_rate", none), dtype=np.float64)
            strengths = np.full(k, np.nan)
            if k and run.settings.get("warm_start_from"):
                self._warm_start_priors(s, run.settings["warm_start_from"], cols["id"], priors, strengths)
                cols["prior_pass_rate"] = repo.nullable(priors)
                cols["prior_strength"] = repo.nullable(strengths)
            # Updates: only the fields each prompt sent change.
            upd_rows: list[dict[str, Any]] = []
            sched_ords = np.zeros(0, np.int64)
            if upd_at.size:
                upd_ords = found[upd_at]
                for i, o in zip(upd_at.tolist(), upd_ords.tolist()):
                    row = {"run_pk": run.pk, "ordinal": o, "version": version, **items[i]}
                    del row["id"]
                    upd_rows.append(row)
                is_sched = np.fromiter((not SCHED.isdisjoint(items[i]) for i in upd_at.tolist()), bool, upd_at.size)
                order = np.argsort(upd_ords[is_sched], kind="stable")
                sched_ords = upd_ords[is_sched][order]
            repo.insert_prompts(s, run.pk, first, version, cols)
            stored = repo.update_prompts(s, upd_rows)
            # The event, in ordinal order (the order the log is read back in): every update
            # that set a scheduling field, with the fields as stored after this upsert (all
            # older prompts), then every created prompt.
            after = [stored[o] for o in sched_ords.tolist()]
            upd_dom = [a[0] for a in after]
            upd_pr = [a[1] for a in after]
            upd_st = [a[2] for a in after]
            upd_tx = [a[3] for a in after]
            upd_em = [a[4] for a in after]
            run.n_prompts += k
            run.prompt_version = version
            event = None
            if k or sched_ords.size:
                seq = repo.take_seq(s, run)
                n_upd = int(sched_ords.size)
                ev_priors = np.concatenate([np.array(upd_pr, dtype=np.float64).reshape(n_upd), priors])
                ev_strengths = np.concatenate([np.array(upd_st, dtype=np.float64).reshape(n_upd), strengths])
                event = PromptsEvent(
                    seq=seq,
                    ordinals=np.concatenate([sched_ords, new_ords]),
                    ids=[None] * n_upd + cols["id"],
                    domains=upd_dom + list(domains),
                    priors=ev_priors,
                    strengths=ev_strengths,
                    texts=upd_tx + list(cols.get("text", none)),
                    embeddings=upd_em + list(cols.get("embedding", none)),
                )
                repo.insert_prompt_events(s, run.pk, seq, event, n_upd)
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
            a, b = pool.posterior(o[known])
        at = todo[known]
        priors[at] = a / (a + b)
        strengths[at] = np.minimum(a + b, WARM_START_MAX_STRENGTH)


SCHED = frozenset({"domain", "prior_pass_rate", "prior_strength", "text", "embedding"})
