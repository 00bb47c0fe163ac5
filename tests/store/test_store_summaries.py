"""The summary DAG on both backends: contiguous prefixes, depth+1 condensation, atomic writes."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from lcm.errors import ConcurrentUpdateError, IntegrityViolation, NotFoundError
from lcm.records import NewSummary
from lcm.store import Store
from lcm.store.schema import Summary, SummarySource
from tests.support.storing import append_messages


def leaf(ids, text="leaf summary", tokens=3):
    return NewSummary(depth=0, content=text, token_count=tokens, source_ids=tuple(ids),
                      kind="extractive", expand_hint="details")


def node(depth, ids, text="condensed", tokens=2):
    return NewSummary(depth=depth, content=text, token_count=tokens, source_ids=tuple(ids),
                      kind="llm", model="test-model", meta={"level": "normal"})


@pytest.fixture
def filled(store: Store, session):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"message number {i} about topic{i}", "timestamp": 1_700_000_000 + i}
            for i in range(40)]
    ids = append_messages(store, session.id, msgs).store_ids
    return session, list(ids)


def status_ok(store):
    checks = {c.name: c for c in store.health.checks(deep=True)}
    bad = [c for c in checks.values() if c.status != "ok"]
    assert not bad, bad
    return checks


def test_leaves_cover_the_oldest_raw_messages_in_order(store, filled):
    session, ids = filled
    l1 = store.summaries.write(session.id, leaf(ids[:10])).node
    assert (l1.depth, l1.first_seq, l1.last_seq, l1.source_count) == (0, 1, 10, 10)
    assert l1.earliest_at == 1_700_000_000 and l1.latest_at == 1_700_000_009
    assert l1.source_token_count == sum(m.token_count for m in store.messages.get_range(session.id, last_seq=10))
    after = store.sessions.get(session.id)
    assert (after.covered_seq + 1, after.last_seq) == (11, 40)
    assert after.raw_tokens == after.token_count - l1.source_token_count
    l2 = store.summaries.write(session.id, leaf(ids[10:20])).node
    assert store.summaries.source_ids(l2.id) == ids[10:20]
    status_ok(store)


@pytest.mark.parametrize("pick,reason", [
    (lambda ids: ids[1:5], "oldest"),  # skips the oldest raw message
    (lambda ids: ids[0:3] + ids[4:6], "gap"),  # leaves a gap
    (lambda ids: [ids[1], ids[0]], "order"),  # out of order
    (lambda ids: ids[:3] + [10**9], "missing"),  # a message that does not exist
])
def test_invalid_leaves_are_refused_and_write_nothing(store, filled, pick, reason):
    session, ids = filled
    with pytest.raises(IntegrityViolation):
        store.summaries.write(session.id, leaf(pick(ids)))
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Summary)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(SummarySource)).scalar_one() == 0
    assert store.sessions.get(session.id).covered_seq == 0


def test_a_message_is_never_in_two_leaves(store, filled):
    session, ids = filled
    store.summaries.write(session.id, leaf(ids[:5]))
    with pytest.raises(IntegrityViolation):
        store.summaries.write(session.id, leaf(ids[3:8]))


def test_messages_of_another_session_cannot_be_summarized(store, filled):
    session, ids = filled
    other = store.sessions.get_or_create("agent-a", "other")
    with pytest.raises(IntegrityViolation):
        store.summaries.write(other.id, leaf(ids[:3]))


def test_condensation_builds_depth_plus_one_over_consecutive_nodes(store, filled):
    session, ids = filled
    leaves = [store.summaries.write(session.id, leaf(ids[i:i + 5], f"leaf {i}")).node for i in range(0, 40, 5)]
    with pytest.raises(IntegrityViolation):  # not consecutive
        store.summaries.write(session.id, node(1, [leaves[0].id, leaves[2].id]))
    with pytest.raises(IntegrityViolation):  # wrong depth
        store.summaries.write(session.id, node(2, [leaves[0].id, leaves[1].id]))
    c1 = store.summaries.write(session.id, node(1, [leaf.id for leaf in leaves[:4]], "first half")).node
    assert (c1.first_seq, c1.last_seq, c1.source_count) == (1, 20, 4)
    assert c1.source_token_count == sum(leaf.token_count for leaf in leaves[:4])
    assert c1.meta == {"level": "normal"} and c1.model == "test-model"
    with pytest.raises(IntegrityViolation):  # already condensed
        store.summaries.write(session.id, node(1, [leaves[3].id, leaves[4].id]))
    c2 = store.summaries.write(session.id, node(1, [leaf.id for leaf in leaves[4:]], "second half")).node
    top = store.summaries.write(session.id, node(2, [c1.id, c2.id], "everything")).node
    assert store.summaries.get(leaves[0].id).parent_id == c1.id
    assert [s.id for s in store.summaries.uncondensed(session.id)] == [top.id]
    stats = {d.depth: (d.count, d.uncondensed) for d in store.summaries.depth_stats(session.id)}
    assert stats == {0: (8, 0), 1: (2, 0), 2: (1, 1)}
    status_ok(store)


def test_expansion_reproduces_sources_in_order(store, filled):
    session, ids = filled
    l1 = store.summaries.write(session.id, leaf(ids[:10])).node
    l2 = store.summaries.write(session.id, leaf(ids[10:20])).node
    top = store.summaries.write(session.id, node(1, [l1.id, l2.id])).node
    msgs, total = store.summaries.expand(l1.id, offset=3, limit=4)
    assert total == 10 and [m.store_id for m in msgs] == ids[3:7]
    expected = store.messages.get_range(session.id, first_seq=4, last_seq=7)
    assert [m.message for m in msgs] == [m.message for m in expected]
    kids, total = store.summaries.expand(top.id)
    assert total == 2 and [k.id for k in kids] == [l1.id, l2.id]
    with pytest.raises(NotFoundError):
        store.summaries.expand(10**9)


def test_summary_scope_follows_the_agent(store, filled):
    session, ids = filled
    l1 = store.summaries.write(session.id, leaf(ids[:4], "the quokka decision")).node
    assert store.summaries.get(l1.id, agent="agent-a").id == l1.id
    assert store.summaries.get(l1.id, agent="agent-b") is None
    assert [h.id for h in store.search.summaries("quokka", agent="agent-a", session_pk=session.id).hits] == [l1.id]
    assert store.search.summaries("quokka", agent="agent-b").hits == []


def test_concurrent_compaction_of_the_same_run_is_detected(store, filled):
    """Two engines that planned the same leaf: the second gets a clear error, not a duplicate."""
    session, ids = filled
    store.summaries.write(session.id, leaf(ids[:5]))
    with pytest.raises(IntegrityViolation):
        store.summaries.write(session.id, leaf(ids[:5]))
    assert len(store.summaries.of_session(session.id)) == 1


def test_crash_between_summary_and_edges_leaves_neither(store, filled):
    session, ids = filled

    def boom(step):
        if step == "summary_inserted":
            raise RuntimeError("simulated crash")

    store.fault_hook = boom
    with pytest.raises(RuntimeError):
        store.summaries.write(session.id, leaf(ids[:5]))
    store.fault_hook = None
    assert store.summaries.of_session(session.id) == []
    assert store.sessions.get(session.id).covered_seq == 0
    assert store.search.summaries("leaf", agent="agent-a").hits == []
    status_ok(store)


def test_bad_summary_arguments(store, filled):
    session, ids = filled
    for bad in (leaf([]), leaf([ids[0], ids[0]]),
                NewSummary(depth=-1, content="x", token_count=1, source_ids=(ids[0],), kind="x"),
                NewSummary(depth=0, content="  ", token_count=1, source_ids=(ids[0],), kind="x")):
        with pytest.raises(ValueError):
            store.summaries.write(session.id, bad)


def test_concurrent_update_error_is_an_integrity_violation():
    assert issubclass(ConcurrentUpdateError, IntegrityViolation)
