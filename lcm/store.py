"""The repository: the only way lcm touches the database.

Compaction, assembly and the tools call these methods and get plain records back
(``lcm.records``); which database is underneath is the business of ``lcm.backends``.

Concurrency model. Every write runs in one short transaction that first locks the session row
(``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already holds the
database write lock), so appends and summary writes to one session are serialised while
different sessions proceed in parallel on PostgreSQL. Expensive preparation (encoding, token
counting, compression) happens before the transaction starts; LLM calls never happen here.

Idempotent ingest. A message's identity is the host's ``message_uid`` when present, else its
content hash chained to the identity of the message before it (``lcm.messages``), and
``UNIQUE(session_id, identity)`` is the backstop: re-sending a transcript stores nothing twice,
while the same text sent twice in a row is two messages.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, case, func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from lcm import codec, db, migrations
from lcm.backends import IndexRow, SearchSpec, backend_for_url
from lcm.errors import (
    ConcurrentUpdateError,
    DatabaseUnavailableError,
    IntegrityViolation,
    InvalidMessageError,
    NotFoundError,
    SchemaMismatchError,
    StaleViewError,
)
from lcm.messages import CONTENT_TEXT, EncodedMessage, chain_identity, decode_message
from lcm.messages import encode_message, message_text, uid_identity
from lcm.models import (
    Agent,
    CarriedSummary,
    Generated,
    Message,
    Payload,
    Session,
    SessionAlias,
    Summary,
    SummarySource,
)
from lcm.records import (
    SORT_MODES,
    AppendResult,
    Candidate,
    CompactionView,
    CheckResult,
    DepthStats,
    MessageMeta,
    MessageRecord,
    NewSummary,
    RawRegion,
    SearchHit,
    SearchResult,
    SessionRecord,
    SummaryRecord,
)
from lcm.textindex import index_body, make_snippet, parse_query
from lcm.tokens import TokenCounter
from lcm.transcript import recall_call_ids as recall_call_ids_of
from lcm.transcript import searchable_text

MAX_SEARCH_LIMIT = 200
MAX_PAGE_LIMIT = 1000
IN_CHUNK = 500
HYBRID_RRF_K = 60
PAYLOAD_CODEC = "zlib"

messages_t = Message.__table__
sessions_t = Session.__table__
agents_t = Agent.__table__
summaries_t = Summary.__table__
edges_t = SummarySource.__table__
payloads_t = Payload.__table__
aliases_t = SessionAlias.__table__
carried_t = CarriedSummary.__table__
generated_t = Generated.__table__


def _fetch_in(conn: Connection, ids: Iterable[Any], statement: Callable[[list[Any]], Any]) -> list[Any]:
    """Rows of ``statement(chunk)`` for ``ids`` in chunks (bounded ``IN (...)`` lists)."""
    unique = list(dict.fromkeys(ids))
    rows: list[Any] = []
    for i in range(0, len(unique), IN_CHUNK):
        rows.extend(conn.execute(statement(unique[i : i + IN_CHUNK])).all())
    return rows


MAX_ID = 2**63 - 1  # both backends' id columns are signed 64-bit


def _storable_id(value: Any) -> bool:
    """Whether ``value`` could be a row id at all; anything else is simply not found (a caller's
    2**70 must not reach a driver that raises on integer overflow)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


#: Claim the next seq numbers of a session whose last seq is as expected, and add the counts;
#: the row comes back (and stays locked until commit), or nothing when the session moved on.
_BUMP_SESSION = (
    update(sessions_t)
    .where(sessions_t.c.id == bindparam("sid"), sessions_t.c.last_seq == bindparam("expected"))
    .values(last_seq=bindparam("new_last"), message_count=sessions_t.c.message_count + bindparam("n"),
            token_count=sessions_t.c.token_count + bindparam("tok"), updated_at=bindparam("now"))
    .returning(*sessions_t.c)
)


def _add_skipped(session_pk: int, count: int):
    return update(sessions_t).where(sessions_t.c.id == session_pk).values(
        skipped_count=sessions_t.c.skipped_count + count)


def _first_of_each(identities: Sequence[str]) -> list[int]:
    """Indexes of the first occurrence of each identity (a uid repeated in one call is one row)."""
    seen: set[str] = set()
    out = []
    for i, ident in enumerate(identities):
        if ident not in seen:
            seen.add(ident)
            out.append(i)
    return out


def _row_time(given: float | None, host: float | None, now: float) -> float:
    """The time a message is recorded at: as given, else the host's, else now."""
    if given is not None:
        if not isinstance(given, (int, float)) or isinstance(given, bool) or given != given:
            raise InvalidMessageError(f"a message time must be Unix seconds, got {given!r}")
        return float(given)
    return host if host is not None else now


def _short_text(field: str, value: Any, max_chars: int) -> str:
    if not isinstance(value, str) or not value or len(value) > max_chars or not codec.is_clean(value):
        raise ValueError(f"{field} must be a non-empty string of at most {max_chars} ordinary characters")
    return value


