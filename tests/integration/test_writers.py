"""Several hosts on one session (issue 13.1, 13.2): the same transcript is stored once, a
diverging one becomes a fork, nothing is interleaved, dropped or duplicated — on both backends,
in one process and across real processes."""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from lcm.config import LcmConfig
from lcm.context.ingest import Ingestor
from lcm.engine import LcmEngine
from lcm.store import Store
from tests.support import workers
from tests.support.storing import lineage_of

SYSTEM = {"role": "system", "content": "You are a test agent."}


def engine_on(url: str) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url))
    engine.update_model("test-model", 10_000_000)  # no compaction: only ingest is under test
    return engine


def rows(store: Store, session_pk: int) -> list[dict]:
    return [r.message for r in store.messages.get_range(session_pk, limit=100_000)]


def family(store: Store, agent: str, key: str) -> dict[str, list[dict]]:
    """Every session of the conversation ``key`` (the session and its forks, recursively)."""
    out: dict[str, list[dict]] = {}
    todo = [store.sessions.find(agent, key)]
    while todo:
        s = todo.pop()
        out[s.session_key] = rows(store, s.id)
        todo.extend(store.sessions.forks(s.id))
    return out


def test_two_hosts_in_step_with_one_ahead_store_each_message_once(db_url):
    """The minimal form of issue 13.1: A and B in step through turn k-1; B sends k and k+1; A
    sends k (nothing new), then k+1: A's fast path used to append k+1 again after B's copy."""
    Store.open(db_url, upgrade=True)
    a, b = engine_on(db_url), engine_on(db_url)
    a.on_session_start("shared")
    b.on_session_start("shared")
    turns = [workers.turn("host", i) for i in range(6)]
    ta, tb = [SYSTEM], [SYSTEM]
    for i in range(3):
        ta += turns[i]
        tb += turns[i]
        a.on_turn_complete(ta)
        b.on_turn_complete(tb)
    tb += turns[3]
    b.on_turn_complete(tb)
    tb += turns[4]
    b.on_turn_complete(tb)
    ta += turns[3]
    a.on_turn_complete(ta)
    ta += turns[4]
    a.on_turn_complete(ta)
    ta += turns[5]
    a.on_turn_complete(ta)
    b.on_turn_complete(tb)
    expected = [m for t in turns for m in t]
    assert family(a.store, a.agent_id, "shared") == {"shared": expected}


@pytest.mark.parametrize("seed", range(6))
def test_two_hosts_with_one_transcript_in_any_order_store_it_once(db_url, seed):
    Store.open(db_url, upgrade=True)
    rng = random.Random(seed)
    hosts = [engine_on(db_url) for _ in range(2)]
    for h in hosts:
        h.on_session_start("shared")
    turns = [workers.turn("t", i) for i in range(25)]
    sent = [0, 0]
    transcripts: list[list[dict]] = [[SYSTEM], [SYSTEM]]
    while min(sent) < len(turns):
        h = rng.choice([i for i in (0, 1) if sent[i] < len(turns)])
        transcripts[h] = transcripts[h] + turns[sent[h]]  # sometimes a new list, like a restart
        sent[h] += 1
        if rng.random() < 0.2:
            hosts[h].compress(transcripts[h])
        else:
            hosts[h].on_turn_complete(transcripts[h])
    expected = [m for t in turns for m in t]
    assert family(hosts[0].store, hosts[0].agent_id, "shared") == {"shared": expected}
    doctor = json.loads(hosts[0].handle_tool_call("lcm_doctor", {}))
    assert doctor["overall"] == "healthy", doctor


