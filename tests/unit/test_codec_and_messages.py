"""Lossless encoding of text and messages (no database involved)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcm import codec
from lcm.errors import InvalidMessageError
from lcm.messages import (
    CONTENT_PAYLOAD,
    PAYLOAD_MIN_CHARS,
    chain_identity,
    content_hash,
    decode_message,
    encode_message,
    parse_timestamp,
    uid_identity,
)
from tests.support.strategies import json_values, messages, nasty_text


def _storable(s: str) -> bool:
    """What both databases accept in a text column: no NUL, valid UTF-8."""
    if "\x00" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(nasty_text)
def test_text_roundtrip_and_storable(s):
    stored = codec.encode_text(s)
    assert _storable(stored)
    assert codec.decode_text(stored) == s


@given(json_values)
def test_json_roundtrip_and_storable(v):
    stored = codec.encode_json(v)
    assert _storable(stored)
    assert codec.decode_json(stored) == v


def test_clean_text_is_stored_verbatim():
    for s in ["hello", "数据库 café", "line\nbreak\ttab", ""]:
        assert codec.encode_text(s) == s


def test_split_surrogate_pair_is_not_merged_into_one_character():
    split = "\ud83d\ude00"  # two code points, as json.loads may never produce but Python can
    assert len(split) == 2
    assert codec.decode_text(codec.encode_text(split)) == split
    assert codec.decode_json(codec.encode_json([split])) == [split]
    assert codec.decode_json(codec.encode_json(["😀"])) == ["😀"]


def test_corrupt_escape_is_reported():
    with pytest.raises(codec.CodecError):
        codec.decode_text("\x01\x01x")


def _rebuild(enc):
    payload = enc.payload
    return decode_message(role=enc.role, content_kind=enc.content_kind, content=enc.content,
                          tool_calls=enc.tool_calls, tool_call_id=enc.tool_call_id, name=enc.name,
                          extra=enc.extra, key_order=enc.key_order, payload=payload)


@settings(max_examples=300)
@given(messages())
def test_message_roundtrip_keeps_every_key_value_and_order(msg):
    enc = encode_message(msg)
    for column in (enc.content, enc.tool_calls, enc.extra, enc.key_order, enc.payload):
        assert column is None or _storable(column)
    back = _rebuild(enc)
    assert back == msg
    assert list(back.keys()) == list(msg.keys())
    assert json.dumps(back, ensure_ascii=True) == json.dumps(msg, ensure_ascii=True)


def test_db_persisted_marker_is_stripped_and_not_part_of_identity():
    a = {"role": "user", "content": "hi"}
    b = {"role": "user", "content": "hi", "_db_persisted": True}
    assert content_hash(a) == content_hash(b)
    assert _rebuild(encode_message(b)) == a


CALL = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\": \"ls\"}"}}


@pytest.mark.parametrize("live,reloaded", [
    # Hermes' in-process assistant turn, and the same turn read back from its session database
    ({"role": "assistant", "content": "done", "reasoning": None, "finish_reason": "stop"},
     {"role": "assistant", "content": "done", "finish_reason": "stop", "timestamp": 1_795_000_000.5}),
    ({"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning": "think"},
     {"role": "assistant", "content": "", "tool_calls": [{**CALL, "index": 0}], "timestamp": 1}),
    ({"role": "tool", "tool_call_id": "c1", "content": "out", "name": "shell", "tool_name": "shell"},
     {"role": "tool", "tool_call_id": "c1", "content": "out", "timestamp": 2}),
    ({"role": "user", "content": "hi"}, {"role": "user", "content": "hi", "api_content": "hi + memory"}),
    ({"role": "assistant", "tool_calls": [CALL]}, {"role": "assistant", "content": None, "tool_calls": [CALL]}),
])
def test_annotations_a_host_adds_or_drops_are_not_identity(live, reloaded):
    assert content_hash(live) == content_hash(reloaded)
    assert _rebuild(encode_message(live)) == live  # while every key is still stored as sent


IMAGE = {"type": "image_url", "image_url": {"url": "data:1"}}
MARK = {"cache_control": {"type": "ephemeral"}}


@pytest.mark.parametrize("sent,resent", [
    # an SDK switching a message between a string and one text part
    ({"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}),
    ({"role": "assistant", "content": [{"type": "text", "text": "done"}]}, {"role": "assistant", "content": "done"}),
    # a client moving its prompt-cache marks to the newest messages (Cline, Roo Code, aider)
    ({"role": "user", "content": [{"type": "text", "text": "hi", **MARK}]}, {"role": "user", "content": "hi"}),
    ({"role": "user", "content": [{"type": "text", "text": "look"}, {**IMAGE, **MARK}]},
     {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]}),
    ({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "out", **MARK}]},
     {"role": "tool", "tool_call_id": "c1", "content": "out"}),
    ({"role": "user", "content": []}, {"role": "user", "content": [{"type": "text", "text": ""}]}),
    # a client that keeps calls parsed (LangChain, the Vercel AI SDK) serialises them again
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": '{"b":1,"a":"é"}'}}]},
     {"role": "assistant",
      "tool_calls": [{**CALL, "function": {"name": "f", "arguments": '{"a": "\\u00e9", "b": 1}'}}]}),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": '{"b": 1}'}}]},
     {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"b": 1}}}]}),
])
def test_a_content_re_encoded_by_the_client_is_the_same_message(sent, resent):
    assert content_hash(sent) == content_hash(resent)
    assert _rebuild(encode_message(sent)) == sent  # stored as first sent


@pytest.mark.parametrize("a,b", [
    ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}),
    ({"role": "user", "content": "hi"}, {"role": "user", "content": "hi "}),
    ({"role": "user", "content": "hi", "name": "alice"}, {"role": "user", "content": "hi", "name": "bob"}),
    ({"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "hi!"}]}),
    # several parts stay parts: how the API joins them is the provider's business
    ({"role": "user", "content": "ab"}, {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                     {"type": "text", "text": "b"}]}),
    ({"role": "user", "content": [IMAGE]}, {"role": "user", "content": [{**IMAGE, "image_url": {"url": "data:2"}}]}),
    ({"role": "assistant", "tool_calls": [CALL]},
     {"role": "assistant", "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": "{}"}}]}),
    # arguments that are not JSON are compared as written; a JSON text is not that text
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "ls -l"}}]},
     {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "ls  -l"}}]}),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": '"x"'}}]},
     {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "x"}}]}),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": '{"n": 1}'}}]},
     {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": '{"n": 1.5}'}}]}),
    ({"role": "tool", "tool_call_id": "c1", "content": "x"}, {"role": "tool", "tool_call_id": "c2", "content": "x"}),
])
def test_what_was_said_is_identity(a, b):
    assert content_hash(a) != content_hash(b)


def test_key_order_does_not_change_identity_but_is_kept():
    a = {"role": "tool", "content": "x", "tool_call_id": "c1"}
    b = {"tool_call_id": "c1", "role": "tool", "content": "x"}
    assert content_hash(a) == content_hash(b)
    assert list(_rebuild(encode_message(b))) == ["tool_call_id", "role", "content"]
    assert encode_message(a).key_order is None  # the usual order costs nothing


def test_identity_chains_so_repeats_differ_and_resends_match():
    h = content_hash({"role": "assistant", "content": "ok"})
    first = chain_identity("", h)
    second = chain_identity(first, h)
    assert first != second
    assert chain_identity("", h) == first
    assert uid_identity("abc") == "u:abc"
    assert uid_identity("x" * 500).startswith("u#")


def test_large_bodies_move_to_a_payload():
    big = "y" * (PAYLOAD_MIN_CHARS + 10)
    enc = encode_message({"role": "tool", "tool_call_id": "c", "content": big})
    assert enc.content_kind == CONTENT_PAYLOAD and enc.content is None
    assert _rebuild(enc) == {"role": "tool", "tool_call_id": "c", "content": big}


@pytest.mark.parametrize("bad", [
    "not a dict", {"content": "no role"}, {"role": ""}, {"role": 5}, {"role": "x" * 100},
])
def test_non_messages_are_refused_with_a_clear_error(bad):
    with pytest.raises(InvalidMessageError):
        encode_message(bad)


@pytest.mark.parametrize("value,expected", [
    (1700000000, 1700000000.0),
    (1700000000123, 1700000000.123),
    ("1700000000.5", 1700000000.5),
    ("2024-01-01T00:00:00Z", 1704067200.0),
    ("2024-01-01T02:00:00+02:00", 1704067200.0),
    ("2024-01-01T00:00:00", 1704067200.0),  # naive: taken as UTC
    ("yesterday", None), (None, None), (True, None), (float("nan"), None),
])
def test_host_timestamps(value, expected):
    got = parse_timestamp(value)
    assert got == pytest.approx(expected) if expected is not None else got is None


@given(st.text())
def test_parse_timestamp_never_raises(s):
    parse_timestamp(s)


def test_values_json_cannot_hold_are_stored_deterministically_with_the_change_noted():
    """Regression (issue 13.3, 13.11): an object, a datetime or content nested 3,000 levels
    deep used to refuse (or crash with RecursionError) the whole message."""
    import datetime as dt

    deep: list = []
    node = deep
    for _ in range(3000):
        node.append([])
        node = node[0]
    for odd in ({"role": "user", "content": object()}, {"role": "tool", "content": "x", "at": dt.date(2026, 1, 1)},
                {"role": "user", "content": deep}):
        encoded = encode_message(odd)
        assert encoded.problem and json.loads(encoded.problem)
        assert encode_message(odd).content_hash == encoded.content_hash
    assert encode_message({"role": "user", "content": "plain"}).problem is None
