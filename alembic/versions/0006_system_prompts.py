"""System prompts: each version of a session's leading system prompt, kept once.

* ``lcm_system_prompts``: per session, one row per distinct leading system prompt (by the
  sha256 ``digest`` of its lossless JSON), with the message itself, its tokens, the ``seq`` of
  the first message it preceded and when it was first seen. Not conversation messages: no
  ``seq`` of their own, not searched, not compacted; ``lcm export`` writes them back.

Nothing to backfill: earlier versions never kept a system prompt.

Revision ID: 0006_system_prompts
Revises: 0005_writers_and_forks
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006_system_prompts"
down_revision = "0005_writers_and_forks"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "lcm_system_prompts",
        sa.Column("id", Id, nullable=False),
        sa.Column("session_id", Id, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["lcm_sessions.id"],
                                name=op.f("fk_lcm_system_prompts_session_id_lcm_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_system_prompts")),
        sa.UniqueConstraint("session_id", "digest", name=op.f("uq_lcm_system_prompts_session_id_digest")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("lcm_system_prompts")
