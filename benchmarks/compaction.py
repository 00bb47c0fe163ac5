"""Compaction throughput: stored messages summarized per second with the extractive summarizer
(LLM time excluded: it is the model's speed, not lcm's), leaves and condensation up to depth 3.

A session of N raw messages is compacted from the store (``compact_stored``, the path of an
import) on a 32k window until nothing is left to do; the rate counts messages covered.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import append_messages
from benchmarks.corpus import Corpus
from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store

BATCH = 500


def run(backend: str, url: str, *, messages: int) -> dict[str, Any]:
    store = Store.open(url, upgrade=True)
    session = store.sessions.get_or_create("bench", "compact")
    anchor = None
    flat = [m for t in Corpus().turns(messages // 4, session="compact") for m in t]
    for b in range(0, len(flat), BATCH):
        anchor = append_messages(store, session.id, flat[b:b + BATCH], after_identity=anchor).last_identity
    config = LcmConfig.from_env({}, database_url=url, agent_id="bench", summarizer="extractive",
                                max_passes=1_000, max_compaction_seconds=3_600)
    engine = LcmEngine(config, store=store)
    engine.update_model("bench", 32_000)
    engine.context.attach("compact")
    started = time.perf_counter()
    passes = leaves = condensed = calls = 0
    while True:
        outcome = engine.context.compact_stored()
        calls += 1
        if not outcome.get("passes"):
            break
        passes += outcome["passes"]
        leaves += outcome.get("leaves", 0)
        condensed += outcome.get("condensed", 0)
    elapsed = time.perf_counter() - started
    done = store.sessions.get(session.id)
    depths = {f"d{d.depth}": d.count for d in store.summaries.depth_stats(session.id)}
    return {"messages": len(flat), "compacted": done.covered_seq, "seconds": elapsed,
            "msgs_per_s": done.covered_seq / elapsed if elapsed else 0.0, "leaves": leaves,
            "condensed": condensed, "calls": calls, "depths": depths,
            "tokens_before": done.token_count, "context_tokens_after": done.raw_tokens + done.summary_tokens}
