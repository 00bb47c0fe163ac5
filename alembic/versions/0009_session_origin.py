"""Session provenance: where an imported session came from.

* ``lcm_sessions.origin`` (nullable text, JSON): for a session made by ``lcm import``, the
  format, the source file and the session's id there (and what it continued, when known).
  Sessions lcm recorded live keep NULL.

Revision ID: 0009_session_origin
Revises: 0008_vectors
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0009_session_origin"
down_revision = "0008_vectors"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lcm_sessions", sa.Column("origin", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("lcm_sessions", "origin")
