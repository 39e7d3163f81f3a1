"""learned predictor: prompt embeddings, predictor model versions

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("prompts") as b:
        b.add_column(sa.Column("embedding", sa.JSON(), nullable=True))
    op.create_table(
        "predictor_models",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "version"),
    )


def downgrade() -> None:
    op.drop_table("predictor_models")
    with op.batch_alter_table("prompts") as b:
        b.drop_column("embedding")
