"""The summarizer failing every way (issue 13.6, 13.7, 13.8): compaction always makes progress,
every call is bounded in wall-clock time, and the reported reason and ``over_budget`` are true.
A real HTTP server on 127.0.0.1 plays the model."""

from __future__ import annotations

import json
import time

import pytest

from lcm.messages import message_text
from tests.support.conversation import conversation, sequence_problems
from tests.support.llm_server import Reply, completion, error

SYSTEM = {"role": "system", "content": "You are a careful agent."}

FAULTS = {
    "http_500": lambda body: error(500),
    "empty": lambda body: completion(""),
    "unparsable": lambda body: Reply(200, "this is not JSON {"),
    "reasoning_only": lambda body: completion("<think>I will summarize this later"),
    "huge": lambda body: completion("word " * 1_200_000),
    "closed": lambda body: Reply(close=True),
    "wrong_shape": lambda body: Reply(200, {"choices": "nope"}),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failing_llm_never_stalls_compaction(make_engine, llm, fault):
    """Every way the model can fail: the extractive fallback summarizes instead, and over 30
    turns the context handed back stays within the window (it used to grow to 10x it)."""
    llm.handler = FAULTS[fault]
    window = 3000
    engine = make_engine(context_length=window, summary_base_url=llm.url, summary_model="m",
                         summary_timeout_ms=3000)
    engine.on_session_start("s")
    transcript = [SYSTEM]
    sizes = []
    for i in range(30):
        transcript = list(transcript) + conversation(i + 1)[-8:] if i else [SYSTEM, *conversation(1)]
        out = engine.compress(transcript, current_tokens=None)
        transcript = out
        sizes.append(sum(engine.context.tokens.count_message_text(message_text(m)) for m in out))
        assert not sequence_problems(out, SYSTEM), sequence_problems(out, SYSTEM)
    assert engine.compression_count > 0
    assert engine.store.summaries.depth_stats(engine.session.id), "no summary was ever written"
    assert max(sizes[5:]) <= window, sizes  # the context handed back stays within the window


def test_a_lone_surrogate_reaches_the_model_as_a_replacement_character(make_engine, llm):
    """Issue 13.6: the request could not be encoded, compress() failed on every turn."""
    llm.handler = lambda body: completion("Summary of the odd message. Expand for details about: odd")
    engine = make_engine(summary_base_url=llm.url, summary_model="m")
    engine.on_session_start("s")
    odd = [{"role": "user", "content": "broken \ud800 text " + "filler " * 150},
           {"role": "assistant", "content": "noted \udfff " + "filler " * 150}]
    transcript = [SYSTEM, *odd, *conversation(12)]
    out = engine.compress(transcript, current_tokens=9999)
    assert out is not transcript and engine.compression_count == 1
    assert llm.requests and all("\ufffd" in json.dumps(r, ensure_ascii=False) or "broken" not in
                                json.dumps(r, ensure_ascii=False) for r in llm.requests)
    stored = [r.message for r in engine.store.messages.get_range(engine.session.id)]
    assert stored[:2] == odd  # stored exactly, surrogates and all
    answer = json.loads(engine.handle_tool_call("lcm_expand_query", {"prompt": "what broke?",
                                                                      "query": "broken"}))
    assert "error" not in answer


def test_a_dripping_server_is_cut_off_at_the_summary_timeout(make_engine, llm):
    """Issue 13.7: with LCM_SUMMARY_TIMEOUT_MS=1000 and a server dribbling its answer for 10 s,
    one compress() took 20.5 s (the timeout was per read)."""
    llm.handler = lambda body: Reply(200, completion("a fine summary " * 20).body, drip=0.05)
    engine = make_engine(summary_base_url=llm.url, summary_model="m", summary_timeout_ms=1000,
                         max_passes=1)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(12)]
    started = time.monotonic()
    out = engine.compress(transcript, current_tokens=9999)
    took = time.monotonic() - started
    assert took < 4.0, took  # two prompt levels at 1 s each, plus the fallback
    assert out is not transcript  # the extractive fallback compacted
    assert engine.get_status()["last_compaction"]["kinds"] == {"extractive": 1}


def test_one_compress_is_bounded_by_max_compaction_seconds(make_engine, llm):
    llm.handler = lambda body: Reply(200, completion("late").body, delay=30)
    engine = make_engine(summary_base_url=llm.url, summary_model="m", summary_timeout_ms=60_000,
                         max_compaction_seconds=2)
    engine.on_session_start("s")
    started = time.monotonic()
    out = engine.compress([SYSTEM, *conversation(20)], current_tokens=99999)
    took = time.monotonic() - started
    assert took < 5.0, took
    assert out  # a context came back; the rest continues next time
    reason = engine.get_status()["last_compaction"]["reason"]
    assert reason


def test_over_budget_is_set_whenever_the_context_handed_back_exceeds_the_cap(make_engine):
    """Issue 13.8: a transcript the host keeps over the window was reported without over_budget."""
    engine = make_engine(context_length=400, fresh_tail_count=50)
    engine.on_session_start("s")
    transcript = [SYSTEM, *conversation(3)]
    out = engine.compress(transcript, current_tokens=5000)
    last = engine.get_status()["last_compaction"]
    size = sum(engine.context.tokens.count_message_text(json.dumps(m)) for m in out)
    if size > 400:
        assert last["over_budget"] is True, last
