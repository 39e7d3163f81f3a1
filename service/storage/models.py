"""SQLAlchemy 2 models. The schema changes only through Alembic (``migrations/``).

A run's ordered event log is the source of truth; every estimator state is a fold
over it (``service/log/``). Each write of a run takes the next position of
the run's log, ``runs.log_seq``, under the run's lock, so log order is commit order:
prompt upserts (``prompt_events``), reports (``reports.report_seq``; their groups in
``results``, ordered by ``(report_seq, position)``), plans and extensions
(``plans.log_seq``, ``plan_extensions.log_seq``) and strategy changes
(``strategy_changes.log_seq``). Rows written before migration 0007 have no position
(NULL) and are not events, except their prompts, logged at position 0.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID_LEN = 200


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(ID_LEN), unique=True, nullable=False)
    settings: Mapped[dict] = mapped_column(JSON, nullable=False)
    meta: Mapped[dict] = mapped_column("metadata", JSON, nullable=False, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    # Counters, all updated in the same transaction as the rows they count.
    n_prompts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    prompt_version: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    # The log position of the run's latest event, and of its latest report.
    log_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    report_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    n_plans: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    n_results: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    n_rollouts: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    n_informative_rollouts: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)


class Prompt(Base):
    __tablename__ = "prompts"

    # No foreign key (migration 0008): written in bulk under the run's lock; runs are never deleted.
    run_pk: Mapped[int] = mapped_column(Integer, primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    id: Mapped[str] = mapped_column(String(ID_LEN), nullable=False)
    domain: Mapped[str | None] = mapped_column(String(ID_LEN))
    tags: Mapped[list | None] = mapped_column(JSON)
    prior_pass_rate: Mapped[float | None] = mapped_column(Float)
    # Pseudo-count strength of the prior (set by a warm start); None = the strategy's.
    prior_strength: Mapped[float | None] = mapped_column(Float)
    text: Mapped[str | None] = mapped_column(Text)
    # Optional client-supplied embedding vector (migration 0004), an input of the learned predictor.
    embedding: Mapped[list | None] = mapped_column(JSON)
    # The run's prompt_version when this row was last written: replicas refresh
    # incrementally with ``version > last_seen``.
    version: Mapped[int] = mapped_column(BigInteger, nullable=False)

    __table_args__ = (
        UniqueConstraint("run_pk", "id", name="uq_prompts_run_id"),
        Index("ix_prompts_run_version", "run_pk", "version"),
    )


class Plan(Base):
    __tablename__ = "plans"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"), nullable=False)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    strategy: Mapped[str] = mapped_column(String(ID_LEN), nullable=False)
    batch_size: Mapped[int] = mapped_column(Integer, nullable=False)
    rollout_budget: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    # Milliseconds the strategy spent computing the plan (migration 0002).
    compute_ms: Mapped[float | None] = mapped_column(Float)
    log_seq: Mapped[int | None] = mapped_column(BigInteger)
    # A plan in tokens (migration 0012): the request's token budget, the rollout budget
    # given beside it (a cap) and the trainer's generation limit; NULL where not given.
    token_budget: Mapped[int | None] = mapped_column(BigInteger)
    rollout_cap: Mapped[int | None] = mapped_column(BigInteger)
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)
    # Migration 0013: the items packed (``repository.pack_items``), written with the plan in
    # one statement; NULL for older plans and plans in tokens (their items are rows only).
    # ``items_indexed``: whether they are rows of ``plan_items`` too (written on the first
    # inspection read that needs them, ``repository.index_plan_items``).
    items: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    items_indexed: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=true())

    __table_args__ = (
        UniqueConstraint("run_pk", "step", name="uq_plans_run_step"),
        Index(
            "ix_plans_unindexed",
            "run_pk",
            postgresql_where=text("NOT items_indexed"),
            sqlite_where=text("NOT items_indexed"),
        ),
    )


class PlanItem(Base):
    __tablename__ = "plan_items"

    # No foreign key (migration 0006): items are written only with their plan, in its
    # transaction, and a per-row check cost more than the COPY of a plan's items.
    plan_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_ordinal: Mapped[int] = mapped_column(Integer, nullable=False)
    rollouts: Mapped[int] = mapped_column(Integer, nullable=False)
    predicted_pass_rate: Mapped[float] = mapped_column(Float, nullable=False)
    # 0: the plan; 1: rollouts added by POST .../plans/{plan_id}/extend (pilot/commit).
    phase: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # Migration 0011: rollouts × the prompt's expected tokens, the generation-limit hint and
    # whether raising it may turn failures into passes (NULL: none).
    expected_tokens: Mapped[float | None] = mapped_column(Float)
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)
    raise_may_pass: Mapped[bool | None] = mapped_column(Boolean)


class Report(Base):
    __tablename__ = "reports"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True)
    report_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    report_id: Mapped[str] = mapped_column(String(ID_LEN), nullable=False)
    body_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    plan_id: Mapped[str | None] = mapped_column(String(64))
    n_groups: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = (UniqueConstraint("run_pk", "report_id", name="uq_reports_run_report"),)


class Result(Base):
    """The reward log: one row per reported prompt group."""

    __tablename__ = "results"

    run_pk: Mapped[int] = mapped_column(Integer, primary_key=True)
    report_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_ordinal: Mapped[int] = mapped_column(Integer, nullable=False)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    n: Mapped[int] = mapped_column(Integer, nullable=False)
    reward_sum: Mapped[float] = mapped_column(Float, nullable=False)
    informative: Mapped[bool] = mapped_column(Boolean, nullable=False)
    # Mean |advantage| of the group with std-normalised advantages (0 when all equal).
    abs_adv: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    # How many steps the run's latest reported step (max step of its earlier reports;
    # planned steps do not count) was past the report's step when it committed.
    staleness: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    rewards: Mapped[list] = mapped_column(JSON, nullable=False)
    # The group's cost (migration 0011; 0 where the report gave none): rollouts with a
    # completion length, the sum of the lengths and of their squares, rollouts with a
    # truncation flag, how many of those were truncated (exact integers), and the sum of the
    # rewards of the flagged rollouts that were not truncated.
    tok_n: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    tok_sum: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    tok_sq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    trunc_n: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    trunc_k: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    pass_nt: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")

    __table_args__ = (
        Index("ix_results_run_prompt", "run_pk", "prompt_ordinal"),
        Index("ix_results_run_step", "run_pk", "step"),
    )


class RunStep(Base):
    """Distinct steps of a run that have a plan or results (for stats and the
    default next step), kept with ``ON CONFLICT DO NOTHING`` inserts."""

    __tablename__ = "run_steps"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)


class PlanExtension(Base):
    """The commit phase of a two-phase (pilot/commit) plan; at most one per plan."""

    __tablename__ = "plan_extensions"

    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), primary_key=True)
    extra_budget: Mapped[int] = mapped_column(BigInteger, nullable=False)
    log_seq: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class StrategyChange(Base):
    """A run's strategy history: ``strategy`` is in force for the plans of steps ≥ ``step``
    (the latest change, in log order, whose step is ≤ the plan's)."""

    __tablename__ = "strategy_changes"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    strategy: Mapped[dict] = mapped_column(JSON, nullable=False)
    log_seq: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class PromptEvent(Base):
    """The scheduling fields of prompts as an upsert wrote them (every created prompt,
    and every update that set one of them), at the upsert's log position."""

    __tablename__ = "prompt_events"

    run_pk: Mapped[int] = mapped_column(Integer, primary_key=True)  # no foreign key (migration 0008)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    created: Mapped[bool] = mapped_column(Boolean, nullable=False)
    domain: Mapped[str | None] = mapped_column(String(ID_LEN))
    prior_pass_rate: Mapped[float | None] = mapped_column(Float)
    prior_strength: Mapped[float | None] = mapped_column(Float)
    # As the upsert wrote them (migration 0009): the text prior of the fold reads them.
    text: Mapped[str | None] = mapped_column(Text)
    embedding: Mapped[list | None] = mapped_column(JSON)


class ApiKey(Base):
    """An API key. Only the SHA-256 of the key is stored; ``key_id`` is the key's
    public, non-secret part (it is embedded in the key), used to find the row
    before the hash is compared in constant time. Keys are revoked, never
    deleted, so revoking the last key never turns auth off."""

    __tablename__ = "api_keys"

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True, nullable=False)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str | None] = mapped_column(String(ID_LEN))
    scope: Mapped[str] = mapped_column(String(16), nullable=False)
    # Bindings: none = every run; otherwise the key may touch only these runs
    # and/or runs whose id starts with the prefix (a project).
    run_ids: Mapped[list | None] = mapped_column(JSON)
    runs_prefix: Mapped[str | None] = mapped_column(String(ID_LEN))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class PredictorModel(Base):
    """A trained version of a run's learned pass-rate predictor (``service/predictor``):
    the serialised model and its metrics (held-out and prequential calibration sums)."""

    __tablename__ = "predictor_models"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    blob: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    metrics: Mapped[dict] = mapped_column(JSON, nullable=False)


class RunMetric(Base):
    """An eval metric of a run (``POST /v1/runs/{run_id}/metrics``, migration 0010): the
    value last reported for ``name`` at ``step``. Not an event of the scheduling fold:
    metrics are the trainer's own measurements, shown next to the run's rollouts. Written
    under the run's lock; a re-sent batch changes nothing (``updated_at`` stays)."""

    __tablename__ = "run_metrics"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float] = mapped_column(Float, nullable=False)
    # How many times a different value replaced the stored one (0: as first reported).
    revisions: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)

    __table_args__ = (Index("ix_run_metrics_run_step", "run_pk", "step"),)
