"""Many connections (PostgreSQL): N agents, each with its own connection, through PgBouncer in
transaction mode on loopback, while the server keeps a small pool.

Each agent is a lightweight client: a thread with its own store handle (its own engine, so its
own connection, named ``agent-N``) running the fleet benchmark's host loop for a few turns
(store once, compact when the 16k window fills, assemble; an ``lcm_grep`` every fifth turn),
waiting ``think_s`` (x 0.5-1.5) before each turn as an agent waits for its model (default 10 s:
one turn every 10 s, the sizing unit of docs/fleet.md).
The agents are spread over a few processes, connect first, then start together. PgBouncer's
admin console is sampled during the run for the clients it holds and the server connections it
uses. Afterwards the server is asked what it stored: every message of every agent exactly once
(rows against distinct (session, seq), and against what the agents sent).

Reported: agents, peak client connections at PgBouncer, peak server connections, turns/s, turn
and search p50/p95/p99, the longest a client waited for a server connection, errors, messages
lost or stored twice. The settings used are the recipe in docs/fleet.md.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from typing import Any

from benchmarks.common import pct, pg_base, summary_ms
from benchmarks.fleet import WINDOW, host_step
from tests.support.pgbouncer import Bouncer, why_not_available

SAMPLE_EVERY_S = 0.2


def _agent(url: str, name: str, turns: int, think_s: float, ready: threading.Barrier, go: threading.Event,
           out: list[dict[str, Any]]) -> None:
    from lcm.config import LcmConfig
    from lcm.context.session import ContextSession
    from lcm.store import Store

    times: list[float] = []
    searches: list[float] = []
    errors: list[str] = []
    sent = 0
    try:
        context = ContextSession(LcmConfig.from_env({}, summarizer="extractive", embeddings="off"),
                                 Store.open(f"{url}?application_name={name}"), agent_id=name,
                                 context_length=WINDOW)
        context.start("work", platform="bench")  # connected: the connection stays in its pool
    except Exception as exc:  # noqa: BLE001 - counted
        errors.append(f"connect: {type(exc).__name__}: {str(exc)[:160]}")
        context = None
    ready.wait()
    go.wait()
    rng = random.Random(name)
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a build bot."}]
    try:
        for i in range(turns if context is not None else 0):
            time.sleep(think_s * rng.uniform(0.5, 1.5))  # the agent's model thinking
            transcript, stored = host_step(context, transcript, rng, i, times, searches, errors)
            sent += stored
    except Exception as exc:  # noqa: BLE001 - an agent that dies is an error, and still reports
        errors.append(f"agent died: {type(exc).__name__}: {str(exc)[:160]}")
    finally:
        out.append({"times": times, "searches": searches, "errors": errors, "sent": sent})


def _process(url: str, first: int, count: int, turns: int, think_s: float, start_at: float, queue: Any) -> None:
    results: list[dict[str, Any]] = []
    ready = threading.Barrier(count + 1)
    go = threading.Event()
    threads = [threading.Thread(target=_agent, args=(url, f"agent-{first + i}", turns, think_s, ready, go,
                                                          results))
               for i in range(count)]
    for t in threads:
        t.start()
    ready.wait()  # every agent of this process connected
    while time.time() < start_at:
        time.sleep(0.005)
    go.set()  # all processes' agents start together
    for t in threads:
        t.join()
    queue.put(results)


def run(backend: str, url: str, *, agents: int = 500, processes: int = 10, turns: int = 10,
        pool_size: int = 10, think_s: float = 10.0) -> dict[str, Any]:
    if backend != "postgresql":
        return {"skipped": "PgBouncer pools PostgreSQL connections"}
    why = why_not_available()
    if why:
        return {"skipped": why}
    from lcm.store import Store

    # Each agent's store holds two client connections: its turns', and its background catch-up's.
    bouncer = Bouncer(pg_base(), pool_size=pool_size, max_client_conn=2 * agents + 100)
    try:
        Store.open(bouncer.direct_url, upgrade=True)  # upgrades go to the server itself
        # The recipe (docs/fleet.md): the agents are told they go through a transaction pooler, so
        # none first tries the startup options PgBouncer refuses (a second connect in the storm).
        os.environ["LCM_PG_POOLER"] = "transaction"
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        per = [agents // processes + (1 if i < agents % processes else 0) for i in range(processes)]
        start_at = time.time() + 8 + agents * 0.02  # every agent connected before the clock starts
        procs, first = [], 0
        for count in per:
            procs.append(ctx.Process(target=_process, args=(bouncer.url, first, count, turns, think_s, start_at,
                                                                   queue)))
            first += count
        for p in procs:
            p.start()
        peak_clients = peak_servers = 0
        max_wait_us = 0
        results: list[dict[str, Any]] = []
        received = 0
        while received < len(procs):
            try:
                results.extend(queue.get(timeout=SAMPLE_EVERY_S))
                received += 1
                continue
            except Exception:  # noqa: BLE001 - queue.Empty: sample the pooler instead
                pass
            if all(p.exitcode is not None for p in procs) and queue.empty():
                raise RuntimeError(f"{len(procs) - received} agent process(es) died without reporting: "
                                   f"exit codes {[p.exitcode for p in procs]}")
            try:
                pools = bouncer.show("POOLS")
            except Exception:  # noqa: BLE001 - a busy console misses one sample, not the run
                continue
            for pool in pools:
                if pool["database"] == "lcm":
                    peak_clients = max(peak_clients, int(pool["cl_active"]) + int(pool["cl_waiting"]))
                    peak_servers = max(peak_servers, int(pool["sv_active"]) + int(pool["sv_idle"])
                                       + int(pool["sv_used"]) + int(pool.get("sv_tested", 0)))
                    max_wait_us = max(max_wait_us, int(pool["maxwait"]) * 1_000_000 + int(pool["maxwait_us"]))
        finished = time.time()
        for p in procs:
            p.join(timeout=120)
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        check = create_engine(bouncer.direct_url, poolclass=NullPool)
        with check.connect() as conn:
            rows, distinct = conn.execute(text(
                "SELECT count(*), count(DISTINCT (session_id, seq)) FROM lcm_messages")).one()
        check.dispose()
    finally:
        bouncer.close()
    times = [t for r in results for t in r["times"]]
    searches = [t for r in results for t in r["searches"]]
    errors = [e for r in results for e in r["errors"]]
    sent = sum(r["sent"] for r in results)
    return {"agents": agents, "processes": processes, "turns_per_agent": turns, "pool_size": pool_size,
            "think_s": think_s, "agents_reporting": len(results),
            "peak_client_connections": peak_clients, "peak_server_connections": peak_servers,
            "max_client_wait_ms": max_wait_us / 1000, "turns": len(times),
            "turns_per_s": len(times) / max(1e-9, finished - start_at),
            "turn_ms": summary_ms(times), "turn_p99_ms": pct(times, 0.99) if times else None,
            "search_ms": summary_ms(searches) if searches else None,
            "errors": len(errors), "error_samples": errors[:5],
            "messages_sent": sent, "messages_stored": int(rows), "stored_twice": int(rows) - int(distinct),
            "lost": sent - int(distinct)}
