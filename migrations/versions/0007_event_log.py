"""One ordered event log per run

Every write of a run takes the next position of the run's log (``runs.log_seq``):
prompt upserts are logged with the scheduling fields they wrote (``prompt_events``),
plans, plan extensions and strategy changes carry their position (``log_seq``), and a
report's ``report_seq`` is its position. Existing runs: the log position continues
from their ``report_seq``; their prompts are logged, with their current fields, at
position 0 (before every report, as a restart replayed them); their plans,
extensions and strategy changes keep no position (NULL: not events of the fold).

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa


revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("log_seq", sa.BigInteger(), nullable=False, server_default="0"))
    op.execute("UPDATE runs SET log_seq = report_seq")
    for table in ("plans", "plan_extensions", "strategy_changes"):
        op.add_column(table, sa.Column("log_seq", sa.BigInteger(), nullable=True))
    op.create_table(
        "prompt_events",
        sa.Column("run_pk", sa.Integer(), sa.ForeignKey("runs.pk", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("ordinal", sa.Integer(), primary_key=True),
        sa.Column("created", sa.Boolean(), nullable=False),
        sa.Column("domain", sa.String(200)),
        sa.Column("prior_pass_rate", sa.Float()),
        sa.Column("prior_strength", sa.Float()),
    )
    op.execute(
        "INSERT INTO prompt_events (run_pk, seq, ordinal, created, domain, prior_pass_rate, prior_strength) "
        "SELECT run_pk, 0, ordinal, TRUE, domain, prior_pass_rate, prior_strength FROM prompts"
    )


def downgrade() -> None:
    op.drop_table("prompt_events")
    for table in ("strategy_changes", "plan_extensions", "plans"):
        with op.batch_alter_table(table) as b:
            b.drop_column("log_seq")
    with op.batch_alter_table("runs") as b:
        b.drop_column("log_seq")
