"""Ingest: 4-message turns, each its own transaction, through the engine; and bulk import.

Per turn, lcm does what a host drives: ``on_turn_complete(transcript)`` with the transcript
grown by one turn (identity, token counts, index, session counters, one transaction). The raw
baseline inserts the same four messages in one transaction. Bulk: batches of 500 messages
(``Store.append_messages``, the path of ``lcm ingest --no-compact``) against raw batches of 500.

The gap to the raw driver, taken apart (each pass on a fresh, empty database of its own, like the
first, with the same turns):

* *tokenizer excluded*: lcm's exact tiktoken counting swapped for a 4-characters-per-token
  estimate. The raw baseline counts no tokens (tiktoken holds the GIL while it encodes, so a
  worker thread cannot hide it);
* *index upkeep excluded*: the work lcm's search indexes cost beyond one plain one taken out
  (SQLite: the batched catch-up of the exact and the stemmed FTS5 index, revision 0010, never
  runs; PostgreSQL: the stemmed catch-up never runs and the exact vector's GIN index is
  dropped from the schema). The raw baseline keeps one index, so this over-credits lcm slightly;
* *both excluded*: what is left is lcm's own path (alignment, identity, encoding, the session
  counters, one transaction or statement).

These passes only measure where the time goes; nothing in lcm runs that way.

On SQLite lcm indexes messages for search in batches (revision 0010): most turns leave their
rows pending, one turn in about 256 indexes a batch of 1024. Every pass but *index upkeep
excluded* ends by indexing what is still pending (what the next search would do), and that
time counts in its rate, so lcm's turns/s include all of its index upkeep.

On PostgreSQL a turn writes each message's exact vector with its row and leaves the stemmed one
to the store's background catch-up (revision 0012), which sends a batch every 64 messages: the
server stems them on its other core while the next turns run. Every pass but *index upkeep
excluded* ends by waiting for that thread and catching up what is left, and that time counts
in its rate too.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from benchmarks.common import append_messages, backend_url, ratio, summary_ms
from benchmarks.corpus import Corpus
from benchmarks.raw import raw_for
from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.tokens import EstimatedTokens

BULK_BATCH = 500
#: Turns played before timing starts, on every path alike: they pay one-time costs (loading the
#: tiktoken encoding, ~0.15 s; compiling statements) that the start-up benchmark measures.
WARMUP_TURNS = 5


#: Schema changes that take PostgreSQL's exact index upkeep out (measurement only; the
#: catch-up of the batched or stemmed index is turned off instead, see ``_without_index_upkeep``).
_WITHOUT_INDEX_UPKEEP = {"postgresql": ["DROP INDEX ix_lcm_messages_search_vector"]}


def _without_index_upkeep(store: Store) -> None:
    """Measurement only: this store's messages are never indexed for search."""
    store.backend.catch_up_index = lambda conn: None  # type: ignore[method-assign]
    with store.engine.begin() as conn:
        for ddl in _WITHOUT_INDEX_UPKEEP.get(store.backend_name, []):
            conn.execute(text(ddl))


class _CharEstimate(EstimatedTokens):
    """Tokens as characters / 4, stored as if exact: the turn's cost with the tokenizer taken
    out and nothing left to count later (on SQLite lcm itself now stores estimates)."""

    exact = True


def _per_turn(engine: LcmEngine, session: str, played: list[list[dict[str, Any]]]) -> tuple[list[float], float]:
    """Milliseconds of on_turn_complete for each turn, the transcript growing by one turn; and
    the milliseconds then spent indexing the messages still pending (the next search's work)."""
    engine.update_model("bench", 10_000_000)  # no compaction: ingest alone is measured
    engine.on_session_start(session)
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a benchmark agent."}]
    times = []
    for turn in played:
        transcript = transcript + turn
        t = time.perf_counter()
        engine.on_turn_complete(transcript)
        times.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    if engine.store.background is not None:  # PostgreSQL: the stems still being computed
        engine.store.background.wait_idle()
    assert engine.store.search.catch_up() == 0
    flush_ms = (time.perf_counter() - t) * 1000
    assert engine.store.sessions.get(engine.session.id).message_count == 4 * len(played)
    return times[WARMUP_TURNS:], flush_ms


def _rate(times: list[float], flush_ms: float) -> float:
    """Turns/s, the final index catch-up included."""
    return 1000 * len(times) / (sum(times) + flush_ms)


def _variant_rate(backend: str, played: list[list[dict[str, Any]]], *, estimate: bool, no_index: bool) -> float:
    """Turns/s of the per-turn pass on a fresh database with parts of the work taken out."""
    url, drop = backend_url(backend)
    try:
        store = Store.open(url, upgrade=True)
        if no_index:
            _without_index_upkeep(store)
        config = LcmConfig.from_env({}, database_url=url, agent_id="bench", embeddings="off")
        return _rate(*_per_turn(LcmEngine(config, store=store, tokens=_CharEstimate() if estimate else None),
                                "ingest-variant", played))
    finally:
        drop()


def run(backend: str, url: str, *, turns: int, bulk_messages: int) -> dict[str, Any]:
    corpus = Corpus()
    Store.open(url, upgrade=True)
    played = list(corpus.turns(turns, session="ingest"))

    config = LcmConfig.from_env({}, database_url=url, agent_id="bench", embeddings="off")
    engine = LcmEngine(config)
    lcm_times, lcm_flush_ms = _per_turn(engine, "ingest-turns", played)
    estimated_rate = _variant_rate(backend, played, estimate=True, no_index=False)
    no_index_rate = _variant_rate(backend, played, estimate=False, no_index=True)
    own_path_rate = _variant_rate(backend, played, estimate=True, no_index=True)

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

    lcm_rate = _rate(lcm_times, lcm_flush_ms)
    raw_rate = 1000 * len(raw_times) / sum(raw_times)
    return {
        "turns": turns, "bulk_messages": len(bulk),
        "per_turn": {"lcm_turns_per_s": lcm_rate, "raw_turns_per_s": raw_rate,
                     "ratio": ratio(lcm_rate, raw_rate), "lcm_ms": summary_ms(lcm_times),
                     "lcm_final_index_catch_up_ms": lcm_flush_ms,
                     "raw_ms": summary_ms(raw_times),
                     "no_tokenizer_turns_per_s": estimated_rate,
                     "no_tokenizer_ratio": ratio(estimated_rate, raw_rate),
                     "no_index_upkeep_turns_per_s": no_index_rate,
                     "no_index_upkeep_ratio": ratio(no_index_rate, raw_rate),
                     "own_path_turns_per_s": own_path_rate,
                     "own_path_ratio": ratio(own_path_rate, raw_rate)},
        "bulk": {"lcm_msgs_per_s": len(bulk) / lcm_bulk, "raw_msgs_per_s": len(bulk) / raw_bulk,
                 "ratio": ratio(raw_bulk, lcm_bulk)},
    }
