"""SQLite: messages are indexed for search in batches behind a watermark, not by a trigger per row.

Indexing a message into the two FTS5 tables (exact and stemmed) one row at a time was the
largest single cost of a stored turn (docs/benchmarks.md, "Where a turn's ingest time goes");
FTS5 indexes a batch of rows for about a third of that per row. So:

* ``lcm_search_marks(name, indexed_through)``: every message with ``id <= indexed_through`` is
  in both message indexes; those above it are *pending*. SQLite has one writer at a time and
  ``lcm_messages`` ids are AUTOINCREMENT (never reused), so rows commit in id order and one
  number says exactly which rows are indexed.
* The insert triggers ``lcm_messages_fts_ai`` / ``lcm_messages_stems_ai`` are dropped. lcm
  indexes the pending rows in one statement per index (``SQLiteBackend.catch_up_index``):
  before any search, so no search misses a stored message, and inside a write once
  ``INDEX_BATCH`` rows are pending, so the backlog stays small.
* The delete and update triggers act only on indexed rows (``old.id <= indexed_through``): FTS5
  must be told a deleted row's old text, and must not be told about a row it never indexed.
* Summaries keep their triggers: they are written a few at a time, at compaction.

Upgrade: every existing row is indexed (the old triggers did it), so the mark starts at the
newest id. Downgrade indexes the pending rows first, then restores the per-row triggers.
PostgreSQL is unchanged: its vectors are written by the insert itself.

Revision ID: 0010_deferred_message_index
Revises: 0009_session_origin
Create Date: 2026-11-27
"""
from __future__ import annotations

from alembic import op

revision = "0010_deferred_message_index"
down_revision = "0009_session_origin"
branch_labels = None
depends_on = None

_SCOPE = "'s' || {r}.session_id || ' a' || {r}.agent_id || ' r' || lower(hex({r}.role))"
_BODY = "coalesce({r}.search_text, {r}.content)"
_WATCHED = "content, search_text, role, session_id, agent_id"
_INDEXES = ("lcm_messages_fts", "lcm_messages_stems")
_INDEXED = "old.id <= (SELECT indexed_through FROM lcm_search_marks WHERE name = 'messages')"


def _delete_old(fts: str) -> str:
    return (f"INSERT INTO {fts}({fts}, rowid, body, scope) VALUES ("
            f"'delete', old.id, {_BODY.format(r='old')}, {_SCOPE.format(r='old')});")


def _insert_new(fts: str) -> str:
    return f"INSERT INTO {fts}(rowid, body, scope) VALUES (new.id, {_BODY.format(r='new')}, {_SCOPE.format(r='new')});"


def _triggers(fts: str, *, guarded: bool) -> list[str]:
    when = f" WHEN {_INDEXED}" if guarded else ""
    return [
        f"CREATE TRIGGER {fts}_ad AFTER DELETE ON lcm_messages{when} BEGIN {_delete_old(fts)} END",
        f"CREATE TRIGGER {fts}_au AFTER UPDATE OF {_WATCHED} ON lcm_messages{when} BEGIN "
        f"{_delete_old(fts)} {_insert_new(fts)} END",
    ]


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute("CREATE TABLE lcm_search_marks (name TEXT PRIMARY KEY, indexed_through INTEGER NOT NULL)")
    op.execute("INSERT INTO lcm_search_marks (name, indexed_through) "
               "SELECT 'messages', coalesce(max(id), 0) FROM lcm_messages")
    for fts in _INDEXES:
        for kind in ("ai", "ad", "au"):
            op.execute(f"DROP TRIGGER {fts}_{kind}")
        for statement in _triggers(fts, guarded=True):
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for fts in _INDEXES:
        op.execute(f"INSERT INTO {fts}(rowid, body, scope) SELECT id, body, scope FROM lcm_messages_fts_src "
                   "WHERE id > (SELECT indexed_through FROM lcm_search_marks WHERE name = 'messages') ORDER BY id")
        op.execute(f"DROP TRIGGER {fts}_ad")
        op.execute(f"DROP TRIGGER {fts}_au")
        op.execute(f"CREATE TRIGGER {fts}_ai AFTER INSERT ON lcm_messages BEGIN {_insert_new(fts)} END")
        for statement in _triggers(fts, guarded=False):
            op.execute(statement)
    op.execute("DROP TABLE lcm_search_marks")
