"""The explorer (``lcm ui``): how long each page takes on a big store, over real HTTP.

The store is the search benchmark's (messages in sessions of two agents, and the same rows in
the raw baseline's table); one session is compacted with the extractive summarizer so the DAG
and node pages have something to draw. Each page is requested ``runs`` times through a real
uvicorn on 127.0.0.1. The baseline for the session page is the raw driver's query for the same
50 newest rows of that session: what a hand-written page would at least have to read.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from benchmarks.common import summary_ms
from benchmarks.corpus import Corpus
from benchmarks.raw import RawPostgres
from benchmarks.search import AGENTS, load
from lcm.config import LcmConfig
from lcm.context.session import ContextSession
from lcm.records import SessionRecord
from lcm.store import Store
from tests.support.ui_server import serving


def _timed(client: httpx.Client, path: str, runs: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - t) * 1000)
        response.raise_for_status()
    return summary_ms(times)


def explorer_pages(store: Store, agent: str, key: str, runs: int, *,
                   query: str = "needle0000000zq") -> tuple[SessionRecord, dict[str, Any]]:
    """Compact session ``key`` a few times (leaves and condensed nodes for the DAG and node
    pages), then time each explorer page over HTTP; the session and the times per page."""
    context = ContextSession(LcmConfig.from_env({}, agent_id=agent), store, agent_id=agent,
                             context_length=32_000, background_embedding=False, apply_filters=False)
    context.attach(key)
    for _ in range(4):  # a few bursts: leaves and condensed nodes
        context.compact_stored(force=True)
    session = store.sessions.find(agent, key)
    assert session is not None
    node = store.summaries.of_session(session.id, limit=1)[0]
    newest = store.messages.tail(session.id, 1)[0]
    pages = {
        "agents and sessions": "/",
        "session, newest page": f"/a/{agent}/s/{key}",
        "session, first page": f"/a/{agent}/s/{key}?after=0",
        "summary DAG": f"/a/{agent}/s/{key}/dag",
        "a node and its sources": f"/a/{agent}/node/{node.id}",
        "a message": f"/a/{agent}/msg/{newest.store_id}",
        "search, agent-wide": f"/search?agent={agent}&q={query}",
        "status (store-wide counts)": "/status",
        "doctor (recent sessions of a big store)": f"/doctor?agent={agent}",
    }
    results: dict[str, Any] = {}
    with serving(store) as base, httpx.Client(base_url=base, timeout=600) as client:
        for name, path in pages.items():
            results[name] = _timed(client, path, runs)
    return session, results


def run(backend: str, url: str, *, messages: int, sessions: int, runs: int = 20) -> dict[str, Any]:
    loaded = load(backend, url, Corpus(), messages, sessions)
    store, agent = loaded.store, AGENTS[0]
    key = next(k for k in sorted(loaded.sessions) if store.sessions.find(agent, k) is not None)
    session, results = explorer_pages(store, agent, key, runs)
    raw = loaded.raw
    raw_times = []
    for _ in range(runs):
        t = time.perf_counter()
        if isinstance(raw, RawPostgres):
            raw.conn.execute("SELECT id, role, data FROM raw_msg WHERE session = %s ORDER BY id DESC LIMIT 50",
                             (session.id,)).fetchall()
            raw.conn.commit()
        else:
            raw.conn.execute("SELECT id, role, data FROM msg WHERE session = ? ORDER BY id DESC LIMIT 50",
                             (session.id,)).fetchall()
        raw_times.append((time.perf_counter() - t) * 1000)
    raw.close()
    return {"messages": loaded.messages, "sessions": sessions, "runs": runs,
            "summaries": len(store.summaries.of_session(session.id, limit=1000)),
            "pages_ms": results, "raw_session_page_ms": summary_ms(raw_times)}
