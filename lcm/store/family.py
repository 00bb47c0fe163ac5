"""Reads and writes inside one conversation's lock (``store.sessions.family(pk)``).

Everything ingest decides (which messages are stored, where the host's transcript diverges,
which fork it continues) is decided from what :class:`FamilyWriter` reads, under that lock, and
written through it in the same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Update, func, select, update

from lcm.errors import IntegrityViolation
from lcm.prepare import PreparedMessage
from lcm.records import AppendResult, MessageMeta, SessionRecord
from lcm.store._core import StoreCore, session_record, session_select, sessions_t
from lcm.store.messages import append_rows, meta_records, metas_select, seq_of_identity_select

#: A fork's session key is its parent's with this and a number.
FORK_SEPARATOR = "/fork-"


def add_skipped_statement(session_pk: int, count: int) -> Update:
    return update(sessions_t).where(sessions_t.c.id == session_pk).values(
        skipped_count=sessions_t.c.skipped_count + count)


class FamilyWriter:
    """One conversation (a session and its forks) inside its locked write transaction."""

    def __init__(self, core: StoreCore, conn: Connection):
        self._core = core
        self._conn = conn

    def session(self, session_pk: int) -> SessionRecord:
        """The session, its row locked until the transaction ends (a concurrent fast-path
        append to it waits, then finds the session moved on)."""
        return self._core.session_of(self._conn, session_pk, lock=True)

    def metas(self, session_pk: int, first_seq: int, last_seq: int) -> list[MessageMeta]:
        return meta_records(self._conn.execute(metas_select(session_pk, first_seq, last_seq)).all())

    def seq_of_identity(self, session_pk: int, identity: str) -> int | None:
        seq: int | None = self._conn.execute(seq_of_identity_select(session_pk, identity)).scalar()
        return seq

    def forks(self, parent_pk: int, fork_seq: int) -> list[SessionRecord]:
        """The forks of ``parent_pk`` that branch off after its message ``fork_seq``, oldest first."""
        stmt = session_select().where(sessions_t.c.parent_id == parent_pk,
                                      sessions_t.c.fork_seq == fork_seq).order_by(sessions_t.c.id)
        return [session_record(r) for r in self._conn.execute(stmt)]

    def append(self, session_pk: int, prepared: Sequence[PreparedMessage], *,
               after_identity: str | None) -> AppendResult:
        self.session(session_pk)
        return append_rows(self._core, self._conn, session_pk, prepared, after_identity=after_identity)

    def create_fork(self, parent: SessionRecord, fork_seq: int) -> SessionRecord:
        """A new session of the parent's agent that continues the parent's conversation after
        its message ``fork_seq`` differently. Its key is the parent's with ``/fork-N``."""
        conn = self._conn
        taken = conn.execute(select(func.count()).select_from(sessions_t).where(
            sessions_t.c.parent_id == parent.id)).scalar_one()
        now = time.time()
        for n in range(taken + 1, taken + 1000):
            suffix = f"{FORK_SEPARATOR}{n}"
            key = parent.session_key[: 255 - len(suffix)] + suffix
            exists = conn.execute(select(sessions_t.c.id).where(
                sessions_t.c.agent_id == parent.agent_pk, sessions_t.c.session_key == key)).first()
            if exists is None:
                break
        else:  # pragma: no cover - a thousand sessions named like forks
            raise IntegrityViolation(f"no free fork name for session {parent.session_key!r}")
        values: dict[str, Any] = dict(
            agent_id=parent.agent_pk, session_key=key, platform=parent.platform,
            conversation_id=parent.conversation_id, created_at=now, updated_at=now, last_seq=0,
            message_count=0, token_count=0, covered_seq=0, covered_tokens=0,
            parent_id=parent.id, fork_seq=fork_seq)
        [pk] = conn.execute(sessions_t.insert().values(values).returning(sessions_t.c.id)).one()
        return self.session(pk)

    def add_skipped(self, session_pk: int, count: int) -> None:
        if count > 0:
            self._conn.execute(add_skipped_statement(session_pk, count))
