"""Fleet: N agent processes on one database, each its own agent in a realistic loop, for a fixed
time; throughput and latency against N, with the server's own ceiling measured in the same run.

Each agent process runs a host loop: a user turn (~60 tokens), a tool call with its result
(~500 tokens of log), an answer (~80 tokens), handed to the engine as a host hands it its live
transcript (``ContextSession.turn``: store exactly once, compact with the extractive summarizer
when the 16k-token window fills, assemble), keeping what the engine hands back, and every fifth
turn an ``lcm_grep`` over all of the agent's sessions. Reported per N: total turns/s, turn
p50/p95/p99, search p95 under load against the same searches run alone before the load, and
errors. The anchor: N raw-driver processes committing one message-sized row per transaction
for the same time (what the server itself sustains for this write shape: the lcm figure is a
share of it). PostgreSQL from 1 to 32 processes, SQLite from 1 to 8 (one writer at a time).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import sqlite3
import time
from typing import Any

from benchmarks.common import pct

LOG_WORDS = ("build", "step", "module", "compiled", "linked", "cache", "miss", "warning", "deprecated", "test",
             "passed", "failed", "retry", "timeout", "socket", "worker", "queue", "shard", "replica", "index")
WINDOW = 16_000
SEARCH_EVERY = 5
#: Process counts per backend (the machine has 2 cores: the curve bends early, on purpose).
COUNTS = {"postgresql": (1, 2, 4, 8, 16, 32), "sqlite": (1, 2, 4, 8)}


def _turn(rng: random.Random, i: int) -> list[dict[str, Any]]:
    log = " ".join(f"{rng.choice(LOG_WORDS)}{rng.randint(1, 99)}" for _ in range(300))
    call = f"call_{i}"
    return [{"role": "user", "content": f"Step {i}: check the {rng.choice(LOG_WORDS)} of service s{rng.randint(1, 40)} "
                                        "and tell me what failed, with the exact error line please."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function", "function": {
                "name": "shell", "arguments": json.dumps({"cmd": f"tail -n 200 /var/log/s{i % 40}.log"})}}]},
            {"role": "tool", "tool_call_id": call, "content": log},
            {"role": "assistant", "content": f"Step {i} done: the {rng.choice(LOG_WORDS)} check passed after one "
                                             f"retry; nothing else failed in s{i % 40}."}]


def host_step(context: Any, transcript: list[dict[str, Any]], rng: random.Random, i: int, times: list[float],
              searches: list[float], errors: list[str]) -> tuple[list[dict[str, Any]], int]:
    """Turn ``i`` of the host loop: the turn handed to the engine (``ContextSession.turn``) and,
    every fifth turn, an ``lcm_grep`` over all the agent's sessions; latencies and errors go to
    the lists. Returns the transcript the engine handed back and the messages stored (0 when
    the turn failed)."""
    from lcm.tools import run_tool

    turn = _turn(rng, i)
    transcript = [*transcript, *turn]
    sent = 0
    t0 = time.perf_counter()
    try:
        transcript = context.turn(transcript)
        sent = len(turn)
    except Exception as exc:  # noqa: BLE001 - counted, the loop goes on
        errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
    times.append((time.perf_counter() - t0) * 1000)
    if (i + 1) % SEARCH_EVERY == 0:
        t0 = time.perf_counter()
        res = json.loads(run_tool(context, "lcm_grep", {"query": f"retry {rng.choice(LOG_WORDS)}",
                                                         "session_scope": "all", "limit": 10}))
        searches.append((time.perf_counter() - t0) * 1000)
        if "error" in res:
            errors.append(res["error"][:160])
    return transcript, sent


def _agent(url: str, agent: str, seconds: float, start_at: float, out: Any) -> None:
    """One agent process: the host loop until the deadline; its latencies go to ``out``."""
    from lcm.config import LcmConfig
    from lcm.context.session import ContextSession
    from lcm.store import Store

    rng = random.Random(agent)
    turns: list[float] = []
    searches: list[float] = []
    errors: list[str] = []
    context = ContextSession(LcmConfig.from_env({}, summarizer="extractive", embeddings="off"),
                             Store.open(url), agent_id=agent, context_length=WINDOW)
    context.start("fleet", platform="bench")
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a build bot."}]
    while time.time() < start_at:
        time.sleep(0.005)
    deadline = start_at + seconds
    i = 0
    while time.time() < deadline:
        transcript, _ = host_step(context, transcript, rng, i, turns, searches, errors)
        i += 1
    out.put({"turns": turns, "searches": searches, "errors": errors})


def _raw_writer(url: str, backend: str, worker: int, seconds: float, start_at: float, out: Any) -> None:
    """The anchor: one message-sized row committed per transaction, as fast as the driver goes."""
    body = "x" * 2_400
    done = 0
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE IF NOT EXISTS raw_fleet (id INTEGER PRIMARY KEY, w INT, body TEXT)")
        while time.time() < start_at:
            time.sleep(0.005)
        while time.time() < start_at + seconds:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw_fleet (w, body) VALUES (?, ?)", (worker, body))
            conn.execute("COMMIT")
            done += 1
        conn.close()
    else:
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(url)
        options = u.query.get("options")
        conn2 = psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, dbname=u.database,
                                options=options if isinstance(options, str) else None, autocommit=True)
        conn2.execute("CREATE TABLE IF NOT EXISTS raw_fleet (id BIGSERIAL PRIMARY KEY, w INT, body TEXT)")
        while time.time() < start_at:
            time.sleep(0.005)
        while time.time() < start_at + seconds:
            conn2.execute("INSERT INTO raw_fleet (w, body) VALUES (%s, %s)", (worker, body))
            done += 1
        conn2.close()
    out.put(done)


def _spawn(target: Any, args_of: Any, n: int, seconds: float) -> list[Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 2.0 + 0.15 * n  # every process imported and connected before the clock starts
    procs = [ctx.Process(target=target, args=(*args_of(i), seconds, start_at, queue)) for i in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return results


def _searches_alone(url: str, agents: int) -> list[float]:
    """The searches of the loop, run alone on the store the load left (no other process)."""
    from lcm.config import LcmConfig
    from lcm.context.session import ContextSession
    from lcm.store import Store
    from lcm.tools import run_tool

    out: list[float] = []
    rng = random.Random(7)
    store = Store.open(url)
    for a in range(min(agents, 4)):
        context = ContextSession(LcmConfig.from_env({}, summarizer="extractive", embeddings="off"), store,
                                 agent_id=f"fleet-{a}", context_length=WINDOW)
        context.start("fleet", platform="bench")
        for _ in range(15):
            t0 = time.perf_counter()
            run_tool(context, "lcm_grep", {"query": f"retry {rng.choice(LOG_WORDS)}", "session_scope": "all",
                                           "limit": 10})
            out.append((time.perf_counter() - t0) * 1000)
    return out


def run(backend: str, url: str, *, seconds: float = 15.0, counts: list[int] | None = None) -> dict[str, Any]:
    from lcm.store import Store

    Store.open(url, upgrade=True)
    rows = []
    for n in counts or COUNTS[backend]:
        raw = _spawn(_raw_writer, lambda i: (url, backend, i), n, seconds)
        results = _spawn(_agent, lambda i, n=n: (url, f"fleet-{i}", ), n, seconds)
        turns = [t for r in results for t in r["turns"]]
        searches = [s for r in results for s in r["searches"]]
        errors = [e for r in results for e in r["errors"]]
        alone = _searches_alone(url, n)
        raw_ops = sum(raw) / seconds
        rows.append({
            "agents": n, "turns": len(turns), "turns_per_s": len(turns) / seconds,
            "turn_ms": {"p50": pct(turns, 0.50), "p95": pct(turns, 0.95), "p99": pct(turns, 0.99)},
            "search_p95_ms": pct(searches, 0.95) if searches else None,
            "search_alone_p95_ms": pct(alone, 0.95) if alone else None,
            "errors": len(errors), "error_examples": sorted(set(errors))[:3],
            # Each turn commits its 4 messages in one transaction, as the anchor commits one row.
            "raw_commits_per_s": raw_ops, "messages_per_s": 4 * len(turns) / seconds,
        })
    return {"seconds": seconds, "rows": rows}
