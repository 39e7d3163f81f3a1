"""Every SQL statement of the write and fold paths, and every dialect difference.

Callers pass a ``Session`` (a ``write_session`` for writes, which holds the run's
lock); nothing here decides anything. Bulk rows go in one round trip: COPY on
PostgreSQL, one executemany on SQLite (``db.bulk_insert``), built column-wise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from sqlalchemy import and_, bindparam, func, select, text, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, make_transient_to_detached, sessionmaker, undefer
from sqlalchemy.orm.attributes import set_committed_value

from ..log.events import Event, PromptsEvent, ReportEvent, SealEvent, StrategyEvent
from ..scheduling.cost import COST_FIELDS, cost_or_none
from .db import bulk_insert, copy_text, literal, locked_read_session
from .models import (
    Plan,
    PlanExtension,
    PlanItem,
    Prompt,
    PromptEvent,
    Report,
    Result,
    Run,
    RunStep,
    StrategyChange,
)

RESULT_COLUMNS = (
    "run_pk",
    "report_seq",
    "position",
    "prompt_ordinal",
    "step",
    "n",
    "reward_sum",
    "informative",
    "abs_adv",
    "staleness",
    "rewards",
    *COST_FIELDS,
)
PLAN_ITEM_COLUMNS = ("plan_id", "position", "prompt_ordinal", "rollouts", "predicted_pass_rate", "phase")
PROMPT_EVENT_COLUMNS = (
    "run_pk", "seq", "ordinal", "created", "domain", "prior_pass_rate", "prior_strength", "text", "embedding",
)  # fmt: skip


def is_postgres(s: Session) -> bool:
    return s.get_bind().dialect.name == "postgresql"


# -- runs ---------------------------------------------------------------------------------
def run_by_id(s: Session, run_id: str) -> Run | None:
    return s.scalar(select(Run).where(Run.id == run_id))


def run_pk_of(s: Session, run_id: str) -> int | None:
    return s.scalar(select(Run.pk).where(Run.id == run_id))


def runs_page(s: Session, after: str | None, limit: int, visible: Any = None) -> list[Run]:
    q = select(Run).order_by(Run.id).limit(limit)
    if visible is not None:
        q = q.where(visible)
    if after is not None:
        q = q.where(Run.id > after)
    return list(s.scalars(q))


def last_report_times(s: Session, run_pks: list[int]) -> dict[int, Any]:
    """When each run's latest report (the one at ``runs.report_seq``) committed, in one query."""
    if not run_pks:
        return {}
    rows = s.execute(
        select(Report.run_pk, Report.created_at)
        .join(Run, (Run.pk == Report.run_pk) & (Run.report_seq == Report.report_seq))
        .where(Report.run_pk.in_(run_pks))
    ).all()
    return {pk: at for pk, at in rows}


def step_counts(s: Session, run_pks: list[int]) -> dict[int, int]:
    """Distinct steps (with a plan or results) of each run, in one query."""
    if not run_pks:
        return {}
    rows = s.execute(
        select(RunStep.run_pk, func.count()).where(RunStep.run_pk.in_(run_pks)).group_by(RunStep.run_pk)
    ).all()
    return {pk: int(n) for pk, n in rows}


