"""A streaming read replica (``LCM_DATABASE_READ_URL`` / ``--read-url``) against real servers: a
private primary and a replica made from it with ``pg_basebackup -R``, both on free loopback
ports. Lag-tolerant reads (search, expand, describe, exports, the explorer) go to the replica;
this process's own writes are never missing from them (the replica must have replayed them, else
the read goes to the primary); a replica that lags, is stopped mid-run or comes back costs a
fallback, never an error."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from lcm.store import Store
from lcm.store import connection as db
from lcm.store import replica as replica_mod
from tests.support.pg_cluster import Cluster, cannot_run_a_cluster
from tests.support.storing import append_messages
from tests.support.ui_server import serving

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

AGENT = "fleet-7"


@pytest.fixture(scope="module")
def servers():
    why = cannot_run_a_cluster()
    if why:
        pytest.skip(why)
    primary = Cluster()
    replica = None
    try:
        Store.open(primary.url, upgrade=True)
        replica = Cluster(replica_of=primary)
        yield primary, replica
    finally:
        for c in (replica, primary):
            if c is not None:
                db.dispose(db.resolve_url(c.url))
                c.close()


@pytest.fixture
def store(servers, monkeypatch):
    monkeypatch.setattr(replica_mod, "RETRY_S", 0.3)
    primary, replica = servers
    s = Store.open(primary.url, read_url=replica.url)
    yield s
    with db.replica_engine(db.resolve_url(replica.url)).connect() as conn:
        conn.execute(text("SELECT pg_wal_replay_resume()"))


def _say(store: Store, session_key: str, words: str) -> int:
    session = store.sessions.get_or_create(AGENT, session_key)
    result = append_messages(store, session.id, [{"role": "user", "content": words},
                                                 {"role": "assistant", "content": f"noted: {words}"}],
                             after_identity=store.messages.tail(session.id, 1)[-1].identity
                             if session.last_seq else None)
    return result.inserted


def _found(store: Store, word: str) -> bool:
    return any(word in h.snippet for h in store.search.messages(word, agent=AGENT).hits)


def _wait_until_replayed(store: Store, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        before = store.replica_state()["reads"]
        store.sessions.agents()
        if store.replica_state()["reads"] > before:
            return
        time.sleep(0.05)
    raise AssertionError(f"the replica did not catch up: {store.replica_state()}")


def test_searches_go_to_the_replica_and_never_miss_this_process_s_own_writes(store):
    for i in range(25):
        word = f"zqown{i}x"
        assert _say(store, "s-own", f"the build fingerprint is {word}") == 2
        assert _found(store, word)  # at once: from the replica if it has replayed it, else the primary
    _wait_until_replayed(store)
    served = store.replica_state()["reads"]
    assert _found(store, "zqown0x")
    assert store.replica_state()["reads"] > served  # that search was the replica's
    message = store.search.messages("zqown3x", agent=AGENT).hits[0]
    assert store.messages.get(message.id, agent=AGENT).message["content"].endswith("zqown3x")


def test_a_replica_that_lags_costs_a_fallback_never_a_missing_message(store, servers):
    _, replica = servers
    _wait_until_replayed(store)
    with db.replica_engine(db.resolve_url(replica.url)).connect() as conn:
        conn.execute(text("SELECT pg_wal_replay_pause()"))
    before = store.replica_state()["fallbacks"]
    _say(store, "s-lag", "written while the replica is paused zqpaused1")
    assert _found(store, "zqpaused1")  # the replica has not replayed it: the primary answers
    state = store.replica_state()
    assert state["fallbacks"] > before and "behind" in state["last_problem"]
    with db.replica_engine(db.resolve_url(replica.url)).connect() as conn:
        conn.execute(text("SELECT pg_wal_replay_resume()"))
    _wait_until_replayed(store)
    assert _found(store, "zqpaused1")


def test_a_replica_stopped_mid_run_and_restarted_costs_fallbacks_never_errors(store, servers):
    _, replica = servers
    _say(store, "s-stop", "before the stop zqstop0")
    _wait_until_replayed(store)
    replica.stop()
    try:
        for i in range(1, 6):  # a live agent keeps writing and searching
            _say(store, "s-stop", f"while the replica is down zqstop{i}")
            assert _found(store, f"zqstop{i}") and _found(store, "zqstop0")
        state = store.replica_state()
        assert "unreachable" in state["last_problem"]
    finally:
        replica.start()
    time.sleep(replica_mod.RETRY_S + 0.1)
    _wait_until_replayed(store)  # back in use once it answers and has caught up
    assert _found(store, "zqstop5")


def test_a_read_that_fails_part_way_on_the_replica_runs_again_on_the_primary(store, servers):
    _, replica = servers
    _say(store, "s-drop", "a fact for the dropped read zqdrop1")
    # Stemmed now, not by the search: a search that stems first has written since the replica
    # replayed, and goes to the primary without trying the replica (as it should).
    store.search.catch_up()
    _wait_until_replayed(store)
    engine = db.replica_engine(db.resolve_url(replica.url))
    failed = []

    def drop_the_search(conn, cursor, statement, *_args) -> None:
        if "lcm_messages" in statement and not failed:
            failed.append(statement)
            raise OperationalError(statement, {}, Exception("server closed the connection unexpectedly"))

    event.listen(engine, "before_cursor_execute", drop_the_search)
    try:
        before = store.replica_state()["fallbacks"]
        assert _found(store, "zqdrop1")  # answered, by the primary
    finally:
        event.remove(engine, "before_cursor_execute", drop_the_search)
    assert failed and store.replica_state()["fallbacks"] > before


def test_the_command_line_and_the_explorer_take_a_read_url(servers, lcm, monkeypatch):
    primary, replica = servers
    store = Store.open(primary.url)
    _say(store, "s-cli", "a fact for the command line zqcli1")
    code, out, err = lcm("grep", "zqcli1", "--url", primary.url, "--read-url", replica.url, "--agent", AGENT, "--json")
    assert code == 0, err
    assert json.loads(out)["results"]
    code, out, err = lcm("status", "--url", primary.url, "--read-url", replica.url, "--json")
    assert code == 0, err
    assert json.loads(out)["read_replica"]["url"].endswith(f":{replica.port}/postgres")
    monkeypatch.setenv("LCM_DATABASE_READ_URL", replica.url)  # the variable does the same
    code, out, _ = lcm("export", "--url", primary.url, "--agent", AGENT, "--session", "s-cli")
    assert code == 0 and "zqcli1" in out

    explorer = Store.open(primary.url, read_only=True, read_url=replica.url)
    _wait_until_replayed(explorer)
    with serving(explorer) as base:
        before = explorer.replica_state()["reads"]
        page = httpx.get(f"{base}/a/{AGENT}/s/s-cli", params={"format": "json"}).json()
        assert any("zqcli1" in str(m) for m in page["messages"])
        assert explorer.replica_state()["reads"] > before  # the explorer read the replica


def test_a_read_url_for_a_sqlite_store_is_refused_with_what_to_do(sqlite_url, servers):
    with pytest.raises(Exception, match="serves a PostgreSQL store"):
        Store.open(sqlite_url, read_url=servers[1].url)
