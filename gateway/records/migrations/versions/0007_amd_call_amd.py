"""A call's answering-machine detection decision (outbound calls with amd on) as JSON.

Revision ID: 0007_amd_call_amd
Revises: 0006_handoff_handoffs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_amd_call_amd"
down_revision = "0006_handoff_handoffs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("amd", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("amd")
