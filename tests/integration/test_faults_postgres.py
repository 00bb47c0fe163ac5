"""PostgreSQL going away under a running host (issue 13.5 and the fault suite): a restart
mid-session, an outage across several turns, and an outage at session start. A private
cluster (initdb + pg_ctl on a free port) plays the server; the shared test server is never
touched.
"""

from __future__ import annotations

import json

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from tests.support.conversation import SYSTEM, conversation
from tests.support.pg_cluster import Cluster, cannot_run_a_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def cluster():
    why = cannot_run_a_cluster()
    if why:
        pytest.skip(why)
    c = Cluster()
    try:
        Store.open(c.url, upgrade=True)
        yield c
    finally:
        from lcm.store import connection as db

        db.dispose(db.resolve_url(c.url))
        c.close()


def _engine(url: str) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url))
    engine.update_model("test-model", 10_000_000)
    return engine


def _stored(engine: LcmEngine, key: str) -> list[dict]:
    session = engine.store.sessions.find(engine.agent_id, key)
    return [r.message for r in engine.store.messages.get_range(session.id, limit=10_000)] if session else []


def test_a_restart_and_an_outage_mid_session_lose_and_duplicate_nothing(cluster):
    engine = _engine(cluster.url)
    engine.on_session_start("s")
    transcript = [SYSTEM]
    for i in range(12):
        transcript = transcript + conversation(i + 1)[len(transcript) - 1:]
        if i == 4:
            cluster.restart()  # the pool's connections die under the engine
        if i == 7:
            cluster.stop()
        if i in (7, 8):  # the server is down: the turn is not stored, nothing raises
            engine.on_turn_complete(transcript)
            grep = json.loads(engine.handle_tool_call("lcm_grep", {"query": "fact1"}))
            assert "unavailable" in grep["error"] and "inside lcm" not in grep["error"]
            continue
        if i == 9:
            cluster.start()
        engine.on_turn_complete(transcript)
    assert _stored(engine, "s") == transcript[1:]
    doctor = json.loads(engine.handle_tool_call("lcm_doctor", {}))
    assert doctor["overall"] == "healthy", doctor


def test_an_outage_at_session_start_files_nothing_under_another_session(cluster):
    """Issue 13.5 with a real server: all 120 messages of a run used to land in "default"."""
    cluster.stop()
    engine = _engine(cluster.url)
    engine.on_session_start("intended", platform="cli")  # fails: the server is down
    transcript = [SYSTEM, *conversation(3)]
    engine.on_turn_complete(transcript)
    cluster.start()
    transcript = transcript + conversation(6)[len(transcript) - 1:]
    engine.on_turn_complete(transcript)
    assert engine.store.sessions.find(engine.agent_id, "default") is None
    assert _stored(engine, "intended") == transcript[1:]
