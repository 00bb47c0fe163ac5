"""What every repository of the store shares: the engine, the backend, short transactions, the
agent-id cache, table handles, and the small checks and conversions they all need.

Concurrency model. Every write runs in one short transaction that first locks the session row
(``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already holds the
database write lock), so appends and summary writes to one session are serialised while
different sessions proceed in parallel on PostgreSQL. Expensive preparation (encoding, token
counting, compression: ``lcm.prepare``) happens before the transaction starts; LLM calls never
happen in the store.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, Engine, RowMapping, Select, Table, event, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, ProgrammingError

from lcm import codec
from lcm.backends import Backend, backend_for_url
from lcm.config import background_catch_up_enabled, in_range
from lcm.errors import AccessDeniedError, DatabaseUnavailableError, NotFoundError, first_line
from lcm.records import SessionRecord, SummaryRecord
from lcm.store import connection, migrations
from lcm.store.catchup import BackgroundCatchUp
from lcm.store.replica import ReadReplica, ReplicaFailed, tolerant_now
from lcm.store.schema import (
    Agent,
    CarriedSummary,
    Generated,
    Message,
    Payload,
    Session,
    SessionAlias,
    Summary,
    SummarySource,
    SystemPrompt,
)

log = logging.getLogger("lcm")

messages_t = cast(Table, Message.__table__)
sessions_t = cast(Table, Session.__table__)
agents_t = cast(Table, Agent.__table__)
summaries_t = cast(Table, Summary.__table__)
edges_t = cast(Table, SummarySource.__table__)
payloads_t = cast(Table, Payload.__table__)
aliases_t = cast(Table, SessionAlias.__table__)
carried_t = cast(Table, CarriedSummary.__table__)
generated_t = cast(Table, Generated.__table__)
system_prompts_t = cast(Table, SystemPrompt.__table__)

#: Rows per ``IN (...)`` list.
IN_CHUNK = 500
#: The largest page any listing returns at once.
MAX_PAGE_LIMIT = 1000
MAX_ID = 2**63 - 1  # both backends' id columns are signed 64-bit


def fetch_in(conn: Connection, ids: Iterable[Any], statement: Callable[[list[Any]], Any]) -> list[Any]:
    """Rows of ``statement(chunk)`` for ``ids`` in chunks (bounded ``IN (...)`` lists)."""
    unique = list(dict.fromkeys(ids))
    rows: list[Any] = []
    for i in range(0, len(unique), IN_CHUNK):
        rows.extend(conn.execute(statement(unique[i : i + IN_CHUNK])).all())
    return rows


def storable_id(value: Any) -> bool:
    """Whether ``value`` could be a row id at all; anything else is simply not found (a caller's
    2**70 must not reach a driver that raises on integer overflow)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


def checked_text(field: str, value: Any, max_chars: int) -> str:
    """``value`` if it is a non-empty string of ordinary characters within ``max_chars``."""
    if not isinstance(value, str) or not value or len(value) > max_chars or not codec.is_clean(value):
        raise ValueError(f"{field} must be a non-empty string of at most {max_chars} ordinary characters")
    return value


