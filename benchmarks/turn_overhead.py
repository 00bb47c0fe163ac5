"""Per-turn overhead: what lcm costs the host per turn, as history grows.

Each size builds a session with that many stored messages, summarized the way a long-running
session is (leaves of ~40 messages condensed 4:1 up to depth 3, the newest 200 raw), hands the
host the assembled context, then plays turns: ingest of one 4-message turn
(``on_turn_complete``), ``should_compress`` and a ``compress()`` with nothing to do. Printed
per operation, p50/p95 in milliseconds; the goal is flat in history size (≤ 5 ms at 100k).
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import append_messages, summary_ms, timed_turn
from benchmarks.corpus import Corpus
from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.records import NewSummary
from lcm.store import Store

LEAF_MESSAGES = 40
FANIN = 4
RAW_TAIL = 200
TURNS = 60


def build(url: str, corpus: Corpus, size: int) -> tuple[Store, str]:
    store = Store.open(url, upgrade=True)
    session = store.sessions.get_or_create("bench", "turns")
    anchor = None
    turns = list(corpus.turns(size // 4, session="turns"))
    for b in range(0, len(turns), 100):
        batch = [m for t in turns[b:b + 100] for m in t]
        anchor = append_messages(store, session.id, batch, after_identity=anchor).last_identity
    metas = store.messages.metas(session.id, first_seq=1, last_seq=max(1, size - RAW_TAIL))
    level: list[int] = []
    chunk = []
    for k, meta in enumerate(metas):
        chunk.append(meta)
        following = metas[k + 1] if k + 1 < len(metas) else None
        if len(chunk) >= LEAF_MESSAGES and following is not None and following.role == "assistant":
            node = store.summaries.write(session.id, NewSummary(
                depth=0, content=f"summary of messages {chunk[0].seq}-{chunk[-1].seq}: " + "work " * 60,
                token_count=70, source_ids=tuple(m.store_id for m in chunk), kind="bench")).node
            level.append(node.id)
            chunk = []
    for depth in (1, 2, 3):
        nxt = []
        for i in range(0, len(level) - FANIN + 1, FANIN):
            node = store.summaries.write(session.id, NewSummary(
                depth=depth, content=f"depth {depth} summary " + "arc " * 60, token_count=70,
                source_ids=tuple(level[i:i + FANIN]), kind="bench")).node
            nxt.append(node.id)
        level = nxt
    return store, session.session_key


def measure(url: str, store: Store, key: str, corpus: Corpus, size: int) -> dict[str, list[float]]:
    config = LcmConfig.from_env({}, database_url=url, condensation_fanin=FANIN, max_passes=1)
    engine = LcmEngine(config)
    engine.update_model("gpt-4", 1_000_000)
    engine.on_session_start(key)
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a benchmark agent."}]
    raw = store.messages.get_range(engine.session.id, first_seq=store.sessions.get(engine.session.id).covered_seq + 1)
    transcript.extend(r.message for r in raw)
    transcript = engine.compress(transcript, current_tokens=10_000, force=False)  # hand over once
    times: dict[str, list[float]] = {"ingest one turn": [], "should_compress": [],
                                     "compress (nothing to do)": [], "whole turn": []}
    for turn in corpus.turns(TURNS, session="bench-turns", start=10_000_000):
        transcript = transcript + turn
        out, took = timed_turn(engine, transcript, 50_000)
        assert out is transcript
        took["compress (nothing to do)"] = took.pop("compress")
        for op, ms in took.items():
            times[op].append(ms)
    return times


def run(backend: str, url: str, *, size: int) -> dict[str, Any]:
    corpus = Corpus()
    started = time.perf_counter()
    store, key = build(url, corpus, size)
    built = time.perf_counter() - started
    times = measure(url, store, key, corpus, size)
    return {"stored": size, "build_seconds": built, "ops": {op: summary_ms(v) for op, v in times.items()}}
