"""Vectors: embeddings of messages and summaries for semantic and hybrid search.

* ``lcm_vectors``: one row per (message or summary, model), unit-length float32 bytes, with the
  scope a search filters by (agent, session, role, time) copied from the row it embeds, and the
  model that made it. Deleted with the row it embeds (``ON DELETE CASCADE``).

Derived data: nothing to backfill here. ``lcm embed`` (or a running engine, in the background)
fills it for an existing store, and can always rebuild it.

Revision ID: 0008_vectors
Revises: 0007_stemmed_search
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0008_vectors"
down_revision = "0007_stemmed_search"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "lcm_vectors",
        sa.Column("id", Id, nullable=False),
        sa.Column("agent_id", Id, nullable=False),
        sa.Column("session_id", Id, nullable=False),
        sa.Column("message_id", Id, nullable=True),
        sa.Column("summary_id", Id, nullable=True),
        sa.Column("role", sa.String(length=64), nullable=True),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("dims", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.CheckConstraint("(message_id IS NULL) <> (summary_id IS NULL)",
                           name=op.f("ck_lcm_vectors_exactly_one_item")),
        sa.ForeignKeyConstraint(["agent_id"], ["lcm_agents.id"], name=op.f("fk_lcm_vectors_agent_id_lcm_agents")),
        sa.ForeignKeyConstraint(["session_id"], ["lcm_sessions.id"], ondelete="CASCADE",
                                name=op.f("fk_lcm_vectors_session_id_lcm_sessions")),
        sa.ForeignKeyConstraint(["message_id"], ["lcm_messages.id"], ondelete="CASCADE",
                                name=op.f("fk_lcm_vectors_message_id_lcm_messages")),
        sa.ForeignKeyConstraint(["summary_id"], ["lcm_summaries.id"], ondelete="CASCADE",
                                name=op.f("fk_lcm_vectors_summary_id_lcm_summaries")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_vectors")),
        sa.UniqueConstraint("message_id", "model", name=op.f("uq_lcm_vectors_message_id_model")),
        sa.UniqueConstraint("summary_id", "model", name=op.f("uq_lcm_vectors_summary_id_model")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_lcm_vectors_agent_model", "lcm_vectors", ["agent_id", "model", "id"])


def downgrade() -> None:
    op.drop_index("ix_lcm_vectors_agent_model", table_name="lcm_vectors")
    op.drop_table("lcm_vectors")
