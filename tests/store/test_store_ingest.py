"""Ingest on both backends: exactly once, lossless, bounded, and refusing non-messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text

from lcm.errors import InvalidMessageError, NotFoundError
from lcm.messages import PAYLOAD_MIN_CHARS
from lcm.store import Store
from lcm.store.schema import Message, Payload
from lcm.tokens import TokenCounter
from tests.support.storing import append_messages
from tests.support.strategies import messages as message_strategy

TURN = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Deploy the service"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "shell", "arguments": "{\"cmd\": \"make deploy\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "deployed v1.4.2"},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "ok"},
    {"role": "assistant", "content": "ok"},
]


def count_rows(store: Store, model) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


def test_append_stores_each_message_once_and_keeps_repeats(store, session):
    first = append_messages(store, session.id, TURN)
    assert first.inserted == len(TURN) and first.skipped == 0
    again = append_messages(store, session.id, TURN)
    assert again.inserted == 0 and again.store_ids == first.store_ids
    # three "ok" messages in a row are three rows
    assert [m.message["content"] for m in store.messages.get_range(session.id)][-3:] == ["ok"] * 3
    more = append_messages(store, session.id, TURN + [{"role": "user", "content": "ok"}])
    assert more.inserted == 1 and more.new_flags[-1] is True
    assert count_rows(store, Message) == len(TURN) + 1
    s = store.sessions.get(session.id)
    assert (s.message_count, s.last_seq) == (len(TURN) + 1, len(TURN) + 1)
    assert [m.seq for m in store.messages.get_range(session.id)] == list(range(1, len(TURN) + 2))


def test_continuing_from_an_anchor_after_compaction(store, session):
    first = append_messages(store, session.id, TURN)
    # the host now sends only the last two stored messages plus a new one, anchored at the
    # stored message before them (what the engine's alignment passes)
    anchor = store.messages.tail(session.id, 3)[0].identity
    tail_and_new = TURN[-2:] + [{"role": "user", "content": "status?"}]
    r = append_messages(store, session.id, tail_and_new, after_identity=anchor)
    assert r.new_flags == (False, False, True)
    assert r.store_ids[:2] == first.store_ids[-2:]
    assert store.sessions.get(session.id).message_count == len(TURN) + 1


def test_host_message_uid_is_the_identity(store, session):
    a = {"role": "user", "content": "same", "message_uid": "u-1"}
    b = {"role": "user", "content": "same", "message_uid": "u-2"}
    assert append_messages(store, session.id, [a, b]).inserted == 2
    # re-sent alone and out of context: still recognised by uid
    assert append_messages(store, session.id, [b]).inserted == 0
    assert append_messages(store, session.id, [a, a]).inserted == 0


def test_messages_round_trip_exactly_including_nul_and_surrogates(store, session):
    nasty = [
        {"role": "user", "content": "nul\x00inside and lone \ud800 surrogate, pair \ud83d\ude00 split"},
        {"role": "assistant", "content": [{"type": "text", "text": "part \x00"},
                                          {"type": "image_url", "image_url": {"url": "data:x"}}],
         "reasoning": {"steps": ["a", None, 1.5]}, "refusal": None},
        {"tool_call_id": "c\x00", "role": "tool", "name": "weird\ud800", "content": ""},
        {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": None, "_db_persisted": True},
    ]
    ids = append_messages(store, session.id, nasty).store_ids
    back = store.messages.get_range(session.id)
    expected = [dict(m) for m in nasty]
    expected[-1].pop("_db_persisted")
    assert [b.message for b in back] == expected
    assert [list(b.message) for b in back] == [list(m) for m in expected]
    assert back[0].store_id == ids[0]
    # and the other words of a message with NUL and surrogates stay searchable
    assert [h.id for h in store.search.messages("surrogate", agent="agent-a").hits] == [ids[0]]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(message_strategy(), min_size=1, max_size=6))
def test_arbitrary_messages_round_trip(store, session, batch):
    before = store.sessions.get(session.id).last_seq
    result = append_messages(store, session.id, batch, after_identity=f"batch-{before}")
    stored = store.messages.get_range(session.id, first_seq=before + 1)
    kept = [m for m, new in zip(batch, result.new_flags, strict=True) if new]
    assert [json.dumps(s.message, ensure_ascii=True) for s in stored] == [
        json.dumps(m, ensure_ascii=True) for m in kept]


def test_large_payload_is_stored_once_and_indexed_only_in_part(store, session):
    big = "HEADWORD " + "lorem ipsum dolor " * 200_000 + " TAILWORD"  # ~3.6 MB
    assert len(big) > 50 * PAYLOAD_MIN_CHARS
    msgs = [{"role": "tool", "tool_call_id": "c1", "content": big},
            {"role": "tool", "tool_call_id": "c2", "content": big}]
    ids = append_messages(store, session.id, msgs).store_ids
    assert count_rows(store, Payload) == 1  # same body twice: one payload row
    with store.engine.connect() as conn:
        stored = conn.execute(select(func.sum(func.length(Payload.data)))).scalar_one()
        search_chars = conn.execute(select(func.max(func.length(Message.search_text)))).scalar_one()
        inline = conn.execute(select(func.count()).where(Message.content.is_not(None))).scalar_one()
    assert stored < len(big) / 10  # compressed
    assert search_chars < 140_000 and inline == 0
    back = store.messages.get_range(session.id)
    assert [b.message for b in back] == msgs
    assert {h.id for h in store.search.messages("headword", agent="agent-a").hits} == set(ids)
    assert {h.id for h in store.search.messages("tailword", agent="agent-a").hits} == set(ids)


def test_invalid_messages_write_nothing(store, session):
    good = {"role": "user", "content": "fine"}
    with pytest.raises(InvalidMessageError):
        append_messages(store, session.id, [good, {"content": "no role"}])
    assert store.sessions.get(session.id).message_count == 0


def test_a_value_json_cannot_hold_is_stored_as_well_as_it_can_be(store, session):
    """Regression (issue 13.3): a set, a datetime or bytes used to make the message unstorable."""
    import datetime as dt

    odd = {"role": "user", "content": {1, 2}, "when": dt.datetime(2026, 1, 2, 3, 4, 5),
           "blob": b"\x00\xff", 7: "int key"}
    result = append_messages(store, session.id, [{"role": "user", "content": "fine"}, odd])
    assert result.inserted == 2
    [_, back] = store.messages.get_range(session.id)
    assert back.message == {"role": "user", "content": [1, 2], "when": "2026-01-02T03:04:05",
                            "blob": "AP8=", "7": "int key"}
    assert any("set stored as list" in p for p in back.problem)
    assert back.to_item()["stored_with_changes"] == list(back.problem)
    # The same odd message sent again is recognised: nothing new.
    again = append_messages(store, session.id, [{"role": "user", "content": "fine"}, odd])
    assert again.inserted == 0


def test_unknown_session_is_not_found(store):
    with pytest.raises(NotFoundError):
        append_messages(store, 987654, [{"role": "user", "content": "x"}])


def test_sessions_are_scoped_by_agent(store):
    a = store.sessions.get_or_create("agent-a", "shared-key")
    b = store.sessions.get_or_create("agent-b", "shared-key")
    assert a.id != b.id and a.agent == "agent-a" and b.agent == "agent-b"
    assert store.sessions.get_or_create("agent-a", "shared-key").id == a.id
    append_messages(store, a.id, [{"role": "user", "content": "secret alpha"}])
    assert store.search.messages("alpha", agent="agent-b").hits == []
    [mine] = store.messages.get_range(a.id)
    assert store.messages.get(mine.store_id, agent="agent-b") is None
    assert store.messages.get(mine.store_id, agent="agent-a").message["content"] == "secret alpha"
    with pytest.raises(NotFoundError):
        store.sessions.get(a.id, agent="agent-b")
    assert [s.session_key for s in store.sessions.of_agent("agent-a")] == ["shared-key"]


def test_session_details_fill_in_but_never_change(store):
    s = store.sessions.get_or_create("agent-a", "k")
    assert s.platform is None
    s = store.sessions.get_or_create("agent-a", "k", platform="telegram", conversation_id="chat-9")
    assert (s.platform, s.conversation_id) == ("telegram", "chat-9")
    s = store.sessions.get_or_create("agent-a", "k", platform="cli")
    assert s.platform == "telegram"


@pytest.mark.parametrize("bad", ["", "x" * 300, "nul\x00", 5])
def test_bad_session_keys_are_refused(store, bad):
    with pytest.raises(ValueError):
        store.sessions.get_or_create("agent-a", bad)


def test_paging_reproduces_the_session(store, session):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(25)]
    append_messages(store, session.id, msgs)
    seen, cursor = [], None
    while True:
        page, cursor = store.messages.page(session.id, after_store_id=cursor, limit=7)
        seen.extend(r.message for r in page)
        if cursor is None:
            break
    assert seen == msgs
    users, _ = store.messages.page(session.id, roles=["user"], limit=100)
    assert [r.message["content"] for r in users] == [f"m{i}" for i in range(0, 25, 2)]
    tail = store.messages.tail(session.id, 3)
    assert [t.seq for t in tail] == [23, 24, 25]


def test_token_counts_are_stored_once_per_message(store, session):
    append_messages(store, session.id, [{"role": "user", "content": "hello world " * 10}])
    [m] = store.messages.get_range(session.id)
    assert m.token_count == TokenCounter().count_message_text("hello world " * 10) > 10
    assert store.sessions.get(session.id).token_count == m.token_count


def test_sqlite_file_runs_in_wal_mode_with_foreign_keys(sqlite_url):
    store = Store.open(sqlite_url)
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 1000


# ----------------------------------------------------- the known-view append (one statement on PostgreSQL)


def _known_view_append(store, session_pk, messages, after=None):
    """What the engine's fast path does: append after the session's last seq as it knows it.
    The first append of a process teaches the store the session's agent; later ones take the
    one-statement path on PostgreSQL."""
    last = store.sessions.get(session_pk).last_seq
    return append_messages(store, session_pk, messages, after_identity=after, expect_last_seq=last)


def test_known_view_appends_round_trip_odd_messages(store, session):
    first = append_messages(store, session.id, [{"role": "user", "content": "warm up"}])
    nasty = [
        {"role": "user", "content": "nul\x00inside, lone \ud800, pair \ud83d\ude00, quote ' \" \\ \u2028"},
        {"role": "assistant", "content": [{"type": "text", "text": "part \x00"}], "refusal": None},
        {"tool_call_id": "c\x00", "role": "tool", "name": "weird\ud800", "content": "x" * 5000},
        {"role": "user", "content": "ok", "timestamp": 1_700_000_000.123456789},
    ]
    r = _known_view_append(store, session.id, nasty, after=first.last_identity)
    assert r.inserted == 4 and r.session.last_seq == 5 and r.session.message_count == 5
    back = store.messages.get_range(session.id)
    assert [b.message for b in back[1:]] == nasty
    assert [b.store_id for b in back[1:]] == list(r.store_ids)
    assert back[-1].ts == 1_700_000_000.123456789
    assert [h.id for h in store.search.messages("quote", agent="agent-a").hits] == [r.store_ids[0]]


def test_a_known_view_append_after_another_writer_is_stale_and_writes_nothing(store, session, db_url):
    first = append_messages(store, session.id, [{"role": "user", "content": "one"}])
    other = Store.open(db_url)
    append_messages(other, session.id, [{"role": "user", "content": "two"}], after_identity=first.last_identity)
    from lcm.errors import StaleViewError

    with pytest.raises(StaleViewError):
        append_messages(store, session.id, [{"role": "user", "content": "three"}],
                        after_identity=first.last_identity, expect_last_seq=1)
    s = store.sessions.get(session.id)
    assert (s.last_seq, s.message_count) == (2, 2)
    assert [m.message["content"] for m in store.messages.get_range(session.id)] == ["one", "two"]


def test_a_known_view_append_of_a_stored_message_conflicts_and_writes_nothing(store, session):
    from lcm.errors import ConcurrentUpdateError

    append_messages(store, session.id, [{"role": "user", "content": "one"}])
    before = store.sessions.get(session.id)
    with pytest.raises(ConcurrentUpdateError):  # same identity as seq 1, claimed as new
        append_messages(store, session.id, [{"role": "user", "content": "one"}], expect_last_seq=1)
    after = store.sessions.get(session.id)
    assert (after.last_seq, after.message_count, after.token_count) == (
        before.last_seq, before.message_count, before.token_count)
    assert count_rows(store, Message) == 1
