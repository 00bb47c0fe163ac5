"""``lcm forget``: what is forgotten is gone from every table, index, vector and summary (and,
with --vacuum, from the SQLite file's bytes), on both backends; what remains satisfies every
invariant the doctor checks, is summarized again, and keeps working."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.prepare import decompress_payload
from lcm.store import Store
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, host_step, turn
from tests.support.llm_server import completion
from tests.support.storing import append_messages

WORD = "zanzibarquux"  # one token, in no other text
SECRET = f"the staging password is {WORD}, keep it safe"


def engine_on(url: str, **kw: Any) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, **{**SMALL_ENGINE, **kw}))
    engine.update_model("test-model", 3000)
    return engine


def build(url: str, llm: Any) -> LcmEngine:
    """A compacted session with the secret in one turn; the summarizer (an LLM on 127.0.0.1)
    repeats it in the summary of that turn, as a model would."""
    llm.handler = lambda body: completion(
        f"- the user asked for work{'; the password is ' + WORD if WORD in json.dumps(body) else ''}")
    Store.open(url, upgrade=True)
    engine = engine_on(url, new_session_retain_depth=-1, summary_base_url=llm.url, summary_model="summarizer")
    engine.on_session_start("s1", platform="cli")
    transcript: list[dict[str, Any]] = [SYSTEM]
    turns = [turn(0), [{"role": "user", "content": SECRET}, {"role": "assistant", "content": f"Noted: {WORD}."}],
             *(turn(i) for i in range(1, 30))]
    for new in turns:
        transcript = host_step(engine, transcript, new)
    engine.on_session_reset()
    engine.on_session_start("s2", platform="cli")
    host_step(engine, [SYSTEM], turn(99))
    store = engine.store
    for kind in ("message", "summary"):
        items = store.vectors.pending("test:m", kind=kind, limit=5000)
        store.vectors.put("test:m", items, np.eye(len(items), 8, dtype=np.float32) if items else np.zeros((0, 8)))
    return engine


def raw_traces(store: Store) -> dict[str, int]:
    """Every place the word could survive, read straight from the tables and indexes."""
    like = f"%{WORD}%"
    with store.engine.connect() as conn:
        q = lambda sql: conn.execute(text(sql), {"w": like}).scalar()  # noqa: E731
        out = {
            "messages": q("SELECT count(*) FROM lcm_messages WHERE content LIKE :w OR search_text LIKE :w "
                          "OR tool_calls LIKE :w"),
            "summaries": q("SELECT count(*) FROM lcm_summaries WHERE content LIKE :w OR search_text LIKE :w"),
            "system_prompts": q("SELECT count(*) FROM lcm_system_prompts WHERE message LIKE :w"),
            "payloads": sum(WORD in decompress_payload(r[0])
                            for r in conn.execute(text("SELECT data FROM lcm_payloads"))),
            "orphan_vectors": q(
                "SELECT count(*) FROM lcm_vectors v WHERE (v.message_id IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM lcm_messages m WHERE m.id = v.message_id)) OR (v.summary_id IS NOT NULL "
                "AND NOT EXISTS (SELECT 1 FROM lcm_summaries s WHERE s.id = v.summary_id))"),
        }
        if store.backend_name == "sqlite":
            for table in ("lcm_messages_fts", "lcm_summaries_fts", "lcm_messages_stems", "lcm_summaries_stems"):
                conn.execute(text(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.v_{table} "
                                  f"USING fts5vocab(main, {table}, 'row')"))
                out[table] = conn.execute(text(f"SELECT count(*) FROM temp.v_{table} WHERE term LIKE :w"),
                                          {"w": f"{WORD[:8]}%"}).scalar()
        else:
            out["search_vector"] = q("SELECT count(*) FROM lcm_messages WHERE search_vector::text LIKE :w")
            out["message_stems"] = q("SELECT count(*) FROM lcm_message_stems WHERE search_stems::text LIKE :w")
            out["summary_vectors"] = q("SELECT count(*) FROM lcm_summaries WHERE search_vector::text LIKE :w "
                                       "OR search_stems::text LIKE :w")
    return out


def test_forgetting_a_secret_erases_it_everywhere_and_rebuilds_the_dag(db_url, lcm, llm):
    engine = build(db_url, llm)
    store = engine.store
    if store.background is not None:  # PostgreSQL stems stored messages on a thread: let it finish first
        store.background.wait_idle()
    before = raw_traces(store)
    assert before["messages"] >= 2 and before["summaries"] >= 1  # in the messages and a summary of them
    s1 = store.sessions.find(engine.agent_id, "s1")

    code, out, err = lcm("forget", "--url", db_url, "--match", WORD.upper(), "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["erased"] is False and plan["messages"] == 2 and plan["summaries"] >= 1
    assert raw_traces(store) == before  # a dry run changes nothing
    code, out, err = lcm("forget", "--url", db_url, "--match", WORD, "--json")
    assert code == 1 and "--yes" in err  # never without saying so
    assert raw_traces(store) == before

    code, out, err = lcm("forget", "--url", db_url, "--match", WORD, "--yes", "--vacuum", "--json")
    assert code == 0, err
    done = json.loads(out)
    assert done["erased"] and done["messages"] == 2 and done["summaries_rebuilt"]["s1"] > 0
    assert not any(raw_traces(store).values()), raw_traces(store)
    if store.backend_name == "sqlite":  # not even a free page or the WAL keeps the bytes
        path = Path(store.location)
        for f in (path, path.with_name(path.name + "-wal")):
            assert not f.exists() or WORD.encode() not in f.read_bytes(), f

    # What remains is whole: gapless, covered, counted, searchable, and the DAG summarizes it.
    checks = {c.name: c for c in store.health.checks(deep=True)}
    assert not [c for c in checks.values() if c.status == "fail"], checks
    after = store.sessions.find(engine.agent_id, "s1")
    assert after.message_count == after.last_seq == s1.message_count - 2
    assert [m.seq for m in store.messages.get_range(after.id)] == list(range(1, after.last_seq + 1))
    assert after.covered_seq > 0 and after.summary_count > 0
    assert store.search.messages(WORD, agent=engine.agent_id).hits == []
    assert store.search.messages("Request 5", agent=engine.agent_id).hits  # the rest is still found
    # The agent carries on in the same session.
    engine2 = engine_on(db_url)
    engine2.on_session_start("s2")
    host_step(engine2, [SYSTEM, *turn(99)], turn(100))
    assert json.loads(engine2.handle_tool_call("lcm_grep", {"query": WORD, "session_scope": "all"}))["results"] == []


def test_forgetting_a_session_or_a_time_range(store, session, lcm, db_url):
    other = store.sessions.get_or_create("agent-a", "other")
    append_messages(store, session.id, [{"role": "user", "content": f"m{i}"} for i in range(6)],
                    timestamps=[1000.0 + i for i in range(6)])
    append_messages(store, other.id, [{"role": "user", "content": "kept"}], timestamps=[1002.0])
    code, out, err = lcm("forget", "--url", db_url, "--agent", "agent-a", "--session", "session-1",
                         "--since", "1001", "--until", "1003", "--yes", "--json")
    assert code == 0, err
    assert json.loads(out)["messages"] == 3
    assert [m.message["content"] for m in store.messages.get_range(session.id)] == ["m0", "m4", "m5"]
    assert [m.seq for m in store.messages.get_range(session.id)] == [1, 2, 3]
    assert [m.message["content"] for m in store.messages.get_range(other.id)] == ["kept"]  # another session
    code, out, err = lcm("forget", "--url", db_url, "--agent", "agent-a", "--session", "session-1", "--yes",
                         "--json")
    assert code == 0 and json.loads(out)["messages"] == 3
    assert store.sessions.get(session.id).message_count == 0
    assert not [c for c in store.health.checks(deep=True) if c.status == "fail"]


@pytest.mark.parametrize(("args", "says"), [
    ((), "say what to forget"),
    (("--match", "a", "--regex", "b"), "not both"),
    (("--regex", "(unclosed"), "not a valid regular expression"),
    (("--session", "nope"), "no session nope"),
])
def test_forget_refuses_what_it_cannot_do_exactly(store, session, lcm, db_url, args, says):
    code, _, err = lcm("forget", "--url", db_url, "--agent", "agent-a", *args, "--yes")
    assert code == 1 and says in err, err


def test_forget_takes_times_in_words_and_refuses_others_in_option_words(store, session, lcm, db_url):
    code, _, err = lcm("forget", "--url", db_url, "--agent", "agent-a", "--until", "someday", "--yes")
    assert code == 2 and "Invalid value for '--until'" in err and "yesterday" in err
    code, out, err = lcm("forget", "--url", db_url, "--agent", "agent-a", "--since", "2026-01-01", "--until", "1d",
                         "--dry-run", "--json")
    assert code == 0, err


def test_forget_names_sessions_by_key_or_alias_and_reports_every_unknown_one(store, session, lcm, db_url):
    store.sessions.alias("agent-a", "session-1-rotated", session.id)
    append_messages(store, session.id, [{"role": "user", "content": "m0"}])
    code, _, err = lcm("forget", "--url", db_url, "--agent", "agent-a", "--session", "session-1-rotated",
                       "--session", "typo", "--yes")
    assert code == 1 and "no session typo" in err  # the alias is known, the typo is not
    code, out, err = lcm("forget", "--url", db_url, "--agent", "agent-a", "--session", "session-1-rotated",
                         "--dry-run", "--json")
    assert code == 0 and json.loads(out)["sessions"][0]["session_id"] == "session-1", err
