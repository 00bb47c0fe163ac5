"""lcm inside the real host: hermes-agent 0.19.0 from PyPI, configured by ``lcm hermes install``,
talking to a scripted model on 127.0.0.1, one ``hermes chat -q ... --resume`` process per turn.

Proves, on SQLite (the database in the Hermes home) and on PostgreSQL (``--database-url``): the
lcm engine is the one in use (Hermes deep-copies plugin engines; a copy that fails silently
falls back to the built-in compressor), its tools reach the model, requests stay within the
window while the conversation grows far past it, a fact from the first turn comes back through
``lcm_grep`` + paged ``lcm_expand`` byte-exactly, every message is stored exactly once across
all those processes, and Hermes' own sanitizers find nothing to repair in ``compress()`` output.
"""

from __future__ import annotations

import json
import os
import random
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lcm.context.assembly import PREAMBLE
from lcm.messages import RECALL_OPEN, strip_recall_blocks
from lcm.store import Store
from lcm.transcript import SUMMARY_MARKER
from tests.support.conversation import sequence_problems
from tests.support.hermes_host import CONTEXT_LENGTH, HermesHome, ensure_venv
from tests.support.hermes_model import HermesModel, prompt_tokens, repeated_chars, wired

pytestmark = pytest.mark.slow

TURNS = 10
FACT = "Remember for later: the deploy fingerprint is FP-7Q2K-ALBATROSS, ticket OPS-4471."
QUESTION = "Quick one before the next log: which OPS ticket did I mention at the start?"
LCM_TOOLS = {"lcm_grep", "lcm_describe", "lcm_expand", "lcm_expand_query", "lcm_load_session",
             "lcm_status", "lcm_doctor"}


@pytest.fixture(scope="session")
def hermes_venv() -> Path:
    venv, why = ensure_venv()
    if venv is None:
        if os.environ.get("LCM_REQUIRE_HERMES"):
            pytest.fail(why)
        pytest.skip(f"Hermes end-to-end tests skipped: {why}")
    return venv


@pytest.fixture
def model():
    server = HermesModel()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(request) -> str | None:
    """None: lcm's default, ``lcm.db`` in the Hermes home; else a PostgreSQL schema URL."""
    return None if request.param == "sqlite" else request.getfixturevalue("pg_url")


def build_log(i: int, lines: int = 520) -> str:
    """A pasted build log of ~9,000 tokens (520 lines): four of them fill the 64k window's
    threshold."""
    rng = random.Random(i)
    return "\n".join(f"build {i} step {k}: compiled module m{rng.randint(1, 999)} in {rng.randint(1, 999)}ms "
                     f"hash {rng.getrandbits(48):012x}" for k in range(lines))


def key(message: dict[str, Any]) -> tuple:
    """A message as said: lcm's auto-recall block in the API copy of a user message is not part
    of it (lcm never stores it)."""
    calls = tuple(c["id"] for c in message.get("tool_calls") or [])
    content = message.get("content") or None
    if isinstance(content, str):
        content = strip_recall_blocks(content)
    return message.get("role"), content if isinstance(content, str) else json.dumps(content), calls, \
        message.get("tool_call_id")


def conversation_seen_by_model(model: HermesModel) -> list[dict[str, Any]]:
    """Every conversation message, in order: the union of what the turn requests carried (each
    new message appears first in the request after it was said), plus the model's last reply."""
    seen: dict[tuple, dict[str, Any]] = {}
    for body in model.turn_requests():
        for m in body["messages"]:
            if m.get("role") == "system" or SUMMARY_MARKER in str(m.get("content")):
                continue
            seen.setdefault(key(m), m)
    last = model.replies[-1]
    seen.setdefault(key(last), last)
    return list(seen.values())


def stored(home: HermesHome, database: str | None) -> tuple[Store, list[Any]]:
    store = Store.open(database or f"sqlite:///{home.home / 'lcm.db'}")
    [session] = store.sessions.of_agent("default")  # the profile name is the agent scope
    return store, store.messages.get_range(session.id)


