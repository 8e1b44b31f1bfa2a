"""A call's recording: its description (path, format, channels, sample rate, bytes, duration) as JSON.

Revision ID: 0005_recording_recordings
Revises: 0004_traces_record_fields
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_recording_recordings"
down_revision = "0004_traces_record_fields"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("recording", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("recording")
