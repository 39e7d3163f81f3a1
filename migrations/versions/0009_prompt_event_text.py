"""prompt_events: the text and embedding each upsert wrote

The scheduling fold reads prompts' text and embeddings (``default``'s text prior), so
the log carries them as an upsert wrote them: a later update of a prompt's text must
not change how an earlier position of the log replays. Existing events of created
prompts take the prompts' current text and embedding.

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa


revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("prompt_events", sa.Column("text", sa.Text(), nullable=True))
    op.add_column("prompt_events", sa.Column("embedding", sa.JSON(), nullable=True))
    op.execute(
        "UPDATE prompt_events SET text = (SELECT p.text FROM prompts p WHERE p.run_pk = prompt_events.run_pk "
        "AND p.ordinal = prompt_events.ordinal), embedding = (SELECT p.embedding FROM prompts p "
        "WHERE p.run_pk = prompt_events.run_pk AND p.ordinal = prompt_events.ordinal) WHERE created"
    )


def downgrade() -> None:
    with op.batch_alter_table("prompt_events") as b:
        b.drop_column("embedding")
        b.drop_column("text")