def sanitizer_check(home: HermesHome, session_id: str) -> dict[str, Any]:
    """Inside Hermes' Python: its plugin loader, a deep copy, the persisted session, one more big
    turn through compress(), and Hermes' own repair/sanitize passes over the result."""
    code = textwrap.dedent(f"""
        import copy, json
        from hermes_cli.plugins import get_plugin_context_engine
        from agent.context_engine import ContextEngine
        from agent.agent_runtime_helpers import repair_message_sequence, sanitize_api_messages
        from hermes_constants import get_hermes_home
        from hermes_state import SessionDB
        registered = get_plugin_context_engine()
        engine = copy.deepcopy(registered)
        engine.update_model("scripted-model", {CONTEXT_LENGTH})
        engine.on_session_start({session_id!r}, hermes_home=str(get_hermes_home()), platform="cli")
        clone, copied = engine.clone_for_agent(), copy.deepcopy(engine)  # with the database open
        history = SessionDB().get_messages_as_conversation({session_id!r})
        msgs = [{{"role": "system", "content": "You are Hermes Agent."}}, *history,
                {{"role": "user", "content": "one more log " + "x y z " * 9000}}]
        out = engine.compress(msgs, current_tokens=60000)
        snapshot = json.dumps(out, sort_keys=True)
        repairs = repair_message_sequence(None, out)
        sanitized = sanitize_api_messages(out)
        print(json.dumps({{
            "is_context_engine": isinstance(engine, ContextEngine), "name": engine.name,
            "copies_independent": clone.context.current is None and copied.context.current is None
                                  and clone.store is engine.store,
            "compacted": len(out) < len(msgs), "repairs": repairs,
            "unchanged_by_repair": json.dumps(out, sort_keys=True) == snapshot,
            "unchanged_by_sanitize": json.dumps(sanitized, sort_keys=True) == snapshot}}))
    """)
    done = home.python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_constructing_and_copying_the_plugin_engine_does_no_io(hermes_venv, tmp_path, model):
    home = HermesHome(hermes_venv, tmp_path / "hermes", model.url)
    home.configure()
    home.install_lcm()
    listed = home.run("hermes", "plugins", "list", "--plain")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^enabled\s+user\s+\S+\s+lcm$", listed.stdout, re.M), listed.stdout
    done = home.python(textwrap.dedent("""
        import copy, json, os
        from hermes_cli.plugins import get_plugin_context_engine
        from agent.context_engine import ContextEngine
        engine = get_plugin_context_engine()
        copies = [copy.deepcopy(engine), engine.clone_for_agent()]
        db = os.path.join(os.environ["HERMES_HOME"], "lcm.db")
        before = os.path.exists(db)
        copies[0].on_session_start("s1", hermes_home=os.environ["HERMES_HOME"], platform="cli")
        again = copy.deepcopy(copies[0])
        print(json.dumps({"name": engine.name, "abc": isinstance(engine, ContextEngine),
                          "db_before": before, "db_after": os.path.exists(db),
                          "copy_has_no_session": again.context.current is None,
                          "tools": sorted(t["name"] for t in again.get_tool_schemas())}))
    """))
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts == {"name": "lcm", "abc": True, "db_before": False, "db_after": True,
                     "copy_has_no_session": True, "tools": sorted(LCM_TOOLS)}


