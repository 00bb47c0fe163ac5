"""Engine state: where the host's transcript resumes, last compaction outcome, the size of the
summaries a session's context shows, session aliases (Hermes' compaction-boundary session
rotation) and summaries carried into a new session (/new).

Revision ID: 0003_engine_state
Revises: 0002_search_index
Create Date: 2026-11-22
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003_engine_state"
down_revision = "0002_search_index"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("lcm_sessions", sa.Column("host_view_seq", sa.Integer(), server_default="0",
                                            nullable=False))
    op.add_column("lcm_sessions", sa.Column("last_compaction", sa.Text(), nullable=True))
    op.add_column("lcm_sessions", sa.Column("summary_count", sa.Integer(), server_default="0",
                                            nullable=False))
    op.add_column("lcm_sessions", sa.Column("summary_tokens", sa.BigInteger(), server_default="0",
                                            nullable=False))
    # Sessions summarized before this revision: count their uncondensed summaries.
    op.execute("""UPDATE lcm_sessions SET
        summary_count = (SELECT count(*) FROM lcm_summaries s
                         WHERE s.session_id = lcm_sessions.id AND s.parent_id IS NULL),
        summary_tokens = (SELECT coalesce(sum(s.token_count), 0) FROM lcm_summaries s
                          WHERE s.session_id = lcm_sessions.id AND s.parent_id IS NULL)""")
    op.create_table(
        "lcm_session_aliases",
        sa.Column("agent_id", Id, nullable=False),
        sa.Column("session_key", sa.String(length=255), nullable=False),
        sa.Column("session_id", Id, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["lcm_agents.id"],
                                name=op.f("fk_lcm_session_aliases_agent_id_lcm_agents")),
        sa.ForeignKeyConstraint(["session_id"], ["lcm_sessions.id"],
                                name=op.f("fk_lcm_session_aliases_session_id_lcm_sessions")),
        sa.PrimaryKeyConstraint("agent_id", "session_key", name=op.f("pk_lcm_session_aliases")),
    )
    op.create_index(op.f("ix_lcm_session_aliases_session_id"), "lcm_session_aliases", ["session_id"])
    op.create_table(
        "lcm_carried_summaries",
        sa.Column("session_id", Id, nullable=False),
        sa.Column("summary_id", Id, nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["lcm_sessions.id"],
                                name=op.f("fk_lcm_carried_summaries_session_id_lcm_sessions")),
        sa.ForeignKeyConstraint(["summary_id"], ["lcm_summaries.id"],
                                name=op.f("fk_lcm_carried_summaries_summary_id_lcm_summaries")),
        sa.PrimaryKeyConstraint("session_id", "summary_id", name=op.f("pk_lcm_carried_summaries")),
    )


def downgrade() -> None:
    op.drop_table("lcm_carried_summaries")
    op.drop_index(op.f("ix_lcm_session_aliases_session_id"), table_name="lcm_session_aliases")
    op.drop_table("lcm_session_aliases")
    op.drop_column("lcm_sessions", "summary_tokens")
    op.drop_column("lcm_sessions", "summary_count")
    op.drop_column("lcm_sessions", "last_compaction")
    op.drop_column("lcm_sessions", "host_view_seq")
