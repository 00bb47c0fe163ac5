"""Full-text search: FTS5 tables kept by triggers (SQLite), tsvector columns + GIN (PostgreSQL).

Existing rows are indexed during the upgrade. See lcm/backends/*.py for how each is queried.

Revision ID: 0002_search_index
Revises: 0001_core_schema
Create Date: 2026-11-22
"""
from __future__ import annotations

from alembic import op
from lcm.store.migrations import create_index_online

revision = "0002_search_index"
down_revision = "0001_core_schema"
branch_labels = None
depends_on = None

# ---------------------------------------------------------------- SQLite: FTS5, views, triggers

_MSG_SCOPE = "'s' || {r}.session_id || ' a' || {r}.agent_id || ' r' || lower(hex({r}.role))"
_SUM_SCOPE = "'s' || {r}.session_id || ' a' || {r}.agent_id"

SQLITE_UP = [
    # Views give FTS5 each row's indexed body and scope tokens (external content).
    f"""CREATE VIEW lcm_messages_fts_src AS
        SELECT m.id AS id, coalesce(m.search_text, m.content) AS body,
               {_MSG_SCOPE.format(r='m')} AS scope
        FROM lcm_messages m""",
    """CREATE VIRTUAL TABLE lcm_messages_fts USING fts5(
        body, scope, content='lcm_messages_fts_src', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2')""",
    f"""CREATE TRIGGER lcm_messages_fts_ai AFTER INSERT ON lcm_messages BEGIN
        INSERT INTO lcm_messages_fts(rowid, body, scope) VALUES (
            new.id, coalesce(new.search_text, new.content),
            {_MSG_SCOPE.format(r='new')});
    END""",
    f"""CREATE TRIGGER lcm_messages_fts_ad AFTER DELETE ON lcm_messages BEGIN
        INSERT INTO lcm_messages_fts(lcm_messages_fts, rowid, body, scope) VALUES (
            'delete', old.id, coalesce(old.search_text, old.content),
            {_MSG_SCOPE.format(r='old')});
    END""",
    f"""CREATE TRIGGER lcm_messages_fts_au
        AFTER UPDATE OF content, search_text, role, session_id, agent_id ON lcm_messages BEGIN
        INSERT INTO lcm_messages_fts(lcm_messages_fts, rowid, body, scope) VALUES (
            'delete', old.id, coalesce(old.search_text, old.content),
            {_MSG_SCOPE.format(r='old')});
        INSERT INTO lcm_messages_fts(rowid, body, scope) VALUES (
            new.id, coalesce(new.search_text, new.content),
            {_MSG_SCOPE.format(r='new')});
    END""",
    f"""CREATE VIEW lcm_summaries_fts_src AS
        SELECT x.id AS id, coalesce(x.search_text, x.content) AS body,
               {_SUM_SCOPE.format(r='x')} AS scope
        FROM lcm_summaries x""",
    """CREATE VIRTUAL TABLE lcm_summaries_fts USING fts5(
        body, scope, content='lcm_summaries_fts_src', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2')""",
    f"""CREATE TRIGGER lcm_summaries_fts_ai AFTER INSERT ON lcm_summaries BEGIN
        INSERT INTO lcm_summaries_fts(rowid, body, scope) VALUES (
            new.id, coalesce(new.search_text, new.content),
            {_SUM_SCOPE.format(r='new')});
    END""",
    f"""CREATE TRIGGER lcm_summaries_fts_ad AFTER DELETE ON lcm_summaries BEGIN
        INSERT INTO lcm_summaries_fts(lcm_summaries_fts, rowid, body, scope) VALUES (
            'delete', old.id, coalesce(old.search_text, old.content),
            {_SUM_SCOPE.format(r='old')});
    END""",
    f"""CREATE TRIGGER lcm_summaries_fts_au
        AFTER UPDATE OF content, search_text, session_id, agent_id ON lcm_summaries BEGIN
        INSERT INTO lcm_summaries_fts(lcm_summaries_fts, rowid, body, scope) VALUES (
            'delete', old.id, coalesce(old.search_text, old.content),
            {_SUM_SCOPE.format(r='old')});
        INSERT INTO lcm_summaries_fts(rowid, body, scope) VALUES (
            new.id, coalesce(new.search_text, new.content),
            {_SUM_SCOPE.format(r='new')});
    END""",
    # Index rows written before this revision.
    "INSERT INTO lcm_messages_fts(lcm_messages_fts) VALUES ('rebuild')",
    "INSERT INTO lcm_summaries_fts(lcm_summaries_fts) VALUES ('rebuild')",
]

SQLITE_DOWN = [
    "DROP TRIGGER lcm_summaries_fts_au",
    "DROP TRIGGER lcm_summaries_fts_ad",
    "DROP TRIGGER lcm_summaries_fts_ai",
    "DROP TABLE lcm_summaries_fts",
    "DROP VIEW lcm_summaries_fts_src",
    "DROP TRIGGER lcm_messages_fts_au",
    "DROP TRIGGER lcm_messages_fts_ad",
    "DROP TRIGGER lcm_messages_fts_ai",
    "DROP TABLE lcm_messages_fts",
    "DROP VIEW lcm_messages_fts_src",
]

# ---------------------------------------------------------------- PostgreSQL: tsvector + GIN


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for statement in SQLITE_UP:
            op.execute(statement)
        return
    from lcm.backends.postgres import PostgresBackend

    # IF NOT EXISTS: a run interrupted after the commit below (in the index builds) is re-run
    # from here, with the columns already in place.
    op.execute("ALTER TABLE lcm_messages ADD COLUMN IF NOT EXISTS search_vector tsvector")
    op.execute("ALTER TABLE lcm_summaries ADD COLUMN IF NOT EXISTS search_vector tsvector")
    # Index rows written before this revision (the same code as `lcm doctor`'s repair).
    PostgresBackend().rebuild_exact_vectors(bind)
    # Built without blocking writers on a big existing table (needs its own transaction).
    # The (agent_id, id) indexes let a search walk one agent's newest rows among many agents'.
    with op.get_context().autocommit_block():
        create_index_online("ix_lcm_messages_search_vector", "lcm_messages", ["search_vector"],
                            postgresql_using="gin")
        create_index_online("ix_lcm_summaries_search_vector", "lcm_summaries", ["search_vector"],
                            postgresql_using="gin")
        create_index_online("ix_lcm_messages_agent_recent", "lcm_messages", ["agent_id", "id"])
        create_index_online("ix_lcm_summaries_agent_recent", "lcm_summaries", ["agent_id", "id"])


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for statement in SQLITE_DOWN:
            op.execute(statement)
        return
    op.drop_index("ix_lcm_summaries_agent_recent", table_name="lcm_summaries")
    op.drop_index("ix_lcm_messages_agent_recent", table_name="lcm_messages")
    op.drop_index("ix_lcm_summaries_search_vector", table_name="lcm_summaries")
    op.drop_index("ix_lcm_messages_search_vector", table_name="lcm_messages")
    op.drop_column("lcm_summaries", "search_vector")
    op.drop_column("lcm_messages", "search_vector")
