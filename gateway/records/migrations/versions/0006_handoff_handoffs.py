"""A call's handoffs between agent profiles, as JSON on its row (``handoffs`` counts them).

Revision ID: 0006_handoff_handoffs
Revises: 0005_recording_recordings
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_handoff_handoffs"
down_revision = "0005_recording_recordings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("handoff_log", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("handoff_log")
