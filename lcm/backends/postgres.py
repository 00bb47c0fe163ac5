"""PostgreSQL: the shared backend for teams (a fleet of agents on one database).

Search: each searchable table has a ``search_vector tsvector`` column with a GIN index (created
by the Alembic revision, not declared in the shared models). The vector is written with the row,
from lexemes lcm computes itself (``lcm.textindex.tokenize``, a mirror of SQLite's unicode61
tokenizer) and passes as a literal ``tsvector``: PostgreSQL's own parser keeps ``alembic.ini`` or
``/usr/bin/x`` as single tokens and drops ``<tags>``, so searching "alembic" would not find
"alembic.ini" here while it would on SQLite. Scope lexemes (``§s<session>``, ``§a<agent>``,
``§r<role hex>``; ``§`` never comes out of the tokenizer, so user text cannot forge them) ride in
the same vector, and GIN intersects them with the query's lexemes before anything is ranked.
Queries are literal ``tsquery`` values built from quoted lexemes: user text can never be a
syntax error and never reaches SQL other than as a bound parameter.

Here: the engine's connections, writes, the stemmed index kept after the turn, integrity and
rebuilds. The literals are in ``pg_text``, the searches in ``pg_search``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    TextClause,
    any_,
    bindparam,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import URL
from sqlalchemy.exc import DisconnectionError

from lcm.backends import Backend, IdsIn, IndexRow, SearchSpec
from lcm.backends.pg_driver import driver_named_rows, driver_row, driver_rows
from lcm.backends.pg_search import PgSearch
from lcm.backends.pg_text import scope_lexemes, tsvector_literal
from lcm.config import application_name, pg_lock_timeout_ms, pg_pooler, pg_statement_timeout_ms
from lcm.records import Candidate, CheckResult
from lcm.textindex import Term

log = logging.getLogger("lcm")

#: A pooled connection unused for this long is pinged before it is handed out (seconds).
IDLE_PING_S = 2.0
SAMPLE_ROWS = 200
REBUILD_BATCH = 2000
#: Messages stemmed per statement by a catch-up (``PostgresBackend.catch_up_index``).
STEM_BATCH = 2000
#: Key of the transaction-level advisory lock one catch-up holds while it stems: two catch-ups
#: (every agent process runs one in the background) would otherwise insert overlapping message
#: ids in different orders and deadlock on the stems' unique index.
STEM_LOCK_KEY = 0x6C636D_5354  # "lcm" "ST"
#: A message's stemmed vector (revision 0012): the ``english`` configuration over its body,
#: plus the same scope lexemes as its exact vector; ``m`` is the message row.
STEMS_OF_MESSAGE = (
    "to_tsvector('english'::regconfig, coalesce(m.search_text, m.content, '')) || "
    "array_to_tsvector(ARRAY['§s' || m.session_id::text, '§a' || m.agent_id::text, '§r:' || coalesce(m.role, '')])")
SEARCHABLE = ("lcm_messages", "lcm_summaries")


#: Renders column types for the unnest casts (SQLAlchemy's dialect constructors are untyped).
_DIALECT = PGDialect()  # type: ignore[no-untyped-call]


def _array_ids_in(column: ColumnElement[Any]) -> ColumnElement[bool]:
    """``column`` is one of the array bound as ``ids`` (``PostgresBackend.rows_by_ids``)."""
    return column == any_(bindparam("ids", type_=ARRAY(BigInteger)))


def _unnest_insert(table: Table, columns: Sequence[str], returning: Sequence[str], indexed: bool) -> TextClause:
    """``INSERT ... SELECT * FROM unnest(CAST(:c0 AS type[]), ...) ON CONFLICT DO NOTHING``."""
    dialect = _DIALECT
    names = list(columns) + (["search_vector"] if indexed else [])
    arrays = [f"CAST(:c{i} AS {table.c[name].type.compile(dialect=dialect)}[])"
              for i, name in enumerate(columns)]
    if indexed:
        arrays.append("CAST(:vec AS tsvector[])")
    return text(
        f"INSERT INTO {table.name} ({', '.join(names)}) SELECT * FROM unnest({', '.join(arrays)}) "
        f"ON CONFLICT DO NOTHING RETURNING {', '.join(returning)}")


def _fused_append(table: Table, columns: Sequence[str]) -> TextClause:
    """``WITH s AS (UPDATE session ... RETURNING *), m AS (INSERT ... SELECT FROM s, rows
    RETURNING id, identity) SELECT s.*, ids, identities FROM s``: the insert reads the updated
    row, so a session that moved on (no row) inserts nothing. The rows travel as one JSON
    array (``jsonb_to_recordset``): measured 0.13 ms a turn cheaper than an array per column,
    which psycopg dumps in Python."""
    dialect = _DIALECT
    record = ", ".join(f"{name} {table.c[name].type.compile(dialect=dialect)}" for name in columns)
    names = ["session_id", "agent_id", *columns, "search_vector"]
    return text(
        "WITH s AS (UPDATE lcm_sessions SET last_seq = :new_last, message_count = message_count + :n, "
        "token_count = token_count + :tok, updated_at = :now WHERE id = :sid AND last_seq = :expected "
        f"RETURNING *), m AS (INSERT INTO {table.name} ({', '.join(names)}) "
        f"SELECT s.id, s.agent_id, r.* FROM s, jsonb_to_recordset(CAST(:rows AS jsonb)) "
        f"AS r({record}, search_vector tsvector) RETURNING id, identity) "
        "SELECT s.*, ARRAY(SELECT id FROM m) AS lcm_new_ids, ARRAY(SELECT identity FROM m) AS lcm_new_identities "
        "FROM s")


_MESSAGES_AT = text(
    "SELECT m.id, m.session_id, m.seq, m.ts FROM unnest(CAST(:s AS bigint[]), CAST(:q AS integer[])) AS p(s, q) "
    "JOIN lcm_messages m ON m.session_id = p.s AND m.seq = p.q")


def lsn_bytes(lsn: str) -> int:
    """A WAL position (``16/B374D848``) as a byte offset, to compare two of them."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


