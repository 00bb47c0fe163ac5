"""PostgreSQL in operation (issue 18.3): behind PgBouncer in transaction mode, connections named
and bounded by timeouts, a dropped connection retried once without losing the turn.

Real components throughout: the shared test server, a real PgBouncer from Debian's package
(skipped with the reason when it cannot start), real backends killed with pg_terminate_backend.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.pool import NullPool

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.errors import DatabaseUnavailableError
from lcm.store import Store
from lcm.store import connection as db
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, conversation, run_host
from tests.support.pgbouncer import running_bouncer, why_not_available
from tests.support.storing import append_messages

pytestmark = pytest.mark.postgres


def _engine(url: str, agent: str = "agent-a", **overrides) -> LcmEngine:
    config = LcmConfig.from_env({}, database_url=url, agent_id=agent, **{**SMALL_ENGINE, **overrides})
    engine = LcmEngine(config)
    engine.update_model("test-model", 3000)
    return engine


def _stored(engine: LcmEngine, key: str) -> list[dict]:
    session = engine.store.sessions.find(engine.agent_id, key)
    return [r.message for r in engine.store.messages.get_range(session.id, limit=100_000)] if session else []


def _admin(server_url: str):
    return create_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")


def _run_agent(engine: LcmEngine, key: str, turns: int) -> list[dict]:
    """A Hermes-shaped loop (compaction under pressure), searching every fourth turn; what
    was sent."""
    engine.on_session_start(key, platform="cli")
    transcript, sent = [SYSTEM], []
    for start in range(0, turns, 4):
        transcript, more = run_host(engine, 4, start=start, transcript=transcript)
        sent.extend(more)
        found = json.loads(engine.handle_tool_call("lcm_grep", {"query": f"fact{start}"}))
        assert found.get("results"), found
    return sent


@pytest.fixture
def bouncer(pg_server):
    problem = why_not_available()
    if problem is not None:
        pytest.skip(f"PgBouncer tests skipped: {problem}")
    with running_bouncer(pg_server, pool_size=1) as b:
        try:
            yield b
        finally:
            db.dispose(db.resolve_url(b.url))
            db.dispose(db.resolve_url(b.direct_url))


# ------------------------------------------------------------------------------ PgBouncer


def test_the_bouncer_multiplexes_sessions_so_session_state_would_break(bouncer):
    """The control: in this setup, what lcm must not do (server-side prepared statements
    across transactions) really fails, so the next test can fail too."""
    a = psycopg.connect(f"host=127.0.0.1 port={bouncer.port} dbname=lcm user=postgres",
                        autocommit=True, prepare_threshold=0)
    b = psycopg.connect(f"host=127.0.0.1 port={bouncer.port} dbname=lcm user=postgres",
                        autocommit=True, prepare_threshold=0)
    try:
        with pytest.raises(psycopg.Error, match="prepared statement"):
            for _ in range(3):
                a.execute("SELECT 1").fetchall()
                b.execute("SELECT 1").fetchall()
    finally:
        a.close()
        b.close()


def test_agents_work_through_pgbouncer_in_transaction_mode(bouncer):
    Store.open(bouncer.direct_url, upgrade=True)  # upgrades go to the server itself
    engines = [_engine(bouncer.url, agent=f"agent-{n}") for n in range(3)]
    results: dict[int, list[dict]] = {}
    failures: list[BaseException] = []

    def agent(n: int) -> None:
        try:
            results[n] = _run_agent(engines[n], f"s{n}", 16)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    for n, engine in enumerate(engines):
        assert engine.context.last_error is None, engine.context.last_error
        assert _stored(engine, f"s{n}") == results[n]
        assert engine.context.compactions > 0  # compaction ran through the pooler too
    with engines[0].store._core.read() as conn:
        assert conn.info["lcm_pooler"] is True  # detected: PgBouncer refused the options parameter
    with _admin(bouncer.direct_url).connect() as conn:  # every message once, on the server
        rows = conn.execute(text("SELECT count(*), count(DISTINCT (session_id, seq)) FROM lcm_messages")).one()
    assert rows[0] == rows[1] == sum(len(r) for r in results.values())


def test_timeouts_hold_inside_write_transactions_through_the_pooler(bouncer, monkeypatch):
    monkeypatch.setenv("LCM_PG_LOCK_TIMEOUT_MS", "1234")
    monkeypatch.setenv("LCM_PG_STATEMENT_TIMEOUT_MS", "4321")
    store = Store.open(bouncer.direct_url, upgrade=True)
    store = Store.open(bouncer.url)
    with store._core.write() as conn:
        got = conn.execute(text("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")).one()
    assert tuple(got) == ("1234ms", "4321ms")
    # transaction-local: the shared server connection is left as it was for the next client
    with store._core.read() as conn:
        assert conn.execute(text("SELECT current_setting('lock_timeout')")).scalar() == "0"


def test_an_upgrade_through_the_pooler_is_refused_with_what_to_do(bouncer, lcm):
    code, out, err = lcm("db", "upgrade", "--url", bouncer.url)
    assert code == 1
    assert "transaction-mode pooler" in err and "against the PostgreSQL server itself" in err
    with _admin(bouncer.direct_url).connect() as conn:
        assert conn.execute(text("SELECT to_regclass('lcm_messages')")).scalar() is None  # nothing half-done


# ------------------------------------------------------------------- names and timeouts


def test_connections_carry_application_name_and_timeouts(pg_url, pg_server, monkeypatch):
    monkeypatch.setenv("LCM_APPLICATION_NAME", "lcm-fleet-7")
    monkeypatch.setenv("LCM_PG_STATEMENT_TIMEOUT_MS", "45000")
    store = Store.open(pg_url, upgrade=True)
    with store._core.read() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        settings = conn.execute(text(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")).one()
    assert tuple(settings) == ("45s", "15s")
    with _admin(pg_server).connect() as conn:
        name = conn.execute(text("SELECT application_name FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar()
    assert name == "lcm-fleet-7"


def test_the_command_line_names_its_connections_after_the_command(lcm, pg_url):
    from lcm import config

    try:
        code, _, _ = lcm("db", "upgrade", "--url", pg_url)
        assert code == 0
        assert config.application_name() == "lcm-cli db upgrade"
    finally:
        config.set_default_application_name("lcm")


def test_a_write_blocked_by_a_held_lock_fails_after_the_lock_timeout(pg_url, monkeypatch):
    monkeypatch.setenv("LCM_PG_LOCK_TIMEOUT_MS", "300")
    store = Store.open(pg_url, upgrade=True)
    session = store.sessions.get_or_create("agent-a", "s1", platform="cli")
    holder = create_engine(db.resolve_url(pg_url), poolclass=NullPool)
    with holder.connect() as conn, conn.begin():
        conn.execute(text("SELECT 1 FROM lcm_sessions WHERE id = :s FOR UPDATE"), {"s": session.id})
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailableError, match="lock timeout"):
            append_messages(store, session.id, [{"role": "user", "content": "waits for the lock"}])
        waited = time.monotonic() - started
    holder.dispose()
    assert waited < 10  # without the timeout it would wait as long as the holder holds on


# ------------------------------------------------------------------- dropped connections


def _kill_backends(server_url: str, name: str) -> int:
    with _admin(server_url).connect() as conn:
        return len(conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :n "
            "AND pid <> pg_backend_pid()"), {"n": name}).all())


def test_connections_dropped_between_turns_cost_no_turn(pg_url, pg_server, monkeypatch):
    monkeypatch.setenv("LCM_APPLICATION_NAME", "lcm-drop-between")
    Store.open(pg_url, upgrade=True)
    engine = _engine(pg_url)
    engine.on_session_start("s", platform="cli")
    transcript = [SYSTEM]
    killed = 0
    for i in range(8):
        transcript = transcript + conversation(i + 1)[len(transcript) - 1:]
        if i in (3, 6):
            killed += _kill_backends(pg_server, "lcm-drop-between")  # the pool's connections die
        engine.on_turn_complete(transcript)
        assert engine.context.last_error is None, engine.context.last_error
        assert _stored(engine, "s") == transcript[1:]  # this turn, not the next one
    assert killed >= 2


def test_a_connection_dropped_mid_transaction_is_retried_once(pg_url, pg_server, monkeypatch):
    monkeypatch.setenv("LCM_APPLICATION_NAME", "lcm-drop-mid")
    Store.open(pg_url, upgrade=True)
    engine = _engine(pg_url)
    engine.on_session_start("s", platform="cli")
    transcript = [SYSTEM, *conversation(2)]
    engine.on_turn_complete(transcript)
    kills: list[int] = []

    def kill_before_the_insert(conn, _cursor, statement, *_args) -> None:
        if "INSERT INTO lcm_messages" in statement and not kills:
            pid = conn.connection.dbapi_connection.info.backend_pid
            with _admin(pg_server).connect() as admin:
                kills.append(admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar())

    sa_engine = engine.store._core.engine
    event.listen(sa_engine, "before_cursor_execute", kill_before_the_insert)
    try:
        transcript = transcript + conversation(4)[len(transcript) - 1:]
        engine.on_turn_complete(transcript)
    finally:
        event.remove(sa_engine, "before_cursor_execute", kill_before_the_insert)
    assert kills == [True]  # the write's connection really died mid-transaction
    assert engine.context.last_error is None, engine.context.last_error
    assert _stored(engine, "s") == transcript[1:]


def test_url_options_the_pooler_refuses_get_an_error_that_says_what_to_do(bouncer):
    with pytest.raises(DatabaseUnavailableError, match="ALTER ROLE"):
        Store.open(bouncer.url + "?options=-csearch_path%3Dlcm")
