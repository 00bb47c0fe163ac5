"""Vectors on both backends: pending rows, idempotent writes, model separation, nearest
neighbours scoped exactly like full-text search, deletion with the row they embed.

Vectors here are made by hand (unit vectors along chosen axes), so that which row is nearest is
known exactly; the embedders themselves are tested in tests/integration/test_embeddings.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from lcm.store import vectors as vector_store
from lcm.store.vectors import vectors_t
from tests.support.storing import append_messages

MODEL = "test:axes-8"
DIMS = 8


def axis(i: int, j: int | None = None) -> np.ndarray:
    """A unit vector along axis ``i`` (or halfway between ``i`` and ``j``)."""
    v = np.zeros(DIMS, dtype=np.float32)
    v[i] = 1.0
    if j is not None:
        v[j] = 1.0
    return (v / np.linalg.norm(v)).reshape(1, -1)


def embed_all(store, agent: str | None, axes: dict[int, int], model: str = MODEL) -> int:
    """Give every pending message the vector of its axis (by store id); returns rows written."""
    items = store.vectors.pending(model, kind="message", agent=agent, limit=1000)
    matrix = np.vstack([axis(axes.get(it.id, DIMS - 1)) for it in items]) if items else np.zeros((0, DIMS))
    return store.vectors.put(model, items, matrix)


@pytest.fixture
def two_agents(store):
    a1 = store.sessions.get_or_create("agent-a", "one", platform="cli")
    a2 = store.sessions.get_or_create("agent-a", "two", platform="telegram")
    b1 = store.sessions.get_or_create("agent-b", "one", platform="cli")
    ids = {}
    ids["a1"] = append_messages(store, a1.id, [{"role": "user", "content": "alpha question"},
                                               {"role": "assistant", "content": "alpha answer"}],
                                timestamps=[1000.0, 1001.0]).store_ids
    ids["a2"] = append_messages(store, a2.id, [{"role": "user", "content": "beta question"},
                                               {"role": "assistant", "content": ""}],
                                timestamps=[2000.0, 2001.0]).store_ids
    ids["b1"] = append_messages(store, b1.id, [{"role": "user", "content": "secret of agent b"}],
                                timestamps=[1500.0]).store_ids
    return {"a1": a1, "a2": a2, "b1": b1, "ids": ids}


def test_pending_put_and_coverage(store, two_agents):
    ids = two_agents["ids"]
    pending = store.vectors.pending(MODEL, kind="message", agent="agent-a")
    assert [p.id for p in pending] == [*ids["a1"], *ids["a2"]]
    assert pending[0].text == "alpha question" and pending[0].role == "user" and pending[0].ts == 1000.0
    assert pending[0].session_pk == two_agents["a1"].id
    assert store.vectors.coverage(MODEL, agent="agent-a").pending == 4

    assert embed_all(store, "agent-a", {}) == 4
    assert store.vectors.pending(MODEL, kind="message", agent="agent-a") == []
    again = store.vectors.pending(MODEL, kind="message")  # every agent: only agent b's row is left
    assert [p.id for p in again] == list(ids["b1"])
    # Writing the same items again changes nothing (idempotent), whatever the vectors say.
    items = store.vectors.pending(MODEL, kind="message", agent="agent-a", limit=10) or [pending[0]]
    store.vectors.put(MODEL, items, axis(3))
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM lcm_vectors")).scalar() == 4
    cov = store.vectors.coverage(MODEL, agent="agent-a")
    assert (cov.messages, cov.messages_embedded, cov.pending, cov.share) == (4, 4, 0, 1.0)
    assert store.vectors.coverage(MODEL).pending == 1  # the whole store: agent b's message


def test_models_never_mix_and_prune_removes_the_old_one(store, two_agents):
    ids = two_agents["ids"]
    embed_all(store, "agent-a", {ids["a1"][0]: 0})
    other = "test:other-model"
    items = store.vectors.pending(other, kind="message", agent="agent-a")
    assert len(items) == 4  # a new model starts from nothing
    store.vectors.put(other, items, np.vstack([axis(5)] * 4))
    cov = store.vectors.coverage(MODEL, agent="agent-a")
    assert cov.messages_embedded == 4 and cov.other_models == {other: 4}
    found = store.search.similar_messages("alpha", axis(0), model=MODEL, agent="agent-a", limit=1).hits
    assert [h.id for h in found] == [ids["a1"][0]]  # the other model's vectors (all on axis 5) ignored
    assert store.vectors.prune(MODEL, agent="agent-a") == 4
    assert store.vectors.coverage(MODEL, agent="agent-a").other_models == {}
    assert store.vectors.coverage(MODEL, agent="agent-a").messages_embedded == 4


def test_nearest_is_scoped_like_full_text(store, two_agents):
    ids, a1, a2 = two_agents["ids"], two_agents["a1"], two_agents["a2"]
    axes = {ids["a1"][0]: 0, ids["a1"][1]: 1, ids["a2"][0]: 2, ids["b1"][0]: 0}
    embed_all(store, None, axes)

    def nearest(vec, **kw):
        return [(h.id, h.match) for h in store.search.similar_messages("q", vec, model=MODEL, agent="agent-a",
                                                                        **kw).hits]

    # Best first; agent b's message on the very same axis is never returned to agent a.
    got = nearest(axis(0), limit=3)
    assert got[0] == (ids["a1"][0], "semantic") and ids["b1"][0] not in [i for i, _ in got]
    assert [i for i, _ in nearest(axis(0, 2), limit=2)] in ([ids["a1"][0], ids["a2"][0]],
                                                          [ids["a2"][0], ids["a1"][0]])
    assert [i for i, _ in nearest(axis(0, 2), session_pk=a2.id, limit=1)] == [ids["a2"][0]]
    assert [i for i, _ in nearest(axis(0, 1), roles=("assistant",), limit=1)] == [ids["a1"][1]]
    assert [i for i, _ in nearest(axis(0, 2), platform="telegram", limit=1)] == [ids["a2"][0]]
    assert {i for i, _ in nearest(axis(0), time_from=1500.0, limit=5)} == set(ids["a2"])
    assert nearest(axis(0), time_to=999.0, limit=5) == []
    assert nearest(axis(0), roles=("tool",), limit=5) == []
    # The message with no text has the zero vector: found only when nothing else is left.
    assert [i for i, _ in nearest(axis(2), session_pk=a2.id, limit=2)] == list(ids["a2"])
    hit = store.search.similar_messages("alpha", axis(0), model=MODEL, agent="agent-a", limit=1).hits[0]
    assert hit.session_key == "one" and hit.role == "user" and hit.score == pytest.approx(1.0)
    assert "**alpha**" in hit.snippet
    assert store.search.similar_messages("q", axis(0), model=MODEL, agent="nobody", limit=3).hits == []
    _ = a1


def test_vectors_go_with_their_rows_and_new_ones_are_seen(store, two_agents, monkeypatch):
    ids, a1 = two_agents["ids"], two_agents["a1"]
    embed_all(store, "agent-a", {ids["a1"][0]: 0, ids["a1"][1]: 1})
    assert [h.id for h in store.search.similar_messages("q", axis(0), model=MODEL, agent="agent-a",
                                                        limit=1).hits] == [ids["a1"][0]]
    # A new message embedded later is found by the next search (incremental refresh).
    [new] = append_messages(store, a1.id, [{"role": "user", "content": "gamma"}]).store_ids
    embed_all(store, "agent-a", {new: 4})
    assert [h.id for h in store.search.similar_messages("q", axis(4), model=MODEL, agent="agent-a",
                                                        limit=1).hits] == [new]
    # Deleting a message deletes its vector (ON DELETE CASCADE), and searches stop returning it.
    monkeypatch.setattr(vector_store, "RECOUNT_SECONDS", 0.0)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM lcm_summary_sources WHERE message_id = :i"), {"i": new})
        conn.execute(text("DELETE FROM lcm_messages WHERE id = :i"), {"i": new})
    with store.engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM lcm_vectors WHERE message_id = :i"), {"i": new}).scalar()
    assert left == 0
    found = store.search.similar_messages("q", axis(4), model=MODEL, agent="agent-a", limit=5).hits
    assert new not in [h.id for h in found]


def test_put_refuses_mismatched_lengths_and_skips_deleted_rows(store, two_agents):
    items = store.vectors.pending(MODEL, kind="message", agent="agent-a")
    with pytest.raises(ValueError, match="4 items but 1 vectors"):
        store.vectors.put(MODEL, items, axis(0))
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM lcm_messages WHERE id = :i"), {"i": items[0].id})
    assert store.vectors.put(MODEL, items, np.vstack([axis(1)] * 4)) == 3
    with store.engine.connect() as conn:
        stored = conn.execute(vectors_t.select().order_by(vectors_t.c.id)).all()
    assert [r.message_id for r in stored] == [it.id for it in items[1:]]
    assert all(r.dims == DIMS and len(r.vector) == 4 * DIMS and r.model == MODEL for r in stored)
    assert stored[0].agent_id == items[1].agent_pk and stored[0].role == items[1].role


def test_summaries_have_vectors_too(store, session):
    from lcm.records import NewSummary

    ids = append_messages(store, session.id, [{"role": "user", "content": "first"},
                                              {"role": "assistant", "content": "second"}]).store_ids
    node = store.summaries.write(session.id, NewSummary(
        depth=0, content="the team chose PostgreSQL", token_count=5, source_ids=tuple(ids), kind="extractive"))
    [pending] = store.vectors.pending(MODEL, kind="summary", agent="agent-a")
    assert pending.id == node.node.id and pending.text == "the team chose PostgreSQL" and pending.role is None
    store.vectors.put(MODEL, [pending], axis(6))
    hits = store.search.similar_summaries("postgres", axis(6), model=MODEL, agent="agent-a",
                                          session_pk=session.id, limit=3).hits
    assert [(h.kind, h.id, h.match) for h in hits] == [("summary", node.node.id, "semantic")]
    cov = store.vectors.coverage(MODEL, agent="agent-a")
    assert (cov.summaries, cov.summaries_embedded, cov.messages_embedded) == (1, 1, 0)
