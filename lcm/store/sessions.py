"""Agents and sessions: host keys and their aliases, forks, per-session counters and the engine
state kept with a session (where the host's view starts, the last compaction's outcome).

A session belongs to one agent; two agents may use the same host session key and stay apart.
A fork is a session whose ``parent_id`` / ``fork_seq`` name the session it branched off and the
last message the two share (``lcm.context.ingest`` explains when one is made).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Select, and_, select, update

from lcm import codec
from lcm.errors import NotFoundError
from lcm.prepare import PreparedSystemPrompt
from lcm.records import SessionRecord, SystemPromptRecord
from lcm.store._core import (
    MAX_PAGE_LIMIT,
    StoreCore,
    agents_t,
    aliases_t,
    checked_int,
    checked_text,
    fetch_in,
    session_record,
    session_select,
    sessions_t,
    system_prompts_t,
)
from lcm.store.family import FamilyWriter, add_skipped_statement
from lcm.store.replica import lag_tolerant

#: How many generations of forks lcm follows from a session to its family's root.
MAX_FORK_DEPTH = 64
#: Sessions per page when a listing walks all of an agent's sessions.
SESSION_PAGE = 100


def forks_select(parent_pk: int, fork_seq: int | None) -> Select[Any]:
    stmt = session_select().where(sessions_t.c.parent_id == parent_pk)
    if fork_seq is not None:
        stmt = stmt.where(sessions_t.c.fork_seq == fork_seq)
    return stmt.order_by(sessions_t.c.id)


class SessionRepository:
    """Agents and their sessions (``store.sessions``)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def get_or_create(self, agent: str, session_key: str, *, platform: str | None = None,
                      conversation_id: str | None = None, origin: Mapping[str, Any] | None = None) -> SessionRecord:
        """The session ``session_key`` of ``agent``, created on first use.

        ``platform`` and ``conversation_id`` fill in values the session does not have yet;
        values already recorded are kept (a session's source never changes under its rows).
        """
        checked_text("session id", session_key, 255)
        if platform is not None:
            checked_text("platform", platform, 64)
        if conversation_id is not None:
            checked_text("conversation id", conversation_id, 255)
        found = self.find(agent, session_key)
        if found is not None and (platform is None or found.platform is not None) and (
            conversation_id is None or found.conversation_id is not None
        ) and (origin is None or found.origin is not None):
            return found
        now = time.time()
        with self._core.write() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=True)
            self._core.backend.insert_ignore(conn, sessions_t, [{
                "agent_id": agent_pk, "session_key": session_key, "platform": platform,
                "conversation_id": conversation_id, "created_at": now, "updated_at": now,
                "last_seq": 0, "message_count": 0, "token_count": 0, "covered_seq": 0,
                "covered_tokens": 0,
            }], ["agent_id", "session_key"])
            where = and_(sessions_t.c.agent_id == agent_pk, sessions_t.c.session_key == session_key)
            encoded = codec.encode_json(dict(origin)) if origin is not None else None
            for column, value in (("platform", platform), ("conversation_id", conversation_id), ("origin", encoded)):
                if value is not None:
                    conn.execute(update(sessions_t).where(where, sessions_t.c[column].is_(None))
                                 .values({column: value}))
            row = conn.execute(session_select().where(where)).one()
        return session_record(row)

    def find(self, agent: str, session_key: str) -> SessionRecord | None:
        """The agent's session with this host key, or the one the key is an alias of."""
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return None
            row = conn.execute(session_select().where(
                sessions_t.c.agent_id == agent_pk, sessions_t.c.session_key == session_key)).first()
            if row is None:
                row = conn.execute(session_select().join(
                    aliases_t, aliases_t.c.session_id == sessions_t.c.id).where(
                    aliases_t.c.agent_id == agent_pk, aliases_t.c.session_key == session_key)).first()
        return session_record(row) if row is not None else None

    def alias(self, agent: str, session_key: str, session_pk: int) -> SessionRecord:
        """Make ``session_key`` another name of the agent's session ``session_pk``.

        Idempotent. A key that already names a session of its own keeps naming it (returned
        unchanged): an alias never hides stored messages.
        """
        checked_text("session id", session_key, 255)
        existing = self.find(agent, session_key)
        if existing is not None:
            return existing
        target = self.get(session_pk, agent=agent)
        with self._core.write() as conn:
            self._core.backend.insert_ignore(conn, aliases_t, [{
                "agent_id": target.agent_pk, "session_key": session_key,
                "session_id": session_pk, "created_at": time.time()}], ["agent_id", "session_key"])
        found = self.find(agent, session_key)
        if found is None:  # pragma: no cover - the row was just written
            raise NotFoundError(f"session {session_key!r} not found after aliasing it")
        return found

    def keys(self, session_pk: int) -> list[str]:
        """Every host key of a session: its own first, then aliases in creation order."""
        with self._core.read() as conn:
            own = conn.execute(select(sessions_t.c.session_key).where(
                sessions_t.c.id == session_pk)).scalar()
            if own is None:
                return []
            aliases = conn.execute(select(aliases_t.c.session_key).where(
                aliases_t.c.session_id == session_pk).order_by(aliases_t.c.created_at)).scalars().all()
        return [own, *aliases]

    def get(self, session_pk: int, *, agent: str | None = None) -> SessionRecord:
        """The session with this internal id (of ``agent`` when given) or NotFoundError."""
        with self._core.read() as conn:
            row = conn.execute(session_select().where(sessions_t.c.id == session_pk)).first()
        if row is None or (agent is not None and row._mapping["agent_name"] != agent):
            raise NotFoundError(f"session {session_pk} not found")
        return session_record(row)

    @lag_tolerant
    def of_agent(self, agent: str, *, limit: int = SESSION_PAGE, after_id: int | None = None) -> list[SessionRecord]:
        """The agent's sessions, oldest first, paged by internal id."""
        checked_int("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return []
            stmt = session_select().where(sessions_t.c.agent_id == agent_pk)
            if after_id is not None:
                stmt = stmt.where(sessions_t.c.id > after_id)
            rows = conn.execute(stmt.order_by(sessions_t.c.id).limit(limit)).all()
        return [session_record(r) for r in rows]

    def each(self, agent: str) -> Iterator[SessionRecord]:
        """Every session of the agent, oldest first, read a page at a time."""
        after = None
        while True:
            page = self.of_agent(agent, limit=SESSION_PAGE, after_id=after)
            yield from page
            if len(page) < SESSION_PAGE:
                return
            after = page[-1].id

    def last_message_times(self, session_pks: Collection[int]) -> dict[int, float]:
        """The time of each session's last message (the conversation's own time: for an imported
        session, when it was said, not when it was imported); sessions without messages are left
        out. One indexed lookup per session (``UNIQUE(session_id, seq)``)."""
        with self._core.read() as conn:
            lasts = fetch_in(conn, session_pks, lambda chunk: select(sessions_t.c.id, sessions_t.c.last_seq).where(
                sessions_t.c.id.in_(chunk), sessions_t.c.last_seq > 0))
            rows = self._core.backend.messages_at(conn, [(r.id, r.last_seq) for r in lasts])
        return {int(r.session_id): float(r.ts) for r in rows}

    @lag_tolerant
    def agents(self) -> list[str]:
        """Every agent with a row in this store, oldest first."""
        with self._core.read() as conn:
            return list(conn.execute(select(agents_t.c.name).order_by(agents_t.c.id)).scalars())

    def forks(self, parent_pk: int, fork_seq: int | None = None) -> list[SessionRecord]:
        """The forks of a session (those branching off after message ``fork_seq`` when given),
        oldest first."""
        with self._core.read() as conn:
            return [session_record(r) for r in conn.execute(forks_select(parent_pk, fork_seq))]

    def add_skipped(self, session_pk: int, count: int) -> None:
        """Count messages of the session that could not be stored at all."""
        if count > 0:
            with self._core.write() as conn:
                conn.execute(add_skipped_statement(session_pk, count))

    def set_host_view(self, session_pk: int, first_seq: int, *,
                      outcome: Mapping[str, Any] | None = None) -> SessionRecord:
        """Record where the transcript lcm just handed the host starts (after its summary) and,
        when given, the compaction outcome that came with it; the session as it is now."""
        values: dict[str, Any] = {"host_view_seq": checked_int("first_seq", first_seq, low=0)}
        if outcome is not None:
            values["last_compaction"] = codec.encode_json(dict(outcome))
        with self._core.write() as conn:
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(values))
            return self._core.session_of(conn, session_pk)

    def record_compaction(self, session_pk: int, outcome: Mapping[str, Any]) -> None:
        """Keep the last compaction's outcome with the session (status readers anywhere)."""
        with self._core.write() as conn:
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                last_compaction=codec.encode_json(dict(outcome))))

    def keep_system_prompt(self, session_pk: int, prompt: PreparedSystemPrompt, *, first_seq: int,
                           at: float | None = None) -> bool:
        """Keep a version of the session's leading system prompt, once (by digest): True when
        it is new. ``first_seq``: the first message it preceded; ``at``: when it was first seen
        (now, unless an import says otherwise)."""
        row = {"session_id": session_pk, "digest": prompt.digest, "message": prompt.text,
               "token_count": checked_int("token_count", prompt.token_count, low=0),
               "first_seq": checked_int("first_seq", first_seq, low=0),
               "created_at": time.time() if at is None else float(at)}
        with self._core.write() as conn:  # UNIQUE(session_id, digest): a known version inserts nothing
            return bool(self._core.backend.insert_rows(conn, system_prompts_t, [row], None, ("id",)))

    def system_prompts(self, session_pk: int) -> list[SystemPromptRecord]:
        """Every version of the session's system prompt, in the order they came."""
        t = system_prompts_t
        with self._core.read() as conn:
            rows = conn.execute(select(t).where(t.c.session_id == session_pk).order_by(t.c.first_seq, t.c.id)).all()
        return [SystemPromptRecord(id=r.id, session_pk=r.session_id, digest=r.digest,
                                   message=codec.decode_json(r.message), token_count=r.token_count,
                                   first_seq=r.first_seq, created_at=r.created_at) for r in rows]

    @contextmanager
    def family(self, session_pk: int) -> Iterator[FamilyWriter]:
        """One write transaction over a session and its forks, holding the lock of the
        family's root session: writers of one conversation (however many processes) run
        their alignment and appends one at a time against what is stored, while other
        conversations proceed in parallel (SQLite: its single write lock does this)."""
        root = session_pk
        with self._core.read() as conn:  # parent links never change once written
            for _ in range(MAX_FORK_DEPTH):
                parent = conn.execute(select(sessions_t.c.parent_id).where(
                    sessions_t.c.id == root)).scalar()
                if parent is None:
                    break
                root = parent
        with self._core.write() as conn:
            self._core.lock_session(conn, root)
            yield FamilyWriter(self._core, conn)
