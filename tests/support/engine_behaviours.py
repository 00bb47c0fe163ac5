"""Engine behaviours, written once and run twice: over the in-memory store
(``tests/unit/test_engine_core.py``: no database) and end to end on SQLite and PostgreSQL
(``tests/integration/test_engine.py``). Each test takes ``make_engine`` from its directory's
conftest: ingest exactly once, the compaction loop (bounds, fan-in, depth, tool groups),
assembly within the cap, sessions, copies and host hooks."""

from __future__ import annotations

import json

from lcm.engine import LcmEngine
from lcm.transcript import SUMMARY_MARKER
from tests.support.conversation import (
    SYSTEM,
    conversation,
    host_tokens,
    newest_user_index,
    run_host,
    sequence_problems,
    turn,
)
from tests.support.llm_server import completion


def stored(engine: LcmEngine) -> list[dict]:
    return [m.message for m in engine.store.messages.get_range(engine.session.id)]


def healthy(engine: LcmEngine) -> None:
    bad = [c for c in engine.store.health.checks(deep=True) if c.status == "fail"]
    assert not bad, bad


def test_copies_share_the_store_not_the_session(make_engine):
    engine = make_engine()
    engine.on_session_start("a1")
    clone = engine.clone_for_agent()
    assert clone.store is engine.store and clone.context.current is None
    clone.on_session_start("a2")
    engine.compress([SYSTEM, *turn(1)])
    clone.compress([SYSTEM, *turn(2)])
    assert engine.session.session_key == "a1" and clone.session.session_key == "a2"
    assert len(stored(engine)) == len(stored(clone)) == 4


# --------------------------------------------------------------------------- ingest


def test_every_entry_point_stores_exactly_once(make_engine):
    engine = make_engine(context_length=100_000)
    engine.on_session_start("s", platform="cli")
    msgs = [SYSTEM, *turn(0), *turn(1)]
    engine.on_turn_complete(msgs, usage={"prompt_tokens": 50})
    engine.handle_tool_call("lcm_status", {}, messages=msgs)
    assert engine.compress(msgs) is msgs  # nothing to do: the official no-op
    engine.on_session_end("s", msgs + turn(2))
    assert stored(engine) == msgs[1:] + turn(2)  # the system prompt is the host's, not stored
    fresh = make_engine(context_length=100_000)  # a restart: no memory of what was seen
    fresh.on_session_start("s")
    fresh.compress(msgs + turn(2) + turn(3))
    assert stored(fresh) == msgs[1:] + turn(2) + turn(3)


def test_the_system_prompt_is_kept_once_per_version_and_never_as_a_message(make_engine):
    engine = make_engine(context_length=100_000)
    engine.on_session_start("s")
    first = {"role": "system", "content": "You are terse. Codeword QUOKKA.", "_db_persisted": True}
    second = {"role": "system", "content": "You are verbose now. Codeword WALLABY."}
    engine.compress([first, *turn(0)])
    engine.on_turn_complete([dict(first), *turn(0), *turn(1)])  # an equal copy: nothing new
    engine.compress([second, *turn(0), *turn(1), *turn(2)])
    engine.compress([first, *turn(0), *turn(1), *turn(2)])  # an old version again: still once
    assert stored(engine) == turn(0) + turn(1) + turn(2)  # conversation only
    versions = engine.store.sessions.system_prompts(engine.session.id)
    assert [v.message for v in versions] == [{"role": "system", "content": first["content"]}, second]
    assert [v.first_seq for v in versions] == [1, 1 + 2 * len(turn(0))]
    assert len({v.digest for v in versions}) == 2 and all(v.token_count > 5 for v in versions)
    grep = json.loads(engine.handle_tool_call("lcm_grep", {"query": "QUOKKA"}))
    assert not grep["results"]  # not searched, while the conversation is
    assert json.loads(engine.handle_tool_call("lcm_grep", {"query": "fact1"}))["results"]
    page = json.loads(engine.handle_tool_call("lcm_load_session", {
        "session_id": "s", "include_system_prompt": True, "max_content_chars": 12}))
    assert [p["first_seq"] for p in page["system_prompts"]] == [v.first_seq for v in versions]
    assert page["system_prompts"][1]["message"]["content"] == second["content"][:12]
    assert "system_prompts" not in json.loads(engine.handle_tool_call("lcm_load_session", {"session_id": "s"}))
    status = json.loads(engine.handle_tool_call("lcm_status", {}))
    assert status["system_prompt"] == {"digest": versions[-1].digest, "token_count": versions[-1].token_count,
                                       "first_seq": versions[-1].first_seq, "versions": 2}
    other = make_engine(context_length=100_000)  # another process: the store already has it
    other.on_session_start("s")
    other.compress([second, *turn(0), *turn(1), *turn(2), *turn(3)])
    assert len(other.store.sessions.system_prompts(other.session.id)) == 2


