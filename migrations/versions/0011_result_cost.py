"""results: the cost of a group (completion tokens and truncations)

A report's rollouts may carry their completion length (``tokens``) and whether the
completion was cut at the generation limit (``truncated``). The reward log keeps each
group's sums, as the fold reads them: rollouts with a length (``tok_n``), the sum of
their lengths and of their squares (``tok_sum``, ``tok_sq``; exact integers), rollouts
with a truncation flag (``trunc_n``) and how many were truncated (``trunc_k``).
Existing rows (and reports without them): 0, no evidence.

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa


revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = ("tok_n", "tok_sum", "tok_sq", "trunc_n", "trunc_k")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("results", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("results", sa.Column("pass_nt", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("results") as b:
        for name in (*COLUMNS, "pass_nt"):
            b.drop_column(name)
