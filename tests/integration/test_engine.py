"""LcmEngine on both backends: ingest exactly once, compaction, assembly, sessions, copies."""

from __future__ import annotations

import copy
import json

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from tests.support.conversation import SYSTEM, conversation
from tests.support.engine_behaviours import (  # noqa: F401 - collected here  # noqa: F401
    healthy,
    stored,
    test_a_backlog_is_worked_off_in_bounded_calls,
    test_a_compacting_turn_reads_the_view_once_and_plans_the_tail_once,
    test_a_host_that_only_calls_compress_loses_nothing,
    test_a_message_larger_than_the_window_is_handed_back_cut_and_recognised,
    test_a_message_that_cannot_be_stored_never_blocks_the_others,
    test_a_session_hermes_reloads_in_a_new_process_is_not_stored_twice,
    test_a_tail_bigger_than_the_cap_is_reported,
    test_a_tail_bigger_than_the_cap_shrinks_to_the_newest_turn,
    test_a_tool_group_is_never_split_and_a_giant_message_is_its_own_leaf,
    test_api_content_stamped_later_is_the_same_message,
    test_assembly_cap_holds_whenever_the_tail_fits,
    test_compaction_gets_under_the_threshold_and_records_why,
    test_compaction_then_host_transcript_adds_only_new_messages,
    test_compress_output_follows_the_contract,
    test_compression_boundary_continues_the_same_conversation,
    test_condensation_fanin_and_max_depth,
    test_copies_share_the_store_not_the_session,
    test_every_entry_point_stores_exactly_once,
    test_focus_topic_and_llm_summaries,
    test_force_runs_a_pass_below_the_threshold,
    test_get_status_clamps_the_host_sentinel,
    test_host_hooks_tolerate_unknown_keyword_arguments,
    test_new_session_carries_deep_summaries_and_keeps_raw_messages,
    test_nothing_outside_the_fresh_tail_is_a_reason_not_a_loop,
    test_own_summary_message_is_never_stored,
    test_passes_are_bounded_and_the_rest_continues_next_time,
    test_repeated_content_is_kept_and_uids_are_identities,
    test_resending_the_full_transcript_after_compaction_adds_nothing,
    test_retain_depth_zero_carries_nothing,
    test_should_compress_and_cheap_preflights,
    test_the_system_message_comes_back_without_the_host_marker,
)


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
