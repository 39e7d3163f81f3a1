"""initial schema

Revision ID: 0001
Revises: 
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    
    op.create_table('results',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('report_seq', sa.BigInteger(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('prompt_ordinal', sa.Integer(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('reward_sum', sa.Float(), nullable=False),
    sa.Column('informative', sa.Boolean(), nullable=False),
    sa.Column('rewards', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('run_pk', 'report_seq', 'position')
    )
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.create_index('ix_results_run_prompt', ['run_pk', 'prompt_ordinal'], unique=False)
        batch_op.create_index('ix_results_run_step', ['run_pk', 'step'], unique=False)

    op.create_table('runs',
    sa.Column('pk', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('settings', sa.JSON(), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('n_prompts', sa.Integer(), nullable=False),
    sa.Column('prompt_version', sa.BigInteger(), nullable=False),
    sa.Column('report_seq', sa.BigInteger(), nullable=False),
    sa.Column('n_plans', sa.Integer(), nullable=False),
    sa.Column('n_results', sa.BigInteger(), nullable=False),
    sa.Column('n_rollouts', sa.BigInteger(), nullable=False),
    sa.Column('n_informative_rollouts', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('pk'),
    sa.UniqueConstraint('id')
    )
    op.create_table('plans',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('strategy', sa.String(length=200), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('rollout_budget', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['run_pk'], ['runs.pk'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_pk', 'step', name='uq_plans_run_step')
    )
    op.create_table('prompts',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('ordinal', sa.Integer(), nullable=False),
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('domain', sa.String(length=200), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=True),
    sa.Column('prior_pass_rate', sa.Float(), nullable=True),
    sa.Column('text', sa.Text(), nullable=True),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['run_pk'], ['runs.pk'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_pk', 'ordinal'),
    sa.UniqueConstraint('run_pk', 'id', name='uq_prompts_run_id')
    )
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.create_index('ix_prompts_run_version', ['run_pk', 'version'], unique=False)

    op.create_table('reports',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('report_seq', sa.BigInteger(), nullable=False),
    sa.Column('report_id', sa.String(length=200), nullable=False),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('plan_id', sa.String(length=64), nullable=True),
    sa.Column('n_groups', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['run_pk'], ['runs.pk'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_pk', 'report_seq'),
    sa.UniqueConstraint('run_pk', 'report_id', name='uq_reports_run_report')
    )
    op.create_table('run_steps',
    sa.Column('run_pk', sa.Integer(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['run_pk'], ['runs.pk'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_pk', 'step')
    )
    op.create_table('plan_items',
    sa.Column('plan_id', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('prompt_ordinal', sa.Integer(), nullable=False),
    sa.Column('rollouts', sa.Integer(), nullable=False),
    sa.Column('predicted_pass_rate', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('plan_id', 'position')
    )



def downgrade() -> None:
    
    op.drop_table('plan_items')
    op.drop_table('run_steps')
    op.drop_table('reports')
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.drop_index('ix_prompts_run_version')

    op.drop_table('prompts')
    op.drop_table('plans')
    op.drop_table('runs')
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_index('ix_results_run_step')
        batch_op.drop_index('ix_results_run_prompt')

    op.drop_table('results')

