"""Service settings: one pydantic-settings class, every field overridable by a
``ROLLPLAN_*`` environment variable."""

from __future__ import annotations

import os
import socket
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROLLPLAN_", extra="ignore")

    database_url: str = Field(
        "sqlite:///./rollplan.db",
        description="SQLAlchemy URL. Default: an embedded SQLite file in the working "
        "directory. PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    auto_migrate: bool = Field(True, description="Upgrade the schema to the latest migration at start-up.")
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated API keys. Empty: no auth (local embedded mode).",
    )
    db_pool_size: int = Field(10, ge=1, description="Connections per process (PostgreSQL).")
    db_max_overflow: int = Field(10, ge=0)

    # Documented request limits (answered with 413 / 422).
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_report_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="A report's body (POST …/results), refused from its Content-Length."
    )
    replica_name: str = Field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}",
        description="Sent as the X-Rollplan-Replica header of every response: which replica answered "
        "(to check the load balancer's run affinity). Default: host name and process id.",
    )
    max_prompts_per_request: int = Field(50_000, ge=1)
    max_results_per_report: int = Field(20_000, ge=1)
    max_rewards_per_group: int = Field(4_096, ge=1)
    max_batch_size: int = Field(100_000, ge=1)
    max_rollout_budget: int = Field(10_000_000, ge=1)
    max_text_chars: int = Field(100_000, ge=1)
    max_page_size: int = Field(1_000, ge=1, le=1_000)
    max_metadata_bytes: int = Field(64 * 1024, ge=2, description="A run's metadata, serialised as JSON.")
    max_metric_entries: int = Field(10_000, ge=1, description="Most {step, values} entries of one POST .../metrics.")
    max_metric_values: int = Field(
        100_000, ge=1, description="Most metric values (over all entries) of one POST .../metrics."
    )
    max_history: int = Field(10_000, ge=1, description="Most history entries GET of one prompt returns.")
    max_allocation_cells: int = Field(
        1 << 24,
        ge=1,
        description="Most batch_size × (max_rollouts − min_rollouts) a plan may ask for "
        "(the table-based allocators hold one marginal gain per cell).",
    )
    state_cache_bytes: int = Field(
        4 << 30,
        ge=0,
        description="Bound on the memory of the run states a process keeps (least recently "
        "used dropped first; a dropped state rebuilds from the log, identical).",
    )
    plan_ahead: bool = Field(
        True,
        description="Decide a run's next plan in the background once its step's reports are in (the latest "
        "plan's request at the next step, on the state that plan will read): a plan that asks it finds it decided, "
        "the same plan it would have decided itself. Off: every plan decides on its own path.",
    )
    db_statement_timeout_s: float = Field(
        60.0,
        ge=0,
        description="PostgreSQL statement_timeout (lock waits included); 0: none. "
        "A request never waits on the database longer than this (503 after).",
    )

    # The learned pass-rate predictor (runs with a strategy's `predictor: true`; needs torch).
    predictor_retrain_groups: int = Field(
        256, ge=1, description="New reported groups of a run that trigger a background retrain of its predictor."
    )
    predictor_train_steps: int = Field(150, ge=1, le=100_000, description="Adam steps per predictor fit.")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: object) -> object:
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @field_validator("api_keys")
    @classmethod
    def _keys_long_enough(cls, v: list[SecretStr]) -> list[SecretStr]:
        for k in v:
            if len(k.get_secret_value()) < 16:
                raise ValueError("API keys must be at least 16 characters long")
        return v

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
