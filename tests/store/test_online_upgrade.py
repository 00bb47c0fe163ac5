"""`lcm db upgrade` on a PostgreSQL database that agents are using (issue 18.4).

An agent of the previous lcm release (its SQL, at revision 0008) keeps writing while the
upgrade to head runs, and another transaction holds a lock on the table the upgrade alters
(a long read, as an export or a report would). A DDL statement waiting for that lock would
queue every agent behind it for as long as the reader reads; lcm's upgrade gives up on the
lock after LCM_MIGRATION_LOCK_TIMEOUT_MS, rolls back whole and tries again, so the agent
waits at most about that long at a time. The control case (no lock timeout) shows the stall
the test guards against.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from lcm.store import Store, migrations
from lcm.store import connection as db
from tests.store.test_migrations import OLD_MESSAGES, write_at_0006
from tests.support.storing import append_messages

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

OLD_REVISION = "0008_vectors"
BLOCK_S = 6.0


class OldAgent(threading.Thread):
    """Writes one message a transaction the way lcm at 0008 did: lock the session row, insert,
    bump the session's counters. Records how long each transaction took."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.engine = create_engine(db.resolve_url(url), poolclass=NullPool)
        self.stop = threading.Event()
        self.latencies: list[tuple[float, float]] = []  # (started, seconds)
        self.errors: list[BaseException] = []
        self.seq = len(OLD_MESSAGES)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with self.engine.connect() as conn, conn.begin():
                    conn.execute(text("SELECT last_seq FROM lcm_sessions WHERE id = 1 FOR UPDATE"))
                    self.seq += 1
                    conn.execute(text(
                        "INSERT INTO lcm_messages (session_id, agent_id, seq, identity, content_hash, role, "
                        "content_kind, content, token_count, ts) VALUES (1, 1, :seq, :ident, 'h', 'user', "
                        "'text', :content, 3, :ts)"),
                        {"seq": self.seq, "ident": f"live-{self.seq}", "content": f"live write {self.seq}",
                         "ts": time.time()})
                    conn.execute(text("UPDATE lcm_sessions SET last_seq = :seq, message_count = message_count + 1 "
                                      "WHERE id = 1"), {"seq": self.seq})
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                self.errors.append(exc)
                return
            self.latencies.append((started, time.monotonic() - started))
            time.sleep(0.02)

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        self.engine.dispose()


def _hold_a_lock_on_sessions(url: str, seconds: float, held: threading.Event) -> threading.Thread:
    def reader() -> None:
        engine = create_engine(db.resolve_url(url), poolclass=NullPool)
        with engine.connect() as conn, conn.begin():
            conn.execute(text("SELECT count(*) FROM lcm_sessions"))  # ACCESS SHARE until commit
            held.set()
            time.sleep(seconds)
        engine.dispose()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("lock_timeout_ms", [500, 600_000], ids=["lcm-default-style", "control-no-lock-timeout"])
def test_an_upgrade_under_a_running_agent_keeps_it_writing(pg_url, monkeypatch, lock_timeout_ms):
    monkeypatch.setenv("LCM_MIGRATION_LOCK_TIMEOUT_MS", str(lock_timeout_ms))
    migrations.upgrade(db.resolve_url(pg_url), OLD_REVISION)
    engine = create_engine(db.resolve_url(pg_url), poolclass=NullPool)
    with engine.begin() as conn:
        write_at_0006(conn)
    engine.dispose()

    agent = OldAgent(pg_url)
    agent.start()
    time.sleep(0.3)
    held = threading.Event()
    reader = _hold_a_lock_on_sessions(pg_url, BLOCK_S, held)
    assert held.wait(10)
    retries: list[int] = []
    upgrade_started = time.monotonic()
    migrations.upgrade(db.resolve_url(pg_url), on_retry=lambda attempt, _reason: retries.append(attempt))
    upgrade_took = time.monotonic() - upgrade_started
    time.sleep(0.3)
    agent.finish()
    reader.join(timeout=30)

    assert not agent.errors, agent.errors
    assert migrations.state_at(db.resolve_url(pg_url)).status == "current"
    worst = max(seconds for _, seconds in agent.latencies)
    during = [s for started, s in agent.latencies if upgrade_started <= started <= upgrade_started + upgrade_took]
    if lock_timeout_ms == 500:
        assert retries, "the upgrade should have backed off at least once while the reader held its lock"
        assert worst < 2.5, f"the agent stalled {worst:.1f} s behind the upgrade"
        assert len(during) >= 10, "the agent should keep committing while the upgrade waits"
    else:
        assert not retries
        assert worst > BLOCK_S - 2.5, f"control: without a lock timeout the agent queues ({worst:.1f} s)"

    # Nothing lost: the old rows, every live write, and today's lcm writing on the new schema.
    store = Store.open(pg_url)
    session = store.sessions.find("old-agent", "old-session")
    stored = store.messages.get_range(session.id, limit=100_000)
    assert [r.seq for r in stored] == list(range(1, agent.seq + 1))
    append_messages(store, session.id, [{"role": "user", "content": "written by this lcm after the upgrade"}])
    assert store.messages.get_range(session.id, limit=100_000)[-1].message["content"].startswith("written by")
    # 0012 moved the stemmed vectors while the agent wrote: every message has one (the doctor
    # finds none missing below the watermark), and the live writes are found by another form.
    # (This stand-in for the old agent writes no exact vector: the doctor says so, rightly.)
    checks = {c.name: c for c in store.health.checks(deep=True)}
    assert "stemmed" not in checks["search_index_messages"].detail, checks["search_index_messages"]
    hits = store.search.messages(f"writes {agent.seq}", agent="old-agent", any_words=True).hits
    assert hits and f"{agent.seq}" in hits[0].snippet  # "live write N": "writes" only by its stem


def test_a_long_upgrade_that_keeps_meeting_a_held_lock_goes_on_from_where_it_stopped(pg_url, monkeypatch):
    """From 0001 with data, while a reader holds a lock on the sessions table several
    revisions alter: each gives up, rolls back alone, and the run resumes; the data reads back."""
    from tests.store.test_migrations import verify_old_data, write_at_0001

    monkeypatch.setenv("LCM_MIGRATION_LOCK_TIMEOUT_MS", "300")
    url = db.resolve_url(pg_url)
    migrations.upgrade(url, "0001_core_schema")
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        write_at_0001(conn)
    engine.dispose()
    held = threading.Event()
    reader = _hold_a_lock_on_sessions(pg_url, 3.0, held)
    assert held.wait(10)
    retries: list[int] = []
    migrations.upgrade(url, on_retry=lambda attempt, _reason: retries.append(attempt))
    reader.join(timeout=30)
    assert retries
    assert migrations.state_at(url).status == "current"
    verify_old_data(Store.open(pg_url))