def test_diverging_transcripts_become_a_fork_and_nothing_is_dropped(db_url):
    """Issue 13.2: B's "ok" used to be dropped as a duplicate of A's "ok", and the two
    conversations interleaved in one session."""
    Store.open(db_url, upgrade=True)
    a, b = engine_on(db_url), engine_on(db_url)
    a.on_session_start("s")
    b.on_session_start("s")
    prefix = workers.turn("common", 0)
    a.on_turn_complete([SYSTEM, *prefix])
    b.on_turn_complete([SYSTEM, *prefix])
    ta, tb = [SYSTEM, *prefix], [SYSTEM, *prefix]
    for i in range(1, 6):  # both end their turns with the same "ok"
        ta = ta + workers.turn("A", i)
        a.on_turn_complete(ta)
        tb = tb + workers.turn("B", i)
        b.on_turn_complete(tb)
    store = a.store
    stored = family(store, a.agent_id, "s")
    assert stored == {"s": ta[1:], "s/fork-1": tb[1 + len(prefix):]}
    fork = store.sessions.find(a.agent_id, "s/fork-1")
    parent = store.sessions.find(a.agent_id, "s")
    assert fork.parent_id == parent.id and fork.fork_seq == len(prefix)
    assert b.session.id == fork.id and a.session.id == parent.id
    status = json.loads(b.handle_tool_call("lcm_status", {}))
    assert status["fork_of"] == {"session_id": "s", "after_seq": len(prefix)}
    assert json.loads(a.handle_tool_call("lcm_status", {}))["forks"] == ["s/fork-1"]
    # B restarts (a new process, bound to "s" again) and resends its transcript: it finds its
    # fork and stores nothing twice; its next turn goes to the fork.
    b2 = engine_on(db_url)
    b2.on_session_start("s")
    b2.on_turn_complete(tb)
    tb = tb + workers.turn("B", 6)
    b2.on_turn_complete(tb)
    assert family(store, a.agent_id, "s") == {"s": ta[1:], "s/fork-1": tb[1 + len(prefix):]}
    assert b2.session.session_key == "s/fork-1"
    # A third host diverging from B's fork forks the fork.
    c = engine_on(db_url)
    c.on_session_start("s")
    tc = [SYSTEM, *prefix, *workers.turn("B", 1), *workers.turn("C", 2)]
    c.on_turn_complete(tc)
    assert c.session.session_key == "s/fork-1/fork-1"
    assert rows(store, c.session.id) == workers.turn("C", 2)


def test_a_host_behind_another_adds_nothing(db_url):
    store = Store.open(db_url, upgrade=True)
    session = store.sessions.get_or_create("agent", "s")
    turns = [m for i in range(5) for m in workers.turn("t", i)]
    Ingestor(store).ingest(session.id, [SYSTEM, *turns])
    result = Ingestor(store).ingest(session.id, [SYSTEM, *turns[:8]])
    assert result.added == 0 and result.session.id == session.id
    assert rows(store, session.id) == turns


def test_a_host_behind_on_repeated_messages_stores_nothing_twice(db_url):
    """Found by the generated-transcript fault test: A stored "u", "u" (two genuine messages);
    B, one message behind, sent ["u"], which matches either stored "u" equally well. Alignment
    took the newer one and B's next turn ["u", "u"] appended its second "u" after it: three
    rows for two messages. A guessed alignment is now re-checked on the next turn."""
    Store.open(db_url, upgrade=True)
    a, b = engine_on(db_url), engine_on(db_url)
    a.on_session_start("shared")
    b.on_session_start("shared")
    first, second = {"role": "user", "content": "u"}, {"role": "user", "content": "u"}
    a.on_turn_complete([SYSTEM, first])
    a.on_turn_complete([SYSTEM, first, second])
    b.on_turn_complete([SYSTEM, first])
    b.on_turn_complete([SYSTEM, first, second])
    a.on_turn_complete([SYSTEM, first, second])
    assert family(a.store, a.agent_id, "shared") == {"shared": [first, second]}


def test_a_pasted_summary_and_a_file_that_looks_like_one_are_stored(make_engine):
    """Issue 13.4: lcm recognised its own summary by its first line, so a user pasting an earlier
    context, or a tool printing a file that starts with the marker, was silently dropped."""
    from lcm.transcript import SUMMARY_MARKER

    engine = make_engine(context_length=1_000_000)
    engine.on_session_start("s")
    pasted = {"role": "user", "content": f"{SUMMARY_MARKER}\nthis is what I pasted from before"}
    printed = {"role": "tool", "tool_call_id": "c1", "content": f"  {SUMMARY_MARKER} file body"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]}
    transcript = [SYSTEM, pasted, call, printed, {"role": "assistant", "content": "done"}]
    engine.on_turn_complete(transcript)
    assert rows(engine.store, engine.session.id) == transcript[1:]


