"""Server cost per agent turn (PostgreSQL): what the *server* spends on one agent turn, against
the raw driver doing the same storage work, on a private cluster of its own.

Agents and the server share two cores here, so wall-clock throughput says little about the
server; this phase counts the server's own work instead:

* **CPU**: the user + system time of every process of the cluster (the postmaster, its live
  children, and the children it already reaped), from ``/proc``, before and after a pass;
* **WAL** written (``pg_current_wal_lsn()`` before and after) and **rows** written
  (``pg_stat_database``: inserted + updated + deleted);
* **statements** per turn, and the costliest ones (``pg_stat_statements``, preloaded on the
  private cluster).

Each pass ends by merging its GIN indexes' pending lists (lcm's and the raw driver's alike):
the rows a pass added wait there until a later insert or autovacuum merges them, which is index
upkeep those turns caused, so it is done, and counted, within the pass. (Without it, a pass
below the pending-list limit leaves the merge out of both sides' figures.)

The turn is the fleet benchmark's agent loop, sequential and alone: a user turn, a tool call
and its ~500-token result, an answer, handed to the engine as a host hands its live transcript
(``ContextSession.turn``: store once, compact with the extractive summarizer when the 16k window
fills, assemble), and every fifth turn an ``lcm_grep`` over all the agent's sessions. The raw
baseline stores the same four messages in one transaction (one table, one GIN index) and runs a
full-text query every fifth turn.

The spread question: the same pass pair runs ``repeats`` times, interleaved (lcm, raw, lcm-ingest,
raw, ...), each on a fresh schema; reported per repeat and as median and range. "Ingest against
raw" is the per-turn ingest alone (``on_turn_complete``, no compaction, the final index catch-up
counted), as the ingest phase measures it, as a share of the raw driver's turns/s.

Capacity: one server core gives 1 s of CPU per second, so at one turn every 10 s per agent it
carries ``10 / (server CPU seconds per turn)`` agents (the arithmetic is printed with the table).
The cluster runs with ``fsync`` on, as a real server does.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks.common import pct, pg_schema_url, ratio, summary_ms
from benchmarks.corpus import Corpus
from benchmarks.fleet import LOG_WORDS, SEARCH_EVERY, WINDOW, _turn, host_step
from benchmarks.raw import RawPostgres
from lcm.store import connection
from tests.support.pg_cluster import Cluster, cannot_run_a_cluster

TICKS = os.sysconf("SC_CLK_TCK")
AGENT_TURN_EVERY_S = 10
TOP_STATEMENTS = 6
WARMUP_TURNS = 5  # as the ingest phase: the first turns pay one-time costs


def _proc_cpu(pid: int, *, with_reaped: bool) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # After the command name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
    used = int(fields[11]) + int(fields[12])
    if with_reaped:
        used += int(fields[13]) + int(fields[14])
    return used / TICKS


def server_cpu_s(postmaster: int) -> float:
    """CPU seconds used so far by the cluster: the postmaster with every child it reaped, plus
    the children still running."""
    total = _proc_cpu(postmaster, with_reaped=True)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
        if ppid == postmaster:
            total += _proc_cpu(int(entry.name), with_reaped=False)
    return total


class ServerMeter:
    """Snapshots of the cluster's CPU, WAL and row counters around a pass."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.admin = psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres",
                                     autocommit=True)

    def snapshot(self) -> dict[str, Any]:
        # The pass's backends have exited (their connections are closed before the last reading)
        # and reported their row counts on the way out; a moment for the postmaster to reap them.
        time.sleep(0.3)
        lsn, rows, commits = self.admin.execute(
            "SELECT pg_current_wal_lsn()::text, sum(tup_inserted + tup_updated + tup_deleted), sum(xact_commit) "
            "FROM pg_stat_database").fetchone()
        return {"cpu_s": server_cpu_s(self.cluster.postmaster_pid), "lsn": lsn, "rows": int(rows or 0),
                "commits": int(commits or 0)}

    def merge_pending_lists(self) -> None:
        """Merge every GIN index's pending list (the pass's schema holds the only ones)."""
        self.admin.execute(
            "SELECT gin_clean_pending_list(c.oid) FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
            "WHERE a.amname = 'gin' AND c.relkind = 'i'").fetchall()

    def reset_statements(self) -> None:
        self.admin.execute("SELECT pg_stat_statements_reset()")

    def statements(self) -> tuple[int, list[dict[str, Any]]]:
        rows = self.admin.execute(
            "SELECT calls, total_exec_time, query FROM pg_stat_statements "
            "WHERE query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_current_wal_lsn%' "
            "ORDER BY total_exec_time DESC").fetchall()
        top = [{"calls": c, "ms": round(t, 1), "query": " ".join(q.split())[:110]} for c, t, q in rows[:TOP_STATEMENTS]]
        return sum(r[0] for r in rows), top

    def delta(self, before: dict[str, Any], after: dict[str, Any], turns: int) -> dict[str, float]:
        wal = self.admin.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)",
                                 (after["lsn"], before["lsn"])).fetchone()[0]
        return {"cpu_ms_per_turn": 1000 * (after["cpu_s"] - before["cpu_s"]) / turns,
                "wal_bytes_per_turn": float(wal) / turns,
                "rows_per_turn": (after["rows"] - before["rows"]) / turns,
                "commits_per_turn": (after["commits"] - before["commits"]) / turns}


