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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    bindparam,
    event,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DatabaseError, OperationalError

from lcm.backends import Backend, IdsIn, IndexRow, SearchSpec, named_rows
from lcm.backends.sqlite_driver import driver_execute
from lcm.backends.sqlite_search import BASE_TABLES, FTS_TABLES, STEM_TABLES, Fts5Search
from lcm.config import sqlite_busy_timeout_ms
from lcm.errors import first_line
from lcm.files import create_private
from lcm.records import Candidate, CheckResult
from lcm.textindex import Term

SAMPLE_ROWS = 200
#: The doctor reports a write lock held longer than this (a write takes milliseconds).
LOCK_PROBE_SECONDS = 1.0

#: A write indexes the pending messages once this many are pending (see the module docstring).
#: Measured per row (both message indexes, docs/benchmarks.md): a batch of 1024 costs about 0.7x
#: a batch of 256 and a fraction of indexing row by row; a search that finds a full batch
#: pending indexes it first (tens of milliseconds).
INDEX_BATCH = 1024
_MARK = "SELECT indexed_through FROM lcm_search_marks WHERE name = 'messages'"


#: Bound variables one statement may hold (SQLITE_MAX_VARIABLE_NUMBER's default since 3.32).
MAX_VARIABLES = 32766


def _mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


def _json_ids_in(column: ColumnElement[Any]) -> ColumnElement[bool]:
    """``column`` is one of the JSON array bound as ``ids`` (``SQLiteBackend.rows_by_ids``)."""
    return column.in_(select(literal_column("value")).select_from(func.json_each(bindparam("ids"))))


class SQLiteBackend(Backend):
    name = "sqlite"
    pool_options = {"pool_size": 8, "max_overflow": 8}

    def __init__(self) -> None:
        super().__init__()
        #: How long a write waits for another connection's write lock (LCM_SQLITE_BUSY_TIMEOUT_MS).
        self.busy_timeout_ms = sqlite_busy_timeout_ms()
        #: The message index's watermark as this process last read it (a lower bound).
        self._mark_seen = 0
        self._fts = Fts5Search()

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
            out.extend(tuple(r) for r in driver_execute(conn, sql, params).fetchall())
        return out

    def rows_by_ids(self, conn: Connection, key: str, build: Callable[[IdsIn], Select[Any]],
                    ids: Sequence[int], params: Mapping[str, Any] | None = None) -> list[Any]:
        """One statement whatever the count: the ids travel as one JSON array
        (``column IN (SELECT value FROM json_each(?))``, each id then looked up in the index),
        so the text is the same every time (sqlite3 keeps it prepared); compiled once per
        ``key`` and run on the driver's connection. A recall's hit rows, their neighbours and
        its records: 1.7-1.9 ms a read through SQLAlchemy at 100k messages, of which SQLite
        took 0.2 (docs/benchmarks.md, eleventh session)."""
        ids_json = json.dumps(list(dict.fromkeys(ids)))
        cursor = self._run_compiled(conn, ("rows_by_ids", key), lambda: build(_json_ids_in),
                                    {**(params or {}), "ids": ids_json})
        return named_rows(cursor.description, cursor.fetchall())

    def _run_compiled(self, conn: Connection, key: Any, make: Callable[[], Any],
                      params: Mapping[str, Any]) -> Any:
        """The statement ``make()`` builds, compiled once per ``key`` and run on the driver's
        connection with ``params`` (its literals, as ``seq - 1``, are parameters too: their
        values are kept from the compile)."""
        compiled = self._inserts.get(key)
        if compiled is None:
            done = make().compile(dialect=conn.dialect)
            compiled = self._inserts[key] = (str(done), tuple(done.positiontup or ()), dict(done.params))
        sql, order, literals = compiled
        values = {**literals, **params}
        return driver_execute(conn, sql, [values[name] for name in order])

    def returning_row(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> Mapping[str, Any] | None:
        """The statement compiled once for SQLite and run on the driver's connection (the
        session bump of every turn; see ``_insert_messages``)."""
        cursor = self._run_compiled(conn, stmt, lambda: stmt, params)
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

    def search_messages(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        return self._fts.search(conn, spec, "messages")

    def term_rows(self, conn: Connection, spec: SearchSpec, kind: str, term: Term) -> float | None:
        return self._fts.term_rows(conn, spec, kind, term)

    def term_rows_many(self, conn: Connection, spec: SearchSpec, kind: str,
                       terms: Sequence[Term]) -> list[float | None]:
        return list(self._fts.term_rows_many(conn, spec, kind, terms))

    def newest_ids_many(self, conn: Connection, kind: str, specs: Sequence[SearchSpec]) -> list[list[int]]:
        return self._fts.newest_ids_many(conn, kind, specs)

    def search_summaries(self, conn: Connection, spec: SearchSpec) -> tuple[list[Candidate], bool]:
        return self._fts.search(conn, spec, "summaries")

    # -- the message index's backlog ------------------------------------------------------

    indexes_in_batches = True
    defer_token_counts = True

    def pending_index(self, conn: Connection, *, except_session: int | None = None) -> int:
        """The messages above the watermark, which a search does not find at all, except
        ``except_session``'s past its coverage: the caller holds those in its context verbatim
        and leaves them out of what it finds (auto-recall), so its search need not stop to
        index them (a write transaction every turn: recall p50 6.5 -> 6.1 ms at 100k
        messages). They are indexed with the next search that needs them, or at
        ``INDEX_BATCH``, with whatever else waits then."""
        if except_session is None:
            return int(driver_execute(
                conn, f"SELECT count(*) FROM lcm_messages WHERE id > ({_MARK})", ()).fetchone()[0])
        return int(driver_execute(
            conn, f"SELECT count(*) FROM lcm_messages m WHERE m.id > ({_MARK}) AND NOT (m.session_id = :sid "
            "AND m.seq > coalesce((SELECT covered_seq FROM lcm_sessions WHERE id = :sid), 0))",
            {"sid": except_session}).fetchone()[0])

    def catch_up_index(self, conn: Connection) -> None:
        """Both message indexes take the rows above the watermark, in id order, and the
        watermark moves to the newest of them (revision 0010)."""
        mark = int(conn.exec_driver_sql(_MARK).scalar_one())
        newest = int(conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM lcm_messages").scalar_one())
        self._mark_seen = max(mark, newest)  # a rolled-back write leaves it higher: read again then
        if newest <= mark:
            return
        for fts in (FTS_TABLES["messages"], STEM_TABLES["messages"]):
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
        for kind, fts in [*FTS_TABLES.items(), *((f"{k}_stems", v) for k, v in STEM_TABLES.items())]:
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

        src = f"{BASE_TABLES[kind.removesuffix('_stems')]}_fts_src"
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
        for kind, fts in FTS_TABLES.items():
            conn.exec_driver_sql(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
            conn.exec_driver_sql(f"INSERT INTO {STEM_TABLES[kind]}({STEM_TABLES[kind]}) VALUES ('rebuild')")
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
