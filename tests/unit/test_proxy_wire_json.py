"""The proxy's JSON writer: orjson where it can, the standard library where orjson refuses, one
result.

A request's whole history is written once per request for the upstream (``wire.json_bytes``);
orjson does it 20 times faster, and must never change what the upstream gets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcm.proxy import wire

orjson = pytest.importorskip("orjson", reason="orjson comes with the [ui] extra")

#: Text with what JSON carries and UTF-8 may not: lone surrogates, controls, astral characters.
texts = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
scalars = st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | texts | st.floats(
    allow_nan=False, allow_infinity=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                      max_leaves=20)


def _standard(value: Any) -> bytes:
    """What the proxy wrote before orjson: compact, non-ASCII as UTF-8, else all escaped."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


@settings(max_examples=300, deadline=None)
@given(values)
def test_written_json_reads_back_as_the_same_value_and_as_the_standard_library_reads_its_own(value):
    written = wire.json_bytes(value)
    assert json.loads(written) == value
    assert json.loads(written) == json.loads(_standard(value))


def test_what_orjson_refuses_is_written_by_the_standard_library():
    assert wire.json_bytes({"content": "broken \ud800 half"}) == b'{"content":"broken \\ud800 half"}'
    assert wire.json_bytes([2**70, -(2**63) - 1]) == b"[1180591620717411303424,-9223372036854775809]"
    assert wire.json_bytes({"content": "caf\u00e9 \U0001f600"}) == '{"content":"caf\u00e9 \U0001f600"}'.encode()
