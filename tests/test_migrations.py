"""The real Alembic migrations: empty → head → base → head, and the models match."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from rollplan.service.storage import migrate
from rollplan.service.storage.models import Base

TABLES = {"runs", "prompts", "plans", "plan_items", "reports", "results", "run_steps", "plan_extensions", "prompt_events",
          "strategy_changes", "api_keys", "predictor_models", "run_metrics"}


def _head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()


def _tables(url):
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_roundtrip(db_url):
    assert _tables(db_url) == set()
    migrate.upgrade(db_url)
    assert _tables(db_url) == TABLES
    assert migrate.current(db_url) == _head()
    migrate.downgrade(db_url, "base")
    assert _tables(db_url) == set()
    assert migrate.current(db_url) is None
    migrate.upgrade(db_url)
    assert _tables(db_url) == TABLES


def test_models_match_migrations(db_url):
    """No schema drift: autogenerate finds nothing to add after the migrations ran."""
    migrate.upgrade(db_url)
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []
