"""Per-agent database roles with row-level security (issue 18.5): `lcm db secure
--per-agent-roles`, then agents run as their own roles, and a process holding agent A's
credentials cannot read or change agent B's rows with raw SQL.

Roles are global to a PostgreSQL server: each test uses agent names of its own and drops the
roles it made.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.errors import AccessDeniedError
from lcm.store import Store
from lcm.store import connection as db
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, run_host

pytestmark = pytest.mark.postgres

BIG = "deploy log " + "line ok\n" * 9000  # over 64 Ki characters: stored as a payload


@pytest.fixture
def secured(pg_url, pg_server, lcm):
    """A secured store with two agents (one with a name that is no identifier); their URLs."""
    Store.open(pg_url, upgrade=True)
    tag = uuid.uuid4().hex[:8]
    agents = [f"alice_{tag}", f"Bob the Builder/{tag}"]
    args = ["db", "secure", "--per-agent-roles", "--url", pg_url, "--json"]
    for agent in agents:
        args += ["--agent", agent]
    code, out, err = lcm(*args)
    assert code == 0, err
    report = json.loads(out)
    roles = {r["agent"]: r for r in report["roles"]}
    try:
        yield agents, roles
    finally:
        for url in [r["url"] for r in roles.values()]:
            db.dispose(db.resolve_url(url))
        admin = create_engine(pg_server, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for r in roles.values():
                conn.exec_driver_sql(f'DROP OWNED BY "{r["role"]}"')
                conn.exec_driver_sql(f'DROP ROLE "{r["role"]}"')
        admin.dispose()


def _engine(url: str, agent: str) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id=agent, **SMALL_ENGINE))
    engine.update_model("test-model", 3000)
    return engine


def _raw(url: str):
    u = make_url(url)
    return psycopg.connect(host=u.host, port=u.port, dbname=u.database, user=u.username,
                           password=u.password, options=u.query.get("options"), autocommit=True)


def _live(engine: LcmEngine, key: str, turns: int, secret: str) -> list[dict]:
    """An agent's run with compaction, a large tool result (a payload) and a secret word."""
    engine.on_session_start(key, platform="cli")
    transcript, sent = run_host(engine, turns, user=f"remember {secret}")
    big = [{"role": "user", "content": "show the log"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "c1", "content": f"{BIG} {secret}"},
           {"role": "assistant", "content": "read it"}]
    transcript, more = run_host(engine, 0, transcript=transcript)
    engine.on_turn_complete([*transcript, *big])
    assert engine.context.last_error is None, engine.context.last_error
    return [*sent, *more, *big]