def _int_arg(field: str, value: Any, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{field} must be {bound}, got {value}")
    return value


#: How many generations of forks lcm follows from a session to its family's root.
MAX_FORK_DEPTH = 64


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A message encoded for storage, before any transaction (see ``Store.prepare``)."""

    encoded: EncodedMessage
    token_count: int
    search_text: str | None
    body: str
    payload: tuple[str, bytes, int] | None  # sha256, compressed data, size in chars


class Store:
    """A handle on one lcm database. Cheap to share; safe to use from several threads."""

    def __init__(self, url: URL, engine: Engine, *, token_counter: TokenCounter | None = None):
        self.url = url
        self.engine = engine
        self.backend = backend_for_url(url)
        self.tokens = token_counter or TokenCounter()
        self._agents: dict[str, int] = {}
        self._agent_names: dict[int, str] = {}
        #: Test hook: called with a step name inside write transactions (crash injection).
        self._on_write_step: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        url: str | URL | None = None,
        *,
        upgrade: bool | None = None,
        token_counter: TokenCounter | None = None,
    ) -> "Store":
        """Open (and for SQLite create or upgrade) the lcm database at ``url``.

        ``upgrade=None`` (the default) upgrades a SQLite file automatically and refuses a
        PostgreSQL schema that is not at this lcm's head (run ``lcm db upgrade``: on a shared
        server, schema changes are an operator's decision). ``upgrade=True`` upgrades either;
        ``upgrade=False`` never does.
        """
        resolved = url if isinstance(url, URL) else db.resolve_url(url)
        engine = db.get_engine(resolved)
        store = cls(resolved, engine, token_counter=token_counter)
        state = store._schema_state()
        if state.status == "current":
            return store
        where = db.display_url(resolved)
        if state.status == "unknown":
            raise SchemaMismatchError(
                f"the database at {where} has schema revision {state.current}, which this lcm "
                f"does not know (it was created by a newer lcm): upgrade lcm"
            )
        auto = upgrade if upgrade is not None else resolved.get_backend_name() == "sqlite"
        if not auto:
            found = "no lcm schema" if state.current is None else f"schema revision {state.current}"
            raise SchemaMismatchError(
                f"the database at {where} has {found}; this lcm needs {state.head}: "
                "run `lcm db upgrade` (or `alembic upgrade head`) first"
            )
        migrations.upgrade(resolved)
        return store

    def _schema_state(self) -> migrations.SchemaState:
        try:
            with self.engine.connect() as conn:
                return migrations.schema_state(conn)
        except (OperationalError, ProgrammingError) as exc:
            raise DatabaseUnavailableError(
                f"cannot open the lcm database at {db.display_url(self.url)}: {_first_line(exc)}"
            ) from exc

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def location(self) -> str:
        """Where the data lives (a file path, or the URL without its password)."""
        return db.display_url(self.url)

    def __deepcopy__(self, memo: dict[int, Any]) -> "Store":
        return self  # a store is a shared handle on a process-wide engine, never copied

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            if self.backend.autocommit_reads:
                with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    yield conn
            else:
                with self.engine.connect() as conn, conn.begin():
                    yield conn
        except OperationalError as exc:
            raise DatabaseUnavailableError(
                f"read from {self.location} failed: {_first_line(exc)}") from exc

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        healed = yielded = False
        while True:
            try:
                with self.engine.connect().execution_options(lcm_write=True) as conn, conn.begin():
                    yielded = True
                    yield conn
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
                    f"write to {self.location} failed: {_first_line(exc)}{cause}") from exc

    def _step(self, name: str) -> None:
        if self._on_write_step is not None:
            self._on_write_step(name)

    # ------------------------------------------------------------------ agents and sessions

    def _agent_pk(self, conn: Connection, agent: str, *, create: bool) -> int | None:
        _short_text("agent id", agent, 128)
        pk = self._agents.get(agent)
        if pk is not None:
            return pk
        pk = conn.execute(select(agents_t.c.id).where(agents_t.c.name == agent)).scalar()
        if pk is None and create:
            self.backend.insert_ignore(conn, agents_t, [{"name": agent, "created_at": time.time()}], ["name"])
            pk = conn.execute(select(agents_t.c.id).where(agents_t.c.name == agent)).scalar_one()
        if pk is not None:
            self._agents[agent] = pk
            self._agent_names[pk] = agent
        return pk

    def _session_select(self):
        return select(sessions_t, agents_t.c.name.label("agent_name")).join(
            agents_t, agents_t.c.id == sessions_t.c.agent_id
        )

    def _agent_name(self, conn: Connection, agent_pk: int) -> str:
        name = self._agent_names.get(agent_pk)
        if name is None:
            name = conn.execute(select(agents_t.c.name).where(agents_t.c.id == agent_pk)).scalar_one()
            self._agents[name] = agent_pk
            self._agent_names[agent_pk] = name
        return name

    @staticmethod
    def _session_record(row: Any) -> SessionRecord:
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
        )

    def get_or_create_session(
        self, agent: str, session_key: str, *, platform: str | None = None,
        conversation_id: str | None = None,
    ) -> SessionRecord:
        """The session ``session_key`` of ``agent``, created on first use.

        ``platform`` and ``conversation_id`` fill in values the session does not have yet;
        values already recorded are kept (a session's source never changes under its rows).
        """
        _short_text("session id", session_key, 255)
        if platform is not None:
            _short_text("platform", platform, 64)
        if conversation_id is not None:
            _short_text("conversation id", conversation_id, 255)
        found = self.find_session(agent, session_key)
        if found is not None and (platform is None or found.platform is not None) and (
            conversation_id is None or found.conversation_id is not None
        ):
            return found
        now = time.time()
        with self._write() as conn:
            agent_pk = self._agent_pk(conn, agent, create=True)
            self.backend.insert_ignore(conn, sessions_t, [{
                "agent_id": agent_pk, "session_key": session_key, "platform": platform,
                "conversation_id": conversation_id, "created_at": now, "updated_at": now,
                "last_seq": 0, "message_count": 0, "token_count": 0, "covered_seq": 0,
                "covered_tokens": 0,
            }], ["agent_id", "session_key"])
            where = and_(sessions_t.c.agent_id == agent_pk, sessions_t.c.session_key == session_key)
            for column, value in (("platform", platform), ("conversation_id", conversation_id)):
                if value is not None:
                    conn.execute(update(sessions_t).where(where, sessions_t.c[column].is_(None))
                                 .values({column: value}))
            row = conn.execute(self._session_select().where(where)).one()
        return self._session_record(row)

    def find_session(self, agent: str, session_key: str) -> SessionRecord | None:
        """The agent's session with this host key, or the one the key is an alias of."""
        with self._read() as conn:
            agent_pk = self._agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return None
            row = conn.execute(self._session_select().where(
                sessions_t.c.agent_id == agent_pk, sessions_t.c.session_key == session_key)).first()
            if row is None:
                row = conn.execute(self._session_select().join(
                    aliases_t, aliases_t.c.session_id == sessions_t.c.id).where(
                    aliases_t.c.agent_id == agent_pk, aliases_t.c.session_key == session_key)).first()
        return self._session_record(row) if row is not None else None

    def alias_session(self, agent: str, session_key: str, session_pk: int) -> SessionRecord:
        """Make ``session_key`` another name of the agent's session ``session_pk``.

        Idempotent. A key that already names a session of its own keeps naming it (returned
        unchanged): an alias never hides stored messages.
        """
        _short_text("session id", session_key, 255)
        existing = self.find_session(agent, session_key)
        if existing is not None:
            return existing
        target = self.get_session(session_pk, agent=agent)
        with self._write() as conn:
            self.backend.insert_ignore(conn, aliases_t, [{
                "agent_id": target.agent_pk, "session_key": session_key,
                "session_id": session_pk, "created_at": time.time()}], ["agent_id", "session_key"])
        found = self.find_session(agent, session_key)
        assert found is not None
        return found

    def session_keys(self, session_pk: int) -> list[str]:
        """Every host key of a session: its own first, then aliases in creation order."""
        with self._read() as conn:
            own = conn.execute(select(sessions_t.c.session_key).where(
                sessions_t.c.id == session_pk)).scalar()
            if own is None:
                return []
            aliases = conn.execute(select(aliases_t.c.session_key).where(
                aliases_t.c.session_id == session_pk).order_by(aliases_t.c.created_at)).scalars().all()
        return [own, *aliases]

    def set_host_view(self, session_pk: int, first_seq: int) -> None:
        """Record where the transcript lcm just handed the host starts (after its summary)."""
        with self._write() as conn:
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                host_view_seq=_int_arg("first_seq", first_seq, low=0)))

    def record_compaction(self, session_pk: int, outcome: Mapping[str, Any]) -> None:
        """Keep the last compaction's outcome with the session (status readers anywhere)."""
        with self._write() as conn:
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                last_compaction=codec.encode_json(dict(outcome))))

    def get_session(self, session_pk: int, *, agent: str | None = None) -> SessionRecord:
        """The session with this internal id (of ``agent`` when given) or NotFoundError."""
        with self._read() as conn:
            row = conn.execute(self._session_select().where(sessions_t.c.id == session_pk)).first()
        if row is None or (agent is not None and row._mapping["agent_name"] != agent):
            raise NotFoundError(f"session {session_pk} not found")
        return self._session_record(row)

    def list_sessions(self, agent: str, *, limit: int = 100, after_id: int | None = None) -> list[SessionRecord]:
        """The agent's sessions, oldest first, paged by internal id."""
        _int_arg("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        with self._read() as conn:
            agent_pk = self._agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return []
            stmt = self._session_select().where(sessions_t.c.agent_id == agent_pk)
            if after_id is not None:
                stmt = stmt.where(sessions_t.c.id > after_id)
            rows = conn.execute(stmt.order_by(sessions_t.c.id).limit(limit)).all()
        return [self._session_record(r) for r in rows]

    def list_agents(self) -> list[str]:
        with self._read() as conn:
            return list(conn.execute(select(agents_t.c.name).order_by(agents_t.c.id)).scalars())

    def _forks_select(self, parent_pk: int, fork_seq: int | None):
        stmt = self._session_select().where(sessions_t.c.parent_id == parent_pk)
        if fork_seq is not None:
            stmt = stmt.where(sessions_t.c.fork_seq == fork_seq)
        return stmt.order_by(sessions_t.c.id)

    def forks(self, parent_pk: int, fork_seq: int | None = None) -> list[SessionRecord]:
        """The forks of a session (those branching off after message ``fork_seq`` when given),
        oldest first."""
        with self._read() as conn:
            return [self._session_record(r) for r in conn.execute(self._forks_select(parent_pk, fork_seq))]

    def add_skipped(self, session_pk: int, count: int) -> None:
        """Count messages of the session that could not be stored at all."""
        if count > 0:
            with self._write() as conn:
                conn.execute(_add_skipped(session_pk, count))

    def remember_generated(self, agent: str, digests: Mapping[str, str | None]) -> None:
        """Record messages lcm generated for a context, by digest (``lcm.transcript.
        generated_digest``), each with the alignment key of the stored message it stands for
        (a cut copy) or None (lcm's own summary and acknowledgement)."""
        if not digests:
            return
        now = time.time()
        with self._write() as conn:
            agent_pk = self._agent_pk(conn, agent, create=True)
            self.backend.insert_ignore(conn, generated_t, [
                {"agent_id": agent_pk, "digest": d, "stands_for": key, "created_at": now}
                for d, key in digests.items()], ["agent_id", "digest"])

    def generated(self, agent: str, digests: Collection[str]) -> dict[str, str | None]:
        """Which of ``digests`` name messages lcm generated for this agent, with what each
        stands for (see ``remember_generated``)."""
        if not digests:
            return {}
        with self._read() as conn:
            agent_pk = self._agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return {}
            return dict(conn.execute(select(generated_t.c.digest, generated_t.c.stands_for).where(
                generated_t.c.agent_id == agent_pk, generated_t.c.digest.in_(list(set(digests))))).all())

    # ------------------------------------------------------------------ ingest

    def _prepare(self, message: Mapping[str, Any], recall_ids: frozenset[str] = frozenset()) -> PreparedMessage:
        enc = encode_message(message)
        body = index_body(searchable_text(message, recall_ids))
        same = enc.content_kind == CONTENT_TEXT and enc.content == body and enc.tool_calls is None
        payload = None
        if enc.payload is not None:
            raw = enc.payload.encode("utf-8")
            payload = (hashlib.sha256(raw).hexdigest(), zlib.compress(raw, 6), len(enc.payload))
        return PreparedMessage(
            encoded=enc,
            token_count=self.tokens.count_message_text(enc.text),
            search_text=None if same else body,
            body=body,
            payload=payload,
        )

    def prepare(self, messages: Sequence[Mapping[str, Any]],
                recall_call_ids: Collection[str] = ()) -> list[PreparedMessage]:
        """Encode messages for storage (the expensive part of a write: encoding, token
        counting, compression), outside any transaction. Raises InvalidMessageError for a
        message that cannot be stored at all."""
        recall = frozenset(recall_call_ids) | recall_call_ids_of(messages)
        return [self._prepare(m, recall) for m in messages]

    def append_messages(
        self,
        session_pk: int,
        messages: Sequence[Mapping[str, Any]],
        *,
        after_identity: str | None = None,
        now: float | None = None,
        expect_last_seq: int | None = None,
        timestamps: Sequence[float | None] | None = None,
        recall_call_ids: Collection[str] = (),
        prepared: Sequence[PreparedMessage] | None = None,
    ) -> AppendResult:
        """Store a turn's messages, each exactly once, in one transaction.

        ``messages`` is a contiguous run of the conversation that follows the stored message
        whose identity is ``after_identity`` (None: the start of the session). Messages already
        stored (same identity) are skipped; the rest get the next ``seq`` numbers. Invalid
        messages raise InvalidMessageError before anything is written.

        ``expect_last_seq``: the caller knows the session ended at that seq and is appending
        after it. If another writer appended since, StaleViewError is raised and nothing is
        written; if not, the per-message existence check is skipped (nothing can exist yet).

        ``timestamps``: one per message, the time to record (an import restoring an export);
        None entries fall back to the message's own ``timestamp`` key, then to now.

        ``recall_call_ids``: ids of calls to lcm's own tools made earlier in the conversation
        (calls in ``messages`` itself are found here): their results are stored but not indexed.
        ``prepared``: ``self.prepare(messages, ...)`` when the caller already has it.
        """
        if timestamps is not None and len(timestamps) != len(messages):
            raise ValueError(f"{len(timestamps)} timestamps for {len(messages)} messages")
        if prepared is None:
            prepared = self.prepare(messages, recall_call_ids)
        with self._write() as conn:
            if expect_last_seq is None:
                self._lock_session(conn, session_pk)
            return self._append(conn, session_pk, prepared, after_identity=after_identity, now=now,
                                expect_last_seq=expect_last_seq, timestamps=timestamps)

    def _append(self, conn: Connection, session_pk: int, prepared: Sequence[PreparedMessage], *,
                after_identity: str | None, now: float | None = None,
                expect_last_seq: int | None = None,
                timestamps: Sequence[float | None] | None = None) -> AppendResult:
        """``append_messages`` inside the caller's write transaction. Without
        ``expect_last_seq`` the caller holds the session row's lock."""
        identities: list[str] = []
        prev = after_identity or ""
        for p in prepared:
            prev = uid_identity(p.encoded.uid) if p.encoded.uid else chain_identity(prev, p.encoded.content_hash)
            identities.append(prev)
        ts_now = time.time() if now is None else now
        times = [_row_time(timestamps[i] if timestamps is not None else None,
                           p.encoded.host_timestamp, ts_now) for i, p in enumerate(prepared)]
        if expect_last_seq is not None:
            # The caller's view is current: nothing of this can be stored yet. Claim the seq
            # numbers first (one UPDATE that also locks the row), then insert.
            fresh = _first_of_each(identities)
            tokens = sum(prepared[i].token_count for i in fresh)
            session = conn.execute(_BUMP_SESSION, {
                "sid": session_pk, "expected": expect_last_seq, "new_last": expect_last_seq + len(fresh),
                "n": len(fresh), "tok": tokens, "now": ts_now}).first()
            if session is None:
                raise StaleViewError(f"session {session_pk} moved on (or is gone) since seq {expect_last_seq}")
            session = session._mapping
            known: dict[str, int] = {}
            first_seq = expect_last_seq
        else:
            session = conn.execute(select(sessions_t).where(sessions_t.c.id == session_pk)).one()._mapping
            known = dict(_fetch_in(
                conn, identities, lambda chunk: select(messages_t.c.identity, messages_t.c.id).where(
                    messages_t.c.session_id == session_pk, messages_t.c.identity.in_(chunk))))
            fresh = [i for i in _first_of_each(identities) if identities[i] not in known]
            first_seq = session["last_seq"]
        payload_ids = self._store_payloads(conn, [prepared[i].payload for i in fresh if prepared[i].payload])
        rows: list[dict[str, Any]] = []
        index: list[IndexRow] = []
        for seq, i in enumerate(fresh, start=first_seq + 1):
            p, e = prepared[i], prepared[i].encoded
            rows.append({
                "session_id": session_pk, "agent_id": session["agent_id"], "seq": seq,
                "identity": identities[i],
                "content_hash": e.content_hash, "role": e.role, "content_kind": e.content_kind,
                "content": e.content, "tool_calls": e.tool_calls, "tool_call_id": e.tool_call_id,
                "name": e.name, "extra": e.extra, "key_order": e.key_order,
                "payload_id": payload_ids[p.payload[0]] if p.payload else None,
                "search_text": p.search_text, "token_count": p.token_count,
                "ts": times[i], "problem": e.problem,
            })
            index.append(IndexRow(body=p.body, session_pk=session_pk,
                                  agent_pk=session["agent_id"], role=e.role))
        inserted = self.backend.insert_rows(conn, messages_t, rows, index, ("id", "identity"))
        if len(inserted) != len(rows):
            raise ConcurrentUpdateError(
                "another writer stored some of these messages concurrently; nothing was written")
        known.update({ident: row_id for row_id, ident in inserted})
        if rows and expect_last_seq is None:
            session = conn.execute(_BUMP_SESSION, {
                "sid": session_pk, "expected": first_seq, "new_last": first_seq + len(rows),
                "n": len(rows), "tok": sum(r["token_count"] for r in rows), "now": ts_now}).one()._mapping
        record = self._session_record({**session, "agent_name": self._agent_name(conn, session["agent_id"])})
        fresh_set = set(fresh)
        return AppendResult(
            session=record,
            store_ids=tuple(known[i] for i in identities),
            new_flags=tuple(i in fresh_set for i in range(len(identities))),
            last_identity=prev,
            token_counts=tuple(p.token_count for p in prepared),
        )

    @contextmanager
    def session_family(self, session_pk: int) -> Iterator["FamilyWriter"]:
        """One write transaction over a session and its forks, holding the lock of the
        family's root session: writers of one conversation (however many processes) run
        their alignment and appends one at a time against what is stored, while other
        conversations proceed in parallel (SQLite: its single write lock does this)."""
        root = session_pk
        with self._read() as conn:  # parent links never change once written
            for _ in range(MAX_FORK_DEPTH):
                parent = conn.execute(select(sessions_t.c.parent_id).where(
                    sessions_t.c.id == root)).scalar()
                if parent is None:
                    break
                root = parent
        with self._write() as conn:
            self._lock_session(conn, root)
            yield FamilyWriter(self, conn)

    def _lock_session(self, conn: Connection, session_pk: int) -> Mapping[str, Any]:
        row = conn.execute(
            select(sessions_t).where(sessions_t.c.id == session_pk).with_for_update()).first()
        if row is None:
            raise NotFoundError(f"session {session_pk} not found")
        return row._mapping

    def _store_payloads(self, conn: Connection, payloads: Iterable[tuple[str, bytes, int]]) -> dict[str, int]:
        unique = {sha: (data, size) for sha, data, size in payloads}
        if not unique:
            return {}
        now = time.time()
        self.backend.insert_ignore(conn, payloads_t, [
            {"sha256": sha, "codec": PAYLOAD_CODEC, "size_chars": size, "data": data, "created_at": now}
            for sha, (data, size) in unique.items()
        ], ["sha256"])
        rows = conn.execute(select(payloads_t.c.sha256, payloads_t.c.id).where(
            payloads_t.c.sha256.in_(list(unique)))).all()
        return {sha: pk for sha, pk in rows}

    # ------------------------------------------------------------------ reading messages

    _MESSAGE_COLUMNS = (
        messages_t.c.id, messages_t.c.session_id, messages_t.c.seq, messages_t.c.role,
        messages_t.c.ts, messages_t.c.token_count, messages_t.c.content_kind,
        messages_t.c.content, messages_t.c.tool_calls, messages_t.c.tool_call_id,
        messages_t.c.name, messages_t.c.extra, messages_t.c.key_order, messages_t.c.payload_id,
        messages_t.c.problem, sessions_t.c.session_key,
    )

    def _message_select(self):
        return select(*self._MESSAGE_COLUMNS).join(sessions_t, sessions_t.c.id == messages_t.c.session_id)

    def _records(self, conn: Connection, rows: Sequence[Any]) -> list[MessageRecord]:
        payloads = {pk: zlib.decompress(data).decode("utf-8") for pk, data in _fetch_in(
            conn, (r.payload_id for r in rows if r.payload_id is not None),
            lambda chunk: select(payloads_t.c.id, payloads_t.c.data).where(payloads_t.c.id.in_(chunk)))}
        out = []
        for r in rows:
            message = decode_message(
                role=r.role, content_kind=r.content_kind, content=r.content,
                tool_calls=r.tool_calls, tool_call_id=r.tool_call_id, name=r.name, extra=r.extra,
                key_order=r.key_order,
                payload=payloads.get(r.payload_id) if r.payload_id is not None else None,
            )
            out.append(MessageRecord(
                store_id=r.id, session_pk=r.session_id, session_key=r.session_key, seq=r.seq,
                role=r.role, ts=r.ts, token_count=r.token_count, message=message,
                problem=tuple(codec.decode_json(r.problem)) if r.problem else ()))
        return out

    def get_messages(
        self, session_pk: int, *, first_seq: int | None = None, last_seq: int | None = None,
        limit: int | None = None,
    ) -> list[MessageRecord]:
        """Messages of a session with ``first_seq <= seq <= last_seq``, in order."""
        stmt = self._message_select().where(messages_t.c.session_id == session_pk)
        if first_seq is not None:
            stmt = stmt.where(messages_t.c.seq >= first_seq)
        if last_seq is not None:
            stmt = stmt.where(messages_t.c.seq <= last_seq)
        stmt = stmt.order_by(messages_t.c.seq)
        if limit is not None:
            stmt = stmt.limit(_int_arg("limit", limit, low=1))
        with self._read() as conn:
            return self._records(conn, conn.execute(stmt).all())

    def page_messages(
        self, session_pk: int, *, after_store_id: int | None = None, limit: int = 100,
        roles: Sequence[str] | None = None,
    ) -> tuple[list[MessageRecord], int | None]:
        """One page of a session in store order, and the cursor for the next (None at the end)."""
        _int_arg("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        stmt = self._message_select().where(messages_t.c.session_id == session_pk)
        if after_store_id is not None:
            stmt = stmt.where(messages_t.c.id > after_store_id)
        if roles:
            stmt = stmt.where(messages_t.c.role.in_(list(roles)))
        with self._read() as conn:
            rows = conn.execute(stmt.order_by(messages_t.c.id).limit(limit + 1)).all()
            records = self._records(conn, rows[:limit])
        return records, (records[-1].store_id if len(rows) > limit else None)

    def latest_messages(self, session_pk: int, *, roles: Sequence[str], limit: int,
                        min_seq: int = 1, max_seq: int | None = None) -> list[MessageRecord]:
        """The session's newest messages with one of ``roles`` in ``min_seq..max_seq``, newest first."""
        _int_arg("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        stmt = self._message_select().where(
            messages_t.c.session_id == session_pk, messages_t.c.role.in_(list(roles)),
            messages_t.c.seq >= min_seq)
        if max_seq is not None:
            stmt = stmt.where(messages_t.c.seq <= max_seq)
        with self._read() as conn:
            return self._records(conn, conn.execute(stmt.order_by(messages_t.c.seq.desc()).limit(limit)).all())

    def get_message(self, store_id: int, *, agent: str) -> MessageRecord | None:
        """The message with this store id if it belongs to ``agent`` (else None: not found)."""
        found = self.get_messages_by_ids([store_id], agent=agent)
        return found[0] if found else None

    def get_messages_by_ids(self, store_ids: Sequence[int], *, agent: str) -> list[MessageRecord]:
        """The agent's messages with these ids, in the order given; others are left out."""
        ids = [i for i in store_ids if _storable_id(i)]
        if not ids:
            return []
        with self._read() as conn:
            agent_pk = self._agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return []
            rows = _fetch_in(conn, ids, lambda chunk: self._message_select().where(
                messages_t.c.id.in_(chunk), messages_t.c.agent_id == agent_pk))
            by_id = {r.store_id: r for r in self._records(conn, rows)}
        return [by_id[i] for i in ids if i in by_id]

    def _metas(self, rows: Sequence[Any]) -> list[MessageMeta]:
        return [MessageMeta(store_id=r.id, seq=r.seq, identity=r.identity,
                            content_hash=r.content_hash, role=r.role, token_count=r.token_count,
                            ts=r.ts, tool_call_id=r.tool_call_id) for r in rows]

    _META_COLUMNS = (messages_t.c.id, messages_t.c.seq, messages_t.c.identity,
                     messages_t.c.content_hash, messages_t.c.role, messages_t.c.token_count,
                     messages_t.c.ts, messages_t.c.tool_call_id)

    def tail(self, session_pk: int, count: int) -> list[MessageMeta]:
        """The newest ``count`` messages of a session (bodies not loaded), oldest first."""
        _int_arg("count", count, low=0)
        if count == 0:
            return []
        with self._read() as conn:
            rows = conn.execute(select(*self._META_COLUMNS).where(
                messages_t.c.session_id == session_pk).order_by(messages_t.c.seq.desc()).limit(count)).all()
        return self._metas(list(reversed(rows)))

    def _metas_select(self, session_pk: int, first_seq: int, last_seq: int):
        return select(*self._META_COLUMNS).where(
            messages_t.c.session_id == session_pk, messages_t.c.seq >= first_seq,
            messages_t.c.seq <= last_seq).order_by(messages_t.c.seq)

    @staticmethod
    def _seq_of_identity_select(session_pk: int, identity: str):
        return select(messages_t.c.seq).where(messages_t.c.session_id == session_pk,
                                               messages_t.c.identity == identity)

    def seq_of_identity(self, session_pk: int, identity: str) -> int | None:
        """The seq of the session's message with this identity (the unique index), or None."""
        with self._read() as conn:
            return conn.execute(self._seq_of_identity_select(session_pk, identity)).scalar()

    def message_metas(self, session_pk: int, *, first_seq: int, last_seq: int) -> list[MessageMeta]:
        """Messages ``first_seq..last_seq`` without bodies (for planning a compaction chunk)."""
        with self._read() as conn:
            return self._metas(conn.execute(self._metas_select(session_pk, first_seq, last_seq)).all())

    def raw_region(self, session_pk: int) -> RawRegion:
        """The messages not covered by a leaf: everything after the session's covered prefix.

        O(1): ``seq`` is gapless (1..last_seq, checked by the doctor), so the count is a
        difference of the session's counters.
        """
        s = self.get_session(session_pk)
        return RawRegion(session_pk=session_pk, first_seq=s.covered_seq + 1, last_seq=s.last_seq,
                         count=s.last_seq - s.covered_seq, tokens=s.raw_tokens)

    # ------------------------------------------------------------------ summaries

    def write_summary(self, session_pk: int, new: NewSummary, *, now: float | None = None) -> SummaryRecord:
        """Write a summary and its ordered edges atomically.

        Depth 0: ``source_ids`` are the store ids of the oldest raw messages of the session, in
        order, with no gap. Depth d > 0: the ids of uncondensed depth d-1 summaries of the
        session, in order, with no other node of that depth between them. Anything else raises
        IntegrityViolation and writes nothing; a concurrent writer that covered the same
        sources first raises ConcurrentUpdateError.
        """
        _int_arg("depth", new.depth, low=0)
        if not isinstance(new.content, str) or not new.content.strip():
            raise ValueError("a summary needs non-empty text")
        ids = list(new.source_ids)
        if not ids or len(set(ids)) != len(ids):
            raise ValueError("a summary needs at least one source, each listed once")
        content = codec.strip_unstorable(new.content)
        body = index_body(content)
        created = time.time() if now is None else now
        try:
            with self._write() as conn:
                session = self._lock_session(conn, session_pk)
                if new.depth == 0:
                    span = self._leaf_span(conn, session, ids)
                else:
                    span = self._condensed_span(conn, session_pk, new.depth, ids)
                row = {
                    "session_id": session_pk, "agent_id": session["agent_id"],
                    "depth": new.depth, "content": content,
                    "search_text": None if body == content else body,
                    "token_count": _int_arg("token_count", new.token_count, low=0),
                    "source_token_count": span["source_tokens"], "source_count": len(ids),
                    "first_seq": span["first_seq"], "last_seq": span["last_seq"],
                    "earliest_at": span["earliest"], "latest_at": span["latest"],
                    "expand_hint": codec.strip_unstorable(new.expand_hint or ""),
                    "kind": _short_text("kind", new.kind, 32), "model": new.model,
                    "parent_id": None,
                    "meta": codec.encode_json(new.meta) if new.meta is not None else None,
                    "created_at": created,
                }
                ix = IndexRow(body=body, session_pk=session_pk, agent_pk=session["agent_id"])
                [(node_id,)] = self.backend.insert_rows(conn, summaries_t, [row], [ix], ("id",))
                self._step("summary_inserted")
                column = "message_id" if new.depth == 0 else "child_id"
                conn.execute(edges_t.insert(), [
                    {"summary_id": node_id, "ordinal": i, column: source}
                    for i, source in enumerate(ids)])
                self._step("edges_inserted")
                if new.depth == 0:
                    conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                        covered_seq=span["last_seq"],
                        covered_tokens=sessions_t.c.covered_tokens + span["source_tokens"],
                        summary_count=sessions_t.c.summary_count + 1,
                        summary_tokens=sessions_t.c.summary_tokens + row["token_count"],
                        updated_at=created))
                else:
                    done = conn.execute(update(summaries_t).where(
                        summaries_t.c.id.in_(ids), summaries_t.c.parent_id.is_(None)).values(
                        parent_id=node_id)).rowcount
                    if done != len(ids):
                        raise ConcurrentUpdateError("another writer condensed these summaries first")
                    conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                        summary_count=sessions_t.c.summary_count + 1 - len(ids),
                        summary_tokens=sessions_t.c.summary_tokens + row["token_count"]
                        - span["source_tokens"], updated_at=created))
                record = self._summary_record(
                    conn.execute(select(summaries_t).where(summaries_t.c.id == node_id)).one())
        except IntegrityError as exc:
            raise ConcurrentUpdateError(
                f"these sources are already summarized (another writer got there first): "
                f"{_first_line(exc)}") from exc
        return record

    def _leaf_span(self, conn: Connection, session: Mapping[str, Any], ids: list[int]) -> dict[str, Any]:
        session_pk = session["id"]
        rows = _fetch_in(conn, ids, lambda chunk: select(
            messages_t.c.id, messages_t.c.seq, messages_t.c.token_count, messages_t.c.ts).where(
            messages_t.c.id.in_(chunk), messages_t.c.session_id == session_pk))
        if len(rows) != len(ids):
            raise IntegrityViolation("some source messages do not exist in this session")
        by_id = {r.id: r for r in rows}
        seqs = [by_id[i].seq for i in ids]
        if seqs != sorted(seqs):
            raise IntegrityViolation("leaf sources must be given in conversation order")
        if seqs[0] <= session["covered_seq"]:
            raise IntegrityViolation(
                f"message seq {seqs[0]} is already summarized (covered up to {session['covered_seq']})")
        between = conn.execute(select(func.count()).select_from(messages_t).where(
            messages_t.c.session_id == session_pk, messages_t.c.seq > session["covered_seq"],
            messages_t.c.seq <= seqs[-1])).scalar_one()
        if between != len(ids):
            raise IntegrityViolation(
                "a leaf must cover the oldest raw messages of the session without gaps")
        return {
            "first_seq": seqs[0], "last_seq": seqs[-1],
            "source_tokens": sum(r.token_count for r in rows),
            "earliest": min(r.ts for r in rows), "latest": max(r.ts for r in rows),
        }

    def _condensed_span(self, conn: Connection, session_pk: int, depth: int, ids: list[int]) -> dict[str, Any]:
        rows = _fetch_in(conn, ids, lambda chunk: select(summaries_t).where(
            summaries_t.c.id.in_(chunk), summaries_t.c.session_id == session_pk))
        if len(rows) != len(ids):
            raise IntegrityViolation("some source summaries do not exist in this session")
        by_id = {r.id: r for r in rows}
        children = [by_id[i] for i in ids]
        if any(c.depth != depth - 1 for c in children):
            raise IntegrityViolation(f"a depth-{depth} summary condenses depth-{depth - 1} summaries only")
        if any(c.parent_id is not None for c in children):
            raise IntegrityViolation("some source summaries are already condensed")
        firsts = [c.first_seq for c in children]
        if firsts != sorted(firsts):
            raise IntegrityViolation("condensed sources must be given in conversation order")
        between = conn.execute(select(func.count()).select_from(summaries_t).where(
            summaries_t.c.session_id == session_pk, summaries_t.c.depth == depth - 1,
            summaries_t.c.first_seq >= firsts[0], summaries_t.c.first_seq <= firsts[-1])).scalar_one()
        if between != len(ids):
            raise IntegrityViolation("condensed sources must be consecutive summaries of their depth")
        return {
            "first_seq": children[0].first_seq, "last_seq": max(c.last_seq for c in children),
            "source_tokens": sum(c.token_count for c in children),
            "earliest": min(c.earliest_at for c in children),
            "latest": max(c.latest_at for c in children),
        }

    @staticmethod
    def _summary_record(row: Any) -> SummaryRecord:
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

    def get_summary(self, node_id: int, *, agent: str | None = None) -> SummaryRecord | None:
        """The summary node (of ``agent`` when given), or None."""
        if not _storable_id(node_id):
            return None
        stmt = select(summaries_t).where(summaries_t.c.id == node_id)
        if agent is not None:
            stmt = stmt.join(agents_t, agents_t.c.id == summaries_t.c.agent_id).where(
                agents_t.c.name == agent)
        with self._read() as conn:
            row = conn.execute(stmt).first()
        return self._summary_record(row) if row is not None else None

    def summary_source_ids(self, node_id: int) -> list[int]:
        """The node's sources in order: message store ids (leaf) or child node ids."""
        with self._read() as conn:
            rows = conn.execute(select(edges_t.c.message_id, edges_t.c.child_id).where(
                edges_t.c.summary_id == node_id).order_by(edges_t.c.ordinal)).all()
        return [m if m is not None else c for m, c in rows]

    def expand_summary(self, node_id: int, *, offset: int = 0, limit: int | None = None,
                       ) -> tuple[list[MessageRecord] | list[SummaryRecord], int]:
        """A page of the node's sources in order (messages or child summaries), and their total."""
        _int_arg("offset", offset, low=0)
        with self._read() as conn:
            node = conn.execute(select(summaries_t.c.depth, summaries_t.c.source_count).where(
                summaries_t.c.id == node_id)).first()
            if node is None:
                raise NotFoundError(f"summary {node_id} not found")
            page = select(edges_t.c.message_id, edges_t.c.child_id).where(
                edges_t.c.summary_id == node_id).order_by(edges_t.c.ordinal).offset(offset)
            if limit is not None:
                page = page.limit(_int_arg("limit", limit, low=1))
            edges = conn.execute(page).all()
            if node.depth == 0:
                ids = [m for m, _ in edges]
                rows = _fetch_in(conn, ids, lambda chunk: self._message_select().where(
                    messages_t.c.id.in_(chunk)))
                by_id = {r.store_id: r for r in self._records(conn, rows)}
                return [by_id[i] for i in ids], node.source_count
            ids = [c for _, c in edges]
            rows = _fetch_in(conn, ids, lambda chunk: select(summaries_t).where(summaries_t.c.id.in_(chunk)))
            by_node = {r.id: self._summary_record(r) for r in rows}
            return [by_node[i] for i in ids], node.source_count

    def carry_summaries(self, session_pk: int, summary_ids: Sequence[int]) -> int:
        """Carry summaries of the agent's earlier sessions into ``session_pk`` (idempotent)."""
        session = self.get_session(session_pk)
        ids = list(dict.fromkeys(summary_ids))
        if not ids:
            return 0
        with self._write() as conn:
            self._lock_session(conn, session_pk)
            rows = _fetch_in(conn, ids, lambda chunk: select(
                summaries_t.c.id, summaries_t.c.agent_id, summaries_t.c.token_count).where(
                summaries_t.c.id.in_(chunk)))
            if len(rows) != len(ids) or any(r.agent_id != session.agent_pk for r in rows):
                raise NotFoundError("some summaries to carry do not exist for this agent")
            already = set(conn.execute(select(carried_t.c.summary_id).where(
                carried_t.c.session_id == session_pk)).scalars())
            fresh = [r for r in sorted(rows, key=lambda r: ids.index(r.id)) if r.id not in already]
            if not fresh:
                return 0
            start = conn.execute(select(func.coalesce(func.max(carried_t.c.ordinal), -1)).where(
                carried_t.c.session_id == session_pk)).scalar_one() + 1
            conn.execute(carried_t.insert(), [
                {"session_id": session_pk, "summary_id": r.id, "ordinal": start + i}
                for i, r in enumerate(fresh)])
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                summary_count=sessions_t.c.summary_count + len(fresh),
                summary_tokens=sessions_t.c.summary_tokens + sum(r.token_count for r in fresh)))
        return len(fresh)

    def compaction_view(self, session_pk: int) -> CompactionView:
        """The session with its uncondensed and carried summaries, in one read."""
        with self._read() as conn:
            row = conn.execute(self._session_select().where(sessions_t.c.id == session_pk)).first()
            if row is None:
                raise NotFoundError(f"session {session_pk} not found")
            uncondensed = conn.execute(select(summaries_t).where(
                summaries_t.c.session_id == session_pk, summaries_t.c.parent_id.is_(None)).order_by(
                summaries_t.c.depth.desc(), summaries_t.c.first_seq)).all()
            carried = conn.execute(select(summaries_t).join(
                carried_t, carried_t.c.summary_id == summaries_t.c.id).where(
                carried_t.c.session_id == session_pk).order_by(carried_t.c.ordinal)).all()
        return CompactionView(session=self._session_record(row),
                              uncondensed=tuple(self._summary_record(r) for r in uncondensed),
                              carried=tuple(self._summary_record(r) for r in carried))

    def carried_summaries(self, session_pk: int) -> list[SummaryRecord]:
        """Summaries carried into the session from earlier ones, in the order carried."""
        with self._read() as conn:
            rows = conn.execute(select(summaries_t).join(
                carried_t, carried_t.c.summary_id == summaries_t.c.id).where(
                carried_t.c.session_id == session_pk).order_by(carried_t.c.ordinal)).all()
        return [self._summary_record(r) for r in rows]

    def uncondensed_summaries(self, session_pk: int) -> list[SummaryRecord]:
        """The session's summaries not condensed into a parent, highest depth first, then oldest."""
        with self._read() as conn:
            rows = conn.execute(select(summaries_t).where(
                summaries_t.c.session_id == session_pk, summaries_t.c.parent_id.is_(None)).order_by(
                summaries_t.c.depth.desc(), summaries_t.c.first_seq)).all()
        return [self._summary_record(r) for r in rows]

    def summaries(self, session_pk: int, *, depth: int | None = None, limit: int = 100,
                  after_first_seq: int | None = None) -> list[SummaryRecord]:
        """The session's summaries (of one depth when given) in conversation order, paged."""
        _int_arg("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        stmt = select(summaries_t).where(summaries_t.c.session_id == session_pk)
        if depth is not None:
            stmt = stmt.where(summaries_t.c.depth == depth)
        if after_first_seq is not None:
            stmt = stmt.where(summaries_t.c.first_seq > after_first_seq)
        with self._read() as conn:
            rows = conn.execute(stmt.order_by(summaries_t.c.depth, summaries_t.c.first_seq).limit(limit)).all()
        return [self._summary_record(r) for r in rows]

    def depth_stats(self, session_pk: int) -> list[DepthStats]:
        """Per depth: node count, uncondensed count and summary tokens."""
        uncondensed = func.sum(case((summaries_t.c.parent_id.is_(None), 1), else_=0))
        with self._read() as conn:
            rows = conn.execute(select(
                summaries_t.c.depth, func.count(), uncondensed, func.sum(summaries_t.c.token_count)
            ).where(summaries_t.c.session_id == session_pk).group_by(summaries_t.c.depth).order_by(
                summaries_t.c.depth)).all()
        return [DepthStats(depth=d, count=c, uncondensed=int(u or 0), tokens=int(t or 0))
                for d, c, u, t in rows]

    # ------------------------------------------------------------------ search

    def _search_spec(self, conn: Connection, query: str, agent: str, session_pk: int | None,
                     sort: str, limit: int, **filters: Any) -> SearchSpec | None:
        if sort not in SORT_MODES:
            raise ValueError(f"sort must be one of {', '.join(SORT_MODES)}, got {sort!r}")
        _int_arg("limit", limit, low=1, high=MAX_SEARCH_LIMIT)
        agent_pk = self._agent_pk(conn, agent, create=False)
        if agent_pk is None:
            return None
        if session_pk is not None:
            owner = conn.execute(select(sessions_t.c.agent_id).where(sessions_t.c.id == session_pk)).scalar()
            if owner != agent_pk:
                raise NotFoundError(f"session {session_pk} not found")
        return SearchSpec(query=parse_query(query), agent_pk=agent_pk, session_pk=session_pk,
                          ranked=sort != "recency", limit=limit, **filters)

    @staticmethod
    def _order(candidates: list[Candidate], sort: str, limit: int) -> list[Candidate]:
        if sort == "recency":
            return candidates[:limit]
        by_score = sorted(candidates, key=lambda c: (-(c.score or 0.0), -c.id))
        if sort == "relevance":
            return by_score[:limit]
        # Reciprocal-rank fusion of the relevance order and the recency order (candidates come
        # newest first), so neither score scale dominates and both backends fuse alike.
        rel_rank = {c.id: i for i, c in enumerate(by_score)}
        fused = sorted(enumerate(candidates), key=lambda ic: -(
            1.0 / (HYBRID_RRF_K + rel_rank[ic[1].id]) + 1.0 / (HYBRID_RRF_K + ic[0])))
        return [c for _, c in fused[:limit]]

    def search_messages(
        self, query: str, *, agent: str, session_pk: int | None = None,
        roles: Sequence[str] = (), platform: str | None = None, time_from: float | None = None,
        time_to: float | None = None, sort: str = "recency", limit: int = 10,
    ) -> SearchResult:
        """Full-text search over the agent's raw messages (one session, or all when None).

        ``recency``: newest matches first, exact. ``relevance`` / ``hybrid``: the newest
        ``RANK_WINDOW`` matches, ranked (BM25 / ts_rank_cd) or fused with recency; the result
        says when more matched than were ranked (``candidates_clamped``).
        """
        with self._read() as conn:
            spec = self._search_spec(conn, query, agent, session_pk, sort, limit,
                                     roles=tuple(roles), platform=platform,
                                     time_from=time_from, time_to=time_to)
            if spec is None or spec.query.is_empty:
                return SearchResult(hits=[], notes=spec.query.notes if spec else ())
            candidates, clamped = self.backend.search_messages(conn, spec)
            chosen = self._order(candidates, sort, limit)
            rows = _fetch_in(conn, (c.id for c in chosen), lambda chunk: self._message_select(
            ).add_columns(messages_t.c.search_text).where(
                messages_t.c.id.in_(chunk), messages_t.c.agent_id == spec.agent_pk))
            # Snippets come from the message's own text; a large payload is not decompressed
            # for that: its indexed excerpt is used instead.
            inline = [r for r in rows if r.payload_id is None]
            texts = {rec.store_id: message_text(rec.message) for rec in self._records(conn, inline)}
            texts.update({r.id: r.search_text or "" for r in rows if r.payload_id is not None})
            by_id = {r.id: r for r in rows}
        hits = []
        for c in chosen:
            r = by_id.get(c.id)
            if r is None:
                continue
            hits.append(SearchHit(kind="message", id=r.id, session_pk=r.session_id,
                                  session_key=r.session_key, ts=r.ts, role=r.role, score=c.score,
                                  snippet=make_snippet(texts[r.id], spec.query)))
        return SearchResult(hits=hits, candidates_clamped=clamped, notes=spec.query.notes)

    def search_summaries(
        self, query: str, *, agent: str, session_pk: int | None = None, sort: str = "recency",
        limit: int = 10, time_from: float | None = None, time_to: float | None = None,
    ) -> SearchResult:
        """Full-text search over the agent's summary nodes (one session, or all when None)."""
        with self._read() as conn:
            spec = self._search_spec(conn, query, agent, session_pk, sort, limit,
                                     time_from=time_from, time_to=time_to)
            if spec is None or spec.query.is_empty:
                return SearchResult(hits=[], notes=spec.query.notes if spec else ())
            candidates, clamped = self.backend.search_summaries(conn, spec)
            chosen = self._order(candidates, sort, limit)
            rows = _fetch_in(conn, (c.id for c in chosen), lambda chunk: select(
                summaries_t, sessions_t.c.session_key).join(
                sessions_t, sessions_t.c.id == summaries_t.c.session_id).where(
                summaries_t.c.id.in_(chunk), summaries_t.c.agent_id == spec.agent_pk))
            by_id = {r.id: r for r in rows}
        hits = []
        for c in chosen:
            r = by_id.get(c.id)
            if r is None:
                continue
            hits.append(SearchHit(kind="summary", id=r.id, session_pk=r.session_id,
                                  session_key=r.session_key, ts=r.latest_at, depth=r.depth,
                                  score=c.score, snippet=make_snippet(r.content, spec.query)))
        return SearchResult(hits=hits, candidates_clamped=clamped, notes=spec.query.notes)

    # ------------------------------------------------------------------ integrity

    def check_schema(self) -> CheckResult:
        state = self._schema_state()
        if state.status == "current":
            return CheckResult("schema_version", "ok", f"schema at {state.head} (head)")
        return CheckResult("schema_version", "fail",
                           f"schema at {state.current or 'nothing'}, expected {state.head}: "
                           "run `lcm db upgrade`")

    def integrity_checks(self, *, deep: bool = False) -> list[CheckResult]:
        """Every storage check the doctor reports. ``deep`` re-verifies the whole search index."""
        results = [self.check_schema()]
        with self._read() as conn:
            results.extend(self.backend.check_database(conn))
            results.extend(self.backend.check_search_index(conn, deep))
            results.extend(self._check_counters(conn))
            results.extend(self._check_coverage(conn))
            results.extend(self._check_edges(conn))
            results.append(self._check_duplicates(conn))
            results.append(self._check_summary_sizes(conn))
        return results

    def _check_counters(self, conn: Connection) -> list[CheckResult]:
        m = messages_t
        actual = select(m.c.session_id, func.count().label("n"), func.max(m.c.seq).label("top"),
                        func.sum(m.c.token_count).label("tok")).group_by(m.c.session_id).subquery()
        bad = conn.execute(select(sessions_t.c.id).outerjoin(
            actual, actual.c.session_id == sessions_t.c.id).where(
            (sessions_t.c.message_count != func.coalesce(actual.c.n, 0))
            | (sessions_t.c.last_seq != func.coalesce(actual.c.top, 0))
            | (sessions_t.c.token_count != func.coalesce(actual.c.tok, 0))
            | (sessions_t.c.message_count != sessions_t.c.last_seq))).scalars().all()
        out = [CheckResult(
            "session_counters", "fail" if bad else "ok",
            f"message counters disagree with the rows in sessions {bad[:10]}" if bad
            else "message counts, gapless sequence numbers and token totals match the rows")]
        own = select(summaries_t.c.session_id, func.count().label("n"),
                     func.sum(summaries_t.c.token_count).label("tok")).where(
            summaries_t.c.parent_id.is_(None)).group_by(summaries_t.c.session_id).subquery()
        brought = select(carried_t.c.session_id, func.count().label("n"),
                         func.sum(summaries_t.c.token_count).label("tok")).join(
            summaries_t, summaries_t.c.id == carried_t.c.summary_id).group_by(
            carried_t.c.session_id).subquery()
        drift = conn.execute(select(sessions_t.c.id).outerjoin(
            own, own.c.session_id == sessions_t.c.id).outerjoin(
            brought, brought.c.session_id == sessions_t.c.id).where(
            (sessions_t.c.summary_count != func.coalesce(own.c.n, 0) + func.coalesce(brought.c.n, 0))
            | (sessions_t.c.summary_tokens != func.coalesce(own.c.tok, 0) + func.coalesce(brought.c.tok, 0))
        )).scalars().all()
        out.append(CheckResult(
            "summary_counters", "fail" if drift else "ok",
            f"summary counters disagree with the DAG in sessions {drift[:10]}" if drift
            else "each session's summary count and tokens match its uncondensed and carried summaries"))
        misfiled = sum(conn.execute(select(func.count()).select_from(t).join(
            sessions_t, sessions_t.c.id == t.c.session_id).where(
            t.c.agent_id != sessions_t.c.agent_id)).scalar_one() for t in (messages_t, summaries_t))
        out.append(CheckResult(
            "agent_scope", "fail" if misfiled else "ok",
            f"{misfiled} rows carry another agent than their session's" if misfiled
            else "every row carries its session's agent"))
        return out

    def _check_coverage(self, conn: Connection) -> list[CheckResult]:
        """Every message is raw or in exactly one leaf; leaves cover each session's prefix."""
        m, e, s = messages_t, edges_t, summaries_t
        problems: list[str] = []
        covered = select(m.c.session_id, func.count().label("n"),
                         func.sum(m.c.token_count).label("tok"), func.max(m.c.seq).label("top")).join(
            e, e.c.message_id == m.c.id).group_by(m.c.session_id).subquery()
        prefix = select(m.c.session_id, func.count().label("n")).join(
            sessions_t, sessions_t.c.id == m.c.session_id).where(
            m.c.seq <= sessions_t.c.covered_seq).group_by(m.c.session_id).subquery()
        rows = conn.execute(select(
            sessions_t.c.id, sessions_t.c.covered_seq, sessions_t.c.covered_tokens,
            func.coalesce(covered.c.n, 0), func.coalesce(covered.c.tok, 0),
            func.coalesce(covered.c.top, 0), func.coalesce(prefix.c.n, 0)).outerjoin(
            covered, covered.c.session_id == sessions_t.c.id).outerjoin(
            prefix, prefix.c.session_id == sessions_t.c.id)).all()
        for sid, cseq, ctok, n_cov, tok_cov, top_cov, n_prefix in rows:
            if n_cov != n_prefix or top_cov != cseq:
                problems.append(f"session {sid}: {n_cov} messages in leaves but {n_prefix} "
                                f"up to the covered mark (seq {cseq})")
            elif tok_cov != ctok:
                problems.append(f"session {sid}: covered token total {ctok} != {tok_cov}")
        cross = conn.execute(select(func.count()).select_from(e).join(
            s, s.c.id == e.c.summary_id).join(m, m.c.id == e.c.message_id).where(
            m.c.session_id != s.c.session_id)).scalar_one()
        if cross:
            problems.append(f"{cross} leaf edges point at another session's messages")
        leaves = select(e.c.summary_id, func.count().label("n"), func.min(m.c.seq).label("lo"),
                        func.max(m.c.seq).label("hi")).join(m, m.c.id == e.c.message_id).group_by(
            e.c.summary_id).subquery()
        broken = conn.execute(select(s.c.id).join(leaves, leaves.c.summary_id == s.c.id).where(
            (leaves.c.n != s.c.source_count) | (leaves.c.lo != s.c.first_seq)
            | (leaves.c.hi != s.c.last_seq))).scalars().all()
        empty_leaves = conn.execute(select(s.c.id).where(s.c.depth == 0, ~select(e.c.summary_id).where(
            e.c.summary_id == s.c.id).exists())).scalars().all()
        if broken or empty_leaves:
            problems.append(f"leaves whose edges disagree with their recorded range: "
                            f"{(broken + empty_leaves)[:10]}")
        gaps = conn.execute(select(s.c.id).join(leaves, leaves.c.summary_id == s.c.id).where(
            leaves.c.n != select(func.count()).select_from(m).where(
                m.c.session_id == s.c.session_id, m.c.seq >= leaves.c.lo,
                m.c.seq <= leaves.c.hi).scalar_subquery())).scalars().all()
        if gaps:
            problems.append(f"leaves not covering a contiguous run: {gaps[:10]}")
        return [CheckResult("coverage", "fail" if problems else "ok",
                            "; ".join(problems[:5]) if problems else
                            "every message is raw or in exactly one leaf; leaves are contiguous")]

    def _check_edges(self, conn: Connection) -> list[CheckResult]:
        """Condensed nodes: children one depth lower, same session, consecutive, linked back."""
        e, s = edges_t, summaries_t
        child = s.alias("child")
        problems = []
        orphans = conn.execute(select(func.count()).select_from(e).outerjoin(
            s, s.c.id == e.c.summary_id).where(s.c.id.is_(None))).scalar_one()
        if orphans:
            problems.append(f"{orphans} edges from missing summaries")
        wrong = conn.execute(select(s.c.id).join(e, e.c.summary_id == s.c.id).join(
            child, child.c.id == e.c.child_id).where(
            (child.c.depth != s.c.depth - 1) | (child.c.session_id != s.c.session_id)
            | (child.c.parent_id.is_(None)) | (child.c.parent_id != s.c.id)).distinct()).scalars().all()
        if wrong:
            problems.append(f"condensed nodes with inconsistent children: {wrong[:10]}")
        dangling = conn.execute(select(child.c.id).where(child.c.parent_id.is_not(None), ~select(
            e.c.child_id).where(e.c.child_id == child.c.id).exists())).scalars().all()
        if dangling:
            problems.append(f"summaries marked condensed without an edge: {dangling[:10]}")
        kids = select(e.c.summary_id, func.count().label("n")).group_by(e.c.summary_id).subquery()
        miscount = conn.execute(select(s.c.id).outerjoin(kids, kids.c.summary_id == s.c.id).where(
            func.coalesce(kids.c.n, 0) != s.c.source_count)).scalars().all()
        if miscount:
            problems.append(f"nodes whose edge count differs from source_count: {miscount[:10]}")
        return [CheckResult("dag_edges", "fail" if problems else "ok",
                            "; ".join(problems) if problems else
                            "edges are consistent: no orphans, depth+1 parents, one parent each")]

    def _check_duplicates(self, conn: Connection) -> CheckResult:
        """Messages stored twice in one session. A tool result answers one call id, which a
        model issues once: the same result for the same id twice in a session is a duplicate
        (what two writers on one session produced before ingest aligned under a lock). Text
        alone ("ok", "ok") is never taken for a duplicate: people repeat themselves."""
        m = messages_t
        dup = select(m.c.session_id, func.count().label("n")).where(
            m.c.role == "tool", m.c.tool_call_id.is_not(None)).group_by(
            m.c.session_id, m.c.tool_call_id, m.c.content_hash).having(func.count() > 1).subquery()
        rows = conn.execute(select(dup.c.session_id, func.sum(dup.c.n - 1)).group_by(
            dup.c.session_id).order_by(dup.c.session_id).limit(10)).all()
        if not rows:
            return CheckResult("duplicate_messages", "ok",
                               "no tool result is stored twice for the same call in a session")
        listed = ", ".join(f"session {sid}: {int(extra)}" for sid, extra in rows)
        return CheckResult("duplicate_messages", "warn",
                           f"tool results stored twice for the same call ({listed}): written by "
                           "two hosts on one session before lcm aligned writers under a lock; "
                           "nothing is lost, the copies are extra")

    def _check_summary_sizes(self, conn: Connection) -> CheckResult:
        s = summaries_t
        n = conn.execute(select(func.count()).select_from(s).where(
            s.c.token_count >= s.c.source_token_count)).scalar_one()
        return CheckResult("summary_sizes", "warn" if n else "ok",
                           f"{n} summaries are not shorter than their sources" if n
                           else "every summary is shorter than what it summarizes")

    def backup(self, destination: str | None = None) -> str | None:
        """A consistent copy of a SQLite store (default: next to it, timestamped); None on
        PostgreSQL, where backups belong to the server's tools."""
        if destination is None and self.backend_name == "sqlite":
            stamp = time.strftime("%Y%m%d-%H%M%S")
            destination = f"{self.url.database}.bak-{stamp}"
        return self.backend.backup(self.engine, destination) if destination else None

    def remove_duplicate_runs(self) -> list[dict[str, Any]]:
        """Remove the copies ``_check_duplicates`` reports, where that is safe.

        A copy is the later of two runs of messages with the same substance, found around a tool
        result stored twice for one call (a call id is issued once): the run extends either way
        while each message equals the one a fixed distance before it. Only a run that is still
        raw (not under a summary) is removed; the messages after it move up so ``seq`` stays
        gapless, and the session's counters follow. Each session is repaired in its own locked
        transaction. Returns what was done per session, runs left alone included (with why)."""
        m = messages_t
        with self._read() as conn:
            sessions = list(conn.execute(select(m.c.session_id).where(
                m.c.role == "tool", m.c.tool_call_id.is_not(None)).group_by(
                m.c.session_id, m.c.tool_call_id, m.c.content_hash).having(
                func.count() > 1)).scalars())
        report = []
        for session_pk in dict.fromkeys(sessions):
            with self._write() as conn:
                session = self._lock_session(conn, session_pk)
                rows = conn.execute(select(m.c.id, m.c.seq, m.c.content_hash, m.c.role,
                                           m.c.tool_call_id, m.c.token_count).where(
                    m.c.session_id == session_pk).order_by(m.c.seq)).all()
                runs, kept = _duplicate_runs(rows, session["covered_seq"])
                doomed = [r.id for lo, hi in runs for r in rows[lo:hi + 1]]
                if doomed:
                    gone = set(doomed)
                    for i in range(0, len(doomed), IN_CHUNK):  # raw messages: no summary edges
                        conn.execute(m.delete().where(m.c.id.in_(doomed[i:i + IN_CHUNK])))
                    survivors = [r for r in rows if r.id not in gone]
                    moved = [{"rid": r.id, "nseq": seq} for seq, r in enumerate(survivors, start=1)
                             if r.seq != seq]
                    # Two steps, so no (session, seq) pair is ever taken twice mid-way.
                    conn.execute(update(m).where(m.c.session_id == session_pk, m.c.seq > rows[runs[0][0]].seq)
                                 .values(seq=-m.c.seq))
                    conn.execute(update(m).where(m.c.id == bindparam("rid")).values(seq=bindparam("nseq")), moved)
                    count = len(survivors)
                    conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                        last_seq=count, message_count=count,
                        token_count=sessions_t.c.token_count - sum(r.token_count for r in rows if r.id in gone),
                        host_view_seq=case((sessions_t.c.host_view_seq > count + 1, count + 1),
                                           else_=sessions_t.c.host_view_seq)))
                report.append({"session": session_pk, "removed": len(doomed),
                               "runs": [[rows[lo].seq, rows[hi].seq] for lo, hi in runs],
                               "left_alone": kept})
        return report

    def rebuild_search_index(self) -> dict[str, int]:
        """Re-index every message and summary (the doctor's repair)."""
        with self._write() as conn:
            return self.backend.rebuild_search_index(conn)

    def optimize(self) -> None:
        """Refresh the query planner's statistics; call after a bulk import."""
        with self.engine.connect() as conn:
            self.backend.optimize(conn)
            conn.commit()

    def stats(self) -> dict[str, Any]:
        """Store-wide counts and size (for status output)."""
        with self._read() as conn:
            counts = {
                name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for name, t in (("agents", agents_t), ("sessions", sessions_t),
                                ("messages", messages_t), ("summaries", summaries_t),
                                ("payloads", payloads_t))
            }
            size = self.backend.database_size(conn)
        return {**counts, "bytes": size, "backend": self.backend_name, "database": self.location}


