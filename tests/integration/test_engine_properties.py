"""DESIGN.md §3 invariants, checked after every compress round of generated conversations."""

from __future__ import annotations

import json
import os
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcm.records import MessageRecord
from lcm.transcript import CUT_NOTE, is_lcm_summary
from tests.support.conversation import filler, sequence_problems

SYSTEM = {"role": "system", "content": "You are a careful agent."}
#: CI runs a fixed set of examples (reproducible); explore more with
#: LCM_PROPERTY_EXAMPLES=200 LCM_PROPERTY_RANDOM=1 python -m pytest tests/test_engine_properties.py
EXAMPLES = int(os.environ.get("LCM_PROPERTY_EXAMPLES", "25"))
RANDOM = os.environ.get("LCM_PROPERTY_RANDOM") == "1"


@st.composite
def turn_specs(draw):
    """One turn: what the user says, how many tool rounds, sizes, and whether to force."""
    return {
        "user": draw(st.sampled_from(["normal", "ok", "long", "repeat"])),
        "tools": draw(st.integers(0, 3)),
        "result_words": draw(st.sampled_from([5, 40, 400])),
        "answer": draw(st.sampled_from(["normal", "ok"])),
        "force": draw(st.integers(0, 9)) == 0,
    }


def build_turn(i: int, spec: dict) -> list[dict]:
    user = {"normal": f"please handle item {i}: {filler(i, 25)}", "ok": "ok",
            "long": f"long request {i}: {filler(i, 900)}", "repeat": "continue"}[spec["user"]]
    msgs = [{"role": "user", "content": user}]
    for t in range(spec["tools"]):
        call = f"c{i}_{t}"
        msgs.append({"role": "assistant", "content": None if t % 2 else f"checking {i}.{t}",
                     "tool_calls": [{"id": call, "type": "function",
                                     "function": {"name": "grep", "arguments": json.dumps({"q": f"x{i}{t}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": call, "name": "grep",
                     "content": f"result {i}.{t}: {filler(i * 3 + t, spec['result_words'])}"})
    msgs.append({"role": "assistant", "content": "ok" if spec["answer"] == "ok" else f"done {i}: {filler(i, 12)}"})
    return msgs


def check_dag(engine) -> None:
    store, session = engine.store, engine.store.sessions.get(engine.session.id)
    checks = {c.name: c for c in store.health.checks(deep=False)}
    for name in ("coverage", "dag_edges", "session_counters", "agent_scope"):
        assert checks[name].status == "ok", checks[name]
    for node in store.summaries.of_session(session.id, limit=1000):
        sources, total = store.summaries.expand(node.id)
        assert total == node.source_count == len(sources)
        if node.depth == 0:  # expansion reproduces the covered messages, in order, exactly
            expected = store.messages.get_range(session.id, first_seq=node.first_seq, last_seq=node.last_seq)
            assert [m.message for m in sources] == [m.message for m in expected]
            assert all(isinstance(m, MessageRecord) for m in sources)
        else:  # children: one depth lower, consecutive, covering the node's range
            assert all(c.depth == node.depth - 1 for c in sources)
            assert sources[0].first_seq == node.first_seq and sources[-1].last_seq == node.last_seq
            for a, b in zip(sources, sources[1:], strict=False):
                assert b.first_seq > a.last_seq


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(specs=st.lists(turn_specs(), min_size=6, max_size=28),
       window=st.sampled_from([2500, 4000, 8000]),
       tail=st.integers(2, 10), chunk=st.sampled_from([150, 400, 900]),
       fanin=st.integers(2, 4), depth=st.sampled_from([-1, 0, 1, 3]),
       cap=st.sampled_from([0, 1800]))
def test_invariants_hold_over_many_compress_rounds(make_engine, specs, window, tail, chunk, fanin,
                                                   depth, cap):
    engine = make_engine(context_length=window, fresh_tail_count=tail, leaf_chunk_tokens=chunk,
                         condensation_fanin=fanin, incremental_max_depth=depth,
                         max_assembly_tokens=cap, max_passes=20)
    engine.on_session_start(f"prop-{uuid.uuid4().hex[:10]}")
    transcript, sent = [SYSTEM], []
    for i, spec in enumerate(specs):
        new = build_turn(i, spec)
        transcript = transcript + new
        sent.extend(new)
        tokens = sum(len(json.dumps(m)) // 4 for m in transcript)
        if not (engine.should_compress(tokens) or spec["force"]):
            continue
        out = engine.compress(transcript, current_tokens=tokens, force=spec["force"])
        outcome = engine.get_status()["last_compaction"]
        # 7. every call ends with a recorded status and reason (progress or why not)
        assert outcome["status"] in ("compacted", "not_needed", "stopped", "partial") and outcome["reason"]
        if outcome["passes"]:
            assert outcome["tokens_after"] < outcome["tokens_before"] or outcome["status"] == "partial"
        # 1. lossless, exactly once: the store holds precisely what was sent, byte for byte
        assert [m.message for m in engine.store.messages.get_range(engine.session.id)] == sent
        # 2./3. coverage and expansion
        check_dag(engine)
        if out is not transcript:
            # 6. a valid sequence, system message first and unchanged
            assert sequence_problems(out, system=SYSTEM) == []
            # 5. the fresh tail holds the newest user message and all after it, verbatim, except
            # a message that had to be cut to fit the cap: a marked copy keeping its head
            newest = max(k for k, m in enumerate(sent) if m["role"] == "user")
            k = len(sent) - newest
            assert len(out) >= k
            for got, want in zip(out[-k:], sent[-k:], strict=True):
                if got != want:
                    head = str(got.get("content")).split("\n" + CUT_NOTE)[0]
                    assert CUT_NOTE in str(got.get("content")) and want["content"].startswith(head)
                    assert {**got, "content": want["content"]} == want
                    assert not outcome["over_budget"]
            # 4. within the cap whenever the tail alone fits (else it says so)
            if cap and not outcome["over_budget"]:
                assert outcome["assembled_tokens"] <= cap
            assert not any(is_lcm_summary(m) for m in out[2:] if m["role"] != "assistant")
        transcript = out
