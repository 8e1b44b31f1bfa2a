"""A call's transcript items and tool calls, one row each.

Revision ID: 0002_transcripts
Revises: 0001_calls
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_transcripts"
down_revision = "0001_calls"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "transcript_items",
        sa.Column("call_id", sa.String(128), sa.ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("start_s", sa.Double, nullable=True),
        sa.Column("end_s", sa.Double, nullable=True),
        sa.Column("truncated", sa.Boolean, nullable=False),
    )
    op.create_table(
        "tool_calls",
        sa.Column("call_id", sa.String(128), sa.ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("start_s", sa.Double, nullable=True),
        sa.Column("duration_ms", sa.Double, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("tool_calls")
    op.drop_table("transcript_items")
