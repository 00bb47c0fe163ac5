"""Session and message filters on both backends: an ignored session leaves no row and passes
the host's context through; a stateless one writes nothing but recalls; matching messages are
not stored (tool exchanges never filtered); a runaway pattern cannot hold a turn."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.errors import ConfigError
from lcm.store import Store
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, host_step, turn


def engine_on(url: str, **kw: Any) -> LcmEngine:
    Store.open(url, upgrade=True)
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, **{**SMALL_ENGINE, **kw}))
    engine.update_model("test-model", 3000)
    return engine


def call(engine: LcmEngine, name: str, **args: Any) -> dict[str, Any]:
    return json.loads(engine.handle_tool_call(name, args))


def test_an_ignored_session_leaves_no_trace_and_passes_the_context_through(db_url):
    engine = engine_on(db_url, ignore_session_patterns=("cron", "telegram:bot-*"))
    engine.on_session_start("real", platform="cli")
    host_step(engine, [SYSTEM], [{"role": "user", "content": "the marmot migration is on Friday"}])
    for key, platform in (("nightly-1", "cron"), ("bot-7", "telegram")):
        engine.on_session_start(key, platform=platform)
        transcript: list[dict[str, Any]] = [SYSTEM]
        for i in range(20):  # far over the window: still nothing is compacted or stored
            new = turn(i)
            assert engine.compress([*transcript, *new], current_tokens=10_000) == [*transcript, *new]
            transcript = host_step(engine, transcript, new)
        assert engine.store.sessions.find(engine.agent_id, key) is None
        status = call(engine, "lcm_status")
        assert status["stored"] is False and status["session_filters"]["session_ignored"] is True
        found = call(engine, "lcm_grep", query="marmot", session_scope="all")["results"]
        assert [h["session_id"] for h in found] == ["real"]
        assert "not stored" in call(engine, "lcm_grep", query="marmot")["error"]
    assert [s.session_key for s in engine.store.sessions.each(engine.agent_id)] == ["real"]
    # Another platform's session of the same id pattern is stored as usual.
    engine.on_session_start("bot-8", platform="discord")
    host_step(engine, [SYSTEM], turn(1))
    assert engine.store.sessions.find(engine.agent_id, "bot-8").message_count == 4


def test_a_stateless_session_writes_nothing_but_recalls(db_url):
    writer = engine_on(db_url)
    writer.on_session_start("shared", platform="cli")
    host_step(writer, [SYSTEM], [{"role": "user", "content": "the quokka cluster moved to eu-west-2"}])
    stored = writer.store.sessions.find(writer.agent_id, "shared")
    reader = engine_on(db_url, stateless_session_patterns=("shared",))
    reader.on_session_start("shared", platform="cli")
    transcript = host_step(reader, [SYSTEM, {"role": "user", "content": "the quokka cluster moved to eu-west-2"}],
                           [{"role": "user", "content": "and where is it now?"}])
    assert transcript[-1]["content"] == "and where is it now?"
    after = reader.store.sessions.find(reader.agent_id, "shared")
    assert after.message_count == stored.message_count == 1 and after.last_compaction == stored.last_compaction
    hits = call(reader, "lcm_grep", query="quokka")["results"]
    assert hits and hits[0]["session_id"] == "shared"
    assert call(reader, "lcm_status")["session_filters"]["session_stateless"] is True
    reader2 = engine_on(db_url, stateless_session_patterns=("never-*",))
    reader2.on_session_start("never-seen")
    host_step(reader2, [SYSTEM], turn(1))
    assert reader2.store.sessions.find(reader2.agent_id, "never-seen") is None


def test_matching_messages_are_not_stored_and_a_runaway_pattern_cannot_hold_a_turn(db_url):
    engine = engine_on(db_url, ignore_message_patterns=(r"^Cronjob Response:", r"(a|aa)+$"))
    engine.on_session_start("chat", platform="telegram")
    noise = {"role": "user", "content": "Cronjob Response: disk 91% full"}
    tool_noise = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "cron", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Cronjob Response: ok"}]
    runaway = {"role": "user", "content": "a" * 40 + "!"}
    transcript: list[dict[str, Any]] = [SYSTEM]
    started = time.monotonic()
    for _ in range(3):  # the host resends its whole transcript each turn
        transcript = host_step(engine, transcript, [noise, {"role": "user", "content": "real question"},
                                                    *tool_noise, runaway])
    assert time.monotonic() - started < 10
    stored = [m.message for m in engine.store.messages.get_range(
        engine.store.sessions.find(engine.agent_id, "chat").id)]
    contents = [m["content"] for m in stored]
    assert "Cronjob Response: disk 91% full" not in contents
    assert contents.count("real question") == 3 and contents.count("Cronjob Response: ok") == 3  # tool result kept
    assert contents.count("a" * 40 + "!") == 3  # the runaway match timed out: kept
    filters = call(engine, "lcm_status")["session_filters"]
    assert filters["ignored_messages"] == 1 and filters["match_timeouts"] >= 1


def test_a_bad_pattern_is_refused_at_start():
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        LcmEngine(LcmConfig.from_env({"LCM_IGNORE_MESSAGE_PATTERNS": "^ok,(unclosed"}))
