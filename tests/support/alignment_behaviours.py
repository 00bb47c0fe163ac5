"""Ingest alignment behaviours, run over the in-memory store (``tests/unit``) and on both
databases (``tests/integration``): a host transcript that starts anywhere in a long stored
session stores only its new messages.

Regression: the first match used to be looked for only within LOOKAHEAD (64) messages of the
alignment window's start, so a host resumed with the tail of a long session (or any transcript
starting more than 64 messages into the window) had every message stored a second time.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcm.context.ingest import Ingestor
from lcm.context.ports import StorePorts
from tests.support.storing import append_messages

SYSTEM = {"role": "system", "content": "You are a test agent."}


def _msgs(prefix: str, n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{prefix} message {i}"}
            for i in range(n)]


def _stored(store: StorePorts, session_pk: int) -> list[dict]:
    return [r.message for r in store.messages.get_range(session_pk, limit=10_000)]


@pytest.mark.parametrize("start", [0, 30, 65, 100, 299, 399])  # 65: past the old 64-message look-ahead
def test_a_transcript_starting_anywhere_adds_only_its_new_messages(store, start):
    session = store.sessions.get_or_create("agent-a", "long")
    history = _msgs("old", 400)
    append_messages(store, session.id, history)
    new = _msgs("new", 3)
    result = Ingestor(store).ingest(session.id, [SYSTEM, *history[start:], *new])
    assert result.added == 3
    assert _stored(store, session.id) == history + new
    stored_ids = [r.store_id for r in store.messages.get_range(session.id, limit=10_000)]
    assert result.store_ids == stored_ids[start:]  # every host message mapped to its own row


def test_a_resumed_engine_with_the_tail_of_a_long_session_stores_nothing_twice(make_engine):
    first = make_engine(context_length=10_000_000)
    first.on_session_start("s")
    history = _msgs("turn", 300)
    first.on_turn_complete([SYSTEM, *history])
    resumed = make_engine(context_length=10_000_000)  # a new process, no memory of the session
    resumed.on_session_start("s")
    resumed.on_turn_complete([SYSTEM, *history[-40:], *_msgs("fresh", 4)])
    assert _stored(resumed.store, resumed.session.id) == history + _msgs("fresh", 4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_nothing_is_lost_and_nothing_unique_is_stored_twice(store, data):
    """Stored history from a small alphabet (repeats on purpose), then a transcript that is any
    suffix of it plus new messages: every transcript message maps to a stored row with its
    content, and the session never holds more than history + the new messages."""
    alphabet = [f"w{i}" for i in range(data.draw(st.integers(2, 6), label="alphabet"))]
    history = [{"role": "user", "content": c}
               for c in data.draw(st.lists(st.sampled_from(alphabet), min_size=1, max_size=150), label="history")]
    start = data.draw(st.integers(0, len(history)), label="start")
    new = [{"role": "user", "content": f"unique {i}"} for i in range(data.draw(st.integers(0, 4), label="new"))]
    session = store.sessions.get_or_create("agent-a", uuid.uuid4().hex)  # the store is shared by examples
    append_messages(store, session.id, history)
    transcript = history[start:] + new
    result = Ingestor(store).ingest(session.id, [SYSTEM, *transcript])
    rows = {r.store_id: r.message for r in store.messages.get_range(session.id, limit=10_000)}
    assert [rows[sid] for sid in result.store_ids] == transcript
    assert len(history) <= len(rows) <= len(history) + len(new)
    assert all(m in rows.values() for m in new)  # unique content: stored, exactly once
    assert sum(m in new for m in rows.values()) == len(new)


def _re_encoded(history: list[dict], turn: int) -> list[dict]:
    """``history`` as a client re-encodes it at request ``turn``: the last two user messages as
    one text part with a prompt-cache mark (Cline, Roo Code), every third message's text as
    one plain text part (an SDK that switches forms), the rest as sent."""
    users = [i for i, m in enumerate(history) if m["role"] == "user"][-2:]
    out = []
    for i, m in enumerate(history):
        if i in users:
            m = {**m, "content": [{"type": "text", "text": m["content"], "cache_control": {"type": "ephemeral"}}]}
        elif (i + turn) % 3 == 0:
            m = {**m, "content": [{"type": "text", "text": m["content"]}]}
        out.append(m)
    return out


def test_a_client_that_re_encodes_its_history_every_request_stores_each_message_once(make_engine):
    """Each request moves the cache marks and switches forms: the same messages, stored once, in
    order, in one session (each as first sent)."""
    engine = make_engine(context_length=10_000_000)
    engine.on_session_start("re-encoded")
    history: list[dict] = []
    for turn in range(12):
        history.append({"role": "user", "content": f"question {turn}"})
        engine.on_turn_complete([SYSTEM, *_re_encoded(history, turn)])
        history.append({"role": "assistant", "content": f"answer {turn}"})
        engine.on_turn_complete([SYSTEM, *_re_encoded(history, turn)])
    rows = _stored(engine.store, engine.session.id)
    said = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in rows]
    assert said == [m["content"] for m in history]
    assert engine.store.sessions.forks(engine.session.id) == []


def test_a_whole_transcript_of_which_nothing_is_stored_opens_a_fork_that_shares_nothing(store):
    """``whole`` (lcm proxy): a transcript of which nothing is stored is the conversation with its
    first message edited: a fork at 0, which the next transcript opening the same way continues.
    Without ``whole`` it follows the stored history (a host may send only what is new)."""
    session = store.sessions.get_or_create("agent-a", uuid.uuid4().hex)
    history = _msgs("old", 6)
    Ingestor(store, whole=True).ingest(session.id, [SYSTEM, *history])
    edited = _msgs("edited", 3)
    Ingestor(store, whole=True).ingest(session.id, [SYSTEM, *edited])
    [fork] = store.sessions.forks(session.id)
    assert fork.fork_seq == 0 and _stored(store, fork.id) == edited
    more = _msgs("edited", 5)  # the same opening, two more messages: the same fork goes on
    result = Ingestor(store, whole=True).ingest(session.id, [SYSTEM, *more])
    assert result.added == 2 and store.sessions.forks(session.id) == [store.sessions.get(fork.id)]
    assert _stored(store, fork.id) == more and _stored(store, session.id) == history
    other = store.sessions.get_or_create("agent-a", uuid.uuid4().hex)
    Ingestor(store).ingest(other.id, [SYSTEM, *history])
    Ingestor(store).ingest(other.id, [SYSTEM, *edited])  # not whole: after the stored history
    assert store.sessions.forks(other.id) == [] and _stored(store, other.id) == history + edited


def test_a_whole_transcript_that_meets_the_store_is_aligned_as_always(store):
    """A client that drops the oldest messages (a sliding window), or puts its own summary of
    them first (aider), still meets the stored history: no fork, nothing stored twice."""
    session = store.sessions.get_or_create("agent-a", uuid.uuid4().hex)
    history = _msgs("old", 40)
    Ingestor(store, whole=True).ingest(session.id, [SYSTEM, *history])
    Ingestor(store, whole=True).ingest(session.id, [SYSTEM, *history[30:], *_msgs("new", 2)])
    summary = {"role": "user", "content": "I spoke to you previously about the old messages."}
    Ingestor(store, whole=True).ingest(session.id, [SYSTEM, summary, *history[34:], *_msgs("new", 4)])
    assert store.sessions.forks(session.id) == []
    assert _stored(store, session.id) == history + _msgs("new", 2) + [summary] + _msgs("new", 4)[2:]


def test_a_host_back_on_the_branch_it_forked_from_continues_that_branch(store):
    """A chat client that edits a message, then switches back to the original (ChatGPT's
    branch arrows): the original continues in its own session, and no fork repeats its
    messages. With ``whole`` the same holds for an edit of the first message."""
    def msg(role: str, text: str) -> dict:
        return {"role": role, "content": text}

    for whole in (False, True):
        root = store.sessions.get_or_create("agent-a", uuid.uuid4().hex)
        ingest = Ingestor(store, whole=whole).ingest
        original = [msg("user", "q1"), msg("assistant", "a1"), msg("user", "q2"), msg("assistant", "a2")]
        at = ingest(root.id, [SYSTEM, *original]).session.id
        at = ingest(at, [SYSTEM, *original[:2], msg("user", "q2 edited"), msg("assistant", "c2")]).session.id
        assert at != root.id  # the edit went to a fork
        more = [*original, msg("user", "q3"), msg("assistant", "a3")]
        at = ingest(at, [SYSTEM, *more]).session.id
        assert at == root.id and _stored(store, root.id) == more
        if whole:
            at = ingest(at, [SYSTEM, msg("user", "q1 edited"), msg("assistant", "b1")]).session.id
            assert store.sessions.get(at).fork_seq == 0
            at = ingest(at, [SYSTEM, *more, msg("user", "q4")]).session.id
            assert at == root.id and _stored(store, root.id) == [*more, msg("user", "q4")]
        forks = store.sessions.forks(root.id)
        assert [len(_stored(store, f.id)) for f in forks] == ([2, 2] if whole else [2])
        assert all(store.sessions.forks(f.id) == [] for f in forks)


#: The tests the collecting modules import (``from ... import *``): every behaviour, so none is
#: forgotten on one side.
__all__ = sorted(name for name in dir() if name.startswith("test_"))
