"""Hypothesis-generated input through the whole engine (the fault suite): odd messages mixed
with unstorable ones and lcm-lookalike text, sent by two hosts in any order, are stored exactly
once and in order; generated tool arguments are answered or refused, never failing inside lcm."""

from __future__ import annotations

import datetime as dt
import json
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.messages import make_storable, unstorable_reason
from lcm.store import Store
from lcm.tools import TOOL_SCHEMAS
from lcm.transcript import SUMMARY_MARKER
from tests.support.strategies import json_values, messages, nasty_text

SYSTEM = {"role": "system", "content": "generated"}

odd = st.one_of(
    messages(),
    st.builds(lambda m: {**m, "when": dt.datetime(2026, 1, 2)}, messages()),
    st.builds(lambda t: {"role": "user", "content": f"{SUMMARY_MARKER}\n{t}"}, nasty_text),
)
unstorable = st.sampled_from([None, 7, "text", {"content": "no role"}, {"role": "r" * 80}])
entries = st.lists(st.one_of(odd, odd, odd, unstorable), min_size=1, max_size=25)


def _engine(url: str) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url))
    engine.update_model("test-model", 10_000_000)
    return engine


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transcript=entries, order=st.lists(st.booleans(), min_size=1, max_size=40))
def test_generated_transcripts_from_two_hosts_are_stored_once_in_order(sqlite_url, transcript, order):
    Store.open(sqlite_url, upgrade=True)
    key = uuid.uuid4().hex
    hosts = [_engine(sqlite_url), _engine(sqlite_url)]
    for h in hosts:
        h.on_session_start(key)
    sent = [0, 0]
    for turn_of_a in order + [True, False]:
        h = 0 if turn_of_a else 1
        sent[h] = min(len(transcript), sent[h] + 3)
        hosts[h].on_turn_complete([SYSTEM, *transcript[:sent[h]]])
    for h in (0, 1):
        hosts[h].on_turn_complete([SYSTEM, *transcript])
    store = hosts[0].store
    session = store.sessions.find(hosts[0].agent_id, key)
    stored = [r.message for r in store.messages.get_range(session.id, limit=10_000)]
    expected = [make_storable({k: v for k, v in m.items() if k != "_db_persisted"})[0]
                for m in transcript if unstorable_reason(m) is None]
    assert json.dumps(stored, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert store.sessions.forks(session.id) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=st.sampled_from([s["function"]["name"] if "function" in s else s["name"] for s in TOOL_SCHEMAS]),
       args=st.dictionaries(st.one_of(nasty_text, st.integers()), json_values, max_size=4))
def test_generated_tool_arguments_never_fail_inside_lcm(sqlite_url, tool, args):
    engine = _engine(sqlite_url)
    engine.on_session_start("s")
    result = json.loads(engine.handle_tool_call(tool, args))
    assert "inside lcm" not in json.dumps(result), result
