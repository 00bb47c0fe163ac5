"""Hosts that hold the context lcm handed them, several on one session (issue 30), written once
and run twice: over the in-memory store (``tests/unit/test_host_views.py``) and on SQLite and
PostgreSQL (``tests/integration/test_host_views.py``). Each interleaving that broke is made
deterministic here; ``tests/integration/test_faults_hosts.py`` runs the same hosts in real
processes with random timing."""

from __future__ import annotations

import copy
import re
from typing import Any

from lcm.engine import LcmEngine
from lcm.transcript import SUMMARY_MARKER, is_lcm_summary
from tests.support.conversation import SYSTEM, host_tokens, sequence_problems, turn


def rows(engine: LcmEngine, session_pk: int) -> list[dict]:
    return [m.message for m in engine.store.messages.get_range(session_pk)]


def family(engine: LcmEngine, key: str) -> dict[str, list[dict]]:
    """Every session of the conversation ``key`` (its forks, recursively), by key."""
    store = engine.store
    out, todo = {}, [store.sessions.find(engine.agent_id, key)]
    while todo:
        s = todo.pop()
        out[s.session_key] = rows(engine, s.id)
        todo.extend(store.sessions.forks(s.id))
    return out


def verbatim(context: list[dict]) -> list[dict]:
    """The conversation messages of a context lcm handed over (its summary and system aside)."""
    return [m for m in context if m.get("role") != "system" and not is_lcm_summary(m)]


def step(engine: LcmEngine, held: list[dict], new: list[dict[str, Any]]) -> list[dict]:
    """One host turn: append, compress with the host's measure, keep what comes back."""
    held = [*held, *new]
    return engine.compress(held, current_tokens=host_tokens(held))


def test_a_host_is_never_handed_a_message_another_host_stored_meanwhile(make_engine, monkeypatch):
    """The root of issue 30. B stores its turn; before B's context is assembled, A stores the
    next one. B used to be handed A's turn (it never had it), then appended its own copy of
    that turn to what it held: a turn stored twice, or a fork of a conversation that agreed."""
    a, b = make_engine(), make_engine()
    a.on_session_start("s")
    b.on_session_start("s")
    held_a, held_b = [SYSTEM], [SYSTEM]
    for i in range(11):  # just under the trigger (2,250 tokens of a 3,000-token window)
        held_a = step(a, held_a, turn(i))
        held_b = step(b, held_b, turn(i))
    burst = b.context._burst

    def a_writes_first(*args: Any, **kwargs: Any) -> Any:
        a.on_turn_complete([*held_a, *turn(11), *turn(12)])  # lands between B's ingest and assembly
        return burst(*args, **kwargs)

    monkeypatch.setattr(b.context, "_burst", a_writes_first)
    held_b = [*held_b, *turn(11), turn(12)[0]]
    held_b = b.compress(held_b, current_tokens=2900)  # B is at its trigger: compaction is due
    monkeypatch.undo()
    assert held_b[1]["content"].startswith(SUMMARY_MARKER), "B was compacted"
    assert verbatim(held_b)[-1] == turn(12)[0], "B's context ends where B's transcript ends"
    held_b = step(b, held_b, turn(12)[1:] + turn(13))
    held_a = step(a, [*held_a, *turn(11), *turn(12)], turn(13) + turn(14))
    expected = [m for i in range(15) for m in turn(i)]
    assert family(a, "s") == {"s": expected}


def test_a_host_behind_the_session_is_compacted_to_where_it_ends(make_engine):
    """A is two turns ahead. B, over its window, used to be told "behind the stored session:
    left as it is" on every call, its list growing past the model's window while A went on."""
    a, b = make_engine(), make_engine()
    a.on_session_start("s")
    b.on_session_start("s")
    held_a, held_b = [SYSTEM], [SYSTEM]
    for i in range(6):
        held_a = step(a, held_a, turn(i))
    held_a = step(a, held_a, turn(6) + turn(7))
    for i in range(6):
        held_b = [*held_b, *turn(i)]
        b.on_turn_complete(held_b)  # B stores nothing new: A has it all
    held_b = b.compress(held_b, current_tokens=2900)  # B reaches its trigger two turns behind A
    assert held_b[1]["content"].startswith(SUMMARY_MARKER)
    assert verbatim(held_b)[-1] == turn(5)[-1] and not sequence_problems(held_b, SYSTEM)
    assert host_tokens(held_b) < 2900
    held_b = step(b, held_b, turn(6))
    held_b = step(b, held_b, turn(7) + turn(8))
    assert family(a, "s") == {"s": [m for i in range(9) for m in turn(i)]}