def test_repeated_content_is_kept_and_uids_are_identities(make_engine):
    engine = make_engine(context_length=100_000)
    engine.on_session_start("s")
    msgs = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}]
    engine.on_turn_complete(msgs)
    engine.on_turn_complete(msgs)
    assert stored(engine) == msgs
    uid_msgs = [{"role": "user", "content": "same", "message_uid": "m1"},
                {"role": "user", "content": "same", "message_uid": "m2"}]
    engine.on_turn_complete(msgs + uid_msgs)
    engine.on_turn_complete(uid_msgs)  # out of context, still recognised by uid
    assert stored(engine)[4:] == uid_msgs


def test_api_content_stamped_later_is_the_same_message(make_engine):
    engine = make_engine(context_length=100_000)
    engine.on_session_start("s")
    msgs = [{"role": "user", "content": "hello"}]
    engine.on_turn_complete(msgs)
    msgs[0]["api_content"] = "hello + memory context"  # Hermes stamps the sent bytes afterwards
    engine.on_turn_complete([dict(msgs[0]), {"role": "assistant", "content": "hi"}])
    assert [m["content"] for m in stored(engine)] == ["hello", "hi"]


def _as_hermes_reloads(message: dict) -> dict:
    """A message as Hermes 0.19 reads it back from its session database on --resume."""
    out = {k: v for k, v in message.items() if k not in ("reasoning", "finish_reason")}
    out["timestamp"] = 1_795_000_000.0
    if out.get("role") == "tool":
        out["tool_name"] = "shell"
    return out


def test_a_session_hermes_reloads_in_a_new_process_is_not_stored_twice(make_engine):
    """Every `hermes chat --resume` is a new process holding the reloaded transcript."""
    first = make_engine(context_length=100_000)
    first.on_session_start("s")
    live = [SYSTEM]
    for i in range(3):
        for m in turn(i):
            live.append({**m, "reasoning": None, "finish_reason": "stop"} if m["role"] == "assistant" else m)
    first.on_turn_complete(live)
    stored_before = stored(first)
    second = make_engine(context_length=100_000)
    second.on_session_start("s")
    resumed = [SYSTEM, *(_as_hermes_reloads(m) for m in live[1:]), *turn(3)]
    second.compress(resumed, current_tokens=1_000)
    second.on_turn_complete(resumed)
    assert stored(second) == stored_before + turn(3)  # the first copies kept, the new turn added once


def test_compaction_then_host_transcript_adds_only_new_messages(make_engine):
    engine = make_engine()
    engine.on_session_start("s")
    transcript, sent = run_host(engine, 24)
    assert engine.compression_count >= 2
    assert stored(engine) == sent  # every message once, in order, byte-identical
    restarted = make_engine()
    restarted.on_session_start("s")
    again, more = run_host(restarted, 3, start=24, transcript=transcript)
    assert stored(restarted) == sent + more
    healthy(restarted)


def test_a_host_that_only_calls_compress_loses_nothing(make_engine):
    """Hermes 0.19 hands the transcript over only through compress(): what it has handed over
    is stored exactly, and the rest arrives with the next call."""
    engine = make_engine()
    engine.on_session_start("s")
    transcript, sent = run_host(engine, 24, notify=False)
    got = stored(engine)
    assert got == sent[: len(got)] and len(got) > len(sent) // 2
    engine.compress(transcript, current_tokens=1)
    assert stored(engine) == sent


