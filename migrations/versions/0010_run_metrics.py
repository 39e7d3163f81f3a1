"""run_metrics: a run's eval metrics (``POST /v1/runs/{run_id}/metrics``)

One row per (run, metric name, step): the value last reported, how many times a
different value replaced it, and when it was first and last written. Not events of
the scheduling fold.

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa


revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_metrics",
        sa.Column("run_pk", sa.Integer(), sa.ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("step", sa.BigInteger(), primary_key=True),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("revisions", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_run_metrics_run_step", "run_metrics", ["run_pk", "step"])


def downgrade() -> None:
    op.drop_index("ix_run_metrics_run_step", table_name="run_metrics")
    op.drop_table("run_metrics")
