"""Ingest: 4-message turns, each its own transaction, through the engine; and bulk import.

Per turn, lcm does what a host drives: ``on_turn_complete(transcript)`` with the transcript
grown by one turn (identity, token counts, index, session counters, one transaction). The raw
baseline inserts the same four messages in one transaction. Bulk: batches of 500 messages
(``Store.append_messages``, the path of ``lcm ingest --no-compact``) against raw batches of 500.

A third per-turn pass swaps lcm's exact tiktoken counting for a 4-characters-per-token
estimate: the raw baseline counts no tokens, so this shows how much of the gap is the tokenizer
(tiktoken holds the GIL while it encodes, so a worker thread cannot hide it) and how much is
lcm's own storage path.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import append_messages, ratio, summary_ms
from benchmarks.corpus import Corpus
from benchmarks.raw import raw_for
from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.tokens import TokenCounter

BULK_BATCH = 500
#: Turns played before timing starts, on every path alike: they pay one-time costs (loading the
#: tiktoken encoding, ~0.15 s; compiling statements) that the start-up benchmark measures.
WARMUP_TURNS = 5


class _CharEstimate(TokenCounter):
    """Tokens as characters / 4: the turn's cost with the tokenizer taken out."""

    def count_text(self, text: str) -> int:
        return (len(text) + 3) // 4


def _per_turn(engine: LcmEngine, session: str, played: list[list[dict[str, Any]]]) -> list[float]:
    """Milliseconds of on_turn_complete for each turn, the transcript growing by one turn."""
    engine.update_model("bench", 10_000_000)  # no compaction: ingest alone is measured
    engine.on_session_start(session)
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a benchmark agent."}]
    times = []
    for turn in played:
        transcript = transcript + turn
        t = time.perf_counter()
        engine.on_turn_complete(transcript)
        times.append((time.perf_counter() - t) * 1000)
    assert engine.store.sessions.get(engine.session.id).message_count == 4 * len(played)
    return times[WARMUP_TURNS:]


def run(backend: str, url: str, *, turns: int, bulk_messages: int) -> dict[str, Any]:
    corpus = Corpus()
    Store.open(url, upgrade=True)
    played = list(corpus.turns(turns, session="ingest"))

    config = LcmConfig.from_env({}, database_url=url, agent_id="bench")
    engine = LcmEngine(config)
    lcm_times = _per_turn(engine, "ingest-turns", played)
    untokenized = _per_turn(LcmEngine(config, store=Store.open(url), tokens=_CharEstimate()),
                            "ingest-turns-estimated", played)

    raw = raw_for(backend, url)
    raw_times = []
    for i, turn in enumerate(played):
        t = time.perf_counter()
        raw.insert(1, 4 * i + 1, turn)
        raw_times.append((time.perf_counter() - t) * 1000)
    raw_times = raw_times[WARMUP_TURNS:]

    bulk = [m for t in corpus.turns(bulk_messages // 4, session="bulk") for m in t]
    store = engine.store
    session = store.sessions.get_or_create("bench", "ingest-bulk")
    anchor = None
    t = time.perf_counter()
    for b in range(0, len(bulk), BULK_BATCH):
        anchor = append_messages(store, session.id, bulk[b:b + BULK_BATCH], after_identity=anchor).last_identity
    lcm_bulk = time.perf_counter() - t
    t = time.perf_counter()
    for b in range(0, len(bulk), BULK_BATCH):
        raw.insert(2, b + 1, bulk[b:b + BULK_BATCH])
    raw_bulk = time.perf_counter() - t
    raw.close()

    lcm_rate = 1000 * len(lcm_times) / sum(lcm_times)
    raw_rate = 1000 * len(raw_times) / sum(raw_times)
    estimated_rate = 1000 * len(untokenized) / sum(untokenized)
    return {
        "turns": turns, "bulk_messages": len(bulk),
        "per_turn": {"lcm_turns_per_s": lcm_rate, "raw_turns_per_s": raw_rate,
                     "ratio": ratio(lcm_rate, raw_rate), "lcm_ms": summary_ms(lcm_times),
                     "raw_ms": summary_ms(raw_times),
                     "no_tokenizer_turns_per_s": estimated_rate,
                     "no_tokenizer_ratio": ratio(estimated_rate, raw_rate)},
        "bulk": {"lcm_msgs_per_s": len(bulk) / lcm_bulk, "raw_msgs_per_s": len(bulk) / raw_bulk,
                 "ratio": ratio(raw_bulk, lcm_bulk)},
    }
