"""Cache-stable compaction over the in-memory store: bursts from the trigger down to the target
(hysteresis), a prompt that only grows at its end between bursts, summaries already handed out
kept in place at a burst, compaction when the cache is cold anyway or the window shrank, and the
cache counters providers report. The same policy runs on both databases through the shared
engine behaviours; these properties need many generated conversations, so they run here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcm.config import DEFAULT_COMPACTION_TARGET, LcmConfig
from lcm.engine import LcmEngine
from lcm.errors import ConfigError
from lcm.transcript import COMPRESSED_SUMMARY_KEY, SUMMARY_END
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, host_tokens, turn
from tests.support.memory_store import MemoryStore


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(context_length: int = 6000, clock: Clock | None = None, **overrides: Any) -> LcmEngine:
    """A small engine over memory (SMALL_ENGINE: half of these tiny windows is the target)."""
    engine = LcmEngine(LcmConfig.from_env({}, **{**SMALL_ENGINE, **overrides}), store=MemoryStore())
    if clock is not None:
        engine.context.clock = clock
    engine.update_model("test-model", context_length)
    engine.on_session_start("s")
    return engine


def dumps(messages: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in messages]


def summary_text(messages: list[dict[str, Any]]) -> str | None:
    found = [m["content"] for m in messages if m.get(COMPRESSED_SUMMARY_KEY) and m.get("role") == "user"]
    return found[0] if found else None


def step(engine: LcmEngine, transcript: list[dict[str, Any]], new: list[dict[str, Any]],
         *, always: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """One host turn as Hermes makes it: compress only when asked to (``always``: a host that
    calls compress every turn); (the next transcript, whether a burst ran)."""
    transcript = [*transcript, *new]
    tokens = host_tokens(transcript)
    before = engine.compression_count
    if always or engine.should_compress(tokens):
        transcript = engine.compress(transcript, current_tokens=tokens)
    return transcript, engine.compression_count != before


def test_a_burst_brings_the_context_to_the_target_and_the_next_waits_for_the_trigger():
    engine = make()
    window = engine.context.window
    transcript, bursts, turns_after_first = [SYSTEM], [], 0
    for i in range(80):
        transcript, burst = step(engine, transcript, turn(i, tools=i % 3))
        if burst:
            out = engine.context.last_outcome
            assert out["cause"] == "threshold" and out["tokens_before"] >= window.target
            assert out["tokens_after"] < window.target, out
            assert not engine.should_compress(host_tokens(transcript))  # quiet again right after
            bursts.append(i)
        elif bursts:
            turns_after_first += 1
    assert len(bursts) >= 3
    gaps = [b - a for a, b in zip(bursts, bursts[1:], strict=False)]
    assert min(gaps) >= 4, f"bursts at turns {bursts}: one burst per 4 turns at most"


def test_the_target_is_validated_and_follows_the_threshold():
    with pytest.raises(ConfigError, match="LCM_COMPACTION_TARGET must be below LCM_CONTEXT_THRESHOLD"):
        LcmConfig.from_env({"LCM_COMPACTION_TARGET": "0.8", "LCM_CONTEXT_THRESHOLD": "0.7"})
    with pytest.raises(ValueError, match="LCM_COMPACTION_TARGET must be greater than 0"):
        LcmConfig.from_env({"LCM_COMPACTION_TARGET": "0"})
    assert LcmConfig.from_env({}).target_fraction == DEFAULT_COMPACTION_TARGET == 0.25
    assert LcmConfig.from_env({"LCM_CONTEXT_THRESHOLD": "0.3"}).target_fraction == pytest.approx(0.2)
    engine = make(10_000, compaction_target=0.3)
    assert engine.context.window.target == pytest.approx(3000)
    engine.threshold_tokens, engine.threshold_percent = 6000, 0.6  # a host moves the threshold
    assert engine.context.window.target == pytest.approx(6000 * 0.3 / 0.75)
    capped = make(10_000, max_assembly_tokens=4000)
    assert capped.context.window.trigger == 4000
    assert capped.context.window.target == pytest.approx(4000 * 0.5 / 0.75)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(st.tuples(st.integers(0, 3), st.integers(5, 90)), min_size=20, max_size=60),
       window=st.integers(3000, 9000), always=st.booleans())
def test_between_bursts_the_prompt_only_grows_at_its_end(turns, window, always):
    """The property the provider's prompt cache needs: with no burst, the context for turn N+1
    is exactly the bytes of turn N followed by the new messages; at a burst the system prompt
    stays first and the summaries already handed out keep their bytes and their place, new ones
    after them (unless the burst condensed); every message stays stored byte-exact."""
    engine = make(window)
    transcript: list[dict[str, Any]] = [SYSTEM]
    sent: list[dict[str, Any]] = []
    for i, (tools, size) in enumerate(turns):
        new = turn(i, tools=tools, size=size)
        sent.extend(new)
        before = dumps(transcript)
        old_summary = summary_text(transcript)
        transcript, burst = step(engine, transcript, new, always=always)
        now = dumps(transcript)
        assert now[0] == before[0], "the system prompt stays first, unchanged"
        if not burst:
            assert now == before + dumps(new)
            continue
        out = engine.context.last_outcome
        assert out["tokens_after"] <= engine.context.window.assembly_cap
        new_summary = summary_text(transcript)
        assert new_summary is not None
        if old_summary is not None and not out["condensed"]:
            kept = old_summary[: old_summary.rindex(SUMMARY_END)]
            assert new_summary.startswith(kept), "summaries handed out earlier are rewritten"
    engine.on_turn_complete(transcript)
    stored = [r.message for r in engine.store.messages.get_range(engine.session.id)]
    assert stored == sent


def test_condensation_is_batched_inside_bursts():
    """Condensing rewrites summaries the host holds: it happens only inside a burst, when the
    summaries outgrow their share, and then every full group at once (so it is rare). Sizes in
    the proportions of the defaults: a leaf chunk is a third of the window."""
    engine = make(6000, leaf_chunk_tokens=2000, condensation_fanin=4, incremental_max_depth=3)
    transcript = [SYSTEM]
    with_condensation, bursts = 0, 0
    for i in range(150):
        transcript, burst = step(engine, transcript, turn(i, tools=i % 3))
        if burst:
            bursts += 1
            with_condensation += bool(engine.context.last_outcome["condensed"])
    assert bursts >= 5
    assert 1 <= with_condensation <= bursts // 2, (with_condensation, bursts)


def _fill_past_a_burst(engine: LcmEngine, clock: Clock) -> tuple[list[dict[str, Any]], int]:
    """Turns until one burst ran and the context is back over the target (under the trigger)."""
    transcript, i, burst_seen = [SYSTEM], 0, False
    window = engine.context.window
    while True:
        transcript, burst = step(engine, transcript, turn(i, tools=1))
        engine.update_from_response({"prompt_tokens": host_tokens(transcript), "completion_tokens": 10})
        clock.now += 20
        i += 1
        burst_seen = burst_seen or burst
        if burst_seen and not burst and host_tokens(transcript) > window.target * 1.15:
            assert host_tokens(transcript) < window.trigger
            return transcript, i
        assert i < 200


def test_an_idle_host_over_the_target_compacts_while_the_cache_is_cold():
    clock = Clock()
    engine = make(6000, clock=clock, cache_ttl_seconds=300)
    transcript, i = _fill_past_a_burst(engine, clock)
    new = turn(i, tools=1)
    tokens = host_tokens([*transcript, *new])
    clock.now += 200  # idle, but the cache is still warm
    assert not engine.should_compress(tokens)
    clock.now += 200  # 400 s since the model last answered: the provider's cache is gone
    assert engine.context.cache_cold() and engine.should_compress(tokens)
    out = engine.compress([*transcript, *new], current_tokens=tokens)
    outcome = engine.context.last_outcome
    assert outcome["cause"] == "cold_cache" and outcome["passes"] >= 1
    assert outcome["tokens_after"] < engine.context.window.target
    assert host_tokens(out) < tokens
    assert not engine.should_compress(host_tokens(out))  # once per idle period
    assert engine.get_status()["cache"]["requests"] >= 1


def test_a_cold_cache_under_the_target_or_a_ttl_of_zero_changes_nothing():
    clock = Clock()
    engine = make(6000, clock=clock, cache_ttl_seconds=0)
    transcript, i = _fill_past_a_burst(engine, clock)
    clock.now += 10_000
    assert not engine.context.cache_cold()
    assert not engine.should_compress(host_tokens(transcript))
    fresh = make(6000, clock=clock)
    fresh.update_from_response({"prompt_tokens": 100})
    clock.now += 10_000
    assert fresh.context.cache_cold()
    assert not fresh.should_compress(1000)  # under the target: nothing worth compacting


def test_a_smaller_window_makes_the_next_turn_compact_to_the_new_target():
    clock = Clock()
    engine = make(9000, clock=clock)
    transcript, i = _fill_past_a_burst(engine, clock)
    tokens = host_tokens(transcript)
    smaller = int(tokens / 0.6)  # between the new target (0.5) and the new trigger (0.75)
    assert smaller < 9000
    engine.update_model("test-model", smaller, max_tokens=1024, a_keyword_from_a_newer_host=True)
    window = engine.context.window
    assert window.target < tokens < window.trigger  # not at the new trigger, over the new target
    assert engine.should_compress(tokens)
    out = engine.compress(transcript, current_tokens=tokens)
    assert engine.context.last_outcome["cause"] == "window_shrank"
    assert engine.context.last_outcome["tokens_after"] < window.target
    assert len(out) < len(transcript)
    assert not engine.should_compress(host_tokens(out))


@pytest.mark.parametrize(("usage", "prompt", "read", "write"), [
    ({"prompt_tokens": 1000, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 800}},
     1000, 800, 0),  # OpenAI chat completions
    ({"input_tokens": 150, "output_tokens": 5, "cache_read_input_tokens": 800,
      "cache_creation_input_tokens": 50}, 1000, 800, 50),  # Anthropic: input_tokens leaves the cache out
    ({"prompt_tokens": 1000, "input_tokens": 150, "cache_read_tokens": 800, "cache_write_tokens": 50,
      "completion_tokens": 5, "total_tokens": 1005}, 1000, 800, 50),  # Hermes, normalized
    ({"input_tokens": 1000, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 600}},
     1000, 600, 0),  # OpenAI Responses API
])
def test_cache_counters_of_every_provider_shape(usage, prompt, read, write):
    engine = make()
    engine.update_from_response(usage)
    engine.update_from_response(usage)
    assert engine.last_prompt_tokens == prompt
    cache = engine.get_status()["cache"]
    assert (cache["requests"], cache["prompt_tokens"]) == (2, 2 * prompt)
    assert (cache["cache_read_tokens"], cache["cache_write_tokens"]) == (2 * read, 2 * write)
    assert cache["cache_read_share"] == pytest.approx(read / prompt, abs=1e-4)
    status = json.loads(engine.handle_tool_call("lcm_status", {}))
    assert status["cache"]["cache_read_share"] == pytest.approx(read / prompt, abs=1e-4)


def test_no_cache_counter_reported_means_no_share_claimed():
    engine = make()
    engine.update_from_response({"prompt_tokens": 900, "completion_tokens": 3})
    engine.update_from_response({})  # a response without usage
    cache = engine.get_status()["cache"]
    assert cache["requests"] == 1 and cache["cache_read_share"] is None


def test_a_system_prompt_sent_apart_from_the_transcript_is_kept_by_its_sessions_engine_only():
    """Hermes builds each request's system message itself and hands compress() the
    conversation only: lcm hears the system prompt through Hermes' pre_api_request hook, and
    only the engine bound to that request's session keeps it (once per version)."""
    import copy

    from lcm.hermes import hooks

    a, b = make(), make()
    a.on_session_start("a")
    b.on_session_start("b")
    twin = copy.deepcopy(a)  # another agent's copy, on the same store, bound to its own session
    twin.on_session_start("twin")
    conversation = turn(0)
    hooks.pre_api_request(session_id="a", request_messages=[SYSTEM, *conversation], api_call_count=1)
    hooks.pre_api_request(session_id="a", request_messages="not a list")
    hooks.pre_api_request(request_messages=[SYSTEM])  # no session: nobody's
    [kept] = a.store.sessions.system_prompts(a.session.id)
    assert kept.message == SYSTEM and kept.first_seq == 1
    assert b.store.sessions.system_prompts(b.session.id) == []
    assert twin.store is a.store and twin.store.sessions.system_prompts(twin.session.id) == []
    a.compress(conversation)  # Hermes' transcript: no system message in it
    stored = a.store.messages.get_range(a.session.id)
    assert [r.message for r in stored] == conversation
    hooks.pre_api_request(session_id="a", request_messages=[SYSTEM, *conversation])  # same version
    newer = {"role": "system", "content": SYSTEM["content"] + " Also: be brief."}
    hooks.pre_api_request(session_id="a", request_messages=[newer, *conversation])
    versions = a.store.sessions.system_prompts(a.session.id)
    assert [v.message for v in versions] == [SYSTEM, newer]
    assert versions[1].first_seq == stored[-1].seq + 1  # in force from the next message on
    # Anthropic's Messages API and OpenAI's Responses API carry it beside the messages.
    blocks = [{"type": "text", "text": "You are Hermes, in Anthropic mode."}]
    hooks.pre_api_request(session_id="b", request_messages=conversation,
                          request={"method": "POST", "body": {"system": blocks, "messages": conversation}})
    hooks.pre_api_request(session_id="b", request_messages=conversation,
                          request={"method": "POST", "body": {"instructions": "Responses mode.", "input": []}})
    hooks.pre_api_request(session_id="b", request_messages=conversation, request={"body": {"system": ""}})
    assert [v.message for v in b.store.sessions.system_prompts(b.session.id)] == [
        {"role": "system", "content": blocks}, {"role": "system", "content": "Responses mode."}]