def test_each_agent_role_reaches_only_its_own_rows(secured, pg_url):
    (alice, bob), roles = secured
    assert roles[alice]["role"] == f"lcm_agent_{alice}"  # a plain name is kept readable
    assert roles[bob]["role"].startswith("lcm_agent_") and " " not in roles[bob]["role"]
    assert all(r["created"] and r["password"] for r in roles.values())

    # Agents run normally as their own roles: storing, compaction, payloads, search.
    a, b = _engine(roles[alice]["url"], alice), _engine(roles[bob]["url"], bob)
    sent_a = _live(a, "s", 20, "walrus")
    sent_b = _live(b, "s", 20, "narwhal")
    assert a.context.compactions > 0 and b.context.compactions > 0
    for engine, sent in ((a, sent_a), (b, sent_b)):
        session = engine.store.sessions.find(engine.agent_id, "s")
        assert [r.message for r in engine.store.messages.get_range(session.id, limit=10_000)] == sent
    found = json.loads(a.handle_tool_call("lcm_grep", {"query": "walrus"}))
    assert found["results"]
    assert not json.loads(a.handle_tool_call("lcm_grep", {"query": "narwhal"}))["results"]

    # Raw SQL with Alice's credentials: exactly her rows, nothing of Bob's, whatever the query.
    owned = {
        "lcm_sessions": "SELECT count(*) FILTER (WHERE agent_id = :a), count(*) FROM lcm_sessions",
        "lcm_messages": "SELECT count(*) FILTER (WHERE agent_id = :a), count(*) FROM lcm_messages",
        "lcm_summaries": "SELECT count(*) FILTER (WHERE agent_id = :a), count(*) FROM lcm_summaries",
        "lcm_generated": "SELECT count(*) FILTER (WHERE agent_id = :a), count(*) FROM lcm_generated",
        "lcm_summary_sources": "SELECT count(*) FILTER (WHERE s.agent_id = :a), count(*) FROM lcm_summary_sources e "
                               "JOIN lcm_summaries s ON s.id = e.summary_id",
        "lcm_system_prompts": "SELECT count(*) FILTER (WHERE s.agent_id = :a), count(*) FROM lcm_system_prompts p "
                              "JOIN lcm_sessions s ON s.id = p.session_id",
        "lcm_payloads": "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM lcm_messages m WHERE m.payload_id = p.id "
                        "AND m.agent_id = :a)), count(*) FROM lcm_payloads p",
    }
    owner = create_engine(db.resolve_url(pg_url), poolclass=NullPool)
    with owner.connect() as conn:
        alice_id, bob_id = (conn.execute(text("SELECT id FROM lcm_agents WHERE name = :n"), {"n": n}).scalar_one()
                            for n in (alice, bob))
        expected = {t: tuple(conn.execute(text(q), {"a": alice_id}).one()) for t, q in owned.items()}
    owner.dispose()
    for table in ("lcm_sessions", "lcm_messages", "lcm_summaries", "lcm_summary_sources", "lcm_payloads"):
        mine, everyone = expected[table]
        assert 0 < mine < everyone, (table, expected[table])  # both agents have rows of each kind
    with _raw(roles[alice]["url"]) as conn:
        for table, (mine, _) in expected.items():
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == mine, table
        assert conn.execute("SELECT count(*) FROM lcm_messages WHERE agent_id = %s", (bob_id,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM lcm_messages WHERE content LIKE '%%narwhal%%'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM lcm_messages WHERE content LIKE '%%walrus%%'").fetchone()[0] > 0
        assert conn.execute("SELECT array_agg(name) FROM lcm_agents").fetchone()[0] == [alice]
        assert conn.execute("UPDATE lcm_messages SET content = 'x' WHERE agent_id = %s", (bob_id,)).rowcount == 0
        assert conn.execute("DELETE FROM lcm_sessions WHERE agent_id = %s", (bob_id,)).rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # cannot write rows as Bob
            conn.execute("INSERT INTO lcm_generated (agent_id, digest, created_at) VALUES (%s, 'x', 0)", (bob_id,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # cannot take the walls down
            conn.execute("ALTER TABLE lcm_messages DISABLE ROW LEVEL SECURITY")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DROP POLICY lcm_agent_isolation ON lcm_messages")
        conn.execute("SET row_security = off")  # refuses instead of showing everything
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM lcm_messages").fetchone()


def test_a_role_used_for_another_agent_is_refused_with_what_to_do(secured):
    (alice, bob), roles = secured
    wrong = Store.open(roles[alice]["url"])
    with pytest.raises(AccessDeniedError, match="LCM_AGENT_ID"):
        wrong.sessions.get_or_create(bob, "s", platform="cli")


def test_the_same_large_text_stored_by_two_agents(secured):
    """Payloads are content-addressed and shared: the second agent claims the first's row by
    its hash (having the text), and each reads its own message back."""
    (alice, bob), roles = secured
    for agent in (alice, bob):
        engine = _engine(roles[agent]["url"], agent)
        engine.on_session_start("same", platform="cli")
        engine.on_turn_complete([SYSTEM, {"role": "user", "content": BIG}])
        assert engine.context.last_error is None, engine.context.last_error
        session = engine.store.sessions.find(agent, "same")
        assert engine.store.messages.get_range(session.id, limit=10)[0].message["content"] == BIG


def test_securing_is_idempotent_and_can_be_turned_off(secured, pg_url, lcm):
    (alice, _bob), roles = secured
    code, out, _ = lcm("db", "secure", "--per-agent-roles", "--url", pg_url, "--json", "--agent", alice)
    assert code == 0
    again = json.loads(out)["roles"][0]
    assert again["created"] is False and again["password"] is None  # the role is left as it was
    with _raw(roles[alice]["url"]) as conn:  # and its password still works
        assert conn.execute("SELECT current_user").fetchone()[0] == roles[alice]["role"]
    code, out, _ = lcm("db", "secure", "--per-agent-roles", "--off", "--url", pg_url, "--json")
    assert code == 0 and json.loads(out)["row_level_security"] is False


def test_sqlite_and_a_missing_flag_get_clear_errors(lcm, tmp_path):
    code, _, err = lcm("db", "secure", "--url", str(tmp_path / "x.db"))
    assert code == 1 and "--per-agent-roles" in err
    Store.open(str(tmp_path / "x.db"))
    code, _, err = lcm("db", "secure", "--per-agent-roles", "--url", str(tmp_path / "x.db"), "--agent", "a")
    assert code == 1 and "PostgreSQL" in err and "chmod" in err


def test_an_agent_role_forgets_its_own_session(secured, lcm):
    """`lcm forget` as an agent role erases that agent's rows (the shared-body caveat aside)."""
    (alice, bob), roles = secured
    for agent in (alice, bob):
        _live(_engine(roles[agent]["url"], agent), "s", 4, agent)
    code, out, err = lcm("forget", "--url", roles[alice]["url"], "--agent", alice, "--all-of-agent", "--yes",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["messages"] > 0
    a, b = Store.open(roles[alice]["url"]), Store.open(roles[bob]["url"])
    mine = a.sessions.find(alice, "s")
    assert mine is None or not a.messages.get_range(mine.id, limit=10_000)
    session = b.sessions.find(bob, "s")
    assert session is not None and len(b.messages.get_range(session.id, limit=10_000)) > 0