def checked_int(field: str, value: Any, *, low: int, high: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer")
    return in_range(field, value, low, high)


def session_record(row: Any) -> SessionRecord:
    """A session row (with its agent's name as ``agent_name``) as a record."""
    m = row if isinstance(row, Mapping) else row._mapping
    return SessionRecord(
        id=m["id"], agent=m["agent_name"], agent_pk=m["agent_id"], session_key=m["session_key"],
        platform=m["platform"], conversation_id=m["conversation_id"],
        created_at=m["created_at"], updated_at=m["updated_at"], last_seq=m["last_seq"],
        message_count=m["message_count"], token_count=m["token_count"],
        covered_seq=m["covered_seq"], covered_tokens=m["covered_tokens"],
        host_view_seq=m["host_view_seq"],
        last_compaction=codec.decode_json(m["last_compaction"]) if m["last_compaction"] else None,
        summary_count=m["summary_count"], summary_tokens=m["summary_tokens"],
        parent_id=m["parent_id"], fork_seq=m["fork_seq"], skipped_count=m["skipped_count"],
        origin=codec.decode_json(m["origin"]) if m["origin"] else None,
        estimated_from=m.get("estimated_from"),
    )


def summary_record(row: Any) -> SummaryRecord:
    m = row._mapping
    return SummaryRecord(
        id=m["id"], session_pk=m["session_id"], depth=m["depth"], content=m["content"],
        token_count=m["token_count"], source_token_count=m["source_token_count"],
        source_count=m["source_count"], first_seq=m["first_seq"], last_seq=m["last_seq"],
        earliest_at=m["earliest_at"], latest_at=m["latest_at"], expand_hint=m["expand_hint"],
        kind=m["kind"], model=m["model"], parent_id=m["parent_id"],
        meta=codec.decode_json(m["meta"]) if m["meta"] is not None else None,
        created_at=m["created_at"],
    )


def session_select() -> Select[Any]:
    """Sessions with their agent's name (what :func:`session_record` reads)."""
    return select(sessions_t, agents_t.c.name.label("agent_name")).join(
        agents_t, agents_t.c.id == sessions_t.c.agent_id)


def _denied(exc: ProgrammingError) -> AccessDeniedError | None:
    """The database refused this role (SQLSTATE 42501): with per-agent roles on PostgreSQL, a
    row of another agent, or an agent id that is not the role's own."""
    if getattr(exc.orig, "sqlstate", None) != "42501":
        return None
    return AccessDeniedError(
        f"the database refused: {first_line(exc)}. With per-agent roles (lcm db secure) each "
        "role reaches only its own agent's rows: set LCM_AGENT_ID to the agent this role "
        "belongs to, or connect with that agent's role")


class StoreCore:
    """One lcm database: its engine and backend, read and write transactions, the agent cache.

    Shared by the repositories of one :class:`lcm.store.Store` (and safe to use from several
    threads: the agent cache only ever gains entries that never change)."""

    def __init__(self, url: URL, engine: Engine):
        self.url = url
        self.engine = engine
        self.backend: Backend = backend_for_url(url)
        self._agents: dict[str, int] = {}
        #: Agents a write transaction created and has not committed yet (see agent_pk).
        self._uncommitted_agents: weakref.WeakKeyDictionary[Connection, dict[str, int]] = weakref.WeakKeyDictionary()
        self._agent_names: dict[int, str] = {}
        self._session_agents: dict[int, int] = {}
        #: Fault injection for tests: called with a step name inside write transactions.
        self.on_write_step: Callable[[str], None] | None = None
        #: Set by ``Store.open(read_only=True)`` (``lcm ui``): lcm writes nothing, not even
        #: derived data such as the search index's backlog.
        self.read_only = False
        #: A streaming replica for lag-tolerant reads (``lcm.store.replica``), and where the
        #: primary's log was after this process's last write (what the replica must have replayed).
        self.replica: ReadReplica | None = None
        self.last_write_position: str | None = None
        #: Catches up derived search data after writes where the backend leaves it for later
        #: and another connection can do it (PostgreSQL's stemmed vectors); None elsewhere.
        self.background: BackgroundCatchUp | None = (
            BackgroundCatchUp(self.catch_up_index)
            if self.backend.index_in_background and background_catch_up_enabled() else None)
        if self.background is not None:
            event.listen(engine, "engine_disposed", self._engine_disposed)

    @property
    def location(self) -> str:
        """Where the data lives (a file path, or the URL without its password)."""
        return connection.display_url(self.url)

    @contextmanager
    def _failures(self, doing: str) -> Iterator[None]:
        """Driver failures as lcm errors: a lost or unreachable server as a (retryable when
        dropped) DatabaseUnavailableError, a refused privilege as AccessDeniedError."""
        try:
            yield
        except OperationalError as exc:
            raise DatabaseUnavailableError(f"{doing} {self.location} failed: {first_line(exc)}",
                                           retryable=exc.connection_invalidated) from exc
        except ProgrammingError as exc:
            raise _denied(exc) or exc from exc

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read. Inside a lag-tolerant call (``lcm.store.replica``), or anywhere in a store
        opened read-only, it goes to the read replica when one is configured and has replayed
        this process's last write; a replica failing part-way raises ReplicaFailed, and the call
        runs again on the primary."""
        replica = self.replica
        if replica is not None and (self.read_only or tolerant_now()):
            conn = replica.connection(self.last_write_position)
            if conn is not None:
                try:
                    with conn:
                        yield conn
                except DBAPIError as exc:
                    if not isinstance(exc, OperationalError | InterfaceError) and not exc.connection_invalidated:
                        raise
                    replica.failed(exc)
                    if not tolerant_now():  # a read-only store's plain read: no caller to rerun it
                        raise DatabaseUnavailableError(f"the read replica failed: {first_line(exc)}",
                                                       retryable=True) from exc
                    raise ReplicaFailed(str(exc)) from exc
                return
        with self._failures("read from"):
            if self.backend.autocommit_reads:
                with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    yield conn
            else:
                with self.engine.connect() as conn, conn.begin():
                    yield conn

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction. A write that fails because of this machine (a SQLite file
        made read-only) is retried once when lcm could remove the cause and nothing was
        written yet; the error names what blocks writes. A connection that drops before the
        commit is sent raises a ``retryable`` error (``lcm.errors.retry_dropped``)."""
        healed = yielded = committing = False
        while True:
            try:
                with self.engine.connect().execution_options(lcm_write=True) as conn:
                    with conn.begin():
                        yielded = True
                        yield conn
                        committing = True  # the body is done: leaving the block commits
                    self._committed_agents(conn)
                    self._note_write(conn)
                return
            except OperationalError as exc:
                blocked, fixed = self.backend.write_blocked(self.url, heal=True)
                if blocked is not None:
                    # Connections opened while the cause was there stay read-only: reopen.
                    self.engine.dispose()
                if fixed and not healed and not yielded:
                    healed = True  # nothing was written yet: once more, with the cause gone
                    continue
                cause = f"; {blocked}" if blocked else ""
                raise DatabaseUnavailableError(
                    f"write to {self.location} failed: {first_line(exc)}{cause}",
                    retryable=exc.connection_invalidated and not committing) from exc
            except ProgrammingError as exc:
                raise _denied(exc) or exc from exc

    @contextmanager
    def write_statement(self) -> Iterator[Connection]:
        """A connection for one atomic write statement outside a transaction (no BEGIN, no
        COMMIT: one round trip). Only for statements that are safe to run again after a drop,
        whether or not they landed: a drop is always reported ``retryable``."""
        with self._failures("write to"), self.engine.connect().execution_options(
                isolation_level="AUTOCOMMIT", lcm_write=True) as conn:
            yield conn
            self._committed_agents(conn)
            self._note_write(conn)

    def _note_write(self, conn: Connection) -> None:
        """With a read replica: remember where the primary's log is after this commit, so no
        read of this process is served by a replica that has not replayed it."""
        if self.replica is None:
            return
        try:
            position = self.backend.write_position(conn)
        except DBAPIError:
            position = None
        if position is not None:
            self.last_write_position = position
        else:  # unknown: no replica read until a later write says where the log is
            self.last_write_position = "FFFFFFFF/FFFFFFFF"

    def _engine_disposed(self, _engine: Engine) -> None:
        if self.background is not None:
            self.background.drop_waiting()

    def wrote_messages(self, count: int) -> None:
        """``count`` messages were stored: the background catch-up may have work."""
        if self.background is not None and not self.read_only:
            self.background.added(count)

    def catch_up_index(self, *, except_session: int | None = None, tolerate: int = 0) -> int:
        """Before a search: index the messages the backend left pending (SQLite indexes them
        in batches). Returns how many stay unindexed, and so unsearchable: 0, unless this
        store may not write (``read_only``, or a file lcm cannot write).

        ``except_session``: a session whose raw region (past its coverage) the caller holds in
        its context; the backend leaves its waiting messages there out of the count where a
        search still finds them by their exact words (``Backend.pending_index``): then nothing
        is written when only they wait, and the background catch-up stems them soon after. A
        compacted message waiting for its stems is caught up first (a conversation played
        faster than the background stemmer leaves them: LoCoMo's evidence depended on it).
        On SQLite, where a waiting message is not found at all, every other one is indexed
        first (the held ones too, when anything else waits: the index takes rows in id order).

        ``tolerate``: where waiting messages are still found by their exact words
        (``Backend.pending_still_found``), up to that many are left to the background catch-up,
        which stems them within about a second: a search that cannot wait (auto-recall, before
        every model call) does not stop to stem what other conversations have just stored. In
        the proxy benchmark on PostgreSQL that was a 2.5 ms write on every request, for about
        two messages."""
        if not self.backend.indexes_in_batches:
            return 0
        with self.read() as conn:
            pending = self.backend.pending_index(conn, except_session=except_session)
        if not pending or self.read_only:
            return pending
        if self.backend.pending_still_found and pending <= tolerate:
            return 0
        try:
            with self.write() as conn:
                self.backend.catch_up_index(conn)
        except DatabaseUnavailableError as exc:
            log.warning("lcm: %d newest messages cannot be indexed for search now: %s", pending, exc)
            return pending
        return 0

    def session_agent(self, session_pk: int) -> int | None:
        """The agent of a session this process has written to (a session never changes agent)."""
        return self._session_agents.get(session_pk)

    def remember_session_agent(self, session_pk: int, agent_pk: int) -> None:
        self._session_agents[session_pk] = agent_pk

    def schema_state(self) -> migrations.SchemaState:
        """Where the database's schema stands against this lcm's migrations."""
        try:
            with self.engine.connect() as conn:
                return migrations.schema_state(conn)
        except (OperationalError, ProgrammingError) as exc:
            raise DatabaseUnavailableError(
                f"cannot open the lcm database at {self.location}: {first_line(exc)}") from exc

    def fault_point(self, name: str) -> None:
        """A named step inside a write transaction, where tests inject crashes."""
        if self.on_write_step is not None:
            self.on_write_step(name)

    def agent_pk(self, conn: Connection, agent: str, *, create: bool) -> int | None:
        """The agent's row id (created when ``create``), cached for the process."""
        checked_text("agent id", agent, 128)
        pk = self._agents.get(agent)
        if pk is not None:
            return pk
        found = conn.execute(select(agents_t.c.id).where(agents_t.c.name == agent)).scalar()
        if found is None and create:
            self.backend.insert_ignore(conn, agents_t, [{"name": agent, "created_at": time.time()}], ["name"])
            created = int(conn.execute(select(agents_t.c.id).where(agents_t.c.name == agent)).scalar_one())
            # Remembered for the process only once committed (``write`` calls
            # ``_committed_agents`` after the commit): another thread given the id of a row this
            # transaction has not committed yet fails its foreign key (found by 64 proxy clients
            # creating their agents at once), and a rollback would leave it stale.
            self._uncommitted_agents.setdefault(conn, {})[agent] = created
            return created
        if found is None:
            return None
        if agent not in self._uncommitted_agents.get(conn, {}):
            self._remember_agent(agent, int(found))
        return int(found)

    def _committed_agents(self, conn: Connection) -> None:
        """The agents ``conn``'s transaction created, now committed: shared with the process."""
        for agent, pk in self._uncommitted_agents.pop(conn, {}).items():
            self._remember_agent(agent, pk)

    def _remember_agent(self, agent: str, pk: int) -> None:
        self._agents[agent] = pk
        self._agent_names[pk] = agent

    def agent_name(self, conn: Connection, agent_pk: int) -> str:
        name = self._agent_names.get(agent_pk)
        if name is None:
            name = conn.execute(select(agents_t.c.name).where(agents_t.c.id == agent_pk)).scalar_one()
            self._agents[name] = agent_pk
            self._agent_names[agent_pk] = name
        return name

    @staticmethod
    def lock_session(conn: Connection, session_pk: int) -> RowMapping:
        """The session's row, locked until the transaction ends (NotFoundError if none)."""
        row = conn.execute(
            select(sessions_t).where(sessions_t.c.id == session_pk).with_for_update()).first()
        if row is None:
            raise NotFoundError(f"session {session_pk} not found")
        return row._mapping

    def session_of(self, conn: Connection, session_pk: int, *, lock: bool = False) -> SessionRecord:
        """The session as a record (its row locked when ``lock``), or NotFoundError."""
        stmt = session_select().where(sessions_t.c.id == session_pk)
        if lock:
            stmt = stmt.with_for_update(of=sessions_t)
        row = conn.execute(stmt).first()
        if row is None:
            raise NotFoundError(f"session {session_pk} not found")
        return session_record(row)