def strategy_histories(s: Session, run_pks: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Each run's strategy changes in log order, in one query."""
    out: dict[int, list[dict[str, Any]]] = {pk: [] for pk in run_pks}
    if not run_pks:
        return out
    rows = s.execute(
        select(StrategyChange.run_pk, StrategyChange.step, StrategyChange.strategy)
        .where(StrategyChange.run_pk.in_(run_pks))
        .order_by(StrategyChange.run_pk, StrategyChange.seq)
    ).all()
    for pk, step, spec in rows:
        out[pk].append({"step": step, "strategy": spec})
    return out


def next_step(s: Session, run_pk: int) -> int:
    last = s.scalar(select(func.max(RunStep.step)).where(RunStep.run_pk == run_pk))
    return 0 if last is None else int(last) + 1


_STEP_ROW = "INSERT INTO run_steps (run_pk, step) VALUES (:run_pk, :step) ON CONFLICT DO NOTHING"
_MARK_STEP = text(_STEP_ROW)


def mark_step(s: Session, run_pk: int, step: int) -> None:
    # Plain SQL (both dialects take ON CONFLICT DO NOTHING): the ORM's insert construct cost
    # more to build per call than the statement itself.
    s.execute(_MARK_STEP, {"run_pk": run_pk, "step": step})


def take_seq(s: Session, run: Run) -> int:
    """The next position of the run's log (the caller holds the run's lock). Set on the
    row: written by the session's flush with the row's other changes, in one UPDATE."""
    seq = run.log_seq + 1
    run.log_seq = seq
    return seq


def add_strategy_change(s: Session, run: Run, step: int, spec: dict[str, Any]) -> None:
    n = s.scalar(select(func.count()).select_from(StrategyChange).where(StrategyChange.run_pk == run.pk)) or 0
    seq = take_seq(s, run)
    s.add(StrategyChange(run_pk=run.pk, seq=n + 1, step=step, strategy=spec, log_seq=seq))


# -- the event log ------------------------------------------------------------------------
def load_events(s: Session, run_pk: int, after: int, upto: int | None = None) -> list[Event]:
    """The run's events after log position ``after`` (up to ``upto``), in log order."""

    def window(q, col):
        q = q.where(col > after)
        return q if upto is None else q.where(col <= upto)

    events: list[Event] = [*_prompt_events(s, run_pk, window), *_report_events(s, run_pk, window)]
    for seq, step in s.execute(window(select(Plan.log_seq, Plan.step).where(Plan.run_pk == run_pk), Plan.log_seq)):
        events.append(SealEvent(int(seq), int(step)))
    for (seq,) in s.execute(
        window(
            select(PlanExtension.log_seq).join(Plan, Plan.id == PlanExtension.plan_id).where(Plan.run_pk == run_pk),
            PlanExtension.log_seq,
        )
    ):
        events.append(SealEvent(int(seq)))
    for seq, step, spec in s.execute(
        window(
            select(StrategyChange.log_seq, StrategyChange.step, StrategyChange.strategy).where(
                StrategyChange.run_pk == run_pk
            ),
            StrategyChange.log_seq,
        )
    ):
        events.append(StrategyEvent(int(seq), int(step), spec))
    events.sort(key=lambda e: e.seq)
    return events


def _prompt_events(s: Session, run_pk: int, window) -> list[PromptsEvent]:
    """The upserts' events in the window: ``prompt_events`` rows, one event per log position."""
    rows = s.execute(
        window(
            select(
                PromptEvent.seq,
                PromptEvent.ordinal,
                PromptEvent.created,
                Prompt.id,
                PromptEvent.domain,
                PromptEvent.prior_pass_rate,
                PromptEvent.prior_strength,
                PromptEvent.text,
                PromptEvent.embedding,
            )
            .join(Prompt, (Prompt.run_pk == PromptEvent.run_pk) & (Prompt.ordinal == PromptEvent.ordinal))
            .where(PromptEvent.run_pk == run_pk),
            PromptEvent.seq,
        ).order_by(PromptEvent.seq, PromptEvent.ordinal)
    ).all()
    if not rows:
        return []
    seqs, ords, created, ids, doms, priors, strengths, texts, embeddings = zip(*rows)
    return [
        PromptsEvent(
            seq=int(seqs[a]),
            ordinals=np.asarray(ords[a:b], np.int64),
            ids=[i if c else None for i, c in zip(ids[a:b], created[a:b])],
            domains=list(doms[a:b]),
            priors=_floats(priors[a:b]),
            strengths=_floats(strengths[a:b]),
            texts=list(texts[a:b]),
            embeddings=list(embeddings[a:b]),
        )
        for a, b in _runs(np.asarray(seqs, np.int64))
    ]


def _report_events(s: Session, run_pk: int, window) -> list[ReportEvent]:
    """The reports' events in the window: their ``results`` rows in position order, one
    event per report, the cost columns back as the report's cost block (``cost_or_none``:
    the event the live process folded)."""
    rows = s.execute(
        window(
            select(
                Result.report_seq,
                Result.step,
                Result.prompt_ordinal,
                Result.n,
                Result.reward_sum,
                Result.informative,
                Result.abs_adv,
                Result.tok_n,
                Result.tok_sum,
                Result.tok_sq,
                Result.trunc_n,
                Result.trunc_k,
                Result.pass_nt,
            ).where(Result.run_pk == run_pk),
            Result.report_seq,
        ).order_by(Result.report_seq, Result.position)
    ).all()
    if not rows:
        return []
    cols = [np.asarray(c) for c in zip(*rows)]
    cost = np.stack([c.astype(np.float64) for c in cols[7:13]], axis=1)
    return [
        ReportEvent(
            seq=int(cols[0][a]),
            step=int(cols[1][a]),
            ordinals=cols[2][a:b].astype(np.int64),
            n=cols[3][a:b].astype(np.int64),
            reward_sum=cols[4][a:b].astype(np.float64),
            informative=cols[5][a:b].astype(bool),
            abs_adv=cols[6][a:b].astype(np.float64),
            cost=cost_or_none(cost[a:b]),
        )
        for a, b in _runs(cols[0].astype(np.int64))
    ]


def _runs(seqs: np.ndarray) -> list[tuple[int, int]]:
    bounds = np.r_[0, np.flatnonzero(np.diff(seqs)) + 1, seqs.size].tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _floats(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


# -- prompts ------------------------------------------------------------------------------
def prompt_rows(s: Session, run_pk: int, ordinals: list[int]) -> dict[int, Prompt]:
    if not ordinals:
        return {}
    return {
        r.ordinal: r for r in s.scalars(select(Prompt).where(Prompt.run_pk == run_pk, Prompt.ordinal.in_(ordinals)))
    }


def prompt_by_id(s: Session, run_pk: int, prompt_id: str) -> Prompt | None:
    return s.scalar(select(Prompt).where(Prompt.run_pk == run_pk, Prompt.id == prompt_id))


def prompts_page(s: Session, run_pk: int, after_ordinal: int, limit: int, domain: str | None) -> list[Prompt]:
    q = select(Prompt).where(Prompt.run_pk == run_pk, Prompt.ordinal > after_ordinal)
    if domain is not None:
        q = q.where(Prompt.domain == domain)
    return list(s.scalars(q.order_by(Prompt.ordinal).limit(limit)))


def scheduling_fields(s: Session, run_pk: int, ordinals: list[int]) -> dict[int, tuple]:
    """(domain, prior_pass_rate, prior_strength, text, embedding) of existing prompts."""
    out: dict[int, tuple] = {}
    for a in range(0, len(ordinals), 10_000):  # bound the bind parameters of one statement
        rows = s.execute(
            select(
                Prompt.ordinal,
                Prompt.domain,
                Prompt.prior_pass_rate,
                Prompt.prior_strength,
                Prompt.text,
                Prompt.embedding,
            ).where(Prompt.run_pk == run_pk, Prompt.ordinal.in_(ordinals[a : a + 10_000]))
        ).all()
        out.update((r[0], tuple(r[1:])) for r in rows)
    return out


def insert_prompts(s: Session, run_pk: int, first: int, version: int, cols: dict[str, list[Any]]) -> None:
    """New prompts, column-wise: ``cols`` maps a column of ``prompts`` (``id`` and any of
    ``PROMPT_VALUE_COLUMNS``) to its values in ordinal order from ``first`` (None: NULL;
    JSON columns hold Python values). The caller holds the run's lock and has checked
    that the ids are new: one COPY on PostgreSQL, one executemany on SQLite."""
    k = len(cols["id"])
    if not k:
        return
    names = ("id", *(c for c in PROMPT_VALUE_COLUMNS if c in cols))
    columns = ("run_pk", "ordinal", "version", *names)
    if is_postgres(s):
        fields = [[str(run_pk)] * k, [str(o) for o in range(first, first + k)], [str(version)] * k]
        fields += [_copy_column(c, cols[c]) for c in names]
        copy_text(s, "prompts", columns, "\n".join(map("\t".join, zip(*fields))) + "\n")
        return
    values = [cols[c] if c not in JSON_COLUMNS else _json_column(cols[c]) for c in names]
    rows = list(zip([run_pk] * k, range(first, first + k), [version] * k, *values))
    bulk_insert(s, "prompts", columns, rows)


def update_prompts(s: Session, rows: list[dict[str, Any]]) -> dict[int, tuple]:
    """Existing prompts: each row (``run_pk``, ``ordinal``, ``version`` and the fields
    sent) changes only the fields it holds. Returns (domain, prior_pass_rate,
    prior_strength, text, embedding) of each as stored after the update. On PostgreSQL one ``UPDATE …
    FROM unnest … RETURNING`` per set of fields sent (a re-upload of a whole dataset is
    one statement)."""
    if not rows:
        return {}
    if not is_postgres(s):
        s.execute(update(Prompt), rows)
        return scheduling_fields(s, rows[0]["run_pk"], [r["ordinal"] for r in rows])
    stored: dict[int, tuple] = {}
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(c for c in PROMPT_VALUE_COLUMNS if c in r), []).append(r)
    for names, grp in groups.items():
        params: dict[str, Any] = {"pk": grp[0]["run_pk"], "v": grp[0]["version"], "o": [r["ordinal"] for r in grp]}
        arrays, sets = ["CAST(:o AS integer[])"], ["version = :v"]
        for j, c in enumerate(names):
            values = [r[c] for r in grp]
            params[f"c{j}"] = _json_column(values) if c in JSON_COLUMNS else values
            arrays.append(f"CAST(:c{j} AS {_PG_ARRAY_TYPE[c]})")
            sets.append(f"{c} = CAST(u.c{j} AS json)" if c in JSON_COLUMNS else f"{c} = u.c{j}")
        cols = ", ".join(["o", *(f"c{j}" for j in range(len(names)))])
        res = s.execute(
            text(
                f"UPDATE prompts AS p SET {', '.join(sets)} FROM unnest({', '.join(arrays)}) AS u({cols}) "
                "WHERE p.run_pk = :pk AND p.ordinal = u.o "
                "RETURNING p.ordinal, p.domain, p.prior_pass_rate, p.prior_strength, p.text, p.embedding"
            ),
            params,
        )
        stored.update((r[0], tuple(r[1:])) for r in res)
    return stored


_PG_ARRAY_TYPE = {
    "domain": "text[]", "tags": "text[]", "prior_pass_rate": "float8[]", "prior_strength": "float8[]",
    "text": "text[]", "embedding": "text[]",
}  # fmt: skip


def insert_prompt_events(s: Session, run_pk: int, seq: int, event: PromptsEvent, n_updates: int) -> None:
    """The upsert's ``prompt_events`` rows: its first ``n_updates`` entries are updates
    (created false, written from the event), the rest the prompts just created, copied
    from their ``prompts`` rows inside the database (the same values: one statement, no
    row data sent again)."""
    k = event.ordinals.size
    if k > n_updates:
        lo, hi = int(event.ordinals[n_updates]), int(event.ordinals[-1])
        s.execute(_CREATED_EVENTS, {"pk": run_pk, "seq": seq, "lo": lo, "hi": hi})
    if not n_updates:
        return
    upd = slice(0, n_updates)
    priors, strengths = nullable(event.priors[upd]), nullable(event.strengths[upd])
    ords = event.ordinals[upd].tolist()
    domains = event.domains[:n_updates]
    texts = (event.texts or [None] * k)[:n_updates]
    embeddings = (event.embeddings or [None] * k)[:n_updates]
    if is_postgres(s):
        fields = [
            [str(run_pk)] * n_updates,
            [str(seq)] * n_updates,
            list(map(str, ords)),
            ["f"] * n_updates,
            _copy_column("domain", domains),
            _copy_column("prior_pass_rate", priors),
            _copy_column("prior_strength", strengths),
            _copy_column("text", texts),
            _copy_column("embedding", embeddings),
        ]
        copy_text(s, "prompt_events", PROMPT_EVENT_COLUMNS, "\n".join(map("\t".join, zip(*fields))) + "\n")
        return
    rows = list(
        zip(
            [run_pk] * n_updates,
            [seq] * n_updates,
            ords,
            [False] * n_updates,
            domains,
            priors,
            strengths,
            texts,
            _json_column(embeddings),
        )
    )
    bulk_insert(s, "prompt_events", PROMPT_EVENT_COLUMNS, rows)


_CREATED_EVENTS = text(
    f"INSERT INTO prompt_events ({', '.join(PROMPT_EVENT_COLUMNS)}) "
    "SELECT run_pk, :seq, ordinal, TRUE, domain, prior_pass_rate, prior_strength, text, embedding FROM prompts "
    "WHERE run_pk = :pk AND ordinal BETWEEN :lo AND :hi"
)


PROMPT_VALUE_COLUMNS = ("domain", "tags", "prior_pass_rate", "prior_strength", "text", "embedding")
JSON_COLUMNS = frozenset({"tags", "embedding"})
_COPY_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def nullable(x: np.ndarray) -> list[float | None]:
    """A float column with NaN as None (NULL)."""
    return [None if v != v else v for v in x.tolist()]


def _json_column(values: list[Any]) -> list[str | None]:
    return [None if v is None else json.dumps(v) for v in values]


def _copy_column(name: str, values: list[Any]) -> list[str]:
    """A column's values as COPY text fields (``\\N``: NULL)."""
    if name in JSON_COLUMNS:
        values = _json_column(values)
    elif name in ("prior_pass_rate", "prior_strength"):
        return ["\\N" if v is None else repr(float(v)) for v in values]
    if None not in values:
        blob = "".join(values)
        if not ("\\" in blob or "\t" in blob or "\n" in blob or "\r" in blob):
            return values  # nothing to escape (ids always: their pattern has no such character)
    distinct = set(values)
    if len(distinct) * 4 < len(values):  # labels (domains): each escaped once
        token = {v: "\\N" if v is None else v.translate(_COPY_ESCAPE) for v in distinct}
        return [token[v] for v in values]
    return ["\\N" if v is None else v.translate(_COPY_ESCAPE) for v in values]


def history(s: Session, run_pk: int, ordinal: int, limit: int | None = None) -> list[dict[str, Any]]:
    """The prompt's reported groups, oldest first; with ``limit``, only the latest ``limit``.
    ``tokens`` and ``truncated``: the group's completion tokens and truncated completions
    (None where its report gave none)."""
    q = (
        select(
            Report.report_id, Result.step, Result.rewards, Result.tok_n, Result.tok_sum, Result.trunc_n, Result.trunc_k
        )  # fmt: skip
        .join(Report, (Report.run_pk == Result.run_pk) & (Report.report_seq == Result.report_seq))
        .where(Result.run_pk == run_pk, Result.prompt_ordinal == ordinal)
    )
    if limit is None:
        rows = s.execute(q.order_by(Result.report_seq, Result.position)).all()
    else:
        rows = s.execute(q.order_by(Result.report_seq.desc(), Result.position.desc()).limit(limit)).all()[::-1]
    return [
        {"report_id": r, "step": st, "rewards": rw, "tokens": ts if tn else None, "truncated": rk if rn else None}
        for r, st, rw, tn, ts, rn, rk in rows
    ]


def history_count(s: Session, run_pk: int, ordinal: int) -> int:
    return int(
        s.scalar(
            select(func.count()).select_from(Result).where(Result.run_pk == run_pk, Result.prompt_ordinal == ordinal)
        )
        or 0
    )


# -- reports ------------------------------------------------------------------------------
def report_context(s: Session, run_id: str, report_id: str, step: int):
    """In one round trip: the run, this report_id's earlier report (n_groups, hash) if
    any, the latest step the run has *reported*, and whether ``step`` is known. The
    caller holds the run's lock, so every earlier report is committed. max(results.step)
    is read from the index ix_results_run_step in one seek."""
    latest_reported = select(func.max(Result.step)).where(Result.run_pk == Run.pk).scalar_subquery()
    step_known = select(RunStep.step).where(RunStep.run_pk == Run.pk, RunStep.step == step).exists()
    return s.execute(
        select(Run, Report.n_groups, Report.body_hash, latest_reported, step_known)
        .outerjoin(Report, (Report.run_pk == Run.pk) & (Report.report_id == report_id))
        .where(Run.id == run_id)
    ).first()


# (attribute, column name) of every column of Run, in the mapper's order.
_RUN_COLUMNS = tuple((a.key, a.columns[0].name) for a in sa_inspect(Run).column_attrs)


def report_context_sql(run_id: str, report_id: str, step: int) -> str:
    """``report_context`` as PostgreSQL text with its values inlined, for
    ``locked_read_session`` (sent with the lock, run once the lock is granted)."""
    cols = ", ".join(f"r.{name}" for _, name in _RUN_COLUMNS)
    return (
        f"SELECT {cols}, rep.n_groups, rep.body_hash, "
        "(SELECT max(x.step) FROM results x WHERE x.run_pk = r.pk), "
        f"EXISTS (SELECT 1 FROM run_steps st WHERE st.run_pk = r.pk AND st.step = {literal(int(step))}) "
        f"FROM runs r LEFT JOIN reports rep ON rep.run_pk = r.pk AND rep.report_id = {literal(report_id)} "
        f"WHERE r.id = {literal(run_id)}"
    )


def context_of_row(s: Session, row: tuple | None):
    """The answer of ``report_context`` or ``plan_context`` from a row of their ``_sql``: the run as a
    persistent instance of this session, as if it had been loaded by a query."""
    if row is None:
        return None
    n = len(_RUN_COLUMNS)
    run = Run(**{key: v for (key, _), v in zip(_RUN_COLUMNS, row[:n])})
    make_transient_to_detached(run)
    s.add(run)
    return (run, *row[n:])


@contextmanager
def locked_context(
    sessions: sessionmaker[Session],
    run_id: str,
    read: str,
    fallback: Callable[[Session], tuple | None],
    of_row: Callable[[Session, tuple | None], tuple | None] = context_of_row,
) -> Iterator[tuple[Session, tuple | None]]:
    """The run's write transaction and its context row (``plan_context``, ``report_context``)
    read under the run's lock: on PostgreSQL in the lock's own round trip (``read``, their
    ``_sql``, read back by ``of_row``), on SQLite by ``fallback(session)`` after it; None for
    an unknown run."""
    with locked_read_session(sessions, run_id, read) as (s, row):
        yield s, (fallback(s) if row is None and not is_postgres(s) else of_row(s, row))


def plan_in_run(s: Session, plan_id: str, run_pk: int) -> bool:
    return s.scalar(select(Plan.id).where(Plan.id == plan_id, Plan.run_pk == run_pk)) is not None


_REPORT_VALUES = "(:pk, :seq, :rid, :hash, :step, :plan, :k)"
_REPORT_COLS = "reports (run_pk, report_seq, report_id, body_hash, step, plan_id, n_groups)"
_COUNTERS = (
    "UPDATE runs SET log_seq = :seq, report_seq = :seq, n_results = n_results + :k, "
    "n_rollouts = n_rollouts + :nr, n_informative_rollouts = n_informative_rollouts + :ni WHERE pk = :pk"
)
_REPORT_ROW = text(f"INSERT INTO {_REPORT_COLS} VALUES {_REPORT_VALUES}")
_RUN_COUNTERS = text(_COUNTERS)
_PG_REPORT_KNOWN_STEP = text(f"WITH r AS (INSERT INTO {_REPORT_COLS} VALUES {_REPORT_VALUES}) {_COUNTERS}")
_PG_REPORT_NEW_STEP = text(
    f"WITH r AS (INSERT INTO {_REPORT_COLS} VALUES {_REPORT_VALUES}), "
    "st AS (INSERT INTO run_steps (run_pk, step) VALUES (:pk, :step) ON CONFLICT DO NOTHING) " + _COUNTERS
)


def insert_report(
    s: Session,
    run: Run,
    event: ReportEvent,
    report_id: str,
    body_hash: str,
    plan_id: str | None,
    staleness: int,
    texts: list[str],
    step_known: bool,
) -> None:
    """The report's ``event`` (the one the fold applies), its rows of the reward log (each
    group's rewards as JSON ``texts``; the groups' cost, zeros where none) with its
    ``staleness``, the step and the run's counters."""
    e, k = event, len(texts)
    n_rollouts, n_informative = int(e.n.sum()), int(e.n[e.informative].sum())
    _insert_results(s, run.pk, e, staleness, texts)
    params = {"pk": run.pk, "seq": e.seq, "rid": report_id, "hash": body_hash, "step": e.step, "plan": plan_id,
              "k": k, "nr": n_rollouts, "ni": n_informative}  # fmt: skip
    if is_postgres(s):  # the report, the step and the counters in one round trip
        s.execute(_PG_REPORT_KNOWN_STEP if step_known else _PG_REPORT_NEW_STEP, params)
    else:
        s.execute(_REPORT_ROW, params)
        if not step_known:
            mark_step(s, run.pk, e.step)
        s.execute(_RUN_COUNTERS, params)
    # Mirror the SQL update on the row (the predictor reads it) without marking it changed:
    # the UPDATE above wrote it, a flush must not write it again.
    for name, value in (
        ("log_seq", e.seq), ("report_seq", e.seq), ("n_results", run.n_results + k),
        ("n_rollouts", run.n_rollouts + n_rollouts), ("n_informative_rollouts", run.n_informative_rollouts + n_informative),
    ):  # fmt: skip
        set_committed_value(run, name, value)


def _insert_results(s: Session, run_pk: int, e: ReportEvent, staleness: int, texts: list[str]) -> None:
    seq, step, cost = e.seq, e.step, e.cost
    cols = zip(
        e.ordinals.tolist(), e.n.tolist(), e.reward_sum.tolist(), e.informative.tolist(), e.abs_adv.tolist(), texts
    )
    # The cost columns: five counts and token sums (exact integers), a reward sum.
    if cost is None:
        cost_rows: list[tuple] = [(0, 0, 0, 0, 0, 0.0)] * len(texts)
    else:
        cost_rows = [(*map(int, c[:5]), float(c[5])) for c in cost.tolist()]
    if is_postgres(s):  # COPY text built in one pass: this is the ingestion hot path
        head, mid, tail = f"{run_pk}\t{seq}\t", f"\t{step}\t", f"\t{staleness}\t"
        costs = ["\t".join([*map(str, c[:5]), repr(c[5])]) for c in cost_rows]
        lines = [
            f"{head}{i}\t{o}{mid}{n}\t{r!r}\t{'t' if inf else 'f'}\t{aa!r}{tail}{rw}\t{c}\n"
            for i, ((o, n, r, inf, aa, rw), c) in enumerate(zip(cols, costs))
        ]
        copy_text(s, "results", RESULT_COLUMNS, "".join(lines))
        return
    rows = [
        (run_pk, seq, i, o, step, n, r, inf, aa, staleness, rw, *c)
        for i, ((o, n, r, inf, aa, rw), c) in enumerate(zip(cols, cost_rows))
    ]
    bulk_insert(s, "results", RESULT_COLUMNS, rows)


# -- plans --------------------------------------------------------------------------------
def plan_of_step(s: Session, run_pk: int, step: int) -> Plan | None:
    return s.scalar(select(Plan).where(Plan.run_pk == run_pk, Plan.step == step))


_PLAN_BY_ID = (
    select(Plan).options(undefer(Plan.items)).where(Plan.id == bindparam("plan_id"), Plan.run_pk == bindparam("run_pk"))
)


def plan_by_id(s: Session, run_pk: int, plan_id: str) -> Plan | None:
    """The plan with its packed items (its caller, a plan's extension, reads them): one round trip."""
    return s.scalar(_PLAN_BY_ID, {"plan_id": plan_id, "run_pk": run_pk})


_PLAN_COLUMNS = (
    "id",
    "run_pk",
    "step",
    "strategy",
    "batch_size",
    "rollout_budget",
    "compute_ms",
    "log_seq",
    "token_budget",
    "rollout_cap",
    "max_new_tokens",
    "items",
    "items_indexed",
)
_PLAN_ROW = f"INSERT INTO plans ({', '.join(_PLAN_COLUMNS)}) VALUES ({', '.join(':' + c for c in _PLAN_COLUMNS)})"
_PLAN_COUNTERS = "UPDATE runs SET log_seq = :log_seq, n_plans = n_plans + 1 WHERE pk = :run_pk"
_SQLITE_PLAN = tuple(text(q) for q in (_PLAN_ROW, _STEP_ROW, _PLAN_COUNTERS))
_PG_PLAN = text(f"WITH p AS ({_PLAN_ROW}), st AS ({_STEP_ROW}) {_PLAN_COUNTERS}")


def add_plan(s: Session, run: Run, plan: Plan, ordinals, rollouts, predicted, costs: PlanCosts | None = None) -> None:
    """Store a plan (``plan.log_seq``: its log position; the caller holds the run's lock):
    its row with its items packed (``pack_items``), its step and the run's counters — one
    statement on PostgreSQL, three plain ones on SQLite, no ORM flush; a plan whose items
    carry costs keeps them as rows of ``plan_items``. ``plan`` stays transient (the answer
    reads it); ``run``'s log position and plan count are set as committed."""
    if costs is None:
        plan.items, plan.items_indexed = pack_items(ordinals, rollouts, predicted), False
    else:
        plan.items, plan.items_indexed = None, True
    params = {c: getattr(plan, c) for c in _PLAN_COLUMNS}
    # The statement below writes the log position ``take_seq`` set on the row: marked as
    # written, so that no flush writes it again in a round trip of its own.
    set_committed_value(run, "log_seq", plan.log_seq)
    if is_postgres(s):
        s.execute(_PG_PLAN, params)
    else:
        for q in _SQLITE_PLAN:
            s.execute(q, params)
    if costs is not None:
        insert_plan_items(s, plan.id, 0, 0, ordinals, rollouts, predicted, costs)
    set_committed_value(run, "n_plans", run.n_plans + 1)


def _plan_context_query(step_given: bool):
    latest = select(func.max(RunStep.step)).where(RunStep.run_pk == Run.pk).scalar_subquery()
    at = bindparam("step") if step_given else func.coalesce(latest + 1, 0)
    return (
        select(Run, latest, Plan)
        .outerjoin(Plan, and_(Plan.run_pk == Run.pk, Plan.step == at))
        .options(undefer(Plan.items))
        .where(Run.id == bindparam("run_id"))
    )


# Built once (with bound parameters): building the statement cost more than running it.
_PLAN_CONTEXT = {given: _plan_context_query(given) for given in (False, True)}
# (attribute, column name) of every column of Plan, in the mapper's order.
_PLAN_ALL_COLUMNS = tuple((a.key, a.columns[0].name) for a in sa_inspect(Plan).column_attrs)


def plan_context(s: Session, run_id: str, step: int | None):
    """Under the run's lock: (the run, the step a plan asked without one gets, the stored plan
    of ``step`` or of that step if any, its packed items loaded), in one query."""
    params: dict[str, Any] = {"run_id": run_id} if step is None else {"run_id": run_id, "step": step}
    return s.execute(_PLAN_CONTEXT[step is not None], params).first()


def plan_context_sql(run_id: str, step: int | None) -> str:
    """``plan_context`` as PostgreSQL text with its values inlined, for ``locked_read_session``
    (read back by ``plan_context_of_row``)."""
    cols = ", ".join(f"r.{name}" for _, name in _RUN_COLUMNS)
    plan_cols = ", ".join(f"p.{name}" for _, name in _PLAN_ALL_COLUMNS)
    latest = "(SELECT max(st.step) FROM run_steps st WHERE st.run_pk = r.pk)"
    at = f"coalesce({latest} + 1, 0)" if step is None else literal(int(step))
    return (
        f"SELECT {cols}, {latest}, {plan_cols} "
        f"FROM runs r LEFT JOIN plans p ON p.run_pk = r.pk AND p.step = {at} WHERE r.id = {literal(run_id)}"
    )


def plan_context_of_row(s: Session, row: tuple | None):
    """``plan_context``'s answer from a row of ``plan_context_sql``: the run and the stored plan
    (None where the step has none) as persistent instances of this session."""
    out = context_of_row(s, row)
    if out is None:
        return None
    run, latest, *cols = out
    if cols[0] is None:  # the plan's primary key: no plan of that step
        return run, latest, None
    plan = Plan(**{key: v for (key, _), v in zip(_PLAN_ALL_COLUMNS, cols)})
    make_transient_to_detached(plan)
    s.add(plan)
    return run, latest, plan


_ITEM_BYTES = 8 + 4 + 8  # a packed item: ordinal int64, rollouts int32, predicted float64


def pack_items(ordinals, rollouts, predicted) -> bytes:
    """A plan's items as one little-endian buffer: the ordinals (int64), then the rollouts
    (int32), then the predicted pass rates (float64), each column whole, in plan order."""
    return b"".join(
        (
            np.asarray(ordinals).astype("<i8").tobytes(),
            np.asarray(rollouts).astype("<i4").tobytes(),
            np.asarray(predicted, dtype=np.float64).astype("<f8").tobytes(),
        )
    )


def unpack_items(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pack_items``' inverse: (ordinals int64, rollouts int64, predicted float64)."""
    n = len(buf) // _ITEM_BYTES
    if n * _ITEM_BYTES != len(buf):  # pragma: no cover - only pack_items writes them
        raise ValueError(f"packed plan items of {len(buf)} bytes are not whole items")
    o = np.frombuffer(buf, "<i8", n, 0).astype(np.int64)
    r = np.frombuffer(buf, "<i4", n, 8 * n).astype(np.int64)
    p = np.frombuffer(buf, "<f8", n, 12 * n).astype(np.float64)
    return o, r, p


def index_plan_items(s: Session, run_pk: int) -> int:
    """Write the packed items of the run's plans not yet indexed as rows of ``plan_items``
    (what the inspection queries join), and mark them indexed; the caller holds the run's
    lock. Returns the number of plans indexed."""
    todo = s.execute(select(Plan.id, Plan.items).where(Plan.run_pk == run_pk, Plan.items_indexed.is_(False))).all()
    rows: list[tuple] = []  # every plan's rows, written in one statement (COPY on PostgreSQL)
    for plan_id, buf in todo:
        if buf is not None:
            o, r, p = (c.tolist() for c in unpack_items(buf))
            rows += [(plan_id, i, *item, 0) for i, item in enumerate(zip(o, r, p))]
    bulk_insert(s, "plan_items", PLAN_ITEM_COLUMNS, rows)
    if todo:
        s.execute(update(Plan).where(Plan.id.in_([t[0] for t in todo])).values(items_indexed=True))
    return len(todo)


def has_unindexed_plans(s: Session, run_pk: int) -> bool:
    return s.scalar(select(Plan.id).where(Plan.run_pk == run_pk, Plan.items_indexed.is_(False)).limit(1)) is not None


PlanCosts = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A plan's items' (expected tokens (NaN: none), max_new_tokens hint (0: none), raise_may_pass)."""
PLAN_ITEM_COST_COLUMNS = ("expected_tokens", "max_new_tokens", "raise_may_pass")


def insert_plan_items(
    s: Session, plan_id: str, phase: int, first: int, ordinals, rollouts, predicted, costs: PlanCosts | None = None
) -> None:
    cols = (np.asarray(ordinals).tolist(), np.asarray(rollouts).tolist(), np.asarray(predicted, dtype=float).tolist())
    if costs is not None:
        tok, hint, flag = costs
        extra = [
            (None if t != t else t, h or None, bool(f) if h else None)
            for t, h, f in zip(np.asarray(tok, float).tolist(), np.asarray(hint).tolist(), np.asarray(flag).tolist())
        ]
        rows = [(plan_id, first + i, o, r, p, phase, *x) for i, ((o, r, p), x) in enumerate(zip(zip(*cols), extra))]
        bulk_insert(s, "plan_items", PLAN_ITEM_COLUMNS + PLAN_ITEM_COST_COLUMNS, rows)
        return
    if is_postgres(s):  # COPY text built in one pass (a plan has thousands of items)
        lines = [f"{plan_id}\t{first + i}\t{o}\t{r}\t{p!r}\t{phase}\n" for i, (o, r, p) in enumerate(zip(*cols))]
        copy_text(s, "plan_items", PLAN_ITEM_COLUMNS, "".join(lines))
        return
    plain = [(plan_id, first + i, o, r, p, phase) for i, (o, r, p) in enumerate(zip(*cols))]
    bulk_insert(s, "plan_items", PLAN_ITEM_COLUMNS, plain)


def plan_item_costs(s: Session, plan_id: str) -> list[tuple[float | None, int | None, bool | None]]:
    """The (expected tokens, max_new_tokens hint, raise_may_pass) of a plan's items, in order."""
    return [
        tuple(r)  # type: ignore[misc]
        for r in s.execute(
            select(PlanItem.expected_tokens, PlanItem.max_new_tokens, PlanItem.raise_may_pass)
            .where(PlanItem.plan_id == plan_id, PlanItem.phase == 0)
            .order_by(PlanItem.position)
        ).all()
    ]


def stored_plan_items(s: Session, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A stored plan's items (ordinals, rollouts, predicted pass rates), from its packed row
    or, for a plan stored without it, from ``plan_items``."""
    buf = plan.items
    if buf is not None:
        return unpack_items(buf)
    rows = plan_items(s, plan.id, 0)
    return (
        np.array([r[0] for r in rows], np.int64),
        np.array([r[1] for r in rows], np.int64),
        np.array([r[2] for r in rows], np.float64),
    )


def plan_items(s: Session, plan_id: str, phase: int) -> list[tuple[int, int, float]]:
    """The rows of ``plan_items`` of a plan's phase (0: a plan stored without packed items;
    1: its extension)."""
    return [
        (int(o), int(r), float(p))
        for o, r, p in s.execute(
            select(PlanItem.prompt_ordinal, PlanItem.rollouts, PlanItem.predicted_pass_rate)
            .where(PlanItem.plan_id == plan_id, PlanItem.phase == phase)
            .order_by(PlanItem.position)
        ).all()
    ]


def extension(s: Session, plan_id: str) -> PlanExtension | None:
    return s.get(PlanExtension, plan_id)


def pilot_sums(s: Session, run_pk: int, plan_id: str) -> list[tuple[int, int, float]]:
    """(ordinal, rollouts, reward sum) of the groups reported with this plan_id."""
    return [
        (int(o), int(n), float(r))
        for o, n, r in s.execute(
            select(Result.prompt_ordinal, func.sum(Result.n), func.sum(Result.reward_sum))
            .join(Report, (Report.run_pk == Result.run_pk) & (Report.report_seq == Result.report_seq))
            .where(Report.run_pk == run_pk, Report.plan_id == plan_id)
            .group_by(Result.prompt_ordinal)
        ).all()
    ]


def add_extension(s: Session, plan_id: str, extra_budget: int, seq: int) -> None:
    s.add(PlanExtension(plan_id=plan_id, extra_budget=extra_budget, log_seq=seq))
    s.flush()


def strategy_changes(s: Session, run_pk: int) -> list[tuple[int, dict[str, Any]]]:
    return [
        (int(st), spec)
        for st, spec in s.execute(
            select(StrategyChange.step, StrategyChange.strategy)
            .where(StrategyChange.run_pk == run_pk)
            .order_by(StrategyChange.seq)
        )
    ]
