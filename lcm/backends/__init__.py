"""Dialect-specific storage code. Nothing outside this package and the migrations knows which
database is underneath: the repository (``lcm/store.py``) calls a :class:`Backend`.

One class per dialect, one method per documented difference:

==========================  ==============================  ===================================
difference                  SQLite (``sqlite.py``)          PostgreSQL (``postgres.py``)
==========================  ==============================  ===================================
connection setup            WAL, busy timeout, FKs on,      idle ping, timeouts, names,
                            ``BEGIN IMMEDIATE`` for writes  PgBouncer detection
search index upkeep         FTS5 external content, triggers ``search_vector`` written at insert
search query                FTS5 ``MATCH``; BM25 over the   ``@@ tsquery`` + ``ts_rank_cd``
                            window (``window_rank.py``)
integrity                   ``quick_check``, FTS5           catalog checks, vector recompute
                            ``integrity-check``
==========================  ==============================  ===================================
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import ColumnElement, Connection, Engine, Select, Table, TextClause, text
from sqlalchemy.engine import URL

from lcm.config import install_command
from lcm.errors import ConfigError
from lcm.records import Candidate, CheckResult
from lcm.textindex import Query, Term

#: Candidate rows considered when a relevance order or a post-filter (time range, platform)
#: applies: the newest matches, so the work per search is bounded whatever the history size.
RANK_WINDOW = 1000
FILTER_SCAN_CAP = 20_000
#: Ids per statement where a backend reads an id list as an ``IN`` list of parameters.
ID_LIST_CHUNK = 500

#: ``ids_in(column)``: the condition that ``column`` is one of a statement's ids
#: (``Backend.rows_by_ids``).
IdsIn = Callable[[ColumnElement[Any]], ColumnElement[bool]]

_ROW_TYPES: dict[tuple[str, ...], Any] = {}


def named_rows(description: Sequence[Any], rows: Iterable[Sequence[Any]]) -> list[Any]:
    """A driver cursor's rows as named tuples (read by attribute, as SQLAlchemy's rows are),
    one tuple type per column list."""
    names = tuple(d[0] for d in description)
    row_type = _ROW_TYPES.get(names)
    if row_type is None:
        row_type = _ROW_TYPES.setdefault(names, namedtuple("Row", names))
    return [row_type._make(r) for r in rows]


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """A search as the backends execute it."""

    query: Query
    agent_pk: int
    session_pk: int | None  # None: every session of the agent
    roles: tuple[str, ...] = ()
    time_from: float | None = None
    time_to: float | None = None
    platform: str | None = None
    ranked: bool = False  # True: return the newest `window` matches with scores
    limit: int = 10
    window: int = RANK_WINDOW
    scan_cap: int = FILTER_SCAN_CAP
    #: Search the stemmed index (porter / PostgreSQL's english configuration: "moved" finds
    #: "move") instead of the exact one: the any-word part of a search.
    stemmed: bool = False
    #: The hits carry snippets (False: the caller reads the rows it wants itself, as auto-recall
    #: does; the backends ignore it).
    snippets: bool = True
    #: What the backend learned of the scope during this search (its id range, its row count),
    #: keyed by what it describes. Copies made with ``dataclasses.replace`` share it, so the
    #: dozens of queries of one search (the any-word part's terms and pairs) look the scope up
    #: once; a new search starts with a new spec, so nothing is kept past one transaction. Also
    #: what one search learns about the whole table: its newest id (:meth:`newest_id`), a
    #: word's document frequency (SQLite).
    scope_memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, compare=False, repr=False)

    def newest_id(self, conn: Connection, table: str) -> int:
        """The newest row id of ``table`` (0 when empty), once per search."""
        return int(self.remembered(("newest_id", table), lambda: conn.execute(text(
            f"SELECT coalesce(max(id), 0) FROM {table}")).scalar_one()))

    def remembered(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, once per search and ``key`` (see ``scope_memo``)."""
        if key not in self.scope_memo:
            self.scope_memo[key] = compute()
        return self.scope_memo[key]

    @property
    def has_post_filters(self) -> bool:
        return self.time_from is not None or self.time_to is not None or self.platform is not None


def post_filters(spec: SearchSpec, ts_column: str) -> tuple[list[str], dict[str, Any]]:
    """SQL conditions (row alias ``t``, session alias ``s``) for a search's time and platform
    filters, and their parameters."""
    filters: list[str] = []
    params: dict[str, Any] = {}
    if spec.time_from is not None:
        filters.append(f"t.{ts_column} >= :t0")
        params["t0"] = spec.time_from
    if spec.time_to is not None:
        filters.append(f"t.{ts_column} <= :t1")
        params["t1"] = spec.time_to
    if spec.platform is not None:
        filters.append("s.platform = :platform")
        params["platform"] = spec.platform
    return filters, params