def test_a_host_far_behind_gets_summaries_of_only_what_it_had(make_engine):
    """A has compacted well past B's last message. B's context is summaries that stop before
    B's newest turn and B's own messages after them, never a summary of what B never had."""
    a, b = make_engine(), make_engine()
    a.on_session_start("s")
    b.on_session_start("s")
    held_a = [SYSTEM]
    for i in range(24):
        held_a = step(a, held_a, turn(i))
    assert a.store.sessions.get(a.session.id).covered_seq > 14 * 4
    held_b = [SYSTEM, *[m for i in range(13) for m in turn(i)]]  # B reaches its trigger at turn 12
    out = step(b, held_b, [])
    assert out is not held_b and not sequence_problems(out, SYSTEM)
    tail = verbatim(out)
    assert tail == held_b[len(held_b) - len(tail):] and turn(12)[0] in tail
    ends = [int(last) for last in re.findall(r'covers="messages? (?:\d+-)?(\d+)"', out[1]["content"])]
    assert ends and max(ends) < 12 * 4 + 1, "no summary reaches B's newest turn"
    step(b, out, turn(13))
    assert family(a, "s") == {"s": [m for i in range(24) for m in turn(i)]}


def test_a_host_far_behind_that_holds_its_view_stores_nothing_twice(make_engine):
    """B holds the context lcm handed it; A then writes hundreds of messages, compacting as it
    goes (the session's recorded host view is A's now). B's next turn (messages A already
    stored) is placed by what B's view proves, not searched for among the session's newest
    messages (where it is not)."""
    a, b = make_engine(), make_engine()
    a.on_session_start("s")
    b.on_session_start("s")
    held_b = [SYSTEM]
    for i in range(14):
        held_b = step(b, held_b, turn(i))
    assert held_b[1]["content"].startswith(SUMMARY_MARKER)
    held_a = [SYSTEM, *[m for i in range(14) for m in turn(i)]]
    for i in range(14, 120):
        held_a = step(a, held_a, turn(i))
    held_b = [*held_b, *turn(14)]
    b.on_turn_complete(held_b)
    held_b = [*held_b, *turn(15)]
    b.on_turn_complete(held_b)
    assert family(a, "s") == {"s": [m for i in range(120) for m in turn(i)]}


def test_a_restarted_host_that_holds_a_forks_context_continues_the_fork(make_engine):
    """B's conversation went its own way (a fork); B compacts there, then restarts: a new
    process, bound to the host key, reloading the list it kept. The summary at its head says
    which session and message it continues: the fork, not the parent."""
    a, b = make_engine(), make_engine()
    a.on_session_start("s")
    b.on_session_start("s")
    shared = [m for i in range(3) for m in turn(i)]
    a.on_turn_complete([SYSTEM, *shared])
    held_a, held_b = [SYSTEM, *shared], [SYSTEM, *shared]
    for i in range(3, 18):
        held_a = step(a, held_a, turn(i, user=f"A asks {i}"))
        held_b = step(b, held_b, turn(i, user=f"B asks {i}"))
    assert b.session.session_key == "s/fork-1" and held_b[1]["content"].startswith(SUMMARY_MARKER)
    restarted = make_engine()
    restarted.on_session_start("s")
    step(restarted, copy.deepcopy(held_b), turn(18, user="B asks 18"))
    assert restarted.session.session_key == "s/fork-1"
    b_own = [m for i in range(3, 19) for m in turn(i, user=f"B asks {i}")]
    assert family(a, "s") == {"s": shared + [m for i in range(3, 18) for m in turn(i, user=f"A asks {i}")],
                              "s/fork-1": b_own}


def test_a_forks_context_holds_what_it_shares_with_its_parent(make_engine):
    """The fork's context starts with the parent's messages since its last summary, up to the
    fork point, verbatim (they were the forking host's latest turns); once the fork has
    summaries of its own they are named as left out, and still found by search."""
    a, b = make_engine(), make_engine(context_length=100_000)
    a.on_session_start("s")
    b.on_session_start("s")
    shared = [m for i in range(4) for m in turn(i)]
    a.on_turn_complete([SYSTEM, *shared, *turn(4, user="A goes on")])
    held_b = [SYSTEM, *shared, *turn(4, user="B goes elsewhere")]
    b.on_turn_complete(held_b)
    assert b.session.session_key == "s/fork-1"
    out = b.compress(held_b, current_tokens=1000, force=True)
    assert verbatim(out) == held_b[1:], "nothing to summarize yet: the shared turns are kept"
    b2 = make_engine()  # a small window: the fork compacts its own messages
    b2.on_session_start("s")
    held = [*held_b]
    for i in range(5, 16):
        held = step(b2, held, turn(i, user=f"B asks {i}"))
    assert b2.session.session_key == "s/fork-1" and b2.store.sessions.get(b2.session.id).covered_seq > 0
    assert "before this session forked (1-16 of session s)" in held[1]["content"]
    assert family(b2, "s")["s/fork-1"] == turn(4, user="B goes elsewhere") + [
        m for i in range(5, 16) for m in turn(i, user=f"B asks {i}")]