class FamilyWriter:
    """Reads and writes inside ``Store.session_family``'s transaction (the family's lock held).

    Everything ingest decides (which messages are stored, where the host's transcript diverges,
    which fork it continues) is decided from what these methods read, under that lock."""

    FORK_SEPARATOR = "/fork-"

    def __init__(self, store: Store, conn: Connection):
        self.store = store
        self.conn = conn

    def session(self, session_pk: int) -> SessionRecord:
        """The session, its row locked until the transaction ends (a concurrent fast-path
        append to it waits, then finds the session moved on)."""
        row = self.conn.execute(self.store._session_select().where(
            sessions_t.c.id == session_pk).with_for_update(of=sessions_t)).first()
        if row is None:
            raise NotFoundError(f"session {session_pk} not found")
        return self.store._session_record(row)

    def metas(self, session_pk: int, first_seq: int, last_seq: int) -> list[MessageMeta]:
        return self.store._metas(self.conn.execute(
            self.store._metas_select(session_pk, first_seq, last_seq)).all())

    def seq_of_identity(self, session_pk: int, identity: str) -> int | None:
        return self.conn.execute(Store._seq_of_identity_select(session_pk, identity)).scalar()

    def forks(self, parent_pk: int, fork_seq: int) -> list[SessionRecord]:
        """The forks of ``parent_pk`` that branch off after its message ``fork_seq``, oldest first."""
        return [self.store._session_record(r)
                for r in self.conn.execute(self.store._forks_select(parent_pk, fork_seq))]

    def append(self, session_pk: int, prepared: Sequence[PreparedMessage], *,
               after_identity: str | None) -> AppendResult:
        self.session(session_pk)
        return self.store._append(self.conn, session_pk, prepared, after_identity=after_identity)

    def create_fork(self, parent: SessionRecord, fork_seq: int) -> SessionRecord:
        """A new session of the parent's agent that continues the parent's conversation after
        its message ``fork_seq`` differently. Its key is the parent's with ``/fork-N``."""
        taken = self.conn.execute(select(func.count()).select_from(sessions_t).where(
            sessions_t.c.parent_id == parent.id)).scalar_one()
        now = time.time()
        for n in range(taken + 1, taken + 1000):
            suffix = f"{self.FORK_SEPARATOR}{n}"
            key = parent.session_key[: 255 - len(suffix)] + suffix
            exists = self.conn.execute(select(sessions_t.c.id).where(
                sessions_t.c.agent_id == parent.agent_pk, sessions_t.c.session_key == key)).first()
            if exists is None:
                break
        else:  # pragma: no cover - a thousand sessions named like forks
            raise IntegrityViolation(f"no free fork name for session {parent.session_key!r}")
        [pk] = self.conn.execute(sessions_t.insert().values(
            agent_id=parent.agent_pk, session_key=key, platform=parent.platform,
            conversation_id=parent.conversation_id, created_at=now, updated_at=now, last_seq=0,
            message_count=0, token_count=0, covered_seq=0, covered_tokens=0,
            parent_id=parent.id, fork_seq=fork_seq).returning(sessions_t.c.id)).one()
        return self.session(pk)

    def add_skipped(self, session_pk: int, count: int) -> None:
        if count > 0:
            self.conn.execute(_add_skipped(session_pk, count))


