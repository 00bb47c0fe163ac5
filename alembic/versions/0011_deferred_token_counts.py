"""Token counts counted when first needed: ``lcm_sessions.estimated_from``.

Exact counting (tiktoken) was the largest cost of a stored turn left after 0010 (docs/
benchmarks.md, "Where a turn's ingest time goes"), and nothing reads a turn's counts until the
engine plans, compacts or assembles. On a backend with ``defer_token_counts`` (SQLite) a turn
stores a characters/4 estimate and records here the first seq whose count may be one; the
engine counts those messages exactly before it reads any count
(``MessageRepository.settle_tokens``), and the session's counters follow in the same write.
NULL (every existing session): every count is exact. PostgreSQL counts each turn exactly: an
UPDATE there rewrites the row and all its index entries, the search vectors' included.

Revision ID: 0011_deferred_token_counts
Revises: 0010_deferred_message_index
Create Date: 2026-11-27
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0011_deferred_token_counts"
down_revision = "0010_deferred_message_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lcm_sessions", sa.Column("estimated_from", sa.Integer(), nullable=True))


def downgrade() -> None:
    # An older lcm reads every count as exact: estimates left behind would stay estimates
    # (lcm doctor reports nothing wrong with them; the next compaction plans with them).
    op.drop_column("lcm_sessions", "estimated_from")
