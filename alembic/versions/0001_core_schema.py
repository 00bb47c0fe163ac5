"""Core schema: agents, sessions, messages, large payloads, summaries and their ordered edges.

Revision ID: 0001_core_schema
Revises:
Create Date: 2026-11-22
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0001_core_schema"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "lcm_agents",
        sa.Column("id", Id, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_agents")),
        sa.UniqueConstraint("name", name=op.f("uq_lcm_agents_name")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "lcm_payloads",
        sa.Column("id", Id, nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("codec", sa.String(length=16), nullable=False),
        sa.Column("size_chars", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_payloads")),
        sa.UniqueConstraint("sha256", name=op.f("uq_lcm_payloads_sha256")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "lcm_sessions",
        sa.Column("id", Id, nullable=False),
        sa.Column("agent_id", Id, nullable=False),
        sa.Column("session_key", sa.String(length=255), nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=True),
        sa.Column("conversation_id", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("token_count", sa.BigInteger(), nullable=False),
        sa.Column("covered_seq", sa.Integer(), nullable=False),
        sa.Column("covered_tokens", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["lcm_agents.id"],
                                name=op.f("fk_lcm_sessions_agent_id_lcm_agents")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_sessions")),
        sa.UniqueConstraint("agent_id", "session_key",
                            name=op.f("uq_lcm_sessions_agent_id_session_key")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "lcm_messages",
        sa.Column("id", Id, nullable=False),
        sa.Column("session_id", Id, nullable=False),
        sa.Column("agent_id", Id, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=80), nullable=False),
        sa.Column("content_hash", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=64), nullable=False),
        sa.Column("content_kind", sa.String(length=8), nullable=False),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("tool_calls", sa.Text(), nullable=True),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("extra", sa.Text(), nullable=True),
        sa.Column("key_order", sa.Text(), nullable=True),
        sa.Column("payload_id", Id, nullable=True),
        sa.Column("search_text", sa.Text(), nullable=True),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.CheckConstraint("content_kind IN ('text', 'json', 'absent', 'payload')",
                           name=op.f("ck_lcm_messages_content_kind")),
        sa.ForeignKeyConstraint(["agent_id"], ["lcm_agents.id"],
                                name=op.f("fk_lcm_messages_agent_id_lcm_agents")),
        sa.ForeignKeyConstraint(["payload_id"], ["lcm_payloads.id"],
                                name=op.f("fk_lcm_messages_payload_id_lcm_payloads")),
        sa.ForeignKeyConstraint(["session_id"], ["lcm_sessions.id"],
                                name=op.f("fk_lcm_messages_session_id_lcm_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_messages")),
        sa.UniqueConstraint("session_id", "identity",
                            name=op.f("uq_lcm_messages_session_id_identity")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_lcm_messages_session_id_seq")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_lcm_messages_payload_id"), "lcm_messages", ["payload_id"])
    op.create_table(
        "lcm_summaries",
        sa.Column("id", Id, nullable=False),
        sa.Column("session_id", Id, nullable=False),
        sa.Column("agent_id", Id, nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("search_text", sa.Text(), nullable=True),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("source_token_count", sa.BigInteger(), nullable=False),
        sa.Column("source_count", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("earliest_at", sa.Float(), nullable=False),
        sa.Column("latest_at", sa.Float(), nullable=False),
        sa.Column("expand_hint", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("parent_id", Id, nullable=True),
        sa.Column("meta", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.CheckConstraint("depth >= 0", name=op.f("ck_lcm_summaries_depth_nonnegative")),
        sa.CheckConstraint("first_seq <= last_seq", name=op.f("ck_lcm_summaries_seq_range")),
        sa.ForeignKeyConstraint(["agent_id"], ["lcm_agents.id"],
                                name=op.f("fk_lcm_summaries_agent_id_lcm_agents")),
        sa.ForeignKeyConstraint(["parent_id"], ["lcm_summaries.id"],
                                name=op.f("fk_lcm_summaries_parent_id_lcm_summaries")),
        sa.ForeignKeyConstraint(["session_id"], ["lcm_sessions.id"],
                                name=op.f("fk_lcm_summaries_session_id_lcm_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lcm_summaries")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_lcm_summaries_session_open", "lcm_summaries",
                    ["session_id", "parent_id", "depth"])
    op.create_table(
        "lcm_summary_sources",
        sa.Column("summary_id", Id, nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("message_id", Id, nullable=True),
        sa.Column("child_id", Id, nullable=True),
        sa.CheckConstraint("(message_id IS NULL) <> (child_id IS NULL)",
                           name=op.f("ck_lcm_summary_sources_exactly_one_source")),
        sa.ForeignKeyConstraint(["child_id"], ["lcm_summaries.id"],
                                name=op.f("fk_lcm_summary_sources_child_id_lcm_summaries")),
        sa.ForeignKeyConstraint(["message_id"], ["lcm_messages.id"],
                                name=op.f("fk_lcm_summary_sources_message_id_lcm_messages")),
        sa.ForeignKeyConstraint(["summary_id"], ["lcm_summaries.id"], ondelete="CASCADE",
                                name=op.f("fk_lcm_summary_sources_summary_id_lcm_summaries")),
        sa.PrimaryKeyConstraint("summary_id", "ordinal", name=op.f("pk_lcm_summary_sources")),
        sa.UniqueConstraint("child_id", name=op.f("uq_lcm_summary_sources_child_id")),
        sa.UniqueConstraint("message_id", name=op.f("uq_lcm_summary_sources_message_id")),
    )


def downgrade() -> None:
    op.drop_table("lcm_summary_sources")
    op.drop_index("ix_lcm_summaries_session_open", table_name="lcm_summaries")
    op.drop_table("lcm_summaries")
    op.drop_index(op.f("ix_lcm_messages_payload_id"), table_name="lcm_messages")
    op.drop_table("lcm_messages")
    op.drop_table("lcm_sessions")
    op.drop_table("lcm_payloads")
    op.drop_table("lcm_agents")
