"""scheduling core: group statistics, staleness, warm-start priors, plan extensions, strategy history

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("results") as b:
        b.add_column(sa.Column("abs_adv", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("staleness", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("prompts") as b:
        b.add_column(sa.Column("prior_strength", sa.Float(), nullable=True))
    with op.batch_alter_table("plan_items") as b:
        b.add_column(sa.Column("phase", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "plan_extensions",
        sa.Column("plan_id", sa.String(length=64), nullable=False),
        sa.Column("extra_budget", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("plan_id"),
    )
    op.create_table(
        "strategy_changes",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("strategy", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "seq"),
    )


def downgrade() -> None:
    op.drop_table("strategy_changes")
    op.drop_table("plan_extensions")
    with op.batch_alter_table("plan_items") as b:
        b.drop_column("phase")
    with op.batch_alter_table("prompts") as b:
        b.drop_column("prior_strength")
    with op.batch_alter_table("results") as b:
        b.drop_column("staleness")
        b.drop_column("abs_adv")