def test_own_summary_is_known_by_digest_in_another_process(make_engine):
    """lcm's own summary, handed out by one engine, is recognised by a new one (after a restart)."""
    from tests.support.conversation import conversation

    first = make_engine()
    first.on_session_start("s")
    transcript = [SYSTEM, *conversation(12)]
    out = first.compress(transcript, current_tokens=9999)
    assert out is not transcript
    before = first.store.sessions.get(first.session.id).message_count
    second = make_engine()
    second.on_session_start("s")
    second.on_turn_complete(out + [{"role": "user", "content": "next question"}])
    assert second.store.sessions.get(second.session.id).message_count == before + 1


# --------------------------------------------------------------------------- real processes


def pool(n: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))


@pytest.mark.slow
def test_processes_sharing_one_session_store_each_message_once(db_url):
    """Four host processes resume one conversation and grow the same transcript at their own
    pace (the gateway + CLI case): 600 messages used to be stored as ~960."""
    Store.open(db_url, upgrade=True)
    start_at = time.time() + 4.0
    turns = 40
    with pool(4) as ex:
        futures = [ex.submit(workers.host_same_transcript, db_url, "shared", turns, seed, start_at)
                   for seed in range(4)]
        assert [f.result(timeout=600) for f in futures] == [turns] * 4
    store = Store.open(db_url)
    expected = [m for i in range(turns) for m in workers.turn("shared", i)]
    assert family(store, "default", "shared") == {"shared": expected}


@pytest.mark.slow
def test_processes_with_diverging_transcripts_each_keep_their_own(db_url):
    """Three processes share a first turn, then each says its own things (with repeated "ok"s):
    every message is stored once, each host's conversation is whole and in order in one
    session of the family, and no session mixes two hosts."""
    Store.open(db_url, upgrade=True)
    start_at = time.time() + 4.0
    turns = 30
    with pool(3) as ex:
        futures = [ex.submit(workers.host_own_transcript, db_url, "s", f"h{w}", turns, start_at)
                   for w in range(3)]
        results = [f.result(timeout=600) for f in futures]
    store = Store.open(db_url)
    stored = family(store, "default", "s")
    common = workers.turn("common", 0)
    total = sum(len(v) for v in stored.values())
    assert total == len(common) + 3 * sum(len(workers.turn("x", i)) for i in range(1, turns))
    for worker, session_key in results:
        own = [m for i in range(1, turns) for m in workers.turn(worker, i)]
        assert lineage_of(store, store.sessions.find("default", session_key)) == common + own, worker
    for key, messages in stored.items():  # no session mixes two hosts' own turns
        hosts = {w for w, _ in results if any(f"from {w}" in str(m.get("content")) for m in messages)}
        assert len(hosts) <= 1, (key, hosts)


def test_a_bad_message_is_counted_when_another_writer_forced_a_full_alignment(db_url):
    """The fast path gives way to full alignment when another writer appended meanwhile; a
    message that cannot be stored is still counted exactly once."""
    Store.open(db_url, upgrade=True)
    a, b = engine_on(db_url), engine_on(db_url)
    a.on_session_start("s")
    b.on_session_start("s")
    transcript = [SYSTEM, *workers.turn("t", 0)]
    a.on_turn_complete(transcript)
    b.on_turn_complete(list(transcript) + workers.turn("t", 1))
    transcript += [None, *workers.turn("t", 1), *workers.turn("t", 2)]
    a.on_turn_complete(transcript)
    a.on_turn_complete(transcript)
    assert rows(a.store, a.session.id) == [m for i in range(3) for m in workers.turn("t", i)]
    assert a.store.sessions.get(a.session.id).skipped_count == 1
