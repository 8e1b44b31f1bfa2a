"""The REFERs a call's peer sent (transfers of the call: gateway/worker/referred.py) as JSON.

Revision ID: 0008_referin_call_referrals
Revises: 0007_amd_call_amd
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_referin_call_referrals"
down_revision = "0008_warm_call_transfer"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("referrals", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("referrals")
