"""Token counts counted when first needed (revision 0011): a store that counts later (SQLite)
keeps a turn's characters/4 estimate until the engine settles the session, and every count,
counter and check is then what counting at once would have given."""

from __future__ import annotations

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.prepare import prepare_messages
from lcm.store import Store
from lcm.store.forget import ForgetSelector
from lcm.tokens import EstimatedTokens, TokenCounter
from tests.support.storing import append_messages

COUNTER = TokenCounter()
ODD = [
    {"role": "user", "content": "plain words about the marmot deployment"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "grep", "arguments": "{\"q\": \"marmot\"}"}}]},
    {"role": "tool", "tool_call_id": "t1", "content": "nul\x00 and \ud800 survive " + "ü" * 50},
    {"role": "assistant", "content": [{"type": "text", "text": "parts survive"}], "extra_key": [1, 2]},
    {"role": "tool", "tool_call_id": "t2", "content": "BIGPAYLOAD " + "x y " * 20_000},
    {"role": "user", "content": ""},
]


def estimated(store: Store, session_pk: int, messages: list[dict], **options) -> object:
    return store.messages.append(session_pk, prepare_messages(messages, EstimatedTokens()), **options)


def check_counters(store: Store) -> None:
    checks = {c.name: c for c in store.health.checks()}
    assert checks["session_counters"].status == "ok", checks["session_counters"]
    assert checks["coverage"].status == "ok", checks["coverage"]


def test_settling_gives_the_counts_counting_at_once_would_have(store):
    eager = store.sessions.get_or_create("a", "eager")
    lazy = store.sessions.get_or_create("a", "lazy")
    exact = append_messages(store, eager.id, ODD)
    first = estimated(store, lazy.id, ODD[:3])
    second = estimated(store, lazy.id, ODD[3:], after_identity=first.last_identity)
    assert second.session.estimated_from == 1
    assert list(first.token_counts + second.token_counts) != list(exact.token_counts)  # estimates
    check_counters(store)  # estimates or not, the counters agree with the rows

    settled = store.messages.settle_tokens(lazy.id, COUNTER.count_message_text)
    assert [settled.counts[i] for i in (*first.store_ids, *second.store_ids)] == list(exact.token_counts)
    assert settled.session is not None and settled.session.estimated_from is None
    assert settled.session.token_count == store.sessions.get(eager.id).token_count == sum(exact.token_counts)
    assert [m.token_count for m in store.messages.get_range(lazy.id)] == list(exact.token_counts)
    check_counters(store)
    again = store.messages.settle_tokens(lazy.id, COUNTER.count_message_text)
    assert again.counts == {} and again.session is None  # nothing left to count


def test_only_sqlite_counts_later(store):
    assert store.messages.counts_later == (store.backend_name == "sqlite")


def test_forgetting_moves_the_estimated_region_with_the_messages(store):
    s = store.sessions.get_or_create("a", "s")
    first = append_messages(store, s.id, [{"role": "user", "content": f"exact {i}"} for i in range(5)])
    estimated(store, s.id, [{"role": "user", "content": f"estimate {i} " + "w " * i} for i in range(5)],
              after_identity=first.last_identity)
    assert store.sessions.get(s.id).estimated_from == 6
    plan = store.forget.plan(ForgetSelector(agent="a", match="exact 2"))
    store.forget.apply(plan)
    after = store.sessions.get(s.id)
    assert after.last_seq == 9 and after.estimated_from is not None and after.estimated_from <= 5
    settled = store.messages.settle_tokens(s.id, COUNTER.count_message_text)
    rows = store.messages.get_range(s.id)
    assert [m.token_count for m in rows] == [COUNTER.count_message_text(str(m.message["content"])) for m in rows]
    assert settled.session is not None and settled.session.token_count == sum(m.token_count for m in rows)
    check_counters(store)


def test_a_fork_settles_the_estimates_it_shares_with_its_parent(sqlite_url):
    store = Store.open(sqlite_url)
    parent = store.sessions.get_or_create("a", "p")
    estimated(store, parent.id, [{"role": "user", "content": f"shared {i} " * 7} for i in range(4)])
    with store.sessions.family(parent.id) as family:
        fork = family.create_fork(family.session(parent.id), 2)
    estimated(store, fork.id, [{"role": "user", "content": "the fork's own words " * 5}])
    settled = store.messages.settle_tokens(fork.id, COUNTER.count_message_text)
    assert len(settled.counts) == 5  # the fork's message and the parent's four
    assert store.sessions.get(parent.id).estimated_from is None
    assert settled.session is not None and settled.session.estimated_from is None
    check_counters(store)


@pytest.mark.parametrize("turns", [30])
def test_the_engine_plans_with_exact_counts(sqlite_url, turns):
    """On SQLite a turn stores estimates; the compacting turn counts them exactly first, so
    what it plans and assembles is what a store counting at once would give."""
    config = LcmConfig.from_env({}, database_url=sqlite_url, agent_id="a", summarizer="extractive",
                                fresh_tail_count=4, leaf_chunk_tokens=400, leaf_target_tokens=100)
    engine = LcmEngine(config)
    engine.update_model("m", 4000)
    engine.on_session_start("s")
    held: list[dict] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        held = held + [{"role": "user", "content": f"question {i} about the " + "quokka habitat " * 12},
                       {"role": "assistant", "content": f"answer {i}: " + "burrows and grass " * 15}]
        engine.on_turn_complete(held)
    store = engine.store
    session = store.sessions.get(engine.session.id)
    assert session.estimated_from == 1  # nothing has needed a count yet
    held = engine.compress(held)
    session = store.sessions.get(engine.session.id)
    assert session.estimated_from is None and session.covered_seq > 0
    rows = store.messages.get_range(session.id)
    assert all(m.token_count == COUNTER.count_message_text(m.message["content"]) for m in rows)
    check_counters(store)


def test_a_turn_far_from_any_compaction_keeps_its_estimates(sqlite_url):
    """compress() with the host's own size far below every trigger, and nothing to assemble,
    counts nothing; once the host's size nears the trigger, the counts are made exact first."""
    config = LcmConfig.from_env({}, database_url=sqlite_url, agent_id="a", summarizer="extractive",
                                fresh_tail_count=4)
    engine = LcmEngine(config)
    engine.update_model("m", 100_000)
    engine.on_session_start("s")
    held: list[dict] = [{"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "first question"}]
    held = engine.compress(held, current_tokens=500)  # hands the context over: counted exactly
    store = engine.store
    assert store.sessions.get(engine.session.id).estimated_from is None
    held = held + [{"role": "assistant", "content": "an answer " * 20}, {"role": "user", "content": "more"}]
    engine.on_turn_complete(held)
    assert engine.compress(held, current_tokens=900) is held  # far below the trigger: nothing to do
    assert store.sessions.get(engine.session.id).estimated_from is not None  # nothing counted
    engine.compress(held, current_tokens=95_000)  # past the trigger: exact counts first
    session = store.sessions.get(engine.session.id)
    assert session.estimated_from is None
    check_counters(store)