def _duplicate_runs(rows: Sequence[Any], covered_seq: int) -> tuple[list[tuple[int, int]], list[str]]:
    """(index ranges of later copies safe to remove, why other copies were left alone).

    ``rows`` are one session's messages in seq order."""
    first_at: dict[tuple[str, str], int] = {}
    runs: list[tuple[int, int]] = []
    kept: list[str] = []
    taken = -1  # index up to which runs were already found
    for i, r in enumerate(rows):
        if r.role != "tool" or r.tool_call_id is None:
            continue
        key = (r.tool_call_id, r.content_hash)
        if key not in first_at:
            first_at[key] = i
            continue
        if i <= taken:
            continue
        d = i - first_at[key]
        lo = hi = i
        while hi + 1 < len(rows) and hi + 1 - lo < d and rows[hi + 1].content_hash == rows[hi + 1 - d].content_hash:
            hi += 1
        while lo - 1 - d >= 0 and lo - 1 > taken and hi - (lo - 1) < d and \
                rows[lo - 1].content_hash == rows[lo - 1 - d].content_hash:
            lo -= 1
        taken = hi
        if rows[lo].seq <= covered_seq:
            kept.append(f"messages {rows[lo].seq}-{rows[hi].seq}: already summarized")
            continue
        runs.append((lo, hi))
    return runs, kept


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__
