"""Alembic environment. Used through ``rollplan migrate`` (or the service's
start-up upgrade), which passes either a URL or an open connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from rollplan.service.storage.models import Base

config = context.config
target_metadata = Base.metadata

# A constant key: concurrent replicas that all upgrade at start-up take turns.
_MIGRATION_LOCK = 7_263_514_902_117


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK})
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK})
            connection.commit()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
