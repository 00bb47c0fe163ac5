"""Ten million messages: what search, a turn, start-up, the doctor, the explorer and forget cost
when one store holds 1,000 agents x 10,000 messages and one agent with 1,000,000.

The store is filled through lcm's own bulk path (``Store.messages.append``, what
``lcm ingest --no-compact`` does: identities, exact token counts, both search indexes), by
``workers`` processes at once, one session per job (each agent has four sessions of 2,500
messages; the big agent one of 900,000 and one of 100,000). Text comes from ``FastCorpus``
(the search benchmark's vocabulary and Zipf law); every 97th message carries a needle unique
in the whole store; timestamps run three seconds apart over the year before the run.

Loading takes most of an hour per backend on 2 cores, so the store can be kept (``keep``: a
directory for SQLite, a database name for PostgreSQL) and the load resumes where it stopped:
each session continues from its last stored message. Measuring never changes the loaded rows
except in the forget step, which runs last, on the store's own copy of one small agent and on
the big agent, and is skipped when ``forget`` is false.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from benchmarks.common import append_messages, pg_base, summary_ms, timed_turn
from benchmarks.corpus import FastCorpus
from benchmarks.startup import cold_start
from benchmarks.ui import explorer_pages
from lcm.config import LcmConfig
from lcm.context.session import ContextSession
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.store import connection as db
from lcm.tools import run_tool

BATCH = 500  # messages per transaction (125 turns)
SESSIONS_PER_AGENT = 4
BIG_AGENT = "agent-big"
BIG_SESSIONS = (900_000, 100_000)
NEEDLE_EVERY = 97
SECONDS_APART = 3.0


def needle(index: int) -> str:
    return f"needle{index:08d}zq"


@dataclass(frozen=True)
class Job:
    """One session to fill: ``messages`` of it, the first at global index ``base``. A copied
    agent (:func:`copy_agents`) holds its template's text: its needles are numbered from the
    template session's base, ``text_base``."""

    agent: str
    key: str
    messages: int
    base: int
    text_base: int = -1

    @property
    def first_needle(self) -> int:
        base = self.base if self.text_base < 0 else self.text_base
        return -(-base // NEEDLE_EVERY) * NEEDLE_EVERY

    def needle_at(self, index: int) -> int:
        """The seq of needle ``index`` in this session."""
        return index - (self.base if self.text_base < 0 else self.text_base) + 1

    @property
    def needle_end(self) -> int:
        return (self.base if self.text_base < 0 else self.text_base) + self.messages


def plan(agents: int, per_agent: int, big: int, templates: int = 0) -> list[Job]:
    """The sessions of the store; with ``templates``, agents past them are copies of agent
    ``k % templates`` (their text, so their needles, are the template's)."""
    jobs = []
    per_session = per_agent // SESSIONS_PER_AGENT
    for a in range(agents):
        t = a % templates if templates and a >= templates else a
        for s in range(SESSIONS_PER_AGENT):
            jobs.append(Job(f"agent-{a:04d}", f"a{a:04d}-s{s}", per_session, a * per_agent + s * per_session,
                            t * per_agent + s * per_session))
    base = agents * per_agent
    if big:
        sizes = [round(big * share / sum(BIG_SESSIONS)) for share in BIG_SESSIONS]
        for s, size in enumerate(sizes):
            jobs.append(Job(BIG_AGENT, f"big-s{s}", size, base))
            base += size
    return jobs


def store_url(backend: str, keep: str) -> str:
    """The kept store's URL: a SQLite file in directory ``keep``, or PostgreSQL database ``keep``
    on the benchmark server (created when missing)."""
    if backend == "sqlite":
        os.makedirs(keep, exist_ok=True)
        return f"sqlite:///{os.path.abspath(keep)}/lcm.db"
    base = make_url(pg_base())
    admin = create_engine(base, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": keep}).first():
            conn.exec_driver_sql(f'CREATE DATABASE "{keep}"')
    admin.dispose()
    return base.set(database=keep).render_as_string(hide_password=False)


_worker_store: Store | None = None


def _open_worker(url: str) -> None:
    global _worker_store
    os.environ["LCM_EMBEDDINGS"] = "off"
    _worker_store = Store.open(url)


@functools.cache
def _corpus() -> FastCorpus:
    return FastCorpus()  # 0.1-0.2 s to build: once per process, not per session


def _messages(job: Job, first: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(global index of the batch's first message, batch) from message ``first`` of the job on."""
    corpus = _corpus()
    turns_per_batch = BATCH // 4
    for start in range(first // 4, job.messages // 4, turns_per_batch):
        count = min(turns_per_batch, job.messages // 4 - start)
        batch = [m for turn in corpus.turns(count, session=job.key, start=start) for m in turn]
        index = job.base + start * 4
        for offset, message in enumerate(batch):
            if (index + offset) % NEEDLE_EVERY == 0:
                message["content"] += " " + needle(index + offset)
        yield index, batch


def fill(job: Job, t0: float) -> tuple[int, int]:
    """Store what the job's session still lacks; (messages stored, characters of their text)."""
    store = _worker_store
    assert store is not None
    session = store.sessions.get_or_create(job.agent, job.key, platform="bench")
    last = session.last_seq
    assert last % 4 == 0, f"{job.key} stopped mid-turn at {last}"
    if last >= job.messages:
        return 0, 0  # filled by an earlier run
    stored = chars = 0
    for index, batch in _messages(job, last):
        stamps = [t0 + (index + i) * SECONDS_APART for i in range(len(batch))]
        append_messages(store, session.id, batch, expect_last_seq=last, timestamps=stamps)
        last += len(batch)
        stored += len(batch)
        chars += sum(len(m["content"]) for m in batch)
    return stored, chars


def load(backend: str, url: str, jobs: list[Job], workers: int) -> dict[str, Any]:
    """Fill every job's session, ``workers`` processes at once; big sessions first."""
    Store.open(url, upgrade=True)
    db.dispose(db.resolve_url(url))  # the workers open their own connections
    t0 = time.time() - 366 * 86400  # the store's year: every run stamps the same spread
    t0 = float(int(t0 // 86400) * 86400)
    total = sum(j.messages for j in jobs)
    stored = chars = done = 0
    started = time.perf_counter()
    last_report = started
    ordered = sorted(jobs, key=lambda j: -j.messages)
    with ProcessPoolExecutor(workers, initializer=_open_worker, initargs=(url,)) as pool:
        futures = [pool.submit(fill, job, t0) for job in ordered]
        for future in as_completed(futures):
            n, c = future.result()
            stored, chars, done = stored + n, chars + c, done + 1
            now = time.perf_counter()
            if now - last_report > 30 or done == len(jobs):
                rate = stored / (now - started) if stored else 0.0
                print(f"[scale load {backend}] {done}/{len(jobs)} sessions, {stored:,} messages stored "
                      f"this run, {rate:,.0f}/s", file=sys.stderr, flush=True)
                last_report = now
    seconds = time.perf_counter() - started
    store = Store.open(url)
    t = time.perf_counter()
    store.health.optimize()
    if backend == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("SET statement_timeout = 0")  # lcm's connections carry one
            conn.exec_driver_sql("VACUUM (ANALYZE) lcm_messages, lcm_sessions, lcm_summaries")
    optimize_s = time.perf_counter() - t
    db.dispose(db.resolve_url(url))
    return {"messages_total": total, "stored_this_run": stored, "load_seconds": seconds,
            "messages_per_s": stored / seconds if seconds and stored else None, "optimize_seconds": optimize_s,
            "workers": workers}



# -- copying agents ---------------------------------------------------------------------------

#: PostgreSQL's search indexes, which a copy would update row by row: dropped while copying and
#: built again after (their definitions are read from the database first, so they come back
#: exactly as lcm made them).
GIN_INDEXES = ("ix_lcm_messages_search_vector", "ix_lcm_message_stems_search_stems")


def _columns(conn: Any, backend: str, table: str, skip: set[str]) -> list[str]:
    if backend == "sqlite":
        names = [row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})").all()]
    else:
        names = [c for (c,) in conn.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = :t ORDER BY ordinal_position"), {"t": table}).all()]
    return [c for c in names if c not in skip]


def _scope(vector: str) -> str:
    """PostgreSQL: ``vector`` with its scope lexemes moved from its own row's session and agent
    to the copy's (``lcm.backends.pg_text.scope_lexemes``: positionless ``§s<id>``, ``§a<id>``)."""
    return (f"(ts_delete({vector}, ARRAY['§s' || m.session_id, '§a' || m.agent_id]) || "
            "format('''§s%s'' ''§a%s''', smap.new_sid, smap.new_aid)::tsvector)")


def _index_definitions(conn: Any, state: Path) -> dict[str, str]:
    """The GIN indexes' DDL as lcm created it, kept in ``state`` while they are dropped (so an
    interrupted copy still knows how to build them again)."""
    defs = dict(conn.execute(text(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
        "AND indexname = ANY(:names)"), {"names": list(GIN_INDEXES)}).all())
    if len(defs) == len(GIN_INDEXES):
        state.write_text(json.dumps(defs))
        return defs
    return dict(json.loads(state.read_text()))


def copy_agents(backend: str, url: str, jobs: list[Job], templates: int) -> dict[str, Any]:
    """Make every small agent not stored yet a copy of agent number ``k % templates``.

    Loading ten million messages through lcm's own path takes hours on this 2-core VM (the
    server's index upkeep and the Python side compete for the same cores); the first
    ``templates`` agents (and the big one) are loaded that way, and the rest are their rows
    copied in SQL: sessions with their counters, messages with every column as lcm wrote it.
    Search indexes: on SQLite the copies are rows above the index watermark, which lcm's own
    catch-up indexes (``store.health.optimize``); on PostgreSQL the exact and the stemmed
    vectors are copied with their scope lexemes moved to the copy's session and agent (the
    doctor's sample check compares the newest rows, all copies, with what lcm would write), the
    two GIN indexes dropped during the copy and built again after it. One transaction per
    agent: an interrupted copy resumes at the first agent not copied."""
    pg = backend == "postgresql"
    Store.open(url, upgrade=True)
    engine = create_engine(url, poolclass=NullPool)  # plain transactions: the driver's own
    names = sorted({job.agent for job in jobs if job.agent != BIG_AGENT})
    per_session = next(job.messages for job in jobs if job.agent != BIG_AGENT)
    state = Path.home() / f".lcm-scale-{zlib.crc32(url.encode()):08x}-gin.json"
    started = time.perf_counter()
    with engine.connect() as conn:
        complete = {name for (name,) in conn.execute(text(
            "SELECT a.name FROM lcm_agents a JOIN lcm_sessions s ON s.agent_id = a.id GROUP BY a.name "
            "HAVING sum(CASE WHEN s.last_seq >= :per THEN 1 ELSE 0 END) >= :n"),  # measuring adds sessions
            {"n": SESSIONS_PER_AGENT, "per": per_session}).all()}
        missing = [n for n in names[:templates] if n not in complete]
        if missing:
            raise RuntimeError(f"template agents not loaded yet: {missing[:5]}")
        todo = [n for n in names[templates:] if n not in complete]
        session_cols = _columns(conn, backend, "lcm_sessions", {"id", "agent_id", "session_key"})
        message_cols = _columns(conn, backend, "lcm_messages", {"id", "session_id", "agent_id", "search_vector"})
        defs = _index_definitions(conn, state) if pg else {}
        if todo:
            for name in defs:
                conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
            conn.exec_driver_sql("CREATE TEMP TABLE IF NOT EXISTS smap "
                                 "(old_sid bigint, new_sid bigint, new_aid bigint)")
            if pg:
                # Fresh statistics (a bulk-loaded table's are stale without autovacuum) and no
                # JIT: each copy then walks the template's rows by index, not the whole table.
                conn.exec_driver_sql("ANALYZE lcm_sessions, lcm_messages, lcm_message_stems")
                conn.exec_driver_sql("SET jit = off")
        conn.commit()
        sc, mc = ", ".join(session_cols), ", ".join(message_cols)
        vector = f", {_scope('m.search_vector')}" if pg else ""
        for done, name in enumerate(todo, start=1):
            template = names[names.index(name) % templates]
            keys = {"template": template, "name": name, "tkey": f"a{template[-4:]}-", "nkey": f"a{name[-4:]}-",
                    "t": time.time()}
            conn.execute(text("INSERT INTO lcm_agents (name, created_at) VALUES (:name, :t) ON CONFLICT DO NOTHING"),
                         keys)
            # Sessions an interrupted run of the loader left (partly filled) are copied over.
            mine = "(SELECT id FROM lcm_agents WHERE name = :name)"
            if pg:
                conn.execute(text(f"DELETE FROM lcm_message_stems WHERE agent_id = {mine}"), keys)
            conn.execute(text(f"DELETE FROM lcm_messages WHERE agent_id = {mine}"), keys)
            conn.execute(text(f"DELETE FROM lcm_sessions WHERE agent_id = {mine}"), keys)
            conn.execute(text("DELETE FROM smap"))
            conn.execute(text(
                f"INSERT INTO lcm_sessions (agent_id, session_key, {sc}) "
                f"SELECT {mine}, replace(s.session_key, :tkey, :nkey), {', '.join('s.' + c for c in session_cols)} "
                "FROM lcm_sessions s JOIN lcm_agents a ON a.id = s.agent_id WHERE a.name = :template "
                "ORDER BY s.id"), keys)
            conn.execute(text(
                "INSERT INTO smap SELECT s.id, n.id, n.agent_id FROM lcm_sessions s "
                "JOIN lcm_agents a ON a.id = s.agent_id AND a.name = :template "
                f"JOIN lcm_sessions n ON n.agent_id = {mine} AND n.session_key = replace(s.session_key, :tkey, :nkey)"),
                keys)
            if pg:
                conn.exec_driver_sql("ANALYZE smap")
            conn.execute(text(
                f"INSERT INTO lcm_messages (session_id, agent_id, {mc}{', search_vector' if pg else ''}) "
                f"SELECT smap.new_sid, smap.new_aid, {', '.join('m.' + c for c in message_cols)}{vector} "
                "FROM smap JOIN lcm_messages m ON m.session_id = smap.old_sid ORDER BY smap.new_sid, m.seq"))
            if pg:
                conn.execute(text(
                    "INSERT INTO lcm_message_stems (message_id, agent_id, search_stems) "
                    f"SELECT n.id, n.agent_id, {_scope('st.search_stems')} "
                    "FROM smap JOIN lcm_messages m ON m.session_id = smap.old_sid "
                    "JOIN lcm_message_stems st ON st.message_id = m.id "
                    "JOIN lcm_messages n ON n.session_id = smap.new_sid AND n.seq = m.seq"))
            conn.commit()
            if done % 20 == 0 or done == len(todo):
                print(f"[scale copy {backend}] {done}/{len(todo)} agents copied, "
                      f"{time.perf_counter() - started:,.0f} s", file=sys.stderr, flush=True)
        copy_s = time.perf_counter() - started
        t = time.perf_counter()
        if pg:
            present = {n for (n,) in conn.execute(text(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")).all()}
            conn.exec_driver_sql("SET maintenance_work_mem = '1GB'")
            for index_name, ddl in defs.items():
                if index_name not in present:
                    print(f"[scale copy {backend}] building {index_name}", file=sys.stderr, flush=True)
                    conn.exec_driver_sql(ddl)
                    conn.commit()
            state.unlink(missing_ok=True)
        else:
            conn.rollback()
    if not pg:
        print(f"[scale copy {backend}] indexing the copies for search (lcm's catch-up)", file=sys.stderr, flush=True)
        Store.open(url).health.optimize()
    index_s = time.perf_counter() - t
    engine.dispose()
    db.dispose(db.resolve_url(url))
    return {"templates": templates, "agents_copied": len(todo), "copy_seconds": copy_s,
            "index_build_seconds": index_s}


# -- measuring ---------------------------------------------------------------------------------

COMBO_BUDGET_S = 8.0
TURNS = 60
WINDOW = 128_000


def _engine(url: str, store: Store, agent: str, key: str) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id=agent), store=store)
    engine.context.attach(key)
    return engine


def _grep(engine: LcmEngine, args: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(run_tool(engine.context, "lcm_grep", args))
    assert "error" not in payload, payload
    return payload


class _Engines:
    """An engine per session searched, the last 64 kept (an engine opens its own context)."""

    def __init__(self, url: str, store: Store) -> None:
        self._url, self._store = url, store
        self._open: dict[str, LcmEngine] = {}

    def of(self, job: Job) -> LcmEngine:
        if job.key not in self._open:
            if len(self._open) >= 64:
                self._open.clear()
            self._open[job.key] = _engine(self._url, self._store, job.agent, job.key)
        return self._open[job.key]


def grep_latency(url: str, store: Store, jobs: list[Job], *, big: bool, runs: int,
                 seed: int = 1) -> list[dict[str, Any]]:
    """``lcm_grep`` per query class x scope x sort, in a random small agent's session each run
    (``big``: the big agent's 900k session), through the agent tool."""
    rng = random.Random(seed)
    corpus = FastCorpus()
    pool = [j for j in jobs if (j.agent == BIG_AGENT) == big]
    if big:
        pool = pool[:1]
    engines = _Engines(url, store)

    def pick() -> tuple[Job, LcmEngine]:
        job = rng.choice(pool)
        return job, engines.of(job)

    def a_needle(job: Job) -> str:
        return needle(rng.randrange(job.first_needle, job.needle_end, NEEDLE_EVERY))

    classes: dict[str, Callable[[Job], str]] = {
        "needle": a_needle,
        "rare word": lambda job: corpus.word_at_rank(rng.randint(12_000, 20_000)),
        "two mid words": lambda job: f"{corpus.word_at_rank(rng.randint(150, 400))} "
                                     f"{corpus.word_at_rank(rng.randint(150, 400))}",
        "most common": lambda job: corpus.word_at_rank(1),
    }
    rows = []
    for name, make_query in classes.items():
        for scope in ("session", "agent"):
            for sort in ("recency", "relevance"):
                times, hits = [], 0
                budget = time.perf_counter() + COMBO_BUDGET_S
                for run in range(runs):
                    if run >= 10 and time.perf_counter() > budget:
                        break
                    job, engine = pick()
                    args = {"query": make_query(job), "sort": sort, "limit": 10,
                            "session_scope": "current" if scope == "session" else "all"}
                    t = time.perf_counter()
                    hits += len(_grep(engine, args)["results"])
                    times.append((time.perf_counter() - t) * 1000)
                rows.append({"class": name, "scope": scope, "sort": sort, "runs": len(times),
                             "lcm": summary_ms(times), "hits": hits / len(times)})
    return rows


def needle_recall(url: str, store: Store, jobs: list[Job], sample: int, seed: int = 2) -> dict[str, int]:
    """Needles drawn across the whole store, each looked for agent-wide by its own agent."""
    rng = random.Random(seed)
    engines = _Engines(url, store)
    found = 0
    for _ in range(sample):
        job = rng.choice(jobs)
        index = rng.randrange(job.first_needle, job.needle_end, NEEDLE_EVERY)
        session = store.sessions.find(job.agent, job.key)
        assert session is not None
        seq = job.needle_at(index)
        want = store.messages.get_range(session.id, first_seq=seq, last_seq=seq)[0].store_id
        hits = _grep(engines.of(job), {"query": needle(index), "session_scope": "all", "limit": 5})["results"]
        found += any(h.get("store_id") == want for h in hits)
    return {"found": found, "total": sample}


def compacted(store: Store, agent: str, key: str, context_length: int = WINDOW) -> int:
    """Compact a bulk-loaded session as a live one would be (extractive summaries, this
    window) until nothing more is due; the summaries written. A live session of 2,500
    messages has a DAG; a bulk load leaves none, and its first turn would compact instead."""
    context = ContextSession(LcmConfig.from_env({}, agent_id=agent, summarizer="extractive"), store,
                             agent_id=agent, context_length=context_length, background_embedding=False,
                             apply_filters=False)
    context.attach(key)
    written = 0
    for _ in range(100):
        outcome = context.compact_stored()
        if not outcome.get("passes"):
            break
        written += int(outcome.get("leaves", 0)) + int(outcome.get("condensed", 0))
    return written


def turn_latency(url: str, store: Store, agent: str, key: str, *, label: str) -> dict[str, Any]:
    """Turns under a 128k window: ingest (``on_turn_complete``), ``should_compress`` and
    ``compress``. An existing session is resumed as a restarted host resumes it (lcm's context
    for it); a new one starts from a system prompt."""
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id=agent, summarizer="extractive"),
                       store=store)
    engine.update_model("bench", WINDOW)
    engine.on_session_start(key)
    system = {"role": "system", "content": "You are a benchmark agent."}
    session = store.sessions.find(agent, key)
    stored_before = session.message_count if session is not None else 0
    transcript: list[dict[str, Any]] = [system]
    if session is not None:
        transcript = list(engine.context.assemble_context(system).messages)
    times: dict[str, list[float]] = {"ingest one turn": [], "should_compress": [], "compress": [],
                                     "whole turn": []}
    compacted_turns = 0
    for turn in FastCorpus(seed=99).turns(TURNS, session=f"turns-{key}-{stored_before}"):
        transcript = transcript + turn
        out, took = timed_turn(engine, transcript, 20_000)
        if out is not transcript:
            compacted_turns += 1
            transcript = out
        for op, ms in took.items():
            times[op].append(ms)
    assert engine.context.last_error is None, engine.context.last_error
    return {"label": label, "session": key, "stored_before": stored_before, "turns": TURNS,
            "compacted_turns": compacted_turns, "ops": {op: summary_ms(v) for op, v in times.items()}}


def _timed_cli(url: str, *args: str) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lcm", *args, "--url", url, "--json"], capture_output=True,
                          text=True, timeout=3 * 3600)
    seconds = time.perf_counter() - t
    if done.returncode not in (0, 1):
        raise RuntimeError(f"lcm {' '.join(args)} failed: {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def disk(store: Store) -> dict[str, Any]:
    """Bytes on disk per message against the text stored (content, tool-call arguments)."""
    with store.engine.connect() as conn:
        messages, text_bytes, json_bytes = conn.execute(text(
            "SELECT count(*), sum(length(coalesce(content, '')) + length(coalesce(tool_calls, ''))), "
            "sum(length(coalesce(content, '')) + length(coalesce(tool_calls, '')) + length(role) + 40) "
            "FROM lcm_messages")).one()
        tables = _table_sizes(store.backend_name, conn)
    size = store.health.stats()["bytes"]
    return {"messages": messages, "store_bytes": size, "text_bytes": int(text_bytes or 0),
            "bytes_per_message": size / messages if messages else None,
            "text_bytes_per_message": (text_bytes or 0) / messages if messages else None,
            "ratio_to_text": size / text_bytes if text_bytes else None, "tables": tables}


def _table_sizes(backend: str, conn: Any) -> dict[str, dict[str, int]] | None:
    """Per lcm table: heap, TOAST and index bytes (PostgreSQL); None on SQLite, one file."""
    if backend != "postgresql":
        return None
    rows = conn.execute(text(
        "SELECT c.relname, pg_relation_size(c.oid), pg_total_relation_size(c.oid) - pg_relation_size(c.oid) "
        "- pg_indexes_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c WHERE c.relkind = 'r' "
        "AND c.relname LIKE 'lcm\\_%' AND c.relnamespace = (SELECT oid FROM pg_namespace "
        "WHERE nspname = current_schema()) ORDER BY pg_total_relation_size(c.oid) DESC")).all()
    return {name: {"heap": heap, "toast": toast, "indexes": indexes} for name, heap, toast, indexes in rows}


def _reclaimable(backend: str, conn: Any) -> dict[str, int]:
    """What deleted rows left behind: dead tuples (PostgreSQL, until VACUUM marks their space
    reusable) or free pages (SQLite, reused by later writes; VACUUM returns them to the OS)."""
    if backend == "postgresql":
        dead, live = conn.execute(text(
            "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables "
            "WHERE relname LIKE 'lcm\\_%'")).one()
        return {"dead_tuples": int(dead), "live_tuples": int(live)}
    pages = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
    size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
    return {"free_pages": int(pages), "free_bytes": int(pages) * int(size)}


def _partial(out: dict[str, Any]) -> None:
    """What is measured so far, as a JSON line on stderr: a later step that fails (an hour
    into a run) does not take the earlier ones with it."""
    print("[scale partial] " + json.dumps(out), file=sys.stderr, flush=True)


def measure(backend: str, url: str, jobs: list[Job], *, runs: int, recall_sample: int, startups: int,
            forget: bool) -> dict[str, Any]:
    store = Store.open(url)
    with store.engine.connect() as conn:  # an agent a measuring run forgot is not measured again
        present = {tuple(r) for r in conn.execute(text(
            "SELECT a.name, s.session_key FROM lcm_sessions s JOIN lcm_agents a ON a.id = s.agent_id "
            "WHERE s.message_count > 0")).all()}
    jobs = [j for j in jobs if (j.agent, j.key) in present]
    small = [j for j in jobs if j.agent != BIG_AGENT]
    rng = random.Random(3)
    out: dict[str, Any] = {"disk": disk(store)}
    print(f"[scale {backend}] search", file=sys.stderr, flush=True)
    out["grep_small_agents"] = grep_latency(url, store, jobs, big=False, runs=runs)
    if any(j.agent == BIG_AGENT for j in jobs):
        out["grep_big_agent"] = grep_latency(url, store, jobs, big=True, runs=runs)
    out["needle_recall"] = needle_recall(url, store, jobs, recall_sample)
    _partial(out)
    print(f"[scale {backend}] turns and start-up", file=sys.stderr, flush=True)
    chosen = rng.sample(small, startups + 1)
    out["compacted_for_turns"] = {job.key: compacted(store, job.agent, job.key) for job in chosen}
    out["turns"] = [turn_latency(url, store, chosen[0].agent, chosen[0].key, label="resumed, 2,500 stored, compacted"),
                    turn_latency(url, store, chosen[0].agent, f"new-{chosen[0].key}", label="new session, small agent")]
    if any(j.agent == BIG_AGENT for j in jobs):
        out["turns"].append(turn_latency(url, store, BIG_AGENT, "new-big", label="new session, 1M-message agent"))
    out["startup"] = [cold_start(store, job.agent, job.key) for job in chosen[1:]]
    _partial(out)
    print(f"[scale {backend}] doctor and explorer", file=sys.stderr, flush=True)
    seconds, report = _timed_cli(url, "doctor")
    out["doctor"] = {"seconds": seconds, "overall": report.get("overall")}
    seconds, report = _timed_cli(url, "status")
    out["status_seconds"] = seconds
    explorer_job = rng.choice(small)
    _, out["explorer_pages_ms"] = explorer_pages(store, explorer_job.agent, explorer_job.key, 3,
                                                 query=needle(explorer_job.first_needle))
    _partial(out)
    if forget:
        print(f"[scale {backend}] forget", file=sys.stderr, flush=True)
        out["forget"] = [forget_agent(backend, url, store, agent)
                         for agent in (rng.choice(small).agent, BIG_AGENT)
                         if any(j.agent == agent for j in jobs)]
    return out


def forget_agent(backend: str, url: str, store: Store, agent: str) -> dict[str, Any]:
    """``lcm forget --all-of-agent --yes`` as a user runs it; the space it leaves; the VACUUM
    that takes the space back (plain VACUUM on PostgreSQL: reusable, not returned to the OS)."""
    before = store.health.stats()["bytes"]
    messages = sum(s.message_count for s in store.sessions.of_agent(agent))
    seconds, report = _timed_cli(url, "forget", "--agent", agent, "--all-of-agent", "--yes")
    after = store.health.stats()["bytes"]
    result: dict[str, Any] = {"agent": agent, "messages": messages, "forget_seconds": seconds,
                              "bytes_before": before, "bytes_after": after}
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        time.sleep(1.0)  # PostgreSQL's statistics reach pg_stat_user_tables within a second
        result.update(_reclaimable(backend, conn))
        if backend == "postgresql":
            conn.exec_driver_sql("SET statement_timeout = 0")  # lcm's connections carry one
            t = time.perf_counter()
            conn.exec_driver_sql("VACUUM lcm_messages, lcm_message_stems, lcm_sessions, lcm_summaries, "
                                 "lcm_summary_sources")
            result["vacuum_seconds"] = time.perf_counter() - t
            time.sleep(1.0)
            result["after_vacuum"] = _reclaimable(backend, conn)
    result["bytes_after_vacuum"] = store.health.stats()["bytes"]
    return result


def run(backend: str, url: str, *, agents: int, per_agent: int, big: int, keep: str = "", workers: int = 2,
        templates: int = 0, runs: int = 40, recall_sample: int = 200, startups: int = 5,
        forget: bool = True, copy: bool = True) -> dict[str, Any]:
    """Load (or resume loading) the store, then measure it. ``keep``: a store kept between runs
    (else the worker's fresh one, dropped afterwards). ``templates``: load only that many small
    agents through lcm and copy the rest (:func:`copy_agents`)."""
    if keep:
        url = store_url(backend, keep)
    jobs = plan(agents, per_agent, big, templates)
    through_lcm = [j for j in jobs if not templates or j.agent == BIG_AGENT or int(j.agent[-4:]) < templates]
    out: dict[str, Any] = {"agents": agents + (1 if big else 0), "sessions": len(jobs),
                           "load": load(backend, url, through_lcm, workers)}
    if templates and copy:  # copy=False: measure a kept store again as it is
        out["copy"] = copy_agents(backend, url, jobs, templates)
        if backend == "postgresql":
            store = Store.open(url)
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("SET statement_timeout = 0")
                t = time.perf_counter()
                conn.exec_driver_sql("VACUUM (ANALYZE) lcm_messages, lcm_message_stems, lcm_sessions")
                out["copy"]["vacuum_analyze_seconds"] = time.perf_counter() - t
    out.update(measure(backend, url, jobs, runs=runs, recall_sample=recall_sample, startups=startups,
                       forget=forget))
    return out


def main() -> None:
    """``python -m benchmarks.scale load BACKEND KEEP [AGENTS PER_AGENT BIG WORKERS]``: fill a
    kept store (resumable) without measuring, e.g. in the background before a measuring run."""
    backend, keep = sys.argv[2], sys.argv[3]
    agents, per_agent, big, workers = (int(v) for v in (sys.argv[4:8] or ["1000", "10000", "1000000", "2"]))
    url = store_url(backend, keep)
    print(json.dumps(load(backend, url, plan(agents, per_agent, big), workers)))


if __name__ == "__main__":
    main()