class PostgresBackend(Backend):
    name = "postgresql"
    #: No ``pool_pre_ping``: it costs a round trip on every checkout, several per turn. A
    #: connection is pinged only after sitting idle (``IDLE_PING_S``, see ``configure_engine``),
    #: and one that drops mid-transaction raises a retryable error (``lcm.errors.retry_dropped``).
    pool_options = {"pool_size": 5, "max_overflow": 10}
    autocommit_reads = True
    supports_replica = True

    def write_position(self, conn: Connection) -> str | None:
        return conn.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar()

    def replica_state(self, conn: Connection, since: str | None) -> tuple[bool, float]:
        in_recovery, replayed, received, idle = conn.exec_driver_sql(
            "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, pg_last_wal_receive_lsn()::text, "
            "extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8").one()
        if not in_recovery:  # a primary (a promoted replica, or the primary itself): it has everything
            return True, 0.0
        caught_up = since is None or (replayed is not None and lsn_bytes(replayed) >= lsn_bytes(since))
        behind = received is not None and replayed is not None and lsn_bytes(received) > lsn_bytes(replayed)
        return caught_up, float(idle or 0.0) if behind else 0.0

    def __init__(self) -> None:
        super().__init__()
        self._searches = PgSearch()
        #: ``rows_by_ids`` statements, compiled once for psycopg, by key.
        self._by_ids: dict[str, tuple[str, dict[str, Any]]] = {}

    def engine_options(self, url: URL) -> dict[str, Any]:
        connect_args: dict[str, Any] = {}
        if "application_name" not in url.query:
            connect_args["application_name"] = application_name()
        if "connect_timeout" not in url.query:
            connect_args["connect_timeout"] = 10
        return {"connect_args": connect_args}

    def configure_engine(self, engine: Engine) -> None:
        """Timeouts, pooler safety and liveness; READ COMMITTED plus row locks is what the
        store relies on, and nothing else is kept in the session.

        * Timeouts (``LCM_PG_STATEMENT_TIMEOUT_MS``, ``LCM_PG_LOCK_TIMEOUT_MS``) travel in the
          startup packet (``options=-c ...``): no round trip.
        * A transaction-mode pooler (PgBouncer) hands each transaction to any server
          connection, so nothing may outlive a transaction: no server-side prepared statements
          (psycopg's ``prepare_threshold`` off) and no session settings; the timeouts are set
          with ``set_config(..., true)`` (transaction-local) at the start of each write
          transaction. ``LCM_PG_POOLER=auto`` detects PgBouncer by its refusal of the
          ``options`` startup parameter; ``transaction`` says so outright (for a pooler that
          ignores ``options`` instead of refusing it).
        * Liveness: a connection idle for ``IDLE_PING_S`` is pinged when checked out and
          replaced if dead (a restarted server or pooler); a busy agent pays no ping.
        """
        pooler = pg_pooler()
        settings = {"statement_timeout": pg_statement_timeout_ms(), "lock_timeout": pg_lock_timeout_ms()}
        startup = " ".join(f"-c {name}={ms}" for name, ms in settings.items() if ms)
        local = "; ".join(f"SET LOCAL {name} = {ms}" for name, ms in settings.items() if ms)
        user_options = engine.url.query.get("options")
        user_options = user_options if isinstance(user_options, str) else None
        state = {"pooled": pooler == "transaction"}

        def use_pooler_safe(cparams: dict[str, Any]) -> None:
            if user_options is None:
                cparams.pop("options", None)
            else:
                cparams["options"] = user_options
            cparams["prepare_threshold"] = None

        @event.listens_for(engine, "do_connect")
        def _connect(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
            # cparams persists across connections: set every key each time.
            if not state["pooled"] and startup:
                cparams["options"] = f"{startup} {user_options}" if user_options else startup
                if pooler == "auto":
                    try:
                        dbapi_conn = dialect.loaded_dbapi.connect(*cargs, **cparams)
                    except dialect.loaded_dbapi.OperationalError as exc:
                        if "unsupported startup parameter" not in str(exc):
                            raise
                        log.info("lcm: %s is a transaction-mode pooler (it refused the options "
                                 "startup parameter): no prepared statements, timeouts per "
                                 "transaction", engine.url.render_as_string(hide_password=True))
                        state["pooled"] = True
                    else:
                        record.info["lcm_pooler"] = False
                        return dbapi_conn
            record.info["lcm_pooler"] = state["pooled"]
            if not state["pooled"]:
                return None
            use_pooler_safe(cparams)
            try:
                return dialect.loaded_dbapi.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as exc:
                if user_options is None or "unsupported startup parameter" not in str(exc):
                    raise
                raise dialect.loaded_dbapi.OperationalError(
                    f"{exc} (the pooler refuses the URL's options={user_options!r}: set them on the "
                    "role instead, e.g. ALTER ROLE ... SET search_path = ..., and drop them from the URL)"
                ) from exc

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            if local and conn.info.get("lcm_pooler") and conn.get_execution_options().get("lcm_write"):
                conn.exec_driver_sql(local)

        @event.listens_for(engine, "checkin")
        def _checkin(_dbapi_conn: Any, record: Any) -> None:
            record.info["lcm_idle_since"] = time.monotonic()

        @event.listens_for(engine, "checkout")
        def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
            since = record.info.get("lcm_idle_since")
            if since is not None and time.monotonic() - since >= IDLE_PING_S:
                if not engine.dialect.do_ping(dbapi_conn):
                    raise DisconnectionError("the connection was closed while idle")  # a new one

    # -- writes --------------------------------------------------------------------------

    def claim_payloads(self, conn: Connection, shas: Sequence[str]) -> None:
        """Transaction-local; a no-op where row-level security is off (see pg_security)."""
        conn.execute(text("SELECT set_config('lcm.payload_claim', :v, true)"), {"v": ",".join(shas)})

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]],
                    index: Sequence[IndexRow] | None, returning: Sequence[str]) -> list[tuple[Any, ...]]:
        """One statement of constant text whatever the row count: each column travels as one
        array parameter and ``unnest`` turns them back into rows. A multi-row VALUES list
        (SQLAlchemy's insertmanyvalues) has a different text per row count and a parameter per
        cell, so psycopg re-parses it every time and PostgreSQL never gets to prepare it; this
        text is parsed once and, after a few executions, runs as a prepared statement."""
        if not rows:
            return []
        columns = list(rows[0])
        params: dict[str, Any] = {f"c{i}": [row[name] for row in rows] for i, name in enumerate(columns)}
        if index is not None:
            params["vec"] = [tsvector_literal(ix.body, scope_lexemes(ix))
                             for _, ix in zip(rows, index, strict=True)]
        key = (table.name, tuple(columns), tuple(returning), index is not None)
        stmt = self._inserts.get(key)
        if stmt is None:  # built once per shape
            stmt = self._inserts[key] = _unnest_insert(table, columns, returning, index is not None)
        return [tuple(r) for r in conn.execute(stmt, params).all()]

    fused_append = True

    def append_fused(self, conn: Connection, bump: dict[str, Any], table: Table,
                     rows: Sequence[dict[str, Any]], index: Sequence[IndexRow]) -> Mapping[str, Any] | None:
        """One round trip for a turn (see ``Backend.append_fused``; ``_fused_append``), sent
        on the driver's connection: SQLAlchemy's per-statement work (compiling the cache key,
        building the result's metadata for two dozen columns) cost 0.1 ms a turn here."""
        columns = list(rows[0])
        params: dict[str, Any] = {"rows": json.dumps(
            [{**row, "search_vector": tsvector_literal(ix.body, scope_lexemes(ix))}
             for row, ix in zip(rows, index, strict=True)], ensure_ascii=False), **bump}
        key = ("fused", table.name, tuple(columns))
        sql = self._inserts.get(key)
        if sql is None:  # compiled once per shape, for the driver's own placeholders
            sql = self._inserts[key] = str(_fused_append(table, columns).compile(dialect=conn.dialect))
        return driver_row(conn, sql, params)

    def insert_ignore(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]],
                      conflict_columns: Sequence[str]) -> None:
        if rows:
            stmt = pg_insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
            conn.execute(stmt, list(rows))

    # -- stemmed vectors, after the turn (revision 0012) --------------------------------------

    #: Messages become searchable by their stems after :meth:`catch_up_index` (their exact
    #: vector is written with the row): the store runs it in the background and before searches.
    indexes_in_batches = True
    index_in_background = True
    pending_still_found = True

    def unindexed_note(self, count: int) -> str:
        return (f"the newest {count} message{'s' if count != 1 else ''} stored since the stemmed index last "
                "caught up were searched by their exact words only (this store could not stem them now; "
                "the next search that may write does)")

    def pending_index(self, conn: Connection, *, except_session: int | None = None) -> int:
        """Messages not stemmed yet, from the sessions' watermarks (a partial index holds
        only the sessions that have any). ``except_session``'s are not counted while every one
        of them is past its coverage (``stemmed_seq >= covered_seq``: in the raw region a
        context holds verbatim); a compacted message waiting for its stems always counts."""
        [(pending,)] = driver_rows(  # before every search: psycopg's own cursor (see pg_driver)
            conn, "SELECT coalesce(sum(last_seq - stemmed_seq), 0) FROM lcm_sessions "
            "WHERE last_seq > stemmed_seq AND NOT (id = :sid AND stemmed_seq >= covered_seq)",
            {"sid": -1 if except_session is None else except_session})
        return int(pending)

    def catch_up_index(self, conn: Connection) -> None:
        """Stem every message above its session's watermark, in statements of ``STEM_BATCH``
        messages, then raise the watermarks. A session's messages up to its ``last_seq`` are
        all committed (appends claim seqs on the session row), so the watermark is exact; the
        watermarks move in one statement at the end, so a session row is locked only for the
        last moment of the transaction, never while the server stems. One catch-up at a time
        stems (an advisory lock taken first; the next one waits, then finds only what is left):
        two at once inserted overlapping ids in different orders and deadlocked, which a store
        with two writers met within minutes of bulk loading. A message stemmed twice anyway
        (a ``_restem``) keeps its first row (``ON CONFLICT``)."""
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": STEM_LOCK_KEY})
        pending = conn.execute(text(
            "SELECT id, stemmed_seq, last_seq FROM lcm_sessions WHERE last_seq > stemmed_seq "
            "ORDER BY id")).all()
        ranges: list[tuple[int, int, int]] = []
        for sid, done, last in pending:
            ranges.extend((sid, lo, min(lo + STEM_BATCH, last)) for lo in range(done, last, STEM_BATCH))
        batch: list[tuple[int, int, int]] = []
        size = 0
        for r in ranges:
            batch.append(r)
            size += r[2] - r[1]
            if size >= STEM_BATCH:
                self._stem_ranges(conn, batch)
                batch, size = [], 0
        if batch:
            self._stem_ranges(conn, batch)
        if pending:
            # Rows locked in id order: two catch-ups never wait on each other in a cycle.
            conn.execute(text(
                "WITH v AS (SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:to AS int[])) AS v(id, through)), "
                "l AS (SELECT s.id FROM lcm_sessions s JOIN v ON v.id = s.id ORDER BY s.id FOR NO KEY UPDATE OF s) "
                "UPDATE lcm_sessions s SET stemmed_seq = greatest(s.stemmed_seq, v.through) "
                "FROM v, l WHERE s.id = v.id AND l.id = v.id"),
                {"ids": [p[0] for p in pending], "to": [p[2] for p in pending]})

    @staticmethod
    def _stem_ranges(conn: Connection, ranges: Sequence[tuple[int, int, int]]) -> None:
        """Stem the messages with ``lo < seq <= hi`` of each (session, lo, hi)."""
        conn.execute(text(
            "INSERT INTO lcm_message_stems (message_id, agent_id, search_stems) "
            f"SELECT m.id, m.agent_id, {STEMS_OF_MESSAGE} "
            "FROM unnest(CAST(:sids AS bigint[]), CAST(:los AS int[]), CAST(:his AS int[])) AS r(sid, lo, hi) "
            "JOIN lcm_messages m ON m.session_id = r.sid AND m.seq > r.lo AND m.seq <= r.hi "
            "ORDER BY m.id ON CONFLICT (message_id) DO NOTHING"),
            {"sids": [r[0] for r in ranges], "los": [r[1] for r in ranges], "his": [r[2] for r in ranges]})

    @staticmethod
    def _restem(conn: Connection, ids: Sequence[int]) -> None:
        """The stemmed vectors of these messages, written again from their rows."""
        conn.execute(text(
            "INSERT INTO lcm_message_stems (message_id, agent_id, search_stems) "
            f"SELECT m.id, m.agent_id, {STEMS_OF_MESSAGE} FROM lcm_messages m "
            "WHERE m.id = ANY(CAST(:ids AS bigint[])) ORDER BY m.id "
            "ON CONFLICT (message_id) DO UPDATE SET agent_id = excluded.agent_id, "
            "search_stems = excluded.search_stems"), {"ids": list(ids)})

    # -- search (lcm.backends.pg_search) --------------------------------------------------

    def search_messages(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        return self._searches.search(conn, spec, "lcm_messages", "ts", spec.roles)

    def search_summaries(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        return self._searches.search(conn, spec, "lcm_summaries", "latest_at", ())

    def search_messages_many(self, conn: Connection, specs: Sequence[SearchSpec]
                             ) -> list[tuple[list[Candidate], bool]]:
        return self._searches.search_many(conn, specs, "lcm_messages", "ts")

    def newest_ids_many(self, conn: Connection, kind: str, specs: Sequence[SearchSpec]) -> list[list[int]]:
        if kind == "messages":
            return self._searches.newest_ids_many(conn, specs, "lcm_messages", "ts")
        return super().newest_ids_many(conn, kind, specs)

    def term_rows(self, conn: Connection, spec: SearchSpec, kind: str, term: Term) -> float | None:
        return self._searches.term_rows(conn, kind, term)

    def newest_id(self, conn: Connection, spec: SearchSpec, table: str) -> int:
        return self._searches.newest_id(conn, spec, table)

    def prepare_terms(self, conn: Connection, terms: Sequence[Term]) -> None:
        self._searches.stem_terms(conn, terms)

    def rows_by_ids(self, conn: Connection, key: str, build: Callable[[IdsIn], Select[Any]],
                    ids: Sequence[int], params: Mapping[str, Any] | None = None) -> list[Any]:
        """``column = ANY(ids)``: one array parameter, so the text is the same whatever the
        count and psycopg prepares it after a few runs (an ``IN`` list of 20-40 ids had a new
        text per count, parsed and planned each time: 0.94 against 0.62 ms for recall's hit
        rows at 100k messages). Compiled once per ``key`` and run on psycopg's connection: no
        cache key, result metadata or ``Row`` per row from SQLAlchemy (a recall reads three
        such lists)."""
        compiled = self._by_ids.get(key)
        if compiled is None:  # its literals (``seq - 1``) are parameters too: their values kept
            done = build(_array_ids_in).compile(dialect=conn.dialect)
            compiled = self._by_ids[key] = (str(done), dict(done.params))
        sql, literals = compiled
        return driver_named_rows(conn, sql, {**literals, **(params or {}), "ids": list(dict.fromkeys(ids))})

    def messages_at(self, conn: Connection, places: Iterable[tuple[int, int]]) -> list[Any]:
        """One statement of constant text whatever the count: the places travel as two arrays
        and join ``UNIQUE(session_id, seq)`` (32 places at 100k messages: 0.41 ms, the OR of 64
        equalities 1.0 ms, planned again until prepared)."""
        unique = list(dict.fromkeys(places))
        if not unique:
            return []
        return list(conn.execute(_MESSAGES_AT, {"s": [s for s, _ in unique], "q": [q for _, q in unique]}).all())

    # -- integrity -----------------------------------------------------------------------

    def check_database(self, conn: Connection, *, whole: bool = True) -> list[CheckResult]:
        out = []  # catalog reads only: the same at any size
        version = conn.exec_driver_sql("SHOW server_version").scalar()
        out.append(CheckResult("postgres_server", "ok", f"PostgreSQL {version}, reachable"))
        bad = conn.execute(text(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_class t ON t.oid = i.indrelid "
            "WHERE t.relname LIKE 'lcm\\_%' AND t.relnamespace = "
            "  (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
            "AND NOT (i.indisvalid AND i.indisready)")).scalars().all()
        out.append(CheckResult(
            "postgres_indexes", "fail" if bad else "ok",
            f"invalid indexes (rebuild with REINDEX): {', '.join(bad)}" if bad
            else "all lcm indexes valid and ready"))
        missing = [t for t in SEARCHABLE if not conn.execute(text(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = :t AND column_name = 'search_vector'"), {"t": t}).first()]
        out.append(CheckResult(
            "postgres_search_columns", "fail" if missing else "ok",
            f"missing search_vector on {', '.join(missing)} (run `lcm db upgrade`)" if missing
            else "search_vector columns present"))
        return out

    @staticmethod
    def _index_source(base: str) -> str:
        role = "t.role" if base == "lcm_messages" else "NULL"
        return (f"SELECT t.id, coalesce(t.search_text, t.content), t.session_id, t.agent_id, {role} "
                f"FROM {base} t ")

    def _index_batches(self, conn: Connection, base: str, newest: int | None,
                       ) -> Iterator[list[tuple[int, str]]]:
        """Batches of (id, expected tsvector literal), paged by id (bounded memory)."""
        sql = self._index_source(base)
        expected = _expected_vectors
        if newest is not None:
            rows = conn.execute(text(sql + "ORDER BY t.id DESC LIMIT :n"), {"n": newest}).all()
            if rows:
                yield expected(rows)
            return
        after = 0
        while True:
            rows = conn.execute(text(sql + "WHERE t.id > :after ORDER BY t.id LIMIT :n"),
                                {"after": after, "n": REBUILD_BATCH}).all()
            if not rows:
                return
            yield expected(rows)
            after = rows[-1][0]

    def check_search_index(self, conn: Connection, deep: bool,
                           sessions: Sequence[int] | None = None) -> list[CheckResult]:
        out = []
        within = "" if sessions is None else " AND session_id = ANY(CAST(:ids AS bigint[]))"
        for base in SEARCHABLE:
            kind = base.removeprefix("lcm_")
            nulls = conn.execute(text(f"SELECT count(*) FROM {base} WHERE search_vector IS NULL{within}"),
                                 {"ids": list(sessions or ())}).scalar_one()
            problems = [f"{nulls} {kind} have no search vector"] if nulls else []
            mismatched = checked = 0
            for batch in self._index_batches(conn, base, None if deep else SAMPLE_ROWS):
                mismatched += self._count_mismatches(conn, base, batch)
                checked += len(batch)
            if mismatched:
                problems.append(f"{mismatched} of {checked} checked {kind} have a stale search vector")
            if base == "lcm_messages":
                problems += self._stem_problems(conn, deep)
            how = "every row" if deep else f"the newest {SAMPLE_ROWS} rows"
            out.append(CheckResult(f"search_index_{kind}", "fail" if problems else "ok",
                                   "; ".join(problems) if problems else f"in sync: {how}"))
        return out

    @staticmethod
    def _stem_problems(conn: Connection, deep: bool) -> list[str]:
        """Messages below their session's stemmed watermark without a stemmed vector, and
        (``deep``: all; else the newest ``SAMPLE_ROWS``) vectors that differ from their row's."""
        rows = "lcm_messages" if deep else f"(SELECT * FROM lcm_messages ORDER BY id DESC LIMIT {SAMPLE_ROWS})"
        missing, stale = conn.execute(text(
            "SELECT count(*) FILTER (WHERE st.message_id IS NULL AND m.seq <= s.stemmed_seq), "
            "count(*) FILTER (WHERE st.message_id IS NOT NULL AND "
            f"st.search_stems IS DISTINCT FROM ({STEMS_OF_MESSAGE})) "
            f"FROM {rows} m JOIN lcm_sessions s ON s.id = m.session_id "
            "LEFT JOIN lcm_message_stems st ON st.message_id = m.id "
            "WHERE st.message_id IS NOT NULL OR m.seq <= s.stemmed_seq")).one()
        out = [f"{missing} messages have no stemmed vector"] if missing else []
        return out + ([f"{stale} messages have a stale stemmed vector"] if stale else [])

    def _count_mismatches(self, conn: Connection, base: str, batch: list[tuple[int, str]]) -> int:
        return int(conn.execute(text(
            f"SELECT count(*) FROM {base} t JOIN unnest(CAST(:ids AS bigint[]), CAST(:vecs AS text[])) "
            "AS e(id, vec) ON e.id = t.id "
            "WHERE t.search_vector IS DISTINCT FROM CAST(e.vec AS tsvector)"),
            {"ids": [b[0] for b in batch], "vecs": [b[1] for b in batch]}).scalar_one())

    def reindex_messages(self, conn: Connection, ids: Sequence[int]) -> None:
        self.rewrite_exact_vectors(conn, ids)
        for i in range(0, len(ids), REBUILD_BATCH):
            self._restem(conn, ids[i:i + REBUILD_BATCH])

    def rewrite_exact_vectors(self, conn: Connection, ids: Sequence[int]) -> None:
        """The exact vectors of these messages, written again (all an upgrade before 0012 has)."""
        for i in range(0, len(ids), REBUILD_BATCH):
            rows = conn.execute(text(self._index_source("lcm_messages") + "WHERE t.id = ANY(CAST(:ids AS bigint[]))"),
                                {"ids": list(ids[i:i + REBUILD_BATCH])}).all()
            if rows:
                self._write_vectors(conn, "lcm_messages", _expected_vectors(rows))

    def rebuild_exact_vectors(self, conn: Connection) -> dict[str, int]:
        """Every exact vector written again from its row (all an upgrade before 0012 has)."""
        return {base.removeprefix("lcm_"): sum(
            self._write_vectors(conn, base, batch) for batch in self._index_batches(conn, base, None))
            for base in SEARCHABLE}

    def rebuild_search_index(self, conn: Connection) -> dict[str, int]:
        counts = self.rebuild_exact_vectors(conn)
        # The messages' stemmed vectors: every one computed again from its row.
        conn.execute(text("DELETE FROM lcm_message_stems"))
        conn.execute(text("UPDATE lcm_sessions SET stemmed_seq = 0 WHERE stemmed_seq <> 0"))
        self.catch_up_index(conn)
        return counts

    def _write_vectors(self, conn: Connection, base: str, batch: list[tuple[int, str]]) -> int:
        conn.execute(text(
            f"UPDATE {base} t SET search_vector = CAST(e.vec AS tsvector) "
            "FROM unnest(CAST(:ids AS bigint[]), CAST(:vecs AS text[])) AS e(id, vec) "
            "WHERE e.id = t.id"),
            {"ids": [b[0] for b in batch], "vecs": [b[1] for b in batch]})
        return len(batch)

    def optimize(self, conn: Connection) -> None:
        # Without statistics the planner cannot tell a needle from the most common word and
        # may rank every match; autovacuum refreshes them later, a bulk import should now.
        conn.exec_driver_sql("ANALYZE lcm_sessions, lcm_messages, lcm_summaries, lcm_summary_sources")
        # Rows inserted since the last vacuum wait in each GIN index's pending list, which every
        # search then scans in full (a rare word read 358 pages instead of 46 after a 100k-row
        # import); merge them now instead of waiting for autovacuum.
        conn.exec_driver_sql(
            "SELECT gin_clean_pending_list(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'i' AND c.relname IN ("
            "'ix_lcm_messages_search_vector', 'ix_lcm_summaries_search_vector', "
            "'ix_lcm_message_stems_search_stems', 'ix_lcm_summaries_search_stems')")

    def after_forget(self, engine: Engine, *, vacuum: bool) -> None:
        """PostgreSQL keeps a deleted row's tuple (and index entries) until VACUUM reclaims
        them, and their bytes until the space is reused: ``vacuum`` rewrites the tables
        (``VACUUM FULL``: an exclusive lock on each table while it runs)."""
        if not vacuum:
            return
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in ("lcm_messages", "lcm_summaries", "lcm_summary_sources", "lcm_payloads", "lcm_vectors",
                          "lcm_system_prompts"):
                conn.exec_driver_sql(f"VACUUM (FULL, ANALYZE) {table}")

    def database_size(self, conn: Connection) -> int | None:
        return int(conn.execute(text(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relkind = 'r' AND c.relname LIKE 'lcm\\_%' "
            "AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
        )).scalar_one())


def _expected_vectors(rows: Sequence[Any]) -> list[tuple[int, str]]:
    """(id, tsvector literal) for rows of (id, body, session id, agent id, role)."""
    out = []
    for row_id, body, session_pk, agent_pk, role_value in rows:
        ix = IndexRow(body=body or "", session_pk=session_pk, agent_pk=agent_pk, role=role_value)
        out.append((row_id, tsvector_literal(ix.body, scope_lexemes(ix))))
    return out