def test_a_long_hermes_conversation_through_lcm(hermes_venv, database, tmp_path, model):
    home = HermesHome(hermes_venv, tmp_path / "hermes", model.url)
    home.configure()
    report = home.install_lcm(*(["--database-url", database] if database else []))
    assert report["changed"] and report["warnings"] == []
    assert "postgresql" in report["database"] if database else report["database"] == str(home.home / "lcm.db")

    session_id = None
    prompts: list[str] = []
    series: list[dict[str, Any]] = []
    for i in range(TURNS):
        prompt = (FACT + "\n" if i == 0 else "") + f"Build log {i}:\n" + build_log(i)
        prompts.append(prompt)
        summaries_before = sum(1 for b in model.requests if model.kind(b) == "summary")
        turn = home.chat(prompt, resume=session_id)
        assert turn.returncode == 0, turn.stderr[-3000:]
        session_id = turn.session_id or session_id
        request = model.turn_requests()[-1]
        conversation = [m for m in conversation_seen_by_model(model)]
        raw = prompt_tokens({"messages": [request["messages"][0], *conversation[:-1]], "tools": request["tools"]})
        series.append({"turn": i, "raw_tokens": raw, "request_tokens": prompt_tokens(request),
                       "compacted_before": sum(1 for b in model.requests
                                               if model.kind(b) == "summary") > summaries_before,
                       "messages_sent": len(request["messages"])})
    # Auto-recall: a plain question late in the conversation brings the first turn's fact into
    # the request itself (the API copy of the user message), with no tool call.
    calls_before = len(model.turn_requests())
    asked = home.chat(QUESTION, resume=session_id)
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert len(model.turn_requests()) == calls_before + 1 and not model.replies[-1].get("tool_calls")
    question_request = model.turn_requests()[-1]["messages"]
    sent = question_request[-1]["content"]
    assert question_request[-1]["role"] == "user" and sent.startswith(QUESTION + "\n\n" + RECALL_OPEN)
    assert FACT in sent.split(RECALL_OPEN, 1)[1] and FACT not in json.dumps(question_request[1:-1])
    recall = home.chat("RECALL deploy fingerprint", resume=session_id)
    assert recall.returncode == 0, recall.stderr[-3000:]
    print("\nrequest size per turn (tokens ~ chars/4):\n" + "\n".join(json.dumps(s) for s in series))
    (tmp_path / "series.json").write_text(json.dumps(series, indent=1))

    # The lcm engine is in use (not Hermes' fallback compressor), with its tools offered.
    for body in model.turn_requests():
        assert LCM_TOOLS <= {t["function"]["name"] for t in body["tools"]}
    log = (home.home / "logs" / "agent.log").read_text(encoding="utf-8", errors="replace")
    assert "registered context engine: lcm" in log
    assert "falling back to built-in compressor" not in log and "could not be safely copied" not in log

    # Requests stay in the window while the conversation grows far past it; each compaction
    # (lcm summaries requested through Hermes' auxiliary client) made the next request smaller
    # than the transcript it replaced.
    assert series[-1]["raw_tokens"] > 1.5 * CONTEXT_LENGTH
    assert all(s["request_tokens"] < CONTEXT_LENGTH for s in series)
    compactions = [s for s in series if s["compacted_before"]]
    assert len(compactions) >= 3
    assert all(s["request_tokens"] < s["raw_tokens"] for s in compactions)
    after_first = [b for b in model.turn_requests()[series.index(compactions[0]):]]
    assert all(SUMMARY_MARKER in json.dumps(b["messages"], ensure_ascii=False) for b in after_first)
    assert all(not sequence_problems(b["messages"], b["messages"][0]) for b in model.turn_requests())

    # The first turn's fact, long compacted away, came back through lcm_grep and paged lcm_expand.
    final = model.turn_requests()[-1]["messages"]
    calls = [c["function"]["name"] for m in final if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    assert calls[0] == "lcm_grep" and set(calls[1:]) == {"lcm_expand"} and len(calls) >= 3  # paged
    answer = model.replies[-1]["content"]
    assert answer.startswith("RECALLED store_id=") and answer.split(": ", 1)[1] == prompts[0]  # byte-exact
    assert FACT in recall.stdout

    # Every message of the conversation is stored exactly once, across all those processes.
    store, messages = stored(home, database)
    expected = conversation_seen_by_model(model)
    assert [key(r.message) for r in messages] == [key(m) for m in expected]
    assert [r.message["content"] for r in messages if r.role == "user"] == [*prompts, QUESTION,
                                                                             "RECALL deploy fingerprint"]
    assert not any(RECALL_OPEN in json.dumps(r.message) for r in messages)  # the block is never stored
    summaries = store.summaries.of_session(messages[0].session_pk, depth=0, limit=100)
    assert summaries and all(s.kind.startswith("llm") for s in summaries)  # via Hermes' aux client

    # One more process resumes the session and adds exactly its own turn.
    more = home.chat("short follow-up: thanks", resume=session_id)
    assert more.returncode == 0, more.stderr[-3000:]
    _, after = stored(home, database)
    assert len(after) == len(messages) + 2 and after[-2].message["content"] == "short follow-up: thanks"

    # Hermes' own sanitizers find nothing to repair in what compress() returns.
    check = sanitizer_check(home, more.session_id or session_id)
    assert check == {"is_context_engine": True, "name": "lcm", "copies_independent": True, "compacted": True,
                     "repairs": 0, "unchanged_by_repair": True, "unchanged_by_sanitize": True}


CACHE_TURNS = 26


def test_hermes_requests_only_grow_at_their_end_between_compactions(hermes_venv, tmp_path, model):
    """Issue 20, measured the way it was found: the real Hermes drives lcm for 26 turns of
    ~3,500 tokens on a 64k window, one process per turn, and the model's request log is compared
    request by request. Compaction comes in bursts (at most one per 4 turns); between them each
    request is the previous one plus the new turn, byte for byte; the system prompt stays first
    and is stored once; lcm_status reports the cache-read share the provider sent."""
    home = HermesHome(hermes_venv, tmp_path / "hermes", model.url)
    home.configure()
    home.install_lcm()
    session_id = None
    compacted_before: list[bool] = []
    for i in range(CACHE_TURNS):
        summaries_before = sum(1 for b in model.requests if model.kind(b) == "summary")
        turn = home.chat(f"Build log {i}:\n" + build_log(i, lines=200), resume=session_id)
        assert turn.returncode == 0, turn.stderr[-3000:]
        session_id = turn.session_id or session_id
        compacted_before.append(sum(1 for b in model.requests if model.kind(b) == "summary") > summaries_before)
    requests = model.turn_requests()
    assert len(requests) == CACHE_TURNS  # one model call a turn: no tool rounds

    bursts = [i for i, c in enumerate(compacted_before) if c]
    assert len(bursts) >= 2, f"compactions before turns {bursts}: the run must reach steady state"
    assert min(b - a for a, b in zip(bursts, bursts[1:], strict=False)) >= 4, bursts
    shares, total = [], 0
    for i in range(1, CACHE_TURNS):
        before, now = wired(requests[i - 1]), wired(requests[i])
        assert now[0] == before[0] and requests[i]["messages"][0]["role"] == "system"  # the system prompt stays
        shares.append(repeated_chars(before, now))
        if not compacted_before[i]:  # append-only: the previous request, then the new messages
            assert now[:len(before)] == before, f"turn {i} rewrote the prompt without compacting"
        elif i > bursts[0]:  # a later burst keeps the system prompt and the summary message's front
            assert SUMMARY_MARKER in now[1] and shares[-1] > len(now[0]) + len(PREAMBLE), i
        total += sum(len(m) for m in now)
    repeated = sum(shares) / total
    print(f"\nrepeated prefix {repeated:.1%}, compactions before turns {bursts}; per turn: "
          + " ".join(f"{shares[i - 1] / sum(len(m) for m in wired(requests[i])):.0%}" for i in range(1, CACHE_TURNS)))
    # Each turn here adds ~3,500 tokens to a prompt of 10-45k, so even a perfect engine repeats
    # at most ~88% of a request; the benchmark (docs/benchmarks.md) measures realistic sizes.
    assert repeated >= 0.75

    # The system prompt Hermes sent is stored once, not as a message.
    store = Store.open(f"sqlite:///{home.home / 'lcm.db'}")
    [session] = store.sessions.of_agent("default")
    [kept] = store.sessions.system_prompts(session.id)
    assert kept.message == requests[-1]["messages"][0] and kept.first_seq == 1
    assert all(r.role != "system" for r in store.messages.get_range(session.id))

    # lcm_status, asked by the model, shows what the provider reported about its cache.
    status = home.chat("STATUS", resume=session_id)
    assert status.returncode == 0 and "STATUS OK" in status.stdout, status.stderr[-3000:]
    report = json.loads(model.turn_requests()[-1]["messages"][-1]["content"])
    assert report["cache"]["requests_reporting_cache"] >= 1 and report["cache"]["cache_read_share"] > 0.5
    assert report["system_prompt"]["versions"] == 1 and report["system_prompt"]["digest"] == kept.digest
    assert report["target_tokens"] < report["threshold_tokens"]
