"""Stemmed search index, beside the exact one: "moved" finds "move", "databases" "database".

The any-word part of ``lcm_grep`` (a question asked in plain words) searches this index; the
every-word part, quoted phrases and ids keep the exact index of 0002, so they still match
exactly.

* SQLite: FTS5 tables ``lcm_messages_stems`` / ``lcm_summaries_stems`` over the same content
  views as 0002, tokenizer ``porter unicode61 remove_diacritics 2`` (FTS5's Porter stemmer over
  the same tokens), kept by their own triggers; existing rows indexed during the upgrade.
* PostgreSQL: a stored generated column ``search_stems`` =
  ``to_tsvector('english', body)`` plus the scope lexemes (``§s<session>``, ``§a<agent>``,
  ``§r:<role>``), with a GIN index: PostgreSQL keeps it in step itself. Adding it rewrites the
  table once (the column is computed for every existing row, under a lock: expect about a
  minute per million messages).

Revision ID: 0007_stemmed_search
Revises: 0006_system_prompts
Create Date: 2026-11-25
"""
from __future__ import annotations

from alembic import op
from lcm.store.migrations import create_index_online

revision = "0007_stemmed_search"
down_revision = "0006_system_prompts"
branch_labels = None
depends_on = None

_MSG_SCOPE = "'s' || {r}.session_id || ' a' || {r}.agent_id || ' r' || lower(hex({r}.role))"
_SUM_SCOPE = "'s' || {r}.session_id || ' a' || {r}.agent_id"
_TABLES = (("lcm_messages", _MSG_SCOPE, "content, search_text, role, session_id, agent_id"),
           ("lcm_summaries", _SUM_SCOPE, "content, search_text, session_id, agent_id"))


def _sqlite_up() -> list[str]:
    out = []
    for base, scope, watched in _TABLES:
        stems = f"{base}_stems"
        body_new, body_old = "coalesce(new.search_text, new.content)", "coalesce(old.search_text, old.content)"
        out += [
            f"""CREATE VIRTUAL TABLE {stems} USING fts5(
                body, scope, content='{base}_fts_src', content_rowid='id',
                tokenize='porter unicode61 remove_diacritics 2')""",
            f"""CREATE TRIGGER {stems}_ai AFTER INSERT ON {base} BEGIN
                INSERT INTO {stems}(rowid, body, scope) VALUES (new.id, {body_new}, {scope.format(r='new')});
            END""",
            f"""CREATE TRIGGER {stems}_ad AFTER DELETE ON {base} BEGIN
                INSERT INTO {stems}({stems}, rowid, body, scope) VALUES (
                    'delete', old.id, {body_old}, {scope.format(r='old')});
            END""",
            f"""CREATE TRIGGER {stems}_au AFTER UPDATE OF {watched} ON {base} BEGIN
                INSERT INTO {stems}({stems}, rowid, body, scope) VALUES (
                    'delete', old.id, {body_old}, {scope.format(r='old')});
                INSERT INTO {stems}(rowid, body, scope) VALUES (new.id, {body_new}, {scope.format(r='new')});
            END""",
            f"INSERT INTO {stems}({stems}) VALUES ('rebuild')",
        ]
    return out


def _pg_scope(base: str) -> str:
    role = ", '§r:' || coalesce(role, '')" if base == "lcm_messages" else ""
    return f"array_to_tsvector(ARRAY['§s' || session_id::text, '§a' || agent_id::text{role}])"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for statement in _sqlite_up():
            op.execute(statement)
        return
    for base, _, _ in _TABLES:
        op.execute(
            f"ALTER TABLE {base} ADD COLUMN IF NOT EXISTS search_stems tsvector GENERATED ALWAYS AS ("
            f"to_tsvector('english'::regconfig, coalesce(search_text, content, '')) || {_pg_scope(base)}) STORED")
    with op.get_context().autocommit_block():
        for base, _, _ in _TABLES:
            create_index_online(f"ix_{base}_search_stems", base, ["search_stems"], postgresql_using="gin")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for base, _, _ in _TABLES:
            stems = f"{base}_stems"
            for suffix in ("au", "ad", "ai"):
                op.execute(f"DROP TRIGGER {stems}_{suffix}")
            op.execute(f"DROP TABLE {stems}")
        return
    for base, _, _ in _TABLES:
        op.drop_index(f"ix_{base}_search_stems", table_name=base)
        op.drop_column(base, "search_stems")
