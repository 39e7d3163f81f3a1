"""inspection: plan compute time

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Wall-clock milliseconds the strategy took to compute the plan (NULL for
    # plans stored before this column existed).
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.add_column(sa.Column('compute_ms', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_column('compute_ms')
