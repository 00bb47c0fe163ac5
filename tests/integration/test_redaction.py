"""Redaction (``LCM_SENSITIVE_PATTERNS_ENABLED``), on both backends: secrets never reach the
store, the search index, a summary or the summarizer; placeholders carry a short digest (none
for passwords); the host sending the original again, or lcm's redacted copy, stores nothing
twice; imports are redacted too; off by default."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.errors import ConfigError
from lcm.redact import DEFAULT_PATTERNS, Redactor
from lcm.store import Store
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, host_step, turn
from tests.support.llm_server import completion

SECRETS = {
    "api_key": "AbCdEf1234567890xyz",
    "bearer": "eyJhbGciOiJIUzI1NiJ9.cGF5bG9hZA.c2lnbmF0dXJl",
    "password": "correct horse battery staple",
    "pem": "MIIEowIBAAKCAQEAzq8kQ2redacted",
    "openai": "sk-proj-Q7rT2xV9mN4bL6kP1sD8fG3hJ5",
}
LEAKY_TURN = [
    {"role": "user", "content": f"deploy with API_KEY={SECRETS['api_key']} and password: \"{SECRETS['password']}\""},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "http", "arguments": json.dumps({"headers": {"Authorization": f"Bearer {SECRETS['bearer']}"}})}}]},
    {"role": "tool", "tool_call_id": "c1",
     "content": f"-----BEGIN RSA PRIVATE KEY-----\n{SECRETS['pem']}\n-----END RSA PRIVATE KEY-----"},
    {"role": "assistant", "content": f"Use {SECRETS['openai']} for the model calls."},
]


def engine_on(url: str, **kw: Any) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, **{**SMALL_ENGINE, **kw}))
    engine.update_model("test-model", 3000)
    return engine


def everything_stored(store: Store) -> str:
    """Every text column of every table lcm writes, as one string."""
    with store.engine.connect() as conn:
        rows = [conn.execute(text(sql)).all() for sql in (
            "SELECT content, search_text, tool_calls, extra FROM lcm_messages",
            "SELECT content, search_text FROM lcm_summaries",
            "SELECT message FROM lcm_system_prompts")]
    return json.dumps([[list(r) for r in table] for table in rows])


def test_secrets_never_reach_the_store_the_index_or_the_summarizer(db_url, llm):
    llm.handler = lambda body: completion("- the user deployed with the credentials given")
    Store.open(db_url, upgrade=True)
    engine = engine_on(db_url, sensitive_patterns_enabled=True, summary_base_url=llm.url, summary_model="m")
    engine.on_session_start("s1")
    system = {"role": "system", "content": f"You are a deploy bot. token: \"{SECRETS['bearer']}\""}
    transcript: list[dict[str, Any]] = [system]
    for new in [LEAKY_TURN, *(turn(i) for i in range(25))]:
        transcript = host_step(engine, transcript, new)
    # The host sends the originals again, then lcm's redacted copies: nothing is stored twice.
    host_step(engine, [system, *LEAKY_TURN, *(m for i in range(25) for m in turn(i))], turn(26))
    assert engine.compression_count > 0 and llm.requests
    store = engine.store
    session = store.sessions.find(engine.agent_id, "s1")
    assert session.message_count == 4 + 26 * 4 and store.sessions.forks(session.id) == []
    stored = everything_stored(store)
    sent = json.dumps(llm.requests)
    for name, secret in SECRETS.items():
        assert secret not in stored, name
        assert secret not in sent, name  # the summarizer never saw it either
        assert not store.search.messages(secret.split()[0], agent=engine.agent_id).hits
    first = store.messages.get_range(session.id, first_seq=1, last_seq=4)
    assert first[0].message["content"].startswith("deploy with API_KEY=[REDACTED:api_key:")
    assert 'password: "[REDACTED:password_assignment]"' in first[0].message["content"]  # no digest
    assert "[REDACTED:bearer_token:" in first[1].message["tool_calls"][0]["function"]["arguments"]
    assert first[2].message["content"].startswith("[REDACTED:private_key:")
    assert "[REDACTED:provider_token:" in first[3].message["content"]
    [prompt] = store.sessions.system_prompts(session.id)
    assert "[REDACTED:bearer_token:" in prompt.message["content"]
    status = json.loads(engine.handle_tool_call("lcm_status", {}))["redaction"]
    assert status["enabled"] and status["patterns"] == list(DEFAULT_PATTERNS)
    assert status["redacted_values"]["password_assignment"] >= 1
    assert not any(secret in json.dumps(status) for secret in SECRETS.values())
    # The placeholders are found by their kind, and two different keys stay apart.
    assert store.search.messages("REDACTED api_key", agent=engine.agent_id).hits


def test_redaction_is_off_by_default_and_lossless_then(db_url):
    Store.open(db_url, upgrade=True)
    engine = engine_on(db_url)
    engine.on_session_start("s1")
    host_step(engine, [SYSTEM], LEAKY_TURN)
    stored = engine.store.messages.get_range(engine.store.sessions.find(engine.agent_id, "s1").id)
    assert [m.message for m in stored] == LEAKY_TURN
    assert json.loads(engine.handle_tool_call("lcm_status", {}))["redaction"] == {"enabled": False}


def test_imports_are_redacted_and_idempotent(db_url, lcm, tmp_path, monkeypatch):
    Store.open(db_url, upgrade=True)
    path = tmp_path / "leaky.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in LEAKY_TURN))
    monkeypatch.setenv("LCM_SENSITIVE_PATTERNS_ENABLED", "true")
    for expected in (4, 0):
        code, out, err = lcm("ingest", str(path), "--url", db_url, "--session", "imp", "--json")
        assert code == 0, err
        assert json.loads(out)["sessions"][0]["added"] == expected
    assert not any(s in everything_stored(Store.open(db_url)) for s in SECRETS.values())


def test_unknown_pattern_names_are_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown names api_keys; known: api_key, bearer_token"):
        LcmConfig.from_env({"LCM_SENSITIVE_PATTERNS_ENABLED": "true", "LCM_SENSITIVE_PATTERNS": "api_keys"})
    with pytest.raises(ValueError, match="must be true or false"):
        LcmConfig.from_env({"LCM_SENSITIVE_PATTERNS_ENABLED": "maybe"})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    "password=", "api_key: ", "Bearer ", "sk-proj-", "token\": \"", "AKIA", "-----BEGIN RSA PRIVATE KEY-----\n",
    "\n-----END RSA PRIVATE KEY-----", "[REDACTED:api_key:0123abcd]", "abcdefghij0123456789", " ", "\"", "x"]),
    max_size=12).map("".join))
def test_redaction_is_idempotent(text_in):
    redactor = Redactor.of(DEFAULT_PATTERNS)
    once = redactor.text(text_in)
    assert redactor.text(once) == once