def test_resending_the_full_transcript_after_compaction_adds_nothing(make_engine):
    """Regression: a host that re-sends everything (a restart without session rotation) after
    lcm compacted must not have the early messages stored a second time."""
    engine = make_engine()
    engine.on_session_start("s")
    full = [SYSTEM, *conversation(20)]
    engine.compress(full, current_tokens=2900, force=True)
    before = stored(engine)
    for fresh in (engine, make_engine()):
        fresh.on_session_start("s")
        fresh.compress(full + turn(50), current_tokens=2900)
        assert stored(fresh) == before + turn(50)


def test_own_summary_message_is_never_stored(make_engine):
    engine = make_engine()
    engine.on_session_start("s")
    transcript, sent = run_host(engine, 20)
    assert transcript[1]["content"].startswith(SUMMARY_MARKER)
    echoed = [transcript[0], {k: v for k, v in transcript[1].items() if k != "_compressed_summary"},
              *transcript[2:]]
    engine.on_turn_complete(echoed)  # the summary comes back even without its marker key
    assert not any(SUMMARY_MARKER in json.dumps(m) for m in stored(engine))


def test_a_message_that_cannot_be_stored_never_blocks_the_others(make_engine):
    """Regression (issue 13.3): one unstorable message used to stop ingest of the session."""
    engine = make_engine(context_length=1_000_000)
    engine.on_session_start("s")
    turns = conversation(10)
    msgs = [SYSTEM, *turns[:4], {"content": "no role"}, None, {"role": "x" * 100, "content": "?"},
            *turns[4:]]
    engine.on_turn_complete(msgs)
    assert stored(engine) == turns
    more = conversation(12)[10:]
    engine.on_turn_complete(msgs + more)
    engine.on_turn_complete(list(msgs + more))  # full alignment: not counted twice
    assert stored(engine) == turns + more
    status = json.loads(engine.handle_tool_call("lcm_status", {}))
    assert status["skipped_messages"] == 3 and status["stored_messages"] == len(turns + more)


# --------------------------------------------------------------------------- compaction & assembly


def test_compress_output_follows_the_contract(make_engine):
    engine = make_engine()
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(20)]
    out = engine.compress(transcript, current_tokens=2900, force=True)
    assert len(out) < len(transcript)
    assert sequence_problems(out, system=SYSTEM) == []
    summary = out[1]
    assert summary["role"] == "user" and summary["_compressed_summary"] is True
    assert summary["content"].startswith(SUMMARY_MARKER)
    assert "node_id=" in summary["content"] and "Expand for details about:" in summary["content"]
    # the fresh tail: verbatim, holding the newest user message and everything after it
    newest = newest_user_index(transcript)
    k = len(transcript) - newest
    assert out[-k:] == transcript[-k:]
    assert out[2]["role"] == "assistant"
    # the same transcript again, nothing new: identical output (prompt caches stay warm) ...
    assert engine.compress(transcript, current_tokens=2900) == out
    assert engine.compress(transcript, current_tokens=2900) == out
    # ... and the host's own copy back, alone or with new messages: nothing to do but store them
    assert engine.compress(out, current_tokens=1000) is out
    grown = out + turn(99)
    assert engine.compress(grown, current_tokens=1200) is grown
    assert stored(engine)[-4:] == turn(99)


def test_compaction_gets_under_the_threshold_and_records_why(make_engine):
    engine = make_engine(context_length=3000, max_passes=40)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(30)]
    out = engine.compress(transcript, current_tokens=host_tokens(transcript))
    last = engine.get_status()["last_compaction"]
    assert last["status"] == "compacted" and last["tokens_after"] < engine.threshold_tokens
    assert last["passes"] >= 2 and last["leaves"] >= 1
    assert sum(len(json.dumps(m)) for m in out) < sum(len(json.dumps(m)) for m in transcript)
    healthy(engine)


def test_passes_are_bounded_and_the_rest_continues_next_time(make_engine):
    engine = make_engine(max_passes=1)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(30)]
    first = engine.compress(transcript, current_tokens=host_tokens(transcript))
    status = engine.get_status()["last_compaction"]
    assert status["status"] == "partial" and "LCM_MAX_PASSES" in status["reason"]
    engine.compress(first, current_tokens=host_tokens(transcript))
    assert engine.store.sessions.get(engine.session.id).covered_seq > 0
    assert sum(d.count for d in engine.store.summaries.depth_stats(engine.session.id)) == 2