def _lcm_loop(url: str, turns: int) -> Callable[[], tuple[list[float], list[float]]]:
    """Set up (schema, engine), and return the pass itself."""
    from lcm.config import LcmConfig
    from lcm.context.session import ContextSession
    from lcm.store import Store

    store = Store.open(url, upgrade=True)
    context = ContextSession(LcmConfig.from_env({}, summarizer="extractive", embeddings="off"), store,
                             agent_id="agent-1", context_length=WINDOW)

    def play() -> tuple[list[float], list[float]]:
        rng = random.Random("server-cost")
        context.start("fleet", platform="bench")
        transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a build bot."}]
        times: list[float] = []
        searches: list[float] = []
        errors: list[str] = []
        for i in range(turns):
            transcript, _ = host_step(context, transcript, rng, i, times, searches, errors)
        assert not errors, errors[:3]
        if store.background is not None:
            store.background.wait_idle()  # the stems of the last turns: the server's work too
        return times, searches

    return play


def _raw_loop(url: str, turns: int) -> Callable[[], tuple[list[float], list[float]]]:
    raw = RawPostgres(url)

    def play() -> tuple[list[float], list[float]]:
        rng = random.Random("server-cost")
        times, searches = [], []
        try:
            for i in range(turns):
                turn = _turn(rng, i)
                t0 = time.perf_counter()
                raw.insert(1, 4 * i + 1, turn)
                times.append((time.perf_counter() - t0) * 1000)
                if (i + 1) % SEARCH_EVERY == 0:
                    t0 = time.perf_counter()
                    raw.search(f"retry {rng.choice(LOG_WORDS)}", session=None, sort="recency")
                    searches.append((time.perf_counter() - t0) * 1000)
        finally:
            raw.close()
        return times, searches

    return play


def _lcm_ingest(url: str, turns: int) -> Callable[[], tuple[list[float], list[float]]]:
    """``on_turn_complete`` alone (the ingest phase's per-turn figure); the last 'time' is the
    final index catch-up."""
    from benchmarks.ingest import _per_turn
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine
    from lcm.store import Store

    played = list(Corpus().turns(turns, session="server-cost"))
    # No vectors, whatever extras are installed: the raw driver embeds nothing, and an embedding
    # thread would take the cores the turns are timed on (``benchmarks.worker`` sets
    # LCM_EMBEDDINGS=off for its phases; this pass says so itself, for a caller without it).
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id="bench", embeddings="off"),
                       store=Store.open(url, upgrade=True))

    def play() -> tuple[list[float], list[float]]:
        times, flush_ms = _per_turn(engine, "ingest", played)
        return times, [flush_ms]

    return play


def _raw_ingest(url: str, turns: int) -> Callable[[], tuple[list[float], list[float]]]:
    played = list(Corpus().turns(turns, session="server-cost"))
    raw = RawPostgres(url)

    def play() -> tuple[list[float], list[float]]:
        times = []
        try:
            for i, turn in enumerate(played):
                t0 = time.perf_counter()
                raw.insert(1, 4 * i + 1, turn)
                times.append((time.perf_counter() - t0) * 1000)
        finally:
            raw.close()
        return times[WARMUP_TURNS:], [0.0]

    return play


