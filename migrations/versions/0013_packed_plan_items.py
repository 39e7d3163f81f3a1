"""a plan's items packed into its row

``plans.items``: the plan's items as one little-endian buffer (prompt ordinals int64,
rollouts int32, predicted pass rates float64, each column whole, in plan order), written
with the plan in one statement; NULL for plans stored before (and for plans in tokens,
whose items keep their costs in ``plan_items``). ``plans.items_indexed``: whether the
items are also rows of ``plan_items`` (the index the inspection queries join), written on
the first inspection read after the plan, not on the plan's path; true for every plan
stored before.

Revision ID: 0013
Revises: 0012
"""
from alembic import op
import sqlalchemy as sa


revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plans", sa.Column("items", sa.LargeBinary(), nullable=True))
    op.add_column("plans", sa.Column("items_indexed", sa.Boolean(), nullable=False, server_default=sa.true()))
    op.create_index("ix_plans_unindexed", "plans", ["run_pk"], postgresql_where=sa.text("NOT items_indexed"),
                    sqlite_where=sa.text("NOT items_indexed"))


def downgrade() -> None:
    op.drop_index("ix_plans_unindexed", table_name="plans")
    with op.batch_alter_table("plans") as b:
        b.drop_column("items_indexed")
        b.drop_column("items")