def test_nothing_outside_the_fresh_tail_is_a_reason_not_a_loop(make_engine):
    engine = make_engine(fresh_tail_count=64)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(5)]
    assert engine.compress(transcript, current_tokens=100_000) is transcript
    reason = engine.get_status()["last_compaction"]["reason"]
    assert "fresh tail" in reason
    assert not engine.should_compress(100_000)  # nothing changed since: no empty promise
    assert engine.should_compress(100_001)


def test_force_runs_a_pass_below_the_threshold(make_engine):
    engine = make_engine(context_length=1_000_000)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(12)]
    assert engine.compress(transcript, current_tokens=500) is transcript
    out = engine.compress(transcript, current_tokens=500, force=True)
    assert out is not transcript and engine.get_status()["last_compaction"]["leaves"] == 1


def test_condensation_fanin_and_max_depth(make_engine):
    engine = make_engine(condensation_fanin=2, incremental_max_depth=1, leaf_chunk_tokens=200)
    engine.on_session_start("s")
    run_host(engine, 40)
    depths = {d.depth: d for d in engine.store.summaries.depth_stats(engine.session.id)}
    assert set(depths) == {0, 1} and depths[1].count >= 2
    assert depths[0].uncondensed < 2  # every full run of 2 leaves was condensed
    leaves_only = make_engine(incremental_max_depth=0)
    leaves_only.on_session_start("t")
    run_host(leaves_only, 30)
    assert {d.depth for d in leaves_only.store.summaries.depth_stats(leaves_only.session.id)} == {0}


def test_a_tool_group_is_never_split_and_a_giant_message_is_its_own_leaf(make_engine):
    engine = make_engine(leaf_chunk_tokens=300)
    engine.on_session_start("s")
    transcript = [SYSTEM, *turn(0, tools=6), *turn(1, user="huge " * 2000), *conversation(6)]
    engine.compress(transcript, current_tokens=host_tokens(transcript))
    for leaf in engine.store.summaries.of_session(engine.session.id, depth=0):
        msgs = [m.message for m in engine.store.messages.get_range(engine.session.id, first_seq=leaf.first_seq,
                                                              last_seq=leaf.last_seq)]
        assert sequence_problems([{"role": "user", "content": "x"}, *msgs]) == [] or msgs[0]["role"] == "user"
        following = engine.store.messages.get_range(engine.session.id, first_seq=leaf.last_seq + 1, limit=1)
        assert not following or following[0].role == "assistant"  # every leaf ends at a turn boundary
    huge = [s for s in engine.store.summaries.of_session(engine.session.id, depth=0) if s.source_token_count > 1000]
    assert huge and all(s.source_count <= 4 for s in huge)


def test_assembly_cap_holds_whenever_the_tail_fits(make_engine):
    engine = make_engine(context_length=100_000, max_assembly_tokens=1500, max_passes=1)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(40)]
    out = engine.compress(transcript)  # no host estimate: no overhead beyond the messages
    last = engine.get_status()["last_compaction"]
    assert last["assembled_tokens"] <= 1500 and not last["over_budget"]
    assert last["omitted_messages"] > 0 and "are not summarized yet and are left out" in out[1]["content"]
    assert sequence_problems(out, system=SYSTEM) == []


def test_the_summaries_a_host_holds_are_counted_once_as_it_extends_them(make_engine):
    """A turn counts the tokens of lcm's own messages (its summaries) in what the host holds.
    A host that extends the list it sent last has only its new messages looked at; other
    objects (a host that rebuilt its list) are looked at afresh, with the same result."""
    from lcm.messages import message_text

    engine = make_engine(context_length=100_000, max_assembly_tokens=1500, max_passes=1)
    engine.on_session_start("s")
    handed = engine.compress([SYSTEM, *conversation(40)])
    session = engine.context
    own = session.own_messages
    summaries = [m for m in handed if own(m)]
    assert summaries, "the compaction handed a summary over"
    expected = sum(session.tokens.count_message_text(message_text(m)) for m in summaries)

    class Counting:
        def __init__(self) -> None:
            self.looked_at = 0

        def __call__(self, message):
            self.looked_at += 1
            return own(message)

    counting = Counting()
    session._own = counting
    assert session._own_tokens(handed) == expected
    assert counting.looked_at == len(handed)
    grown = [*handed, {"role": "user", "content": "one more question"}]
    assert session._own_tokens(grown) == expected
    assert counting.looked_at == len(handed) + 1  # only the new message
    rebuilt = json.loads(json.dumps(grown))  # the same messages, other objects
    assert session._own_tokens(rebuilt) == expected
    assert counting.looked_at == 2 * len(handed) + 1 + 1
    without = [m for m in rebuilt if not own(m)]
    assert session._own_tokens(without) == 0


