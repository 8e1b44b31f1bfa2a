"""The trunk a call came in on or went out through (docs/adr/0038-trunks-several-trunks.md), indexed for the
history's ``trunk`` filter.

Revision ID: 0010_trunkrec_call_trunk
Revises: 0009_referin_call_referrals
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_trunkrec_call_trunk"
down_revision = "0009_referin_call_referrals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("trunk", sa.String(64), nullable=True))
    op.create_index("ix_calls_trunk", "calls", ["trunk", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_calls_trunk", table_name="calls")
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("trunk")
