"""SQLite: the embedded default (one user, zero setup).

Connections run in WAL mode with a busy timeout and foreign keys on. The driver is put in
autocommit mode and lcm issues ``BEGIN`` itself: ``BEGIN IMMEDIATE`` for writes (a deferred
transaction that later writes gets ``SQLITE_BUSY`` at once, ignoring the busy timeout) and a
plain ``BEGIN`` for reads (a consistent snapshot).

Search: FTS5 external-content tables (``lcm_messages_fts``, ``lcm_summaries_fts``) over views
that expose each row's indexed body (``search_text`` when set, else ``content``) and a ``scope``
column of tokens (``s<session>``, ``a<agent>``, ``r<role hex>``). Queries put the scope into the
``MATCH`` expression, so FTS5 intersects posting lists instead of ranking every match, and walk
``ORDER BY rowid DESC`` so a recency search stops after ``limit`` rows.

Summaries are indexed by triggers. Messages are indexed in batches behind a watermark
(``lcm_search_marks``, revision 0010): a stored turn leaves its rows *pending*, and
:meth:`SQLiteBackend.catch_up_index` indexes every pending row in one statement per index,
before any search (the store calls it) and inside a write once ``INDEX_BATCH`` rows are pending.
FTS5 indexes a batch for about a third of the per-row cost, and the turn no longer waits on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, event, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DatabaseError, DBAPIError, OperationalError

from lcm.backends import Backend, IndexRow, SearchSpec, post_filters, role_token, window_rank
from lcm.config import sqlite_busy_timeout_ms
from lcm.errors import first_line
from lcm.files import create_private
from lcm.records import Candidate, CheckResult
from lcm.textindex import Query, Term

SAMPLE_ROWS = 200
#: The doctor reports a write lock held longer than this (a write takes milliseconds).
LOCK_PROBE_SECONDS = 1.0

_FTS = {"messages": "lcm_messages_fts", "summaries": "lcm_summaries_fts"}
#: The stemmed twins (FTS5's porter tokenizer over the same content views; revision 0007).
_STEMS = {"messages": "lcm_messages_stems", "summaries": "lcm_summaries_stems"}
_BASE = {"messages": "lcm_messages", "summaries": "lcm_summaries"}
#: A write indexes the pending messages once this many are pending (see the module docstring).
#: Measured per row (both message indexes, docs/benchmarks.md): a batch of 1024 costs about 0.7x
#: a batch of 256 and a fraction of indexing row by row; a search that finds a full batch
#: pending indexes it first (tens of milliseconds).
INDEX_BATCH = 1024
_MARK = "SELECT indexed_through FROM lcm_search_marks WHERE name = 'messages'"


#: Bound variables one statement may hold (SQLITE_MAX_VARIABLE_NUMBER's default since 3.32).
MAX_VARIABLES = 32766
#: An agent with more sessions than this is searched without an id range (finding it costs
#: two index seeks a session).
EXTENT_SESSIONS = 256


def _driver_execute(conn: Connection, sql: str, params: Sequence[Any]) -> Any:
    """``sql`` on the driver's own connection, inside the transaction ``conn`` holds; a driver
    error comes out as SQLAlchemy's (what the store's error handling catches)."""
    import sqlite3

    driver: Any = conn.connection.driver_connection
    try:
        return driver.execute(sql, params)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, params, exc, sqlite3.Error) from exc


def _mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


def _doc_freq(conn: Connection, fts: str, term: Term, newest: int) -> float:
    """The term's document frequency in ``fts``, estimated from its newest matches (a walk of at
    most ``window_rank.DF_SAMPLE`` postings, see ``window_rank.estimate_doc_freq``)."""
    sampled, oldest = conn.execute(text(
        f"SELECT count(*), min(id) FROM (SELECT rowid AS id FROM {fts} WHERE {fts} MATCH :m "
        "ORDER BY rowid DESC LIMIT :n)"), {"m": _fts5_term(term), "n": window_rank.DF_SAMPLE}).one()
    return window_rank.estimate_doc_freq(int(sampled), oldest, newest)


def _fts5_term(term: Term) -> str:
    phrase = 'body:"' + term.raw.replace('"', '""') + '"'
    return phrase + "*" if term.prefix else phrase


def render_match(query: Query, scope: Sequence[str], roles: Sequence[str] = ()) -> str:
    """The FTS5 MATCH expression for a query restricted to scope tokens (never a syntax error:
    every user-derived string is a quoted phrase with quotes doubled)."""
    parts: list[str] = []
    for group in query.groups:
        terms = [_fts5_term(t) for t in group]
        parts.append(terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")")
    parts.extend(f'scope:"{tok}"' for tok in scope)
    if roles:
        parts.append("(" + " OR ".join(f'scope:"{role_token(r)}"' for r in roles) + ")")
    expr = "(" + " AND ".join(parts) + ")"
    for neg in query.negatives:
        expr += " NOT " + _fts5_term(neg)
    return expr


class SQLiteBackend(Backend):
    name = "sqlite"
    pool_options = {"pool_size": 8, "max_overflow": 8}

    def __init__(self) -> None:
        super().__init__()
        #: How long a write waits for another connection's write lock (LCM_SQLITE_BUSY_TIMEOUT_MS).
        self.busy_timeout_ms = sqlite_busy_timeout_ms()
        #: The message index's watermark as this process last read it (a lower bound).
        self._mark_seen = 0

    def engine_options(self, url: URL) -> dict[str, Any]:
        return {"connect_args": {"timeout": self.busy_timeout_ms / 1000.0, "check_same_thread": False}}

    def prepare_location(self, url: URL) -> None:
        """The store's file and folder, created owner-only when new (``lcm.files``): SQLite gives
        its WAL and shared-memory files the database file's mode."""
        database = str(url.database or "")
        if database and database != ":memory:" and not database.startswith("file:"):
            create_private(Path(database).expanduser())

    def configure_engine(self, engine: Engine) -> None:
        busy_timeout_ms = self.busy_timeout_ms

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # lcm issues BEGIN itself (see module docstring)
            cur = dbapi_conn.cursor()
            try:
                cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
                cur.execute("PRAGMA foreign_keys = ON")
                mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable, never corrupt
                cur.execute("PRAGMA temp_store = MEMORY")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = "IMMEDIATE" if conn.get_execution_options().get("lcm_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")

    # -- what stops writes ----------------------------------------------------------------

    def write_blocked(self, url: URL, *, heal: bool) -> tuple[str | None, bool]:
        """SQLite writes need the database file, its folder (to create ``-wal``/``-shm``) and
        both companion files writable. SQLite creates the companions with the database file's
        mode, so a database that was read-only for a while leaves them read-only after it is
        writable again, and every write keeps failing, across restarts. With ``heal`` lcm gives
        a companion it owns the database file's mode back (the only change it makes)."""
        path = Path(str(url.database)).expanduser()
        if not path.exists():
            return None, False
        if not os.access(path, os.W_OK):
            return f"the database file {path} is read-only (mode {_mode(path)}): make it writable", False
        if not os.access(path.parent, os.W_OK | os.X_OK):
            return (f"the folder {path.parent} is not writable, and SQLite creates {path.name}-wal "
                    "and -shm there: make it writable"), False
        for suffix in ("-wal", "-shm"):
            companion = path.with_name(path.name + suffix)
            if not companion.exists() or os.access(companion, os.W_OK):
                continue
            problem = (f"{companion} is read-only (mode {_mode(companion)}) while the database "
                       "file is writable (SQLite created it while the database was read-only)")
            if heal and companion.stat().st_uid == os.geteuid():
                try:
                    companion.chmod(path.stat().st_mode & 0o777)
                except OSError as exc:
                    return f"{problem}; lcm could not change its mode ({exc}): chmod u+w it", False
                return f"{problem}; lcm gave it the database file's mode", True
            return f"{problem}: give it the database file's mode (chmod u+w)", False
        return None, False

    def write_lock_holder(self, url: URL) -> str | None:
        """Whether another connection holds SQLite's write lock for longer than a write takes
        (waits ``LOCK_PROBE_SECONDS``; None: it is free)."""
        import sqlite3

        path = Path(str(url.database)).expanduser()
        if not path.exists():
            return None
        try:
            probe = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=LOCK_PROBE_SECONDS,
                                    isolation_level=None)
        except sqlite3.Error as exc:
            return f"cannot open {path} for writing: {exc}"
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return None
        except sqlite3.OperationalError as exc:
            return (f"{path}: {exc} for over {LOCK_PROBE_SECONDS:g} s (another process holds the "
                    "write lock)")
        finally:
            probe.close()

    # -- writes --------------------------------------------------------------------------

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]],
                    index: Sequence[IndexRow] | None, returning: Sequence[str]) -> list[tuple[Any, ...]]:
        if not rows:
            return []
        # FTS5 indexes rows from their own columns (triggers for summaries, catch_up_index for
        # messages); `index` is not needed here.
        if table.name == "lcm_messages":
            inserted = self._insert_messages(conn, rows, returning)
            if inserted and "id" in returning:
                self._index_if_due(conn, max(int(r[list(returning).index("id")]) for r in inserted))
            return inserted
        key = (table.name, tuple(returning))
        stmt = self._inserts.get(key)
        if stmt is None:  # built once: constructing the expression costs more than running it
            stmt = self._inserts[key] = (
                sqlite_insert(table).on_conflict_do_nothing().returning(*(table.c[name] for name in returning)))
        return [tuple(r) for r in conn.execute(stmt, list(rows)).all()]

    def _index_if_due(self, conn: Connection, newest: int) -> None:
        """Index the pending messages once a batch is due. The watermark is read only when the
        one last seen says a batch may be due (it only ever rises, so what this process saw is a
        lower bound): no query per turn."""
        if newest - self._mark_seen >= INDEX_BATCH:
            self._mark_seen = int(conn.exec_driver_sql(_MARK).scalar_one())
            if newest - self._mark_seen >= INDEX_BATCH:
                self.catch_up_index(conn)

    def _insert_messages(self, conn: Connection, rows: Sequence[dict[str, Any]],
                         returning: Sequence[str]) -> list[tuple[Any, ...]]:
        """Messages, the hot insert of every turn: one multi-row ``INSERT ... ON CONFLICT DO
        NOTHING RETURNING`` on the driver's connection, inside the write transaction the
        store began. SQLAlchemy's per-statement work cost more than SQLite's own for a turn's
        few rows (measured, docs/benchmarks.md); the values are plain Python scalars, so
        nothing of SQLAlchemy's type processing is skipped."""
        columns = tuple(rows[0])
        out: list[tuple[Any, ...]] = []
        per_statement = max(1, MAX_VARIABLES // len(columns))
        for start in range(0, len(rows), per_statement):
            chunk = rows[start:start + per_statement]
            key = ("lcm_messages", columns, tuple(returning), len(chunk))
            sql = self._inserts.get(key)
            if sql is None:
                one = "(" + ", ".join("?" * len(columns)) + ")"
                sql = self._inserts[key] = (
                    f"INSERT INTO lcm_messages ({', '.join(columns)}) VALUES {', '.join([one] * len(chunk))} "
                    f"ON CONFLICT DO NOTHING RETURNING {', '.join(returning)}")
            params = [row[name] for row in chunk for name in columns]
            out.extend(tuple(r) for r in _driver_execute(conn, sql, params).fetchall())
        return out

    def returning_row(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> Mapping[str, Any] | None:
        """The statement compiled once for SQLite and run on the driver's connection (the
        session bump of every turn; see ``_insert_messages``)."""
        compiled = self._inserts.get(stmt)
        if compiled is None:
            done = stmt.compile(dialect=conn.dialect)
            compiled = self._inserts[stmt] = (str(done), tuple(done.positiontup or ()))
        sql, order = compiled
        cursor = _driver_execute(conn, sql, [params[name] for name in order])
        row = cursor.fetchone()
        if row is None:
            return None
        names = [d[0] for d in cursor.description]
        cursor.fetchall()  # finish the statement
        return dict(zip(names, row, strict=True))

    def insert_ignore(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]],
                      conflict_columns: Sequence[str]) -> None:
        if rows:
            stmt = sqlite_insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
            conn.execute(stmt, list(rows))

    # -- search --------------------------------------------------------------------------

    def _search(self, conn: Connection, spec: SearchSpec, kind: str) -> tuple[list[Candidate], bool]:
        fts = (_STEMS if spec.stemmed else _FTS)[kind]
        want = spec.window if spec.ranked else spec.limit
        extent = spec.remembered(("extent", kind, spec.agent_pk, spec.session_pk),
                                 lambda: self._scope_extent(conn, kind, spec))
        if extent is None:  # the scope holds no row
            return [], False
        first_id, last_id, scope_rows = extent
        # A scope whose rows fill their id range (a store's only agent, a session written alone)
        # is scoped by the range alone: FTS5 reads the words' postings, not their intersection
        # with the scope's own list (a term in a 100k-message agent: 1.1 ms with it, 0.2 without).
        # The session counters say so (messages only), and hits are read back within the scope.
        alone = (kind == "messages" and first_id is not None and last_id is not None
                 and last_id - first_id + 1 == scope_rows)
        scope = [] if alone else [f"a{spec.agent_pk}"] if spec.session_pk is None else [f"s{spec.session_pk}"]
        match = render_match(spec.query, scope, spec.roles if kind == "messages" else ())
        # Ranking: FTS5's bm25() unless that reads long posting lists (see window_rank): it
        # counts, before scoring anything, the rows of the whole index with each query word
        # and with the scope token, so a common word or a big scope costs their whole lists.
        idfs, postings, share = self._term_stats(conn, kind, fts, spec.query) if spec.ranked else ({}, 0.0, 0.0)
        native = (spec.ranked and postings + (0 if alone else scope_rows) < window_rank.NATIVE_RANK_MAX_ROWS
                  and share < window_rank.WINDOW_RANK_MIN_SHARE)
        score = f"bm25({fts}, 1.0, 0.0)" if native else "NULL"
        # The scope's id range: FTS5 seeks its posting lists to it, so the query words' matches
        # elsewhere in the store are skipped, not read (its own rows are the only ones in it
        # that also carry its scope token).
        params: dict[str, Any] = {"match": match, "want": want, "lo": first_id, "hi": last_id}
        within = f"{fts} MATCH :match" + (" AND rowid BETWEEN :lo AND :hi" if first_id is not None else "")
        if not spec.has_post_filters:
            sql = f"SELECT rowid, {score} FROM {fts} WHERE {within} ORDER BY rowid DESC LIMIT :want"
            rows = conn.execute(text(sql), params).all()
            clamped = spec.ranked and len(rows) >= want
        else:
            base = _BASE[kind]
            filters, filter_params = post_filters(spec, "ts" if kind == "messages" else "latest_at")
            params.update(filter_params, cap=spec.scan_cap)
            sql = (
                f"WITH c AS (SELECT rowid AS id, {score} AS score FROM {fts} WHERE {within} "
                "ORDER BY rowid DESC LIMIT :cap) "
                f"SELECT c.id, c.score FROM c JOIN {base} t ON t.id = c.id "
                "JOIN lcm_sessions s ON s.id = t.session_id "
                f"WHERE {' AND '.join(filters)} ORDER BY c.id DESC LIMIT :want"
            )
            rows = conn.execute(text(sql), params).all()
            if len(rows) < want:
                inner = conn.execute(text(
                    f"SELECT count(*) FROM (SELECT rowid FROM {fts} WHERE {within} LIMIT :cap)"),
                    params).scalar_one()
                clamped = inner >= spec.scan_cap
            else:
                clamped = spec.ranked
        if not spec.ranked:
            return [Candidate(int(r[0]), None) for r in rows], clamped
        if native:  # bm25() is lower-is-better; lcm reports higher-is-better scores
            return [Candidate(int(r[0]), -float(r[1])) for r in rows], clamped
        ids = [int(r[0]) for r in rows]
        scores = self._rank_window(conn, kind, spec.query, ids, idfs)
        return [Candidate(i, scores.get(i, 0.0)) for i in ids], clamped

    @staticmethod
    def _scope_extent(conn: Connection, kind: str, spec: SearchSpec) -> tuple[int | None, int | None, int] | None:
        """(first id, last id, rows) of the search's scope, from indexes and counters (index
        seeks, whatever its size; the ids None when they would cost more); None when it is
        empty. A session's messages by seq (its ids rise with it); an agent's messages from its
        sessions' ends (SQLite keeps no (agent_id, id) index: ``min(id)`` of an agent would read
        the table), up to ``EXTENT_SESSIONS`` sessions; summaries (few) by their session index."""
        if kind == "messages" and spec.session_pk is not None:
            row = conn.execute(text(
                "SELECT (SELECT id FROM lcm_messages WHERE session_id = :s ORDER BY seq LIMIT 1), "
                "(SELECT id FROM lcm_messages WHERE session_id = :s ORDER BY seq DESC LIMIT 1), "
                "(SELECT message_count FROM lcm_sessions WHERE id = :s)"), {"s": spec.session_pk}).one()
            return None if row[0] is None else (int(row[0]), int(row[1]), int(row[2] or 0))
        if kind == "messages":
            count, rows = conn.execute(text(
                "SELECT count(*), coalesce(sum(message_count), 0) FROM lcm_sessions WHERE agent_id = :a"),
                {"a": spec.agent_pk}).one()
            if not rows:
                return None
            if count > EXTENT_SESSIONS:
                return None, None, int(rows)
            first, last = conn.execute(text(
                "SELECT min((SELECT id FROM lcm_messages m WHERE m.session_id = s.id ORDER BY m.seq LIMIT 1)), "
                "max((SELECT id FROM lcm_messages m WHERE m.session_id = s.id ORDER BY m.seq DESC LIMIT 1)) "
                "FROM lcm_sessions s WHERE s.agent_id = :a AND s.message_count > 0"), {"a": spec.agent_pk}).one()
            return None if first is None else (int(first), int(last), int(rows))
        if spec.session_pk is None:
            return None, None, 0  # an agent's summaries: no index to bound them by, and few
        first, last = conn.execute(text(
            "SELECT min(id), max(id) FROM lcm_summaries WHERE session_id = :s"), {"s": spec.session_pk}).one()
        return None if first is None else (int(first), int(last), int(last) - int(first) + 1)

    @staticmethod
    def _term_stats(conn: Connection, kind: str, fts: str, query: Query) -> tuple[dict[Term, float], float, float]:
        """Each query word's IDF, from its document frequency estimated on its newest matches
        (``window_rank.estimate_doc_freq``); those document frequencies added up (the postings
        bm25() would read), and the largest one's share of all rows."""
        base = _BASE[kind]
        newest = int(conn.execute(text(f"SELECT coalesce(max(id), 0) FROM {base}")).scalar_one())
        idfs: dict[Term, float] = {}
        widest = total = 0.0
        for term in query.positive_terms():
            if term in idfs:
                continue
            doc_freq = _doc_freq(conn, fts, term, newest)
            idfs[term] = window_rank.idf(doc_freq, newest)
            widest, total = max(widest, doc_freq), total + doc_freq
        return idfs, total, widest / max(newest, 1)

    @staticmethod
    def _rank_window(conn: Connection, kind: str, query: Query, ids: list[int],
                     idfs: dict[Term, float]) -> dict[int, float]:
        """BM25 over the candidate window (``window_rank``), for queries with a common word."""
        if not ids:
            return {}
        rows = [window_rank.WindowRow(int(r[0]), r[1] or "", int(r[2] or 0)) for r in conn.execute(text(
            f"SELECT id, substr(coalesce(search_text, content), 1, :head), token_count FROM {_BASE[kind]} "
            "WHERE id IN (SELECT value FROM json_each(:ids))"),
            {"head": window_rank.HEAD_CHARS, "ids": json.dumps(ids)})]
        return window_rank.bm25_scores(rows, query, idfs)

    def search_messages(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        return self._search(conn, spec, "messages")

    def term_rows(self, conn: Connection, kind: str, term: Term) -> float | None:
        """From the term's newest matches (a bounded FTS5 walk, ``window_rank.estimate_doc_freq``)."""
        newest = int(conn.execute(text(f"SELECT coalesce(max(id), 0) FROM {_BASE[kind]}")).scalar_one())
        return _doc_freq(conn, _FTS[kind], term, newest)

    def search_summaries(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        return self._search(conn, spec, "summaries")

    # -- the message index's backlog ------------------------------------------------------

    indexes_in_batches = True
    defer_token_counts = True

    def pending_index(self, conn: Connection) -> int:
        return int(conn.exec_driver_sql(
            f"SELECT count(*) FROM lcm_messages WHERE id > ({_MARK})").scalar_one())

    def catch_up_index(self, conn: Connection) -> None:
        """Both message indexes take the rows above the watermark, in id order, and the
        watermark moves to the newest of them (revision 0010)."""
        mark = int(conn.exec_driver_sql(_MARK).scalar_one())
        newest = int(conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM lcm_messages").scalar_one())
        self._mark_seen = max(mark, newest)  # a rolled-back write leaves it higher: read again then
        if newest <= mark:
            return
        for fts in (_FTS["messages"], _STEMS["messages"]):
            conn.execute(text(f"INSERT INTO {fts}(rowid, body, scope) SELECT id, body, scope "
                              "FROM lcm_messages_fts_src WHERE id > :mark AND id <= :newest ORDER BY id"),
                         {"mark": mark, "newest": newest})
        conn.execute(text("UPDATE lcm_search_marks SET indexed_through = :newest WHERE name = 'messages'"),
                     {"newest": newest})

    # -- integrity -----------------------------------------------------------------------

    def check_database(self, conn: Connection, *, whole: bool = True) -> list[CheckResult]:
        journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        out = []
        if whole:  # both read every page of the file (minutes at ten million messages)
            rows = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check").all()]
            if rows == ["ok"]:
                out.append(CheckResult("sqlite_quick_check", "ok", "PRAGMA quick_check: ok"))
            else:
                out.append(CheckResult("sqlite_quick_check", "fail",
                                       "PRAGMA quick_check: " + "; ".join(map(str, rows[:5]))))
            fk = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
            out.append(CheckResult("sqlite_foreign_keys", "ok" if not fk else "fail",
                                   "no dangling references" if not fk else
                                   f"{len(fk)} rows reference missing rows (first: {tuple(fk[0])})"))
        out.append(CheckResult("sqlite_journal_mode", "ok" if str(journal).lower() == "wal" else "warn",
                               f"journal_mode={journal}" + ("" if str(journal).lower() == "wal" else
                               " (WAL is needed for concurrent readers and writers)")))
        url = conn.engine.url
        blocked, _ = self.write_blocked(url, heal=False)
        out.append(CheckResult("sqlite_writable", "fail" if blocked else "ok",
                               blocked or "the database file, its folder, -wal and -shm are writable"))
        held = self.write_lock_holder(url)
        out.append(CheckResult("sqlite_write_lock", "warn" if held else "ok",
                               f"{held}: writes wait up to {self.busy_timeout_ms} ms, then fail" if held
                               else "no other connection holds the write lock"))
        return out

    def check_search_index(self, conn: Connection, deep: bool,
                           sessions: Sequence[int] | None = None) -> list[CheckResult]:
        """Every indexed row is in the index and nothing else is. Messages above the watermark
        are pending, not missing: they are indexed before the next search, and reported.
        ``sessions``: the counts compare only these sessions' rows (a whole count reads every
        row of the table and of the index: seconds at ten million messages)."""
        out = []
        listed = "" if sessions is None else ",".join(str(int(s)) for s in sessions) or "NULL"
        through = int(conn.exec_driver_sql(_MARK).scalar_one())
        pending = self.pending_index(conn)
        for kind, fts in [*_FTS.items(), *((f"{k}_stems", v) for k, v in _STEMS.items())]:
            base = f"lcm_{kind.removesuffix('_stems')}"
            upto = through if base == "lcm_messages" else None
            below = "" if upto is None else f" WHERE id <= {upto}"
            if sessions is None:
                rows = conn.exec_driver_sql(f"SELECT count(*) FROM {base}{below}").scalar_one()
                indexed = conn.exec_driver_sql(f"SELECT count(*) FROM {fts}_docsize").scalar_one()
            else:
                mine = f"SELECT id FROM {base} WHERE session_id IN ({listed})" + (
                    "" if upto is None else f" AND id <= {upto}")
                rows = conn.exec_driver_sql(f"SELECT count(*) FROM ({mine})").scalar_one()
                # A row of these sessions above the watermark is pending, not indexed: the
                # index's rows of these sessions are those at or below it (an id is unique).
                indexed = conn.exec_driver_sql(
                    f"SELECT count(*) FROM {fts}_docsize WHERE id IN ({mine})").scalar_one()
            problems = []
            if rows != indexed:
                problems.append(f"{indexed} indexed rows for {rows} {kind}" + ("" if upto is None else
                                                                               f" up to id {upto}"))
            waiting = pending if upto is not None else 0
            if deep:
                # With rank 1 FTS5 also compares the index with every row of the content view,
                # where pending rows are not indexed yet: then only the structure is checked.
                check = "('integrity-check', 1)" if not waiting else "('integrity-check', 0)"
                try:
                    conn.exec_driver_sql(f"INSERT INTO {fts}({fts}, rank) VALUES {check}")
                except (DatabaseError, OperationalError) as exc:
                    problems.append(f"FTS5 integrity-check failed: {first_line(exc)}")
            else:
                problems.extend(self._spot_check(conn, kind, fts, upto))
            how = "every row (FTS5 integrity-check)" if deep else f"counts and the newest {SAMPLE_ROWS} rows"
            if waiting:
                how += f"; {waiting} newest {kind.removesuffix('_stems')} wait to be indexed (before the next search)"
            out.append(CheckResult(f"search_index_{kind}", "fail" if problems else "ok",
                                   "; ".join(problems) if problems else f"in sync: {how}"))
        return out

    def _spot_check(self, conn: Connection, kind: str, fts: str, upto: int | None) -> list[str]:
        """Each of the newest indexed rows must be found by the first token of its own body."""
        from lcm.textindex import tokenize

        src = f"{_BASE[kind.removesuffix('_stems')]}_fts_src"
        below = "" if upto is None else f"WHERE id <= {upto} "
        rows = conn.exec_driver_sql(
            f"SELECT id, body, scope FROM {src} {below}ORDER BY id DESC LIMIT {SAMPLE_ROWS}").all()
        missing = []
        for row_id, body, scope in rows:
            toks = tokenize(body or "")
            if not toks:
                continue
            match = f'body:"{toks[0]}" AND scope:"{scope.split()[0]}"'
            found = conn.execute(
                text(f"SELECT 1 FROM {fts} WHERE {fts} MATCH :m AND rowid = :id"),
                {"m": match, "id": row_id}).first()
            if found is None:
                missing.append(row_id)
        return [f"{len(missing)} of the newest {kind} not found by their own words "
                f"(ids {missing[:5]})"] if missing else []

    def rebuild_search_index(self, conn: Connection) -> dict[str, int]:
        counts = {}
        for kind, fts in _FTS.items():
            conn.exec_driver_sql(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
            conn.exec_driver_sql(f"INSERT INTO {_STEMS[kind]}({_STEMS[kind]}) VALUES ('rebuild')")
            counts[kind] = conn.exec_driver_sql(f"SELECT count(*) FROM {fts}_docsize").scalar_one()
        # 'rebuild' indexed every row of the content views: nothing is pending any more.
        conn.exec_driver_sql("UPDATE lcm_search_marks SET indexed_through = "
                             "(SELECT coalesce(max(id), 0) FROM lcm_messages) WHERE name = 'messages'")
        return counts

    def backup(self, engine: Engine, destination: str) -> str | None:
        """SQLite's online backup API: a consistent copy while other connections keep writing."""
        import sqlite3

        target = Path(destination).expanduser()
        create_private(target)  # a copy of the conversations: owner-only when new
        raw = engine.raw_connection()
        try:
            source: Any = raw.driver_connection  # the sqlite3 connection under the pool's proxy
            with sqlite3.connect(str(target)) as copy:
                source.backup(copy)
        finally:
            raw.close()
        return str(target)

    def optimize(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA optimize")

    def before_forget(self, conn: Connection) -> None:
        # Freed pages are overwritten with zeros, so the forgotten bytes do not linger in them.
        conn.exec_driver_sql("PRAGMA secure_delete = ON")

    def after_forget(self, engine: Engine, *, vacuum: bool) -> None:
        """FTS5 keeps a deleted row's tokens in its segments until they are merged: merge them
        all now ('optimize'). Then the WAL is checkpointed into the file and truncated, and with
        ``vacuum`` the whole file is rewritten."""
        with engine.connect() as conn:
            for table in ("lcm_messages_fts", "lcm_summaries_fts", "lcm_messages_stems", "lcm_summaries_stems"):
                conn.exec_driver_sql(f"INSERT INTO {table}({table}) VALUES ('optimize')")
            conn.commit()
        raw = engine.raw_connection()  # VACUUM runs outside any transaction: the driver's own connection
        try:
            driver: Any = raw.driver_connection
            driver.execute("PRAGMA secure_delete = ON")
            if vacuum:
                driver.execute("VACUUM")
            driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            raw.close()

    def database_size(self, conn: Connection) -> int | None:
        db = conn.exec_driver_sql("PRAGMA database_list").all()
        path = next((r[2] for r in db if r[1] == "main"), None)
        if not path:
            return None
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(path + suffix)
            except OSError:
                pass
        return total
