"""Several real processes on one database lose and duplicate nothing; a crash writes nothing."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from sqlalchemy import func, select, text

from lcm.records import NewSummary
from lcm.store import Store
from lcm.store.schema import Message
from tests.conftest import REPO_ROOT
from tests.support import workers

pytestmark = pytest.mark.slow

WRITERS = 4
TURNS = 150
RESENDERS = 2
RESEND_TURNS = 40
START_DELAY = 4.0  # seconds for every spawned process to be up before they all start


def pool(n: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))


def test_many_processes_append_without_loss_or_duplicates(db_url):
    Store.open(db_url, upgrade=True)
    start_at = time.time() + START_DELAY
    with pool(WRITERS + RESENDERS) as ex:
        futures = [ex.submit(workers.append_turns, db_url, "agent-a", f"s{w}", f"w{w}", TURNS, start_at)
                   for w in range(WRITERS)]
        futures += [ex.submit(workers.resend_transcript, db_url, "agent-a", "shared", RESEND_TURNS,
                              start_at) for _ in range(RESENDERS)]
        assert [f.result(timeout=600) for f in futures] == [TURNS] * WRITERS + [RESEND_TURNS] * RESENDERS

    store = Store.open(db_url)
    for w in range(WRITERS):
        s = store.sessions.find("agent-a", f"s{w}")
        stored = store.messages.get_range(s.id)
        assert [m.message for m in stored] == [m for i in range(TURNS) for m in workers.turn(f"w{w}", i)]
        assert [m.seq for m in stored] == list(range(1, 4 * TURNS + 1))
    shared = store.sessions.find("agent-a", "shared")
    expected = [m for i in range(RESEND_TURNS) for m in workers.turn("shared", i)]
    assert [m.message for m in store.messages.get_range(shared.id)] == expected
    with store.engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(Message)).scalar_one()
        distinct = conn.execute(text(
            "SELECT count(*) FROM (SELECT DISTINCT session_id, identity FROM lcm_messages) d")).scalar_one()
    assert total == distinct == 4 * (WRITERS * TURNS + RESEND_TURNS)
    for w in range(WRITERS):
        for i in (0, TURNS // 2, TURNS - 1):
            assert len(store.search.messages(f"tokenw{w}x{i}", agent="agent-a").hits) == 1
    assert {c.name: c.status for c in store.health.checks(deep=True)} == {
        c.name: "ok" for c in store.health.checks()}


def test_processes_opening_a_new_sqlite_file_at_once_all_succeed(sqlite_url):
    with pool(4) as ex:
        assert list(ex.map(workers.open_store, [sqlite_url] * 4, timeout=300)) == ["ok"] * 4


def test_a_process_killed_between_summary_and_edges_leaves_neither(db_url):
    Store.open(db_url, upgrade=True)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run([sys.executable, "-m", "tests.support.workers", db_url], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stderr
    store = Store.open(db_url)
    session = store.sessions.find("agent-a", "crash")
    assert session.message_count == 8 and session.covered_seq == 0
    assert store.summaries.of_session(session.id) == []
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM lcm_summary_sources")).scalar_one() == 0
    assert all(c.status == "ok" for c in store.health.checks(deep=True))
    ids = [m.store_id for m in store.messages.get_range(session.id)]
    again = store.summaries.write(session.id, NewSummary(depth=0, content="fine now", token_count=1,
                                                       source_ids=tuple(ids[:4]), kind="extractive")).node
    assert store.summaries.source_ids(again.id) == ids[:4]


def test_an_agent_created_by_a_transaction_is_shared_only_once_committed(db_url):
    """Threads of one process share the agents' row ids; an id from a transaction that has not
    committed (or rolled back) must not reach another thread: its session insert would fail
    the foreign key (64 proxy clients creating their agents at once did)."""
    import threading

    store = Store.open(db_url, upgrade=True)
    core = store.sessions._core
    with pytest.raises(RuntimeError):
        with core.write() as conn:
            core.agent_pk(conn, "fresh", create=True)
            assert core.agent_pk(conn, "fresh", create=False) is not None  # its own transaction sees it
            raise RuntimeError("roll back")
    assert "fresh" not in core._agents
    session = store.sessions.get_or_create("fresh", "s")  # created again, for real this time
    assert store.sessions.find("fresh", "s") == session and core._agents["fresh"] == session.agent_pk

    errors: list[BaseException] = []

    def make(i: int) -> None:
        try:
            store.sessions.get_or_create(f"agent-{i % 3}", f"s{i}")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(len(list(store.sessions.each(f"agent-{a}"))) for a in range(3)) == [8, 8, 8]
