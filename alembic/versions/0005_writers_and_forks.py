"""Writers and forks: a diverging transcript becomes a fork of its session, a message lcm had
to change to store is marked with what was changed, messages lcm could not store at all are
counted, and lcm remembers the exact messages it generated (so only those are recognised as
its own when a host sends them back).

* ``lcm_sessions.parent_id`` / ``fork_seq``: a fork's parent session and the parent's last
  message the fork shares (0: none). No foreign key: SQLite cannot add one to an existing
  table without rebuilding it, and lcm never deletes a parent under a fork.
* ``lcm_sessions.skipped_count``: messages of the session that could not be stored at all.
* ``lcm_messages.problem``: NULL, or what lcm changed to store the message (JSON text).
* ``lcm_generated``: digests of the messages lcm put into a context (summary, acknowledgement,
  and a message too large for the window handed back cut, whose ``stands_for`` is the stored
  original's alignment key), per agent.

Revision ID: 0005_writers_and_forks
Revises: 0004_message_identity_v2
Create Date: 2026-11-24
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0005_writers_and_forks"
down_revision = "0004_message_identity_v2"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("lcm_sessions", sa.Column("parent_id", Id, nullable=True))
    op.add_column("lcm_sessions", sa.Column("fork_seq", sa.Integer(), nullable=True))
    op.add_column("lcm_sessions", sa.Column("skipped_count", sa.Integer(), server_default="0",
                                            nullable=False))
    op.create_index(op.f("ix_lcm_sessions_parent_id"), "lcm_sessions", ["parent_id"])
    op.add_column("lcm_messages", sa.Column("problem", sa.Text(), nullable=True))
    op.create_table(
        "lcm_generated",
        sa.Column("agent_id", Id, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("stands_for", sa.String(length=80), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["lcm_agents.id"],
                                name=op.f("fk_lcm_generated_agent_id_lcm_agents")),
        sa.PrimaryKeyConstraint("agent_id", "digest", name=op.f("pk_lcm_generated")),
    )


def downgrade() -> None:
    op.drop_table("lcm_generated")
    op.drop_column("lcm_messages", "problem")
    op.drop_index(op.f("ix_lcm_sessions_parent_id"), table_name="lcm_sessions")
    op.drop_column("lcm_sessions", "skipped_count")
    op.drop_column("lcm_sessions", "fork_seq")
    op.drop_column("lcm_sessions", "parent_id")