def test_a_tail_bigger_than_the_cap_shrinks_to_the_newest_turn(make_engine):
    """Issue 13 (assembly cap on every turn): a fresh tail of 30 messages over the cap used to
    be handed back whole and over budget; it now starts later, keeping the newest user turn
    and its tool calls with their results."""
    from tests.support.conversation import turn

    engine = make_engine(context_length=100_000, max_assembly_tokens=700, fresh_tail_count=30,
                         max_passes=1)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(12, size=60)]
    out = engine.compress(transcript)
    last = engine.get_status()["last_compaction"]
    assert not last["over_budget"] and last["assembled_tokens"] <= 700, last
    assert out[-len(turn(11, size=60)):] == turn(11, size=60)  # the newest turn, whole
    assert sequence_problems(out, system=SYSTEM) == []


def test_a_message_larger_than_the_window_is_handed_back_cut_and_recognised(make_engine):
    """Issue 13: the assembly cap holds on every turn, even when the newest turn holds one
    message larger than the window: that message goes back cut, with a pointer to its intact
    stored original; the cut copy coming back (same process or a restarted one) is that
    message, never a new one."""
    from tests.support.conversation import turn

    engine = make_engine(context_length=100_000, max_assembly_tokens=1200)
    engine.on_session_start("s")
    huge = "line of a very long build log with unique words " * 2000
    newest = turn(9)
    newest[2] = {**newest[2], "content": huge}
    transcript = [SYSTEM, *conversation(6), *newest]
    out = engine.compress(transcript)
    last = engine.get_status()["last_compaction"]
    assert not last["over_budget"] and last["assembled_tokens"] <= 1200, last
    [cut] = [m for m in out if "lcm cut:" in str(m.get("content"))]
    stored = engine.store.messages.get_range(engine.session.id)
    original = next(r for r in stored if r.message.get("content") == huge)
    assert f"lcm_expand(store_id={original.store_id})" in cut["content"]
    assert cut["tool_call_id"] == newest[2]["tool_call_id"] and len(cut["content"]) < len(huge) // 10
    assert sequence_problems(out, system=SYSTEM) == []
    whole = json.loads(engine.handle_tool_call("lcm_expand", {"store_id": original.store_id,
                                                              "content_offset": 0}))
    assert whole["item"]["message"]["content"].startswith(huge[:1000])
    count = len(stored)
    engine.on_turn_complete(out + conversation(11)[-len(turn(10)):])
    assert len(engine.store.messages.get_range(engine.session.id)) == count + len(turn(10))
    restarted = make_engine(context_length=100_000, max_assembly_tokens=1200)
    restarted.on_session_start("s")
    restarted.on_turn_complete(out + conversation(11)[-len(turn(10)):])
    assert len(restarted.store.messages.get_range(restarted.session.id)) == count + len(turn(10))
    assert restarted.store.sessions.forks(restarted.session.id) == []


def test_a_tail_bigger_than_the_cap_is_reported(make_engine):
    engine = make_engine(context_length=100_000, max_assembly_tokens=300, fresh_tail_count=30)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(12)]
    engine.compress(transcript, current_tokens=host_tokens(transcript) + 90_000)
    last = engine.get_status()["last_compaction"]
    assert last["over_budget"] is True and "over budget" in last["reason"]


