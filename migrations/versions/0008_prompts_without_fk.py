"""prompts, prompt_events: no per-row foreign-key check

Prompts are registered in bulk (10,000 and more per request) by COPY in a transaction
that holds the run's lock, and runs are never deleted; the per-row referential check
on ``run_pk`` cost more than the COPY itself (about 60% of a registration). Like the
reward log (``results``) and ``plan_items`` (0006), the tables rely on that single
writer.

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa


revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# SQLite's foreign keys are unnamed: batch mode names them by this convention to drop one.
NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}
TABLES = ("prompts", "prompt_events")


def upgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        if bind.dialect.name == "sqlite":
            with op.batch_alter_table(table, naming_convention=NAMING) as b:
                b.drop_constraint(f"fk_{table}_run_pk_runs", type_="foreignkey")
            continue
        for fk in sa.inspect(bind).get_foreign_keys(table):
            if fk["referred_table"] == "runs":
                op.drop_constraint(fk["name"], table, type_="foreignkey")


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as b:
            b.create_foreign_key(f"{table}_run_pk_fkey", "runs", ["run_pk"], ["pk"], ondelete="CASCADE")
