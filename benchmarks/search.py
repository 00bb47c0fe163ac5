"""Search: ``lcm_grep`` latency against the raw driver's FTS query, on the same corpus.

Query classes: a unique needle, a rare word, two mid-frequency words, the most common word;
each session-scoped and across all of an agent's sessions, sorted by recency and by relevance.
lcm is measured through the agent tool (``lcm_grep`` via ``run_tool``: argument checks, the
bounded search, snippets, the JSON answer); the baseline is the plain FTS5 / tsvector query a
raw-driver user would write (which ranks every match). Needle recall must be 100%.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.common import append_messages, summary_ms
from benchmarks.corpus import Corpus, plant_needles
from benchmarks.raw import RawPostgres, RawSQLite, raw_for
from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.tools import run_tool

BATCH_TURNS = 125  # 500 messages per transaction
COMBO_BUDGET_S = 6.0  # per query class x scope x sort, for the slowest (raw ranked) queries
AGENTS = ("bench-0", "bench-1")


@dataclass
class Loaded:
    url: str
    store: Store
    sessions: dict[str, int]  # session key -> pk
    needles: dict[int, tuple[str, int]]  # needle index -> (agent, store id)
    messages: int
    seconds: float
    raw: RawSQLite | RawPostgres


def load(backend: str, url: str, corpus: Corpus, messages: int, sessions: int) -> Loaded:
    """``messages`` in ``sessions`` sessions of two agents, into lcm and into the raw baseline."""
    store = Store.open(url, upgrade=True)
    raw = raw_for(backend, url)
    per_session = max(1, messages // 4 // sessions)
    keys: dict[str, int] = {}
    needles: dict[int, tuple[str, int]] = {}
    index = 0
    started = time.perf_counter()
    for s in range(sessions):
        agent, key = AGENTS[s % 2], f"session-{s:04d}"
        session = store.sessions.get_or_create(agent, key, platform="cli")
        keys[key] = session.id
        anchor = None
        turns = list(corpus.turns(per_session, session=key))
        for b in range(0, len(turns), BATCH_TURNS):
            batch, base, planted = [], index, []
            for turn in turns[b:b + BATCH_TURNS]:
                planted.extend(plant_needles(turn, index))
                batch.extend(turn)
                index += len(turn)
            result = append_messages(store, session.id, batch, after_identity=anchor)
            anchor = result.last_identity
            for needle_index in planted:
                needles[needle_index] = (agent, result.store_ids[needle_index - base])
            raw.insert(session.id, base, batch)
    elapsed = time.perf_counter() - started
    store.health.optimize()
    if isinstance(raw, RawPostgres):
        # A freshly bulk-loaded table gets vacuumed by autovacuum within minutes, and that
        # would land in the middle of the timed queries: both sides are vacuumed first.
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM (ANALYZE) lcm_messages, lcm_sessions, lcm_summaries")
        raw.analyze()
    return Loaded(url, store, keys, needles, index, elapsed, raw)


def _grep(engine: LcmEngine, args: dict[str, Any]) -> dict[str, Any]:
    payload = json.loads(run_tool(engine.context, "lcm_grep", args))
    assert "error" not in payload, payload
    return payload


def measure(loaded: Loaded, corpus: Corpus, runs: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    agent = AGENTS[0]
    own = [key for key in loaded.sessions if int(key.split("-")[1]) % 2 == 0]
    engines = {}
    for key in own:
        engine = LcmEngine(LcmConfig.from_env({}, database_url=loaded.url, agent_id=agent),
                           store=loaded.store)
        engine.context.attach(key)
        engines[key] = engine
    own_needles = [i for i, (a, _) in loaded.needles.items() if a == agent]
    classes: dict[str, Callable[[], str]] = {
        "needle": lambda: Corpus.needle(rng.choice(own_needles)),
        "rare word": lambda: corpus.word_at_rank(rng.randint(12_000, 20_000)),
        "two mid words": lambda: f"{corpus.word_at_rank(rng.randint(150, 400))} "
                                 f"{corpus.word_at_rank(rng.randint(150, 400))}",
        "most common": lambda: corpus.word_at_rank(1),
    }
    rows = []
    for name, make_query in classes.items():
        for scope in ("session", "agent"):
            for sort in ("recency", "relevance"):
                lcm_ms, raw_ms, hits = [], [], 0
                budget = time.perf_counter() + COMBO_BUDGET_S
                for run in range(runs):
                    if run >= 5 and time.perf_counter() > budget:
                        break
                    query, key = make_query(), rng.choice(own)
                    engine = engines[key]
                    args = {"query": query, "sort": sort, "limit": 10,
                            "session_scope": "current" if scope == "session" else "all"}
                    t = time.perf_counter()
                    hits += len(_grep(engine, args)["results"])
                    lcm_ms.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    loaded.raw.search(query, session=loaded.sessions[key] if scope == "session" else None,
                                      sort=sort)
                    raw_ms.append((time.perf_counter() - t) * 1000)
                rows.append({"class": name, "scope": scope, "sort": sort, "runs": len(lcm_ms),
                             "lcm": summary_ms(lcm_ms), "raw": summary_ms(raw_ms), "hits": hits / len(lcm_ms)})
    return rows


def recall(loaded: Loaded) -> tuple[int, int]:
    """Every needle found by lcm_grep across its agent's sessions."""
    engines = {a: LcmEngine(LcmConfig.from_env({}, database_url=loaded.url, agent_id=a), store=loaded.store)
               for a in AGENTS}
    found = 0
    for index, (agent, store_id) in loaded.needles.items():
        hits = _grep(engines[agent], {"query": Corpus.needle(index), "session_scope": "all", "limit": 5})
        found += any(h.get("store_id") == store_id for h in hits["results"])
    return found, len(loaded.needles)


def run(backend: str, url: str, *, messages: int, sessions: int, runs: int) -> dict[str, Any]:
    corpus = Corpus()
    loaded = load(backend, url, corpus, messages, sessions)
    try:
        rows = measure(loaded, corpus, runs)
        found, total = recall(loaded)
    finally:
        loaded.raw.close()
    size = loaded.store.health.stats()["bytes"]
    return {"messages": loaded.messages, "sessions": sessions, "load_seconds": loaded.seconds,
            "store_bytes": size, "rows": rows, "recall": {"found": found, "total": total}}