def role_token(role: str) -> str:
    """The scope token for a role: hex of its UTF-8 bytes (any role string becomes one token)."""
    return "r" + role.encode("utf-8").hex()


@dataclass(frozen=True, slots=True)
class IndexRow:
    """What the search index needs for one row besides the row itself."""

    body: str
    session_pk: int
    agent_pk: int
    role: str | None = None


#: Places per statement of :meth:`Backend.messages_at` (its portable form).
PLACES_PER_STATEMENT = 64


@functools.cache
def _messages_at_statement() -> TextClause:
    """The portable statement of :meth:`Backend.messages_at`: an OR of (session, seq)
    equalities, which both databases answer by one search of ``UNIQUE(session_id, seq)`` per
    place (SQLite reads the whole table for a row-value ``IN``). Written once as text: an OR
    expression built per call cost more in Python (building it and computing its cache key)
    than its index searches."""
    places = " OR ".join(f"(session_id = :s{i} AND seq = :q{i})" for i in range(PLACES_PER_STATEMENT))
    return text(f"SELECT id, session_id, seq, ts FROM lcm_messages WHERE {places}")


class Backend(ABC):
    """Everything that differs between the databases lcm supports."""

    name: str
    #: Pool settings for the shared, process-wide engine.
    pool_options: dict[str, Any] = {}
    #: Run reads without BEGIN/COMMIT. On PostgreSQL (READ COMMITTED) a transaction gives a
    #: read nothing but two more round trips; on SQLite a read transaction is a free snapshot.
    autocommit_reads: bool = False

    def __init__(self) -> None:
        #: Statements built or compiled once, by key: inserts (``insert_rows``) and what a
        #: backend runs on the driver.
        self._inserts: dict[tuple[Any, ...], Any] = {}

    #: Whether a streaming read replica can serve lag-tolerant reads (``LCM_DATABASE_READ_URL``).
    supports_replica: bool = False

    def write_position(self, conn: Connection) -> str | None:
        """Where the database's write-ahead log is after this connection's last commit (what a
        replica must have replayed to show it); None for a backend without replicas."""
        return None

    def replica_state(self, conn: Connection, since: str | None) -> tuple[bool, float]:
        """On a replica connection: (has it replayed ``since``, seconds it has been sitting on
        WAL it received but has not applied)."""
        raise NotImplementedError(f"{self.name} has no read replicas")

    @abstractmethod
    def engine_options(self, url: URL) -> dict[str, Any]:
        """Keyword arguments for ``sqlalchemy.create_engine`` (pool settings aside)."""

    @abstractmethod
    def configure_engine(self, engine: Engine) -> None:
        """Attach per-connection setup (pragmas, transaction begin behaviour)."""

    def prepare_location(self, url: URL) -> None:  # noqa: B027 - optional hook
        """Create whatever must exist before the first connection (a SQLite file's folder)."""

    @abstractmethod
    def insert_rows(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]],
        index: Sequence[IndexRow] | None, returning: Sequence[str],
    ) -> list[tuple[Any, ...]]:
        """Insert rows (skipping unique conflicts) keeping the search index in step.

        ``index`` is given for tables with a search index (messages, summaries): one entry per
        row. Returns the ``returning`` columns of the rows actually inserted.
        """

    #: Whether :meth:`append_fused` exists: a session's counters bumped and its new messages
    #: inserted by one statement (PostgreSQL's data-modifying CTEs), run outside a transaction.
    fused_append: bool = False

    def append_fused(self, conn: Connection, bump: dict[str, Any], table: Table,
                     rows: Sequence[dict[str, Any]], index: Sequence[IndexRow]) -> Mapping[str, Any] | None:
        """One statement: ``UPDATE`` the session (``bump``: sid, expected, new_last, n, tok, now)
        where its last seq is still ``expected``, and only then insert ``rows`` (session and
        agent ids come from the updated row). The session row with ``lcm_new_ids`` and
        ``lcm_new_identities``, or None when the session moved on (nothing written). A unique
        conflict raises (the statement is atomic: nothing written either)."""
        raise NotImplementedError

    def returning_row(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> Mapping[str, Any] | None:
        """The one row an ``UPDATE ... RETURNING`` statement returns (None: no row matched). A
        backend may run its hot statements closer to the driver (SQLite)."""
        row = conn.execute(stmt, params).first()
        return cast(Mapping[str, Any], row._mapping) if row is not None else None

    @abstractmethod
    def insert_ignore(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]],
                      conflict_columns: Sequence[str]) -> None:
        """INSERT ... ON CONFLICT DO NOTHING."""

    @abstractmethod
    def search_messages(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        """Matching message store ids, newest first (with scores when ``spec.ranked``).

        Returns the candidates and whether the candidate window or scan cap was reached.
        """

    @abstractmethod
    def search_summaries(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        """As :meth:`search_messages` for summary nodes (session and agent scope only)."""

    def search_messages_many(self, conn: Connection, specs: Sequence[SearchSpec]
                             ) -> list[tuple[list[Candidate], bool]]:
        """:meth:`search_messages` of each spec, in order: the any-word part's lookups, which
        do not depend on each other. A backend may answer several in one statement."""
        return [self.search_messages(conn, spec) for spec in specs]

    def newest_ids_many(self, conn: Connection, kind: str, specs: Sequence[SearchSpec]) -> list[list[int]]:
        """The ids of each unranked search's newest ``spec.limit`` matches in ``kind``
        (``messages`` or ``summaries``), newest first: the any-word part's word lookups, which
        do not depend on each other. A backend may answer them in one statement."""
        if kind == "messages":
            return [[c.id for c in found] for found, _ in self.search_messages_many(conn, specs)]
        return [[c.id for c in self.search_summaries(conn, s)[0]] for s in specs]

    def term_rows_many(self, conn: Connection, spec: SearchSpec, kind: str,
                       terms: Sequence[Term]) -> list[float | None]:
        """:meth:`term_rows` of each term (a backend may answer them in one statement)."""
        return [self.term_rows(conn, spec, kind, t) for t in terms]

    @abstractmethod
    def term_rows(self, conn: Connection, spec: SearchSpec, kind: str, term: Term) -> float | None:
        """About how many rows of the whole table (``messages`` or ``summaries``) contain
        ``term``, from what is cheap to know (None: unknown). Lets a search skip looking up
        a word too common to decide anything on its own. ``spec``: the search asking (what
        it already looked up is in its ``scope_memo``)."""

    def newest_id(self, conn: Connection, spec: SearchSpec, table: str) -> int:
        """``spec.newest_id``: the newest row id of ``table``, once per search. A backend may
        learn, in the same round trip, what the search will ask of its scope next (PostgreSQL:
        whether its agent is alone, its rows), so its phases find them in ``scope_memo``."""
        return spec.newest_id(conn, table)

    def rows_by_ids(self, conn: Connection, key: str, build: Callable[[IdsIn], Select[Any]],
                    ids: Sequence[int], params: Mapping[str, Any] | None = None) -> list[Any]:
        """The rows of ``build(ids_in)`` for ``ids`` (``ids_in(column)``: the column is one of
        them), with the statement's named ``bindparam``s from ``params``; rows read by
        attribute. ``key`` names the statement: a backend may build and compile it once and
        run it on the driver's connection (a recall reads three such id lists, where
        SQLAlchemy's work per statement cost several times what the database took). Here:
        SQLAlchemy, an ``IN`` list per chunk of ids."""
        unique = list(dict.fromkeys(ids))
        rows: list[Any] = []
        for i in range(0, len(unique), ID_LIST_CHUNK):
            chunk = unique[i:i + ID_LIST_CHUNK]

            def in_chunk(column: ColumnElement[Any], chunk: list[int] = chunk) -> ColumnElement[bool]:
                return column.in_(chunk)

            rows.extend(conn.execute(build(in_chunk), dict(params or {})).all())
        return rows

    def messages_at(self, conn: Connection, places: Iterable[tuple[int, int]]) -> list[Any]:
        """``(id, session_id, seq, ts)`` of the messages at ``places`` (session id, seq), those
        that exist, in no particular order (the explorer's last message per session)."""
        unique = list(dict.fromkeys(places))
        rows: list[Any] = []
        for i in range(0, len(unique), PLACES_PER_STATEMENT):
            chunk = unique[i:i + PLACES_PER_STATEMENT]
            chunk += [chunk[-1]] * (PLACES_PER_STATEMENT - len(chunk))  # the same place again: one row
            params = {f"{kind}{n}": value for n, (session, seq) in enumerate(chunk)
                      for kind, value in (("s", session), ("q", seq))}
            rows.extend(conn.execute(_messages_at_statement(), params).all())
        return rows

    def prepare_terms(self, conn: Connection, terms: Sequence[Term]) -> None:  # noqa: B027 - optional hook
        """A search is about to look ``terms`` up one at a time (the any-word part): work the
        lookups share can be done here at once (PostgreSQL stems every word in one round trip
        instead of one per word)."""

    #: Whether a turn stores estimated token counts, counted exactly when the engine first
    #: needs them (``MessageRepository.settle_tokens``): where a later UPDATE of a row is cheap
    #: (SQLite), not where it rewrites the row and every index entry (PostgreSQL).
    defer_token_counts: bool = False
    #: Whether messages wait for :meth:`catch_up_index` to become searchable.
    indexes_in_batches: bool = False
    #: Whether a message waiting for :meth:`catch_up_index` is still found by its exact words
    #: (PostgreSQL: only its stems wait), so a search in a hurry may leave a few to the
    #: background catch-up (``StoreCore.catch_up_index``'s ``tolerate``).
    pending_still_found: bool = False
    #: Whether a background thread should run :meth:`catch_up_index` after writes
    #: (``lcm.store.catchup``): where a catch-up on another connection runs beside the
    #: writes (PostgreSQL), not where it would wait for the writer's lock (SQLite).
    index_in_background: bool = False

    def unindexed_note(self, count: int) -> str:
        """What a search that could not catch up tells its reader about ``count`` messages."""
        return (f"the newest {count} message{'s' if count != 1 else ''} stored since the index last caught "
                "up were not searched (this store is read-only; the next search that may write indexes them)")

    def pending_index(self, conn: Connection, *, except_session: int | None = None) -> int:
        """Messages stored but not yet in the search index (0 where the insert indexes them).
        ``except_session``: a session whose raw region (past its coverage) the caller holds in
        its context and leaves out of what it finds (auto-recall); its waiting messages there
        are not counted: a search still finds them by their exact words on PostgreSQL (whose
        stems alone wait), and on SQLite (where a waiting message is not found at all) the
        caller does not want them. See :meth:`catch_up_index`."""
        return 0

    def catch_up_index(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Index every pending message, inside the caller's write transaction. The store runs
        it before any search, so a search never misses a stored message (SQLite indexes
        messages in batches, revision 0010)."""

    @abstractmethod
    def check_database(self, conn: Connection, *, whole: bool = True) -> list[CheckResult]:
        """Low-level integrity of the database itself. ``whole`` False: a bounded doctor run
        (a big store), which leaves out checks that read the whole database."""

    @abstractmethod
    def check_search_index(self, conn: Connection, deep: bool,
                           sessions: Sequence[int] | None = None) -> list[CheckResult]:
        """Does the search index match the rows? ``deep`` checks every row (slow on big stores);
        ``sessions``: the counts read only these sessions' rows (a bounded doctor run)."""

    @abstractmethod
    def rebuild_search_index(self, conn: Connection) -> dict[str, int]:
        """Rebuild the search index from the rows; returns rows indexed per table."""

    def reindex_messages(self, conn: Connection, ids: Sequence[int]) -> None:  # noqa: B027 - optional
        """Bring these messages' index entries up to date after their search text changed
        (SQLite's triggers already did; PostgreSQL's vectors are written by lcm)."""

    def write_blocked(self, url: URL, *, heal: bool) -> tuple[str | None, bool]:
        """(what on this machine stops writes to the database, or None; whether lcm removed
        that cause itself). Only files can block writes this way (SQLite)."""
        return None, False

    def backup(self, engine: Engine, destination: str) -> str | None:
        """Copy the database while it is in use; None when this backend leaves that to the
        server's own tools (a PostgreSQL operator has pg_dump and PITR)."""
        return None

    @abstractmethod
    def optimize(self, conn: Connection) -> None:
        """Refresh planner statistics (after a bulk import; routine upkeep otherwise)."""

    @abstractmethod
    def database_size(self, conn: Connection) -> int | None:
        """Bytes on disk used by lcm's tables (None when unknown)."""

    def claim_payloads(self, conn: Connection, shas: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """Before reading back the ids of payloads just stored (by their SHA-256): PostgreSQL
        with per-agent roles shows another agent's identical payload only when claimed."""

    def before_forget(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Inside the transaction that erases forgotten rows, before it does."""

    @abstractmethod
    def after_forget(self, engine: Engine, *, vacuum: bool) -> None:
        """After rows were forgotten: make sure no index structure keeps their words, and with
        ``vacuum`` rewrite the storage so no free page keeps their bytes."""


def backend_for_url(url: URL) -> Backend:
    name = url.get_backend_name()
    if name == "sqlite":
        from lcm.backends.sqlite import SQLiteBackend

        return SQLiteBackend()
    if name == "postgresql":
        from importlib.util import find_spec

        if find_spec("psycopg") is None:
            raise ConfigError("a PostgreSQL URL needs psycopg, which comes with the postgres extra: "
                              + install_command("postgres"))
        from lcm.backends.postgres import PostgresBackend

        return PostgresBackend()
    raise ConfigError(f"no lcm backend for database {name!r}")