def test_focus_topic_and_llm_summaries(make_engine, llm):
    llm.handler = lambda body: completion("Summary: steps ran. Expand for details about: steps")
    engine = make_engine(summary_base_url=llm.url, summary_model="sum-model")
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(20)]
    engine.compress(transcript, current_tokens=host_tokens(transcript), focus_topic="the step-7 failure")
    assert llm.requests and all(r["model"] == "sum-model" for r in llm.requests)
    assert "the step-7 failure" in llm.requests[0]["messages"][0]["content"]
    kinds = {s.kind for s in engine.store.summaries.of_session(engine.session.id)}
    assert kinds <= {"llm", "llm-bullets"}
    assert engine.get_status()["summarizer"]["route"].startswith("endpoint:sum-model")


def test_a_backlog_is_worked_off_in_bounded_calls(make_engine, llm):
    llm.handler = lambda body: completion("Short summary.")
    engine = make_engine(summary_base_url=llm.url, summary_model="m", leaf_chunk_tokens=500, max_passes=4)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(80, size=60)]
    for _ in range(6):
        transcript = engine.compress(transcript, current_tokens=host_tokens(transcript))
    biggest = max(len(json.dumps(r["messages"])) for r in llm.requests)
    assert biggest < 500 * 4 * 2 + 4000  # a summarizer call never carries more than ~a chunk
    healthy(engine)


def test_should_compress_and_cheap_preflights(make_engine):
    engine = make_engine(context_length=10_000)
    assert not engine.should_compress(100) and engine.should_compress(7_500)
    engine.update_from_response({"prompt_tokens": 8_000, "completion_tokens": 10})
    assert engine.should_compress()
    short = [SYSTEM, *turn(0)]
    assert not engine.has_content_to_compress(short)
    assert engine.has_content_to_compress([SYSTEM, *conversation(10)])
    assert not engine.should_compress_preflight(short)
    engine.on_session_reset()
    assert engine.last_prompt_tokens == 0 and engine.get_status()["last_prompt_tokens"] == 0


def test_get_status_clamps_the_host_sentinel(make_engine):
    engine = make_engine()
    engine.last_prompt_tokens = -1  # what Hermes sets right after a compaction
    assert engine.get_status()["last_prompt_tokens"] == 0


# --------------------------------------------------------------------------- sessions


def test_compression_boundary_continues_the_same_conversation(make_engine):
    engine = make_engine()
    engine.on_session_start("first", platform="telegram")
    transcript, sent = run_host(engine, 20)
    session_pk = engine.session.id
    engine.on_session_start("second", boundary_reason="compression", old_session_id="first")
    assert engine.session.id == session_pk
    transcript, more = run_host(engine, 2, start=20, transcript=transcript)
    assert stored(engine) == sent + more
    assert engine.store.sessions.find(engine.agent_id, "second").id == session_pk
    assert engine.store.sessions.keys(session_pk) == ["first", "second"]


def test_new_session_carries_deep_summaries_and_keeps_raw_messages(make_engine):
    engine = make_engine(condensation_fanin=2, leaf_chunk_tokens=200, new_session_retain_depth=1)
    engine.on_session_start("old")
    run_host(engine, 40)
    old = engine.session
    deep = [n for n in engine.store.summaries.uncondensed(old.id) if n.depth >= 1]
    assert deep
    engine.on_session_end("old", [])
    engine.on_session_reset()
    engine.on_session_start("new", old_session_id="old")
    assert engine.session.id != old.id
    carried = engine.store.summaries.carried(engine.session.id)
    assert {n.id for n in carried} == {n.id for n in deep}
    # visible at once to the tools ...
    overview = json.loads(engine.handle_tool_call("lcm_describe", {}))
    assert any(n.get("carried") for d in overview["depths"].values() for n in d["nodes"])
    # ... not forced into a tiny context (a result never grows) ...
    small = [SYSTEM, *turn(100)]
    assert engine.compress(small, current_tokens=100, force=True) is small
    # ... and part of the context from the new session's first compaction on
    transcript, _ = run_host(engine, 30, start=100, transcript=small[:1])
    summary = next(m for m in transcript if m.get("_compressed_summary") and m["role"] == "user")
    assert 'from_previous_session="true"' in summary["content"]
    assert sequence_problems(transcript, system=SYSTEM) == []
    assert engine.store.sessions.get(old.id).message_count == old.message_count  # raw rows stay
    assert stored(engine)[0]["content"].startswith("Request 100")


