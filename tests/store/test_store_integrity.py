"""Integrity checks find deliberately planted faults on both backends; repair fixes the index."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from lcm.records import NewSummary
from lcm.store import Store
from tests.support.faults import corrupt_index_entry, drop_from_index
from tests.support.storing import append_messages


def statuses(store: Store, deep: bool = False) -> dict[str, str]:
    return {c.name: c.status for c in store.health.checks(deep=deep)}


@pytest.fixture
def populated(store, session):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"row {i} quasar{i}"}
            for i in range(30)]
    ids = append_messages(store, session.id, msgs).store_ids
    leaf = store.summaries.write(session.id, NewSummary(
        depth=0, content="summary of rows", token_count=3, source_ids=tuple(ids[:10]), kind="extractive")).node
    return session, list(ids), leaf


def test_empty_database_is_healthy(store):
    assert set(statuses(store, deep=True).values()) == {"ok"}


def test_populated_database_is_healthy(store, populated):
    assert set(statuses(store, deep=True).values()) == {"ok"}


def test_a_row_missing_from_the_index_is_found_and_repaired(store, populated):
    session, ids, _ = populated
    drop_from_index(store, ids[3])
    assert store.search.messages("quasar3", agent="agent-a").hits == []
    assert statuses(store)["search_index_messages"] == "fail"
    assert statuses(store, deep=True)["search_index_messages"] == "fail"
    counts = store.health.rebuild_index()
    assert counts["messages"] == 30 and counts["summaries"] == 1
    assert [h.id for h in store.search.messages("quasar3", agent="agent-a").hits] == [ids[3]]
    assert set(statuses(store, deep=True).values()) == {"ok"}


def test_a_stale_index_entry_is_found_by_the_deep_check(store, populated):
    session, ids, _ = populated
    corrupt_index_entry(store, ids[2])  # an old row: outside the quick check's sample
    assert statuses(store, deep=True)["search_index_messages"] == "fail"
    store.health.rebuild_index()
    assert statuses(store, deep=True)["search_index_messages"] == "ok"
    assert [h.id for h in store.search.messages("quasar2", agent="agent-a").hits] == [ids[2]]


def test_a_stale_recent_entry_is_found_by_the_quick_check(store, populated):
    session, ids, _ = populated
    corrupt_index_entry(store, ids[-1])
    assert statuses(store)["search_index_messages"] == "fail"


def test_counter_drift_is_found(store, populated):
    session, _, _ = populated
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE lcm_sessions SET token_count = token_count + 7 WHERE id = :s"),
                     {"s": session.id})
    assert statuses(store)["session_counters"] == "fail"


def test_a_removed_leaf_edge_is_found(store, populated):
    session, ids, leaf = populated
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM lcm_summary_sources WHERE summary_id = :l AND ordinal = 4"),
                     {"l": leaf.id})
    found = statuses(store)
    assert found["coverage"] == "fail" and found["dag_edges"] == "fail"


def test_a_summary_not_shorter_than_its_sources_is_a_warning(store, session):
    ids = append_messages(store, session.id, [{"role": "user", "content": "hi"}]).store_ids
    store.summaries.write(session.id, NewSummary(depth=0, content="a much longer summary " * 20,
                                               token_count=500, source_ids=tuple(ids), kind="x"))
    assert statuses(store)["summary_sizes"] == "warn"


def test_a_row_filed_under_another_agent_is_found(store, populated):
    session, ids, _ = populated
    other = store.sessions.get_or_create("agent-b", "elsewhere")
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE lcm_messages SET agent_id = :a WHERE id IN (:i, :j)"),
                     {"a": other.agent_pk, "i": ids[0], "j": ids[3]})
    check = {c.name: c for c in store.health.checks()}["agent_scope"]
    assert check.status == "fail" and check.detail.startswith("2 rows carry another agent")


def test_a_tool_result_stored_twice_for_one_call_is_reported(store, session):
    """A tool result stored twice for one call in a session (what two writers produced before
    ingest aligned under a lock, issue 13.1; a host handed a message it never had, issue 30):
    the doctor says what it found, not a guess at why. Repeated plain text ("ok", "ok") is not
    a duplicate."""
    from tests.support.workers import turn

    first = append_messages(store, session.id, turn("w", 0) + turn("w", 1))
    assert statuses(store)["duplicate_messages"] == "ok"
    # The pre-fix bug: turn 1 appended again after itself, chained to a different predecessor.
    append_messages(store, session.id, turn("w", 1), after_identity=first.last_identity)
    checks = {c.name: c for c in store.health.checks()}
    assert checks["duplicate_messages"].status == "warn"
    detail = checks["duplicate_messages"].detail
    assert f"session {session.id}: 1" in detail and "lock" not in detail and "--repair" in detail


def test_a_fork_that_repeats_its_parent_is_reported(store, session):
    """A fork claims the two conversations differ after its fork point (issue 30.2). One that
    holds the parent's own later turn (same call, same result) says they agreed there: the
    conversation is stored twice, once in each session."""
    from tests.support.workers import turn

    append_messages(store, session.id, turn("w", 0) + turn("w", 1) + turn("w", 2))
    with store.sessions.family(session.id) as family:
        honest = family.create_fork(family.session(session.id), 4)
    append_messages(store, honest.id, turn("other", 1))  # a real divergence: no warning
    assert statuses(store)["fork_repeats"] == "ok"
    with store.sessions.family(session.id) as family:
        repeating = family.create_fork(family.session(session.id), 4)
    append_messages(store, repeating.id, [{"role": "user", "content": "again"}, *turn("w", 1), *turn("w", 2)])
    check = {c.name: c for c in store.health.checks()}["fork_repeats"]
    assert check.status == "warn"
    assert f"session {repeating.id} (fork of {session.id}): 2" in check.detail
    assert f"session {honest.id}" not in check.detail


def test_repair_removes_the_copies_and_keeps_the_store_consistent(store, session):
    """doctor --repair removes what two writers stored twice, when it is not summarized yet:
    the session reads exactly as the conversation, seq gapless, every check ok."""
    from tests.support.workers import turn

    expected = turn("w", 0) + turn("w", 1) + turn("w", 2) + turn("w", 3)
    first = append_messages(store, session.id, turn("w", 0) + turn("w", 1))
    again = append_messages(store, session.id, turn("w", 1), after_identity=first.last_identity)  # the bug
    append_messages(store, session.id, turn("w", 2) + turn("w", 3), after_identity=again.last_identity)
    assert len(store.messages.get_range(session.id)) == len(expected) + 4
    [done] = store.health.remove_duplicate_runs()
    assert done["removed"] == 4 and done["runs"] == [[9, 12]] and not done["left_alone"]
    back = store.messages.get_range(session.id)
    assert [r.message for r in back] == expected
    assert [r.seq for r in back] == list(range(1, len(expected) + 1))
    assert {c.name: c.status for c in store.health.checks(deep=True)} == {
        c.name: "ok" for c in store.health.checks(deep=True)}
    assert store.health.remove_duplicate_runs() == []
    assert store.search.messages("tokenwx2", agent="agent-a").hits  # the index follows


def test_repair_leaves_a_summarized_copy_alone(store, session):
    from tests.support.workers import turn

    first = append_messages(store, session.id, turn("w", 0))
    again = append_messages(store, session.id, turn("w", 0), after_identity=first.last_identity)
    append_messages(store, session.id, turn("w", 1), after_identity=again.last_identity)
    ids = [r.store_id for r in store.messages.get_range(session.id)]
    store.summaries.write(session.id, NewSummary(depth=0, content="both copies", token_count=2,
                                               source_ids=tuple(ids[:8]), kind="extractive"))
    [done] = store.health.remove_duplicate_runs()
    assert done["removed"] == 0 and "already summarized" in done["left_alone"][0]
    assert len(store.messages.get_range(session.id)) == 12


def _three_sessions(store: Store) -> list[int]:
    """Three sessions of 40 messages, written oldest first (so the last is the most recent)."""
    pks = []
    for n in range(3):
        session = store.sessions.get_or_create("agent-a", f"bounded-{n}", platform="cli")
        append_messages(store, session.id, [{"role": "user" if i % 2 == 0 else "assistant",
                                             "content": f"session {n} row {i}"} for i in range(40)])
        pks.append(session.id)
    return pks


def test_a_big_store_is_checked_by_its_most_recent_sessions_and_all_reads_every_one(store):
    """Over the bound, the doctor reads the most recently active sessions up to it (so it stays
    quick at ten million messages) and says so; ``everything`` reads every session. A fault in
    an old session is found by the whole check, not by the bounded one."""
    old, middle, recent = _three_sessions(store)
    with store.engine.begin() as conn:  # an old session's counter drifts
        conn.execute(text("UPDATE lcm_sessions SET message_count = 39 WHERE id = :id"), {"id": old})
    scope = store.health.scope(bound=90)
    assert scope.sessions == (recent, middle) and scope.messages == 80
    assert (scope.total_sessions, scope.total_messages) == (3, 119)
    bounded = {c.name: c for c in store.health.checks(bound=90)}
    assert bounded["session_counters"].status == "ok"
    assert "the 2 most recently active sessions (80 of 119 messages" in bounded["check_scope"].detail
    assert "lcm doctor --all" in bounded["check_scope"].detail
    whole = {c.name: c for c in store.health.checks(bound=90, everything=True)}
    assert whole["session_counters"].status == "fail" and f"[{old}]" in whole["session_counters"].detail
    assert whole["check_scope"].detail.startswith("every session checked (3 sessions")
    assert {c.name: c.status for c in store.health.checks(bound=90, deep=True)}["session_counters"] == "fail"
    if store.backend_name == "sqlite":  # the whole-file checks run only on a whole check
        assert "sqlite_quick_check" not in bounded and whole["sqlite_quick_check"].status == "ok"
    # At least one session is checked, however big: a bound below the newest session's size.
    assert store.health.scope(bound=10).sessions == (recent,)
    # Under the bound nothing changes: every session.
    assert store.health.scope(bound=1_000).whole


def test_a_bounded_check_still_finds_faults_in_the_sessions_it_reads(store):
    _, _, recent = _three_sessions(store)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE lcm_sessions SET token_count = token_count + 1 WHERE id = :id"), {"id": recent})
    assert {c.name: c.status for c in store.health.checks(bound=50)}["session_counters"] == "fail"
    assert store.health.stats()["messages"] == 120  # from the sessions' counters, not a count of rows


def test_a_bounded_check_reads_the_search_index_of_its_sessions_only(store):
    """The index counts of a bounded run compare the checked sessions' rows with their entries
    (a whole count reads every row of the table and the index): a row missing from the index
    in an old session is not counted (the spot check of the newest rows may still see it in a
    store this small), one in a recent session is."""
    old, _, recent = _three_sessions(store)
    drop_from_index(store, store.messages.get_range(old)[0].store_id)

    def detail(**kw: int | bool) -> str:
        return {c.name: c for c in store.health.checks(**kw)}["search_index_messages"].detail

    counted = "indexed rows for" if store.backend_name == "sqlite" else "have no search vector"
    assert counted not in detail(bound=90)
    assert counted in detail(bound=90, everything=True)
    drop_from_index(store, store.messages.get_range(recent)[-1].store_id)
    assert counted in detail(bound=90)
