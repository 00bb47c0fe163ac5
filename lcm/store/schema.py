"""SQLAlchemy 2.0 models: the schema both backends share.

Dialect-only objects (SQLite FTS5 tables, their content views and triggers; PostgreSQL
``search_vector`` columns and their GIN indexes) are not declared here: they live in the
Alembic revisions and in ``lcm/backends``, and ``alembic/env.py`` leaves them out of the
model/migration comparison (:data:`DIALECT_ONLY_OBJECTS`).

Invariants the schema itself enforces:
  * a message is stored once per session identity: ``UNIQUE(session_id, identity)``;
  * ``seq`` orders a session's messages: ``UNIQUE(session_id, seq)``;
  * a message is covered by at most one leaf and a summary condensed into at most one parent:
    ``UNIQUE(message_id)`` and ``UNIQUE(child_id)`` on the edge table, each edge pointing at
    exactly one of the two (CHECK);
  * a session is unique per agent: ``UNIQUE(agent_id, session_key)``;
  * a system prompt is kept once per version per session: ``UNIQUE(session_id, digest)``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: BIGINT on PostgreSQL; INTEGER on SQLite so the column is the rowid (and FTS5 content_rowid).
IdType = BigInteger().with_variant(Integer(), "sqlite")

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Objects created by migrations for one dialect only; excluded from autogenerate comparison.
DIALECT_ONLY_OBJECTS = frozenset(
    {
        "lcm_messages_fts",
        "lcm_summaries_fts",
        "search_vector",
        "ix_lcm_messages_search_vector",
        "ix_lcm_summaries_search_vector",
        "ix_lcm_messages_agent_recent",
        "ix_lcm_summaries_agent_recent",
        "lcm_messages_stems",
        "lcm_summaries_stems",
        "lcm_search_marks",
        "search_stems",
        "ix_lcm_messages_search_stems",
        "ix_lcm_summaries_search_stems",
        "lcm_message_stems",
        "stemmed_seq",
        "ix_lcm_sessions_unstemmed",
    }
)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Agent(Base):
    """An agent scope. Rows of one agent are never returned to another."""

    __tablename__ = "lcm_agents"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class Session(Base):
    """A host conversation session, with counters kept in step with its messages and leaves.

    The counters make per-turn work O(1): ``last_seq`` numbers the next message, and
    ``covered_seq`` / ``covered_tokens`` mark the end of the region summarized by leaves (the
    raw region is every message with ``seq > covered_seq``). ``lcm_doctor`` re-derives them.
    """

    __tablename__ = "lcm_sessions"
    __table_args__ = (
        UniqueConstraint("agent_id", "session_key"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("lcm_agents.id"))
    session_key: Mapped[str] = mapped_column(String(255))
    platform: Mapped[str | None] = mapped_column(String(64))
    conversation_id: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    message_count: Mapped[int] = mapped_column(Integer, default=0)
    token_count: Mapped[int] = mapped_column(BigInteger, default=0)
    covered_seq: Mapped[int] = mapped_column(Integer, default=0)
    covered_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    #: First seq of the raw messages in the context lcm last handed the host (0: none yet):
    #: where the host's transcript resumes after lcm's summary message, for ingest alignment.
    host_view_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: JSON: outcome of the last compaction (status, reason, counts), for status readers.
    last_compaction: Mapped[str | None] = mapped_column(Text)
    #: The summaries the session's context shows (uncondensed and carried): how many and their
    #: tokens, kept with every summary write so "is compaction needed?" costs no query.
    summary_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    summary_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: A fork's parent session and the parent's last message the fork shares (0: none): a host
    #: transcript that diverged from the stored history continues here (see ``lcm.ingest``).
    #: No foreign key: SQLite cannot add one to an existing table; lcm never deletes a parent.
    parent_id: Mapped[int | None] = mapped_column(IdType, index=True)
    fork_seq: Mapped[int | None] = mapped_column(Integer)
    #: Messages of this session lcm could not store at all (not a JSON object, no usable role).
    skipped_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: JSON: where an imported session came from (``lcm import``); NULL when recorded live.
    origin: Mapped[str | None] = mapped_column(Text)
    #: The first seq whose token count may be an estimate (NULL: every count is exact). A
    #: backend with ``defer_token_counts`` (SQLite) stores a turn with estimated counts; the
    #: engine counts them exactly before it plans, compacts or assembles (``settle_tokens``).
    estimated_from: Mapped[int | None] = mapped_column(Integer)


class SessionAlias(Base):
    """Another host session key for the same conversation.

    Hermes rotates to a new session id at a compaction boundary
    (``on_session_start(new, boundary_reason="compression", old_session_id=old)``); the
    conversation, its messages and its DAG continue, so the new key points at the same session.
    """

    __tablename__ = "lcm_session_aliases"

    agent_id: Mapped[int] = mapped_column(ForeignKey("lcm_agents.id"), primary_key=True)
    session_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("lcm_sessions.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)


class CarriedSummary(Base):
    """A summary of an earlier session carried into a new one on /new (raw rows stay put)."""

    __tablename__ = "lcm_carried_summaries"

    session_id: Mapped[int] = mapped_column(ForeignKey("lcm_sessions.id"), primary_key=True)
    summary_id: Mapped[int] = mapped_column(ForeignKey("lcm_summaries.id"), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer)


class Generated(Base):
    """A message lcm generated and put into a context (its summary, its acknowledgement, a cut
    copy of a message too large for the window), by digest: when a host sends one back, lcm
    knows it as its own by this, never by its text (a user may paste text that looks like lcm's
    summary; that is a message to store)."""

    __tablename__ = "lcm_generated"

    agent_id: Mapped[int] = mapped_column(ForeignKey("lcm_agents.id"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: For a stored message handed back cut (too large for the window): the original's
    #: alignment key (``lcm.ingest.meta_key``), so the cut copy coming back is that message.
    stands_for: Mapped[str | None] = mapped_column(String(80))
    #: For lcm's summary message: the session whose context it opened and the last message of
    #: that session it stands in for (revision 0013), so a host that sends it back (after a
    #: restart, say) is known to continue that session right after that message.
    session_id: Mapped[int | None] = mapped_column(Integer)
    through_seq: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class Payload(Base):
    """A large message body (content and/or tool calls), compressed, stored once per hash."""

    __tablename__ = "lcm_payloads"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    codec: Mapped[str] = mapped_column(String(16))
    size_chars: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)


class Message(Base):
    """One host message, stored verbatim (see ``lcm.messages`` for the column encoding)."""

    __tablename__ = "lcm_messages"
    __table_args__ = (
        UniqueConstraint("session_id", "identity"),
        UniqueConstraint("session_id", "seq"),
        CheckConstraint(
            "content_kind IN ('text', 'json', 'absent', 'payload')", name="content_kind"
        ),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("lcm_sessions.id"))
    #: The session's agent, on the row itself: the scope every read checks, and (PostgreSQL)
    #: the index that walks one agent's newest rows among many agents'.
    agent_id: Mapped[int] = mapped_column(ForeignKey("lcm_agents.id"))
    seq: Mapped[int] = mapped_column(Integer)
    identity: Mapped[str] = mapped_column(String(80))
    content_hash: Mapped[str] = mapped_column(String(32))
    role: Mapped[str] = mapped_column(String(64))
    content_kind: Mapped[str] = mapped_column(String(8))
    content: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[str | None] = mapped_column(Text)
    tool_call_id: Mapped[str | None] = mapped_column(String(255))
    name: Mapped[str | None] = mapped_column(String(255))
    extra: Mapped[str | None] = mapped_column(Text)
    key_order: Mapped[str | None] = mapped_column(Text)
    payload_id: Mapped[int | None] = mapped_column(ForeignKey("lcm_payloads.id"), index=True)
    #: The indexed text when it differs from ``content`` (tool-call arguments, text parts,
    #: CJK split into characters, payload excerpt); NULL means "index ``content`` itself".
    search_text: Mapped[str | None] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    #: NULL, or JSON saying what lcm changed to store the message (a value JSON cannot hold).
    problem: Mapped[str | None] = mapped_column(Text)


class SystemPrompt(Base):
    """A version of a session's leading system prompt, kept once (by digest) with the first
    message it preceded. Not a conversation message: no ``seq``, not searched, not compacted."""

    __tablename__ = "lcm_system_prompts"
    __table_args__ = (
        UniqueConstraint("session_id", "digest"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("lcm_sessions.id"))
    #: sha256 of the stored message text: what makes two versions the same.
    digest: Mapped[str] = mapped_column(String(64))
    #: The whole message, lossless JSON (``lcm.codec.encode_json``): exactly what the host sent.
    message: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    #: ``seq`` of the first message the version preceded (the session's next seq when it came).
    first_seq: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class Summary(Base):
    """A node of the summary DAG: depth 0 summarizes messages, depth d+1 summarizes depth d."""

    __tablename__ = "lcm_summaries"
    __table_args__ = (
        Index("ix_lcm_summaries_session_open", "session_id", "parent_id", "depth"),
        CheckConstraint("depth >= 0", name="depth_nonnegative"),
        CheckConstraint("first_seq <= last_seq", name="seq_range"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("lcm_sessions.id"))
    agent_id: Mapped[int] = mapped_column(ForeignKey("lcm_agents.id"))
    depth: Mapped[int] = mapped_column(Integer)
    content: Mapped[str] = mapped_column(Text)
    #: As for messages: the indexed text when it differs from ``content``, else NULL.
    search_text: Mapped[str | None] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)
    source_token_count: Mapped[int] = mapped_column(BigInteger)
    source_count: Mapped[int] = mapped_column(Integer)
    #: The message ``seq`` range this node covers (for any depth), and its time range.
    first_seq: Mapped[int] = mapped_column(Integer)
    last_seq: Mapped[int] = mapped_column(Integer)
    earliest_at: Mapped[float] = mapped_column(Float)
    latest_at: Mapped[float] = mapped_column(Float)
    expand_hint: Mapped[str] = mapped_column(Text, default="")
    #: How the text was made: "llm", "llm-bullets", "extractive", "truncated", ...
    kind: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(255))
    #: The summary this node was condensed into (NULL while uncondensed); mirrors the edge.
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("lcm_summaries.id"))
    meta: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class SummarySource(Base):
    """An ordered edge from a summary to one source: a message (leaf) or a child summary."""

    __tablename__ = "lcm_summary_sources"
    __table_args__ = (
        CheckConstraint(
            "(message_id IS NULL) <> (child_id IS NULL)", name="exactly_one_source"
        ),
    )

    summary_id: Mapped[int] = mapped_column(
        ForeignKey("lcm_summaries.id", ondelete="CASCADE"), primary_key=True
    )
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    message_id: Mapped[int | None] = mapped_column(ForeignKey("lcm_messages.id"), unique=True)
    child_id: Mapped[int | None] = mapped_column(ForeignKey("lcm_summaries.id"), unique=True)


class Vector(Base):
    """An embedding of one message or one summary by one model: derived data, rebuilt at will
    (``lcm embed``), deleted with its row. Unit-length float32 bytes (``lcm.vectors``).

    The scope a search filters by (agent, session, role, time) is copied from the row it
    embeds, which never changes: a vector search reads this table alone."""

    __tablename__ = "lcm_vectors"
    __table_args__ = (
        CheckConstraint("(message_id IS NULL) <> (summary_id IS NULL)", name="exactly_one_item"),
        UniqueConstraint("message_id", "model"),
        UniqueConstraint("summary_id", "model"),
        Index("ix_lcm_vectors_agent_model", "agent_id", "model", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("lcm_agents.id"))
    session_id: Mapped[int] = mapped_column(ForeignKey("lcm_sessions.id", ondelete="CASCADE"))
    message_id: Mapped[int | None] = mapped_column(ForeignKey("lcm_messages.id", ondelete="CASCADE"))
    summary_id: Mapped[int | None] = mapped_column(ForeignKey("lcm_summaries.id", ondelete="CASCADE"))
    role: Mapped[str | None] = mapped_column(String(64))
    ts: Mapped[float] = mapped_column(Float)
    #: The embedder's name (``local:wordllama-...``, ``openai:<model>[@dims]``): vectors of two
    #: models are never compared.
    model: Mapped[str] = mapped_column(String(255))
    dims: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float)