def test_retain_depth_zero_carries_nothing(make_engine):
    engine = make_engine(new_session_retain_depth=0)
    engine.on_session_start("old")
    run_host(engine, 20)
    engine.on_session_reset()
    engine.on_session_start("new")
    assert engine.store.summaries.carried(engine.session.id) == []


def test_host_hooks_tolerate_unknown_keyword_arguments(make_engine):
    """Issue 13.9: update_model, on_session_end and on_session_reset raised TypeError."""
    engine = make_engine()
    engine.on_session_start("s", future_flag=True)
    engine.update_model("m", 5000, base_url="", api_key="", provider="p", api_mode="chat", new_kw=1)
    engine.on_turn_complete([SYSTEM, *conversation(1)], usage={"prompt_tokens": 5}, extra=2)
    engine.on_session_end("s", [SYSTEM, *conversation(1)], reason="exit")
    engine.on_session_reset(reason="new")
    assert engine.context_length == 5000


def test_the_system_message_comes_back_without_the_host_marker(make_engine):
    engine = make_engine()
    engine.on_session_start("s")
    system = {**SYSTEM, "_db_persisted": True}
    out = engine.compress([system, *conversation(12)], current_tokens=9999)
    assert out[0] == SYSTEM and "_db_persisted" not in out[0]


#: Issue 14: one compacting turn made 17 repository calls (13 reads, 4 writes): the view read
#: 3 times, the session 3 times, the tail planned twice. The call shape allows at most this.
MAX_CALLS_PER_COMPACTING_TURN = 9


def _demo_turns(count: int) -> list[list[dict]]:
    """The first ``count`` messages of the shipped demo transcript, one user turn at a time."""
    from importlib import resources

    lines = resources.files("lcm.demo").joinpath("transcript.jsonl").read_text(encoding="utf-8").splitlines()
    messages = [json.loads(line)["message"] for line in lines if line.strip()][:count]
    turns: list[list[dict]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def test_a_compacting_turn_reads_the_view_once_and_plans_the_tail_once(make_engine):
    """The call shape of a turn that compacts: ingest, one view read, one read of the raw
    messages near the tail (which serve as leaf sources and as the verbatim context), then the
    writes; no session re-reads. Measured the way the architecture review measured 17 calls."""
    from tests.support.calls import count_calls

    engine = make_engine(context_length=8000, summarizer="extractive", fresh_tail_count=8,  # the review's A.3
                         leaf_chunk_tokens=1500, leaf_target_tokens=250, condensed_target_tokens=400,
                         condensation_fanin=4, incremental_max_depth=3)
    calls = count_calls(engine.store)
    engine.on_session_start("s1")
    held: list[dict] = [SYSTEM]
    compacting = []
    for turn_messages in _demo_turns(120):
        calls.clear()
        held = engine.compress(held + turn_messages)
        if engine.get_status()["last_compaction"].get("passes"):
            compacting.append(list(calls))
    assert len(compacting) >= 3, "the transcript must compact several times for this to mean anything"
    for turn_calls in compacting:
        # A store that counts tokens later (SQLite) has the turn's counts settled: one call more.
        settle = turn_calls.count("messages.settle_tokens")
        assert settle == (1 if engine.store.messages.counts_later else 0), turn_calls
        assert len(turn_calls) - settle <= MAX_CALLS_PER_COMPACTING_TURN, turn_calls
        # Each pass is one write and reads nothing: whatever the passes, the rest stays put.
        assert len(turn_calls) - turn_calls.count("summaries.write") - settle <= 5, turn_calls
        assert turn_calls.count("summaries.compaction_view") == 1, turn_calls
        assert turn_calls.count("messages.get_range") == 1, turn_calls  # the tail, planned once
        assert "sessions.get" not in turn_calls and "messages.tail" not in turn_calls, turn_calls
    one_leaf = [c for c in min(compacting, key=len) if c != "messages.settle_tokens"]
    assert one_leaf == ["messages.append", "summaries.compaction_view", "messages.get_range",
                        "summaries.write", "messages.remember_generated", "sessions.set_host_view"]
    healthy(engine)


#: The tests the collecting modules import (``from ... import *``): every behaviour, so none is
#: forgotten on one side.
__all__ = sorted(name for name in dir() if name.startswith("test_"))
