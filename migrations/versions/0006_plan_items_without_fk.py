"""plan_items: no per-row foreign-key check

A plan's items (1,024 and more per step) are written by COPY in the transaction that
creates the plan, and plans are never deleted; the per-row referential check on
``plan_items.plan_id`` cost more than the COPY itself. Like the reward log
(``results``), the table now relies on that single writer.

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa


revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# SQLite's foreign keys are unnamed: batch mode names them by this convention to drop one.
NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def upgrade() -> None:
    bind = op.get_bind()
    names = [fk["name"] for fk in sa.inspect(bind).get_foreign_keys("plan_items") if fk["referred_table"] == "plans"]
    if bind.dialect.name == "sqlite":
        with op.batch_alter_table("plan_items", naming_convention=NAMING) as b:
            b.drop_constraint("fk_plan_items_plan_id_plans", type_="foreignkey")
    else:
        for name in names:
            op.drop_constraint(name, "plan_items", type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("plan_items") as b:
        b.create_foreign_key("plan_items_plan_id_fkey", "plans", ["plan_id"], ["id"], ondelete="CASCADE")
