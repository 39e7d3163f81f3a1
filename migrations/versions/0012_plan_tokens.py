"""plans in tokens: token budget, generation-limit hints, expected tokens per item

``plans``: the request's ``token_budget``, the ``rollout_budget`` given beside it
(``rollout_cap``) and the trainer's generation limit (``max_new_tokens``).
``plan_items``: ``expected_tokens`` (rollouts × the prompt's expected completion
tokens), the ``max_new_tokens`` hint and ``raise_may_pass``. All NULL where not given.

Revision ID: 0012
Revises: 0011
"""
from alembic import op
import sqlalchemy as sa


revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plans", sa.Column("token_budget", sa.BigInteger(), nullable=True))
    op.add_column("plans", sa.Column("rollout_cap", sa.BigInteger(), nullable=True))
    op.add_column("plans", sa.Column("max_new_tokens", sa.Integer(), nullable=True))
    op.add_column("plan_items", sa.Column("expected_tokens", sa.Float(), nullable=True))
    op.add_column("plan_items", sa.Column("max_new_tokens", sa.Integer(), nullable=True))
    op.add_column("plan_items", sa.Column("raise_may_pass", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("plan_items") as b:
        for name in ("raise_may_pass", "max_new_tokens", "expected_tokens"):
            b.drop_column(name)
    with op.batch_alter_table("plans") as b:
        for name in ("max_new_tokens", "rollout_cap", "token_budget"):
            b.drop_column(name)
