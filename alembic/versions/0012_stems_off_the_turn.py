"""PostgreSQL stems messages off the turn: ``lcm_message_stems`` and ``lcm_sessions.stemmed_seq``.

0007 made ``lcm_messages.search_stems`` a stored generated column: every turn's INSERT ran the
``english`` configuration's stemmer over each message and added the result to a second GIN
index, about a third of PostgreSQL's per-turn ingest time (docs/benchmarks.md, issue 18). Here
the stemmed vector moves to a side table that lcm fills after the turn, in batches, on another
connection (``PostgresBackend.catch_up_index``, run by the store's background catch-up and
before any search), so the server stems on a core of its own while the agent carries on.

* ``lcm_message_stems(message_id, agent_id, search_stems)``: one row per stemmed message (the
  same vector as before: ``to_tsvector('english', body)`` plus the scope lexemes), a GIN index,
  deleted with its message (``ON DELETE CASCADE``), walled off per agent like the messages when
  row-level security is on.
* ``lcm_sessions.stemmed_seq``: every message of the session up to this seq has its row. A
  session's messages commit in seq order (each append claims its seqs by updating the session
  row), so one number per session is an exact watermark, where a global id watermark is not
  (ids from the sequence commit out of order). The partial index over sessions with
  ``last_seq > stemmed_seq`` finds the pending ones without reading the others.
* A trigger keeps the watermark safe when a session's messages are renumbered downwards (forget,
  the doctor's duplicate repair): it moves down by as many messages as were left unstemmed.

Existing vectors are copied, not recomputed; the old column and its index are dropped (an
ACCESS EXCLUSIVE lock on ``lcm_messages`` for a catalog change, no rewrite). SQLite: nothing
changes (it already stems in batches, 0010).

Revision ID: 0012_stems_off_the_turn
Revises: 0011_deferred_token_counts
Create Date: 2026-11-27
"""
from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012_stems_off_the_turn"
down_revision = "0011_deferred_token_counts"
branch_labels = None
depends_on = None

POLICY = "lcm_agent_isolation"  # lcm.backends.pg_security.POLICY, fixed at this revision

_STEMS = ("to_tsvector('english'::regconfig, coalesce(search_text, content, '')) || "
          "array_to_tsvector(ARRAY['§s' || session_id::text, '§a' || agent_id::text, '§r:' || coalesce(role, '')])")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("""
        CREATE TABLE lcm_message_stems (
            message_id bigint NOT NULL,
            agent_id bigint NOT NULL,
            search_stems tsvector NOT NULL,
            CONSTRAINT pk_lcm_message_stems PRIMARY KEY (message_id)
        )""")
    # One statement, one snapshot: the vectors copied are exactly those of the messages up to
    # each session's last_seq as read here (a session's messages commit with its counters).
    # Agents may keep writing meanwhile; what they add lies above these watermarks and is
    # stemmed by the first catch-up after the upgrade.
    marks = op.get_bind().exec_driver_sql(
        "WITH copied AS (INSERT INTO lcm_message_stems (message_id, agent_id, search_stems) "
        "SELECT id, agent_id, search_stems FROM lcm_messages WHERE search_stems IS NOT NULL) "
        "SELECT id, last_seq FROM lcm_sessions").all()
    op.execute("CREATE INDEX ix_lcm_message_stems_search_stems ON lcm_message_stems USING gin (search_stems)")
    op.execute("ALTER TABLE lcm_sessions ADD COLUMN stemmed_seq integer NOT NULL DEFAULT 0")
    if marks:
        op.get_bind().execute(sa.text(
            "UPDATE lcm_sessions s SET stemmed_seq = least(m.through, s.last_seq) "
            "FROM unnest(CAST(:ids AS bigint[]), CAST(:through AS int[])) AS m(id, through) WHERE s.id = m.id"),
            {"ids": [r[0] for r in marks], "through": [r[1] for r in marks]})
    op.execute("CREATE INDEX ix_lcm_sessions_unstemmed ON lcm_sessions (agent_id, id) "
               "WHERE last_seq > stemmed_seq")
    op.execute("""
        CREATE FUNCTION lcm_lower_stemmed_seq() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            -- Renumbering closes gaps below the unstemmed messages: they move down by at most
            -- as many places as the session lost, so as many stay above the watermark.
            NEW.stemmed_seq := greatest(0, least(NEW.stemmed_seq,
                                                 NEW.last_seq - (OLD.last_seq - OLD.stemmed_seq)));
            RETURN NEW;
        END $$""")
    op.execute("CREATE TRIGGER lcm_sessions_lower_stemmed_seq BEFORE UPDATE OF last_seq ON lcm_sessions "
               "FOR EACH ROW WHEN (NEW.last_seq < OLD.last_seq) EXECUTE FUNCTION lcm_lower_stemmed_seq()")
    # Locks on the agents' tables come last and in the order an agent's append takes them
    # (the session, then its messages), so an append waits briefly and never deadlocks; a
    # foreign key to lcm_messages locks it against writes, so it is added last, unchecked,
    # and checked after the commit without blocking anyone.
    op.execute("ALTER TABLE lcm_message_stems ADD CONSTRAINT fk_lcm_message_stems_message_id_lcm_messages "
               "FOREIGN KEY (message_id) REFERENCES lcm_messages (id) ON DELETE CASCADE NOT VALID")
    op.execute("DROP INDEX IF EXISTS ix_lcm_messages_search_stems")
    op.execute("ALTER TABLE lcm_messages DROP COLUMN IF EXISTS search_stems")
    _secure_like_messages()
    with op.get_context().autocommit_block():
        # A message deleted after the copy and before the key existed left its vector behind.
        op.execute("DELETE FROM lcm_message_stems st WHERE NOT EXISTS "
                   "(SELECT 1 FROM lcm_messages m WHERE m.id = st.message_id)")
        op.execute("ALTER TABLE lcm_message_stems VALIDATE CONSTRAINT fk_lcm_message_stems_message_id_lcm_messages")


def _secure_like_messages() -> None:
    """Where ``lcm db secure --per-agent-roles`` walled the messages off, the stems too."""
    bind = op.get_bind()
    secured = bind.exec_driver_sql(
        "SELECT relrowsecurity FROM pg_class WHERE oid = to_regclass('lcm_messages')").scalar()
    if secured:
        op.execute("ALTER TABLE lcm_message_stems ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON lcm_message_stems USING (agent_id = lcm_current_agent()) "
                   "WITH CHECK (agent_id = lcm_current_agent())")
    grantees = bind.exec_driver_sql(
        "SELECT DISTINCT quote_ident(grantee::text) FROM information_schema.role_table_grants "
        "WHERE table_schema = current_schema() AND table_name = 'lcm_messages' AND privilege_type = 'INSERT' "
        "AND grantee::text <> current_user::text").scalars().all()
    for grantee in grantees:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON lcm_message_stems TO {grantee}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"ALTER TABLE lcm_messages ADD COLUMN search_stems tsvector GENERATED ALWAYS AS ({_STEMS}) STORED")
    op.execute("CREATE INDEX ix_lcm_messages_search_stems ON lcm_messages USING gin (search_stems)")
    op.execute("DROP TRIGGER IF EXISTS lcm_sessions_lower_stemmed_seq ON lcm_sessions")
    op.execute("DROP FUNCTION IF EXISTS lcm_lower_stemmed_seq()")
    op.execute("DROP INDEX IF EXISTS ix_lcm_sessions_unstemmed")
    op.execute("ALTER TABLE lcm_sessions DROP COLUMN IF EXISTS stemmed_seq")
    op.execute("DROP TABLE IF EXISTS lcm_message_stems")
