"""Issue 16.3: ``lcm export`` is a lossless format. Generated messages, with the characters
line readers trip on (U+2028, U+2029, U+0085, form feeds, CR, NUL, lone surrogates), go
store → export → read → import → export on a real SQLite file and a real PostgreSQL schema, and
come back identical line for line.

One thing JSON cannot carry: a lone high surrogate directly followed by a lone low one is, in
any JSON text, the character the pair encodes; such a message reads back as that character
(``as_json_reads_it``), and from then on round-trips exactly."""

from __future__ import annotations

import io
import json
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcm.store import Store
from lcm.tokens import TokenCounter
from lcm.transfer import dump_line, export_sessions, import_session, plan_sessions, read_transcript
from tests.support.storing import append_messages

TRICKY = ["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\r", "\r\n", "\n", "\x00", "\ud800", "\udfff", "\x1e",
          "é", "日本", "🙂", "\\", '"']
text = st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=8)), max_size=12).map("".join)
message = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, text),
    st.builds(lambda c, n: {"role": "assistant", "content": c, "name": n}, text, text),
    st.builds(lambda c: {"role": "assistant", "content": [{"type": "text", "text": c}]}, text))
TOKENS = TokenCounter()


def as_json_reads_it(value: object) -> object:
    """``value`` as any JSON reader returns it (adjacent high+low surrogates combined)."""
    return json.loads(json.dumps(value))


def export_text(store: Store, agent: str) -> str:
    return "".join(dump_line(line) + "\n" for line in export_sessions(store, agent))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=st.lists(message, min_size=1, max_size=6))
def test_export_reads_back_into_an_identical_store(db_url, messages):
    store = Store.open(db_url, upgrade=True)
    first, second = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    session = store.sessions.get_or_create(first, "s", platform="cli")
    append_messages(store, session.id, messages)
    exported = export_text(store, first)
    assert len(exported.splitlines()) >= len(messages)  # another reader may split more; ours must not
    transcript = read_transcript(io.StringIO(exported))
    assert [e.message for e in transcript.entries] == as_json_reads_it(messages)
    for plan in plan_sessions(transcript):
        report = import_session(store, second, plan, TOKENS)
        assert report.added == len(messages)
    again = export_text(store, second)
    assert again == exported or as_json_reads_it(messages) != messages
    assert [json.loads(line)["message"] for line in again.split("\n") if line] == as_json_reads_it(messages)
    assert all("\u2028" not in line and "\x85" not in line for line in exported.split("\n"))
