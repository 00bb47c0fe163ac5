"""LcmEngine on both backends: ingest exactly once, compaction, assembly, sessions, copies."""

from __future__ import annotations

import copy
import json

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from tests.support.conversation import SYSTEM, conversation
from tests.support.engine_behaviours import *  # noqa: F403 - every shared behaviour, collected here


def test_construction_and_copies_do_no_io(tmp_path, monkeypatch):
    path = tmp_path / "never.db"
    monkeypatch.setenv("LCM_DATABASE_URL", f"sqlite:///{path}")
    engine = LcmEngine()
    clone = copy.deepcopy(engine)
    assert engine.name == "lcm" and engine.get_tool_schemas() and clone is not engine
    assert engine.clone_for_agent() is not engine
    assert not path.exists() and not tmp_path.joinpath("never.db-wal").exists()


@pytest.mark.parametrize("var,value", [("LCM_CONTEXT_THRESHOLD", "2"), ("LCM_FRESH_TAIL_COUNT", "many"),
                                       ("LCM_SUMMARIZER", "magic"), ("LCM_CONDENSATION_FANIN", "1")])
def test_bad_settings_are_refused_with_the_variable_named(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        LcmEngine()


def test_two_agents_on_one_database_stay_apart(db_url):
    Store.open(db_url, upgrade=True)
    a = LcmEngine(LcmConfig.from_env({}, database_url=db_url, agent_id="alice"))
    b = LcmEngine(LcmConfig.from_env({}, database_url=db_url, agent_id="bob"))
    for e in (a, b):
        e.update_model("m", 100_000)
        e.on_session_start("shared-id")
    a.on_turn_complete([{"role": "user", "content": "alice secret kumquat"}])
    b.on_turn_complete([{"role": "user", "content": "bob note"}])
    assert a.session.id != b.session.id
    assert json.loads(b.handle_tool_call("lcm_grep", {"query": "kumquat", "session_scope": "all"}))["results"] == []


def test_a_failed_session_start_never_files_messages_under_another_session(make_engine, monkeypatch):
    """Issue 13.5: when on_session_start failed (database locked or down), the host's messages
    went to a session called "default", merging conversations."""
    from lcm.errors import DatabaseUnavailableError
    from lcm.store.sessions import SessionRepository

    engine = make_engine(context_length=1_000_000)
    real = SessionRepository.get_or_create
    down = {"on": True}

    def flaky(self, *args, **kwargs):
        if down["on"]:
            raise DatabaseUnavailableError("the database is down (test)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SessionRepository, "get_or_create", flaky)
    engine.on_session_start("intended", platform="cli")
    transcript = [SYSTEM, *conversation(2)]
    engine.on_turn_complete(transcript)  # still down: nothing stored anywhere, nothing raised
    status = json.loads(engine.handle_tool_call("lcm_status", {}))
    assert "unavailable" in status["error"]
    down["on"] = False
    transcript = transcript + conversation(3)[len(transcript) - 1:]
    engine.on_turn_complete(transcript)
    store = engine.store
    assert store.sessions.find(engine.agent_id, "default") is None
    intended = store.sessions.find(engine.agent_id, "intended")
    assert [r.message for r in store.messages.get_range(intended.id)] == transcript[1:]
    assert intended.platform == "cli"


def test_a_copy_started_in_a_hermes_home_stores_in_that_home(tmp_path, monkeypatch):
    """Hermes deep-copies the registered engine per agent; a copy that learns its home at
    session start must open the database there (and take the profile as its agent), not where
    the engine it was copied from would have."""
    monkeypatch.delenv("HERMES_HOME", raising=False)
    monkeypatch.delenv("LCM_DATABASE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    original = LcmEngine(LcmConfig.from_env({}))
    clone = copy.deepcopy(original)
    home = tmp_path / "hermes" / "profiles" / "coder"
    home.mkdir(parents=True)
    clone.on_session_start("s1", hermes_home=str(home))
    clone.on_turn_complete([SYSTEM, *conversation(1)])
    assert clone.context.last_error is None, clone.context.last_error
    assert (home / "lcm.db").is_file() and not (tmp_path / "user" / ".lcm").exists()
    assert clone.agent_id == "coder" and original.context.current is None


def test_a_session_that_opens_with_a_huge_tool_result_still_compacts_later(make_engine):
    """The first turn's huge tool result is handed back cut (nothing outside the fresh tail to
    summarize yet): the stall that records is measured from the smaller context the host then
    holds, so compaction resumes once the conversation grows, not once the host regrows past
    the huge size it had before the cut (it never would: it keeps the cut copy)."""
    from tests.support.conversation import host_step, turn

    engine = make_engine(context_length=3000)
    engine.on_session_start("s1")
    huge = "".join(f"line {i}: ok\n" for i in range(8_000))
    transcript = host_step(engine, [SYSTEM], [
        {"role": "user", "content": "show the deploy log"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_big", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_big", "content": huge},
        {"role": "assistant", "content": "The log ends fine."}])
    assert engine.compression_count == 1 and len(json.dumps(transcript)) < len(huge) // 4  # handed back cut
    for i in range(12):
        transcript = host_step(engine, transcript, turn(i))
    session = engine.store.sessions.find(engine.agent_id, "s1")
    assert session.covered_seq > 4 and session.summary_count > 0  # the huge turn and more are summarized
    assert len(json.dumps(transcript)) // 4 < 3000  # and the host's context fits its window again


def test_a_resumed_host_holding_less_than_lcm_is_not_assembled_again_every_turn(make_engine):
    """A host resumed with its last few messages while lcm holds many more raw ones, under a
    window they all fit: lcm's context would not be smaller, the host keeps its own, and its
    next turns extend what it kept. Each of those turns once read the whole raw region again
    (160 ms at 2,500 messages, minutes at 900,000); now only the first does."""
    engine = make_engine(context_length=1_000_000, fresh_tail_count=64)
    engine.on_session_start("resumed", platform="cli")
    history = [{"role": "system", "content": SYSTEM}]
    for i in range(100):
        history += [{"role": "user", "content": f"question {i} about the harbour"},
                    {"role": "assistant", "content": f"answer {i}: the tide is high"}]
    engine.on_turn_complete(history)
    session = engine.store.sessions.find(engine.agent_id, "resumed")
    assert session.message_count == 200 and session.covered_seq == 0
    resumed = make_engine(context_length=1_000_000, fresh_tail_count=64)
    resumed.on_session_start("resumed", platform="cli")
    reads: list[tuple[int | None, int | None]] = []
    real = resumed.store.messages.get_range

    def counting(session_pk, **kw):
        reads.append((kw.get("first_seq"), kw.get("last_seq")))
        return real(session_pk, **kw)

    resumed.store.messages.get_range = counting  # type: ignore[method-assign]
    transcript = [history[0], *history[-10:]]
    for turn in range(5):
        transcript = transcript + [{"role": "user", "content": f"new question {turn}"},
                                   {"role": "assistant", "content": f"new answer {turn}"}]
        resumed.on_turn_complete(transcript)
        assert resumed.compress(transcript, current_tokens=2_000) is transcript
    whole_region = [r for r in reads if r[0] in (None, 1)]
    assert len(whole_region) <= 1, reads
    assert resumed.store.sessions.get(session.id).message_count == 210