def _metered(meter: ServerMeter, base: str, turns: int, setup: Any) -> dict[str, Any]:
    """One pass on a fresh schema: set up, then the server's counters around the pass alone."""
    url, drop = pg_schema_url(base)
    try:
        play = setup(url, turns)
        meter.reset_statements()
        before = meter.snapshot()
        times, extra = play()
        # Rows a pass added wait in its GIN indexes' pending lists (lcm's and the raw driver's
        # alike) until a later insert or autovacuum merges them: that is index upkeep these
        # turns caused, so it is done, and counted, within the pass.
        meter.merge_pending_lists()
        # Close the pass's connections first: a backend reports its row counts when it exits (an
        # idle one only every 10 s), and its CPU then counts among the postmaster's reaped children.
        connection.dispose(connection.resolve_url(url))
        after = meter.snapshot()
        calls, top = meter.statements()
    finally:
        drop()
    return {**meter.delta(before, after, turns), "statements_per_turn": calls / turns, "top_statements": top,
            "turn_ms": summary_ms(times), "times": times, "extra_ms": extra}


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("times", "extra_ms")}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(backend: str, url: str, *, turns: int = 300, repeats: int = 5) -> dict[str, Any]:
    if backend != "postgresql":
        return {"skipped": "server cost per turn is measured on PostgreSQL (SQLite has no server)"}
    why = cannot_run_a_cluster()
    if why:
        return {"skipped": f"server cost needs a private cluster: {why}"}
    cluster = Cluster(settings={"shared_preload_libraries": "pg_stat_statements", "fsync": "on",
                                "pg_stat_statements.track": "all"})
    try:
        meter = ServerMeter(cluster)
        meter.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        base = f"postgresql+psycopg://postgres@127.0.0.1:{cluster.port}/postgres"
        passes: list[dict[str, Any]] = []
        for _ in range(repeats):
            lcm_pass = _metered(meter, base, turns, _lcm_loop)
            raw_pass = _metered(meter, base, turns, _raw_loop)
            lcm_ingest = _metered(meter, base, turns, _lcm_ingest)
            raw_ingest = _metered(meter, base, turns, _raw_ingest)
            lcm_rate = 1000 * len(lcm_ingest["times"]) / (sum(lcm_ingest["times"]) + sum(lcm_ingest["extra_ms"]))
            raw_rate = 1000 * len(raw_ingest["times"]) / sum(raw_ingest["times"])
            passes.append({"lcm": _brief(lcm_pass), "raw": _brief(raw_pass),
                           "ingest": {"lcm_turns_per_s": lcm_rate, "raw_turns_per_s": raw_rate,
                                      "ratio": ratio(lcm_rate, raw_rate),
                                      "lcm_p50_ms": pct(lcm_ingest["times"], 0.5),
                                      "raw_p50_ms": pct(raw_ingest["times"], 0.5),
                                      "lcm_cpu_ms_per_turn": lcm_ingest["cpu_ms_per_turn"],
                                      "raw_cpu_ms_per_turn": raw_ingest["cpu_ms_per_turn"],
                                      "lcm_statements_per_turn": lcm_ingest["statements_per_turn"],
                                      "lcm_top_statements": lcm_ingest["top_statements"]}})
        meter.admin.close()
    finally:
        cluster.close()  # each pass's engines were closed with its schema (pg_schema_url)
    cpu = [p["lcm"]["cpu_ms_per_turn"] for p in passes]
    raw_cpu = [p["raw"]["cpu_ms_per_turn"] for p in passes]
    median_cpu_s = statistics.median(cpu) / 1000
    return {
        "turns": turns, "repeats": repeats, "passes": passes,
        "lcm_cpu_ms_per_turn": _spread(cpu), "raw_cpu_ms_per_turn": _spread(raw_cpu),
        "cpu_ratio": _spread([a / b for a, b in zip(cpu, raw_cpu, strict=True) if b]),
        "ingest_ratio": _spread([p["ingest"]["ratio"] for p in passes]),
        "agents_per_core": AGENT_TURN_EVERY_S / median_cpu_s if median_cpu_s else None,
        "agent_turn_every_s": AGENT_TURN_EVERY_S,
    }
