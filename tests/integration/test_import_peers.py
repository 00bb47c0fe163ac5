"""``lcm import hermes-lcm`` and ``lcm import lossless-claw`` against real stores those programs
wrote (the peer-stores fixtures, README there): every message byte-exact and in the
program's order, tool calls paired with their results, the programs' summaries placed into lcm's
DAG (a leaf that split a tool call from its result moved back), provenance kept; idempotent, a
dry run writes nothing, a file of another format is refused before any write; afterwards the
history works like native history (grep, expand, doctor --deep, export -> ingest). Both backends.

The fixtures' folder comes from ``LCM_PEER_STORES_DIR`` (``.ci/run`` sets it when the shared
fixtures are beside the checkout); without it these tests skip, saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from lcm.store import Store

FIXTURES = os.environ.get("LCM_PEER_STORES_DIR")
pytestmark = pytest.mark.skipif(
    not FIXTURES or not Path(FIXTURES, "hermes-lcm.db").is_file(),
    reason="peer-store importer tests skipped: LCM_PEER_STORES_DIR is not set to the peer-stores fixtures "
           "(.ci/run sets it when the shared peer-stores fixtures are beside the checkout)")

SESSIONS = ("20250514_091200_a1b2c3", "20250516_184000_d4e5f6")


def fixture(name: str) -> Path:
    return Path(FIXTURES or ".", name)


def expected(program: str) -> dict[str, Any]:
    return json.loads(fixture(f"{program}.expected.json").read_text(encoding="utf-8"))


@pytest.fixture
def copies(tmp_path) -> dict[str, Path]:
    """The stores copied to a private folder (the import must not change them: checked byte for byte)."""
    out = {}
    for program in ("hermes-lcm", "lossless-claw"):
        out[program] = tmp_path / f"{program}.db"
        shutil.copyfile(fixture(f"{program}.db"), out[program])
    return out


def _calls(message: dict[str, Any]) -> list[tuple[str, str, str]] | None:
    calls = message.get("tool_calls")
    if not calls:
        return None
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]


def _stored(store: Store, agent: str, key: str):
    session = store.sessions.find(agent, key)
    assert session is not None, f"{agent}/{key} was not imported"
    return session, store.messages.get_range(session.id)


def _assert_clean_boundaries(store: Store, session, records) -> None:
    """No leaf ends between a tool call and its result, and the verbatim part does not start
    with a result: every tool result sits on the same side of a summary as its call."""
    by_seq = {r.seq: r for r in records}
    leaves = store.summaries.of_session(session.id, depth=0, limit=1000)
    for leaf in leaves:
        after = by_seq.get(leaf.last_seq + 1)
        assert after is None or after.message["role"] != "tool", (leaf.id, leaf.meta)
    covered = max((leaf.last_seq for leaf in leaves), default=0)
    assert session.covered_seq == covered
    first_raw = by_seq.get(covered + 1)
    assert first_raw is None or first_raw.message["role"] != "tool"


def _import(lcm, copies: dict[str, Path], program: str, db_url: str) -> dict[str, Any]:
    """``lcm import PROGRAM`` of the copy into a fresh store: its report; the file only read."""
    before = copies[program].read_bytes()
    Store.open(db_url, upgrade=True)
    code, out, err = lcm("import", program, str(copies[program]), "--url", db_url, "--json")
    assert code == 0, err
    assert copies[program].read_bytes() == before
    return json.loads(out)


def test_hermes_lcm_store_comes_in_exactly(copies, db_url, lcm):
    want = expected("hermes-lcm")
    report = _import(lcm, copies, "hermes-lcm", db_url)
    assert report["messages_added"] == 88  # 90 rows less the two system prompts
    assert [(r["agent"], r["session_id"], r["summaries"]["placed"], r["summaries"]["notes"])
            for r in report["sessions"]] == [("default", SESSIONS[0], 9, 0), ("default", SESSIONS[1], 2, 0)]

    store = Store.open(db_url)
    for session_want in want["sessions"]:
        session, records = _stored(store, "default", session_want["session_id"])
        rows = session_want["messages"]
        assert rows[0]["role"] == "system"
        [prompt] = store.sessions.system_prompts(session.id)
        assert prompt.message == {"role": "system", "content": rows[0]["content"]}
        rows = rows[1:]
        assert len(records) == len(rows)
        for record, row in zip(records, rows, strict=True):
            message = record.message
            assert message["role"] == row["role"]
            assert message["content"] == row["content"]  # byte-exact: U+2028, CRLF, NFD, the 20,000 characters
            assert message.get("tool_call_id") == row["tool_call_id"]
            assert _calls(message) == ([(c["id"], c["name"], c["arguments"]) for c in row["tool_calls"]]
                                       if row["tool_calls"] else None)
            assert record.ts == pytest.approx(row["timestamp"])
        assert session.platform == session_want["source"]
        assert session.origin["format"] == "hermes-lcm" and session.origin["id"] == session.session_key
        _assert_clean_boundaries(store, session, records)

    # The DAG: every node placed, with the program's text; node 4 and 8 condense 1-3 and 5-7.
    first, records = _stored(store, "default", SESSIONS[0])
    nodes = {n.meta["imported"]["id"]: n for d in (0, 1) for n in store.summaries.of_session(first.id, depth=d)}
    want_nodes = {f"node:{n['node_id']}": n for n in want["summary_nodes"] if n["session_id"] == SESSIONS[0]}
    assert set(nodes) == set(want_nodes)
    for peer_id, node in nodes.items():
        assert node.content == want_nodes[peer_id]["summary"] and node.kind == "imported"
        assert node.depth == want_nodes[peer_id]["depth"]
    assert [nodes[f"node:{i}"].id for i in (1, 2, 3)] == store.summaries.source_ids(nodes["node:4"].id)
    assert [nodes[f"node:{i}"].id for i in (5, 6, 7)] == store.summaries.source_ids(nodes["node:8"].id)
    # Leaf 9 ended with the `git push` call (store_id 48) whose result (49) hermes-lcm left raw: the
    # leaf moves back to end before the call, which opens the verbatim part with its result.
    leaf9 = nodes["node:9"]
    assert leaf9.meta["imported"]["moved_from"]["why"]
    covered = store.messages.get_many(store.summaries.source_ids(leaf9.id), agent="default")
    assert covered[-1].message["role"] != "assistant" or not covered[-1].message.get("tool_calls")
    call = next(r for r in records if r.seq == leaf9.last_seq + 1)
    assert call.message["role"] == "assistant" and call.message["tool_calls"][0]["function"]["name"]

    code, out, _ = lcm("import", "hermes-lcm", str(copies["hermes-lcm"]), "--url", db_url, "--json")
    again = json.loads(out)
    assert again["messages_added"] == 0  # idempotent, summaries too
    assert [r["summaries"]["placed"] for r in again["sessions"]] == [0, 0]
    assert [r["summaries"]["already_placed"] for r in again["sessions"]] == [9, 2]


def test_lossless_claw_store_comes_in_exactly(copies, db_url, lcm):
    want = expected("lossless-claw")
    report = _import(lcm, copies, "lossless-claw", db_url)
    assert report["messages_added"] == 88
    assert [(r["agent"], r["session_id"], r["summaries"]["placed"]) for r in report["sessions"]] == [
        ("main", SESSIONS[0], 13), ("main", SESSIONS[1], 5)]

    store = Store.open(db_url)
    for conv in want["conversations"]:
        session, records = _stored(store, "main", conv["session_id"])
        assert len(records) == len(conv["messages"])
        for record, row in zip(records, conv["messages"], strict=True):
            message = record.message
            assert message["role"] == row["role"]
            assert message["content"] == row["content"]
            assert _calls(message) == ([(c["id"], c["name"], c["arguments"]) for c in row["tool_calls"]]
                                       if row.get("tool_calls") else None)
            if row["role"] == "tool":  # lossless-claw keeps the pairing in message_parts
                assert (message["tool_call_id"], message["name"]) == (row["tool_call_id"], row["tool_name"])
        assert session.origin["session_key"] == conv["session_key"]
        assert session.origin["conversation_id"] == conv["conversation_id"]
        _assert_clean_boundaries(store, session, records)
    first, records = _stored(store, "main", SESSIONS[0])
    assert first.platform == "main" and _stored(store, "main", SESSIONS[1])[0].platform == "telegram"
    errors = [m for c in want["conversations"] for m in c["messages"] if m.get("is_error")]
    assert first.origin.get("tool_errors", []) + _stored(store, "main", SESSIONS[1])[0].origin.get(
        "tool_errors", []) == [m["tool_call_id"] for m in errors]

    # 17 leaves and the condensed node over the 8 leaves that cover message_id 1-24.
    leaves = store.summaries.of_session(first.id, depth=0) + store.summaries.of_session(
        _stored(store, "main", SESSIONS[1])[0].id, depth=0)
    assert len(leaves) == 17
    by_peer = {n.meta["imported"]["id"]: n for n in leaves}
    [condensed] = store.summaries.of_session(first.id, depth=1)
    peer_condensed = next(s for s in want["summaries"] if s["kind"] == "condensed")
    assert condensed.content == peer_condensed["content"]
    assert store.summaries.source_ids(condensed.id) == [by_peer[s].id for s in peer_condensed["parent_summary_ids"]]
    # message 10 (two parallel calls) was split from its results 11-12: it now opens their leaf.
    split = next(s for s in want["summaries"] if s["source_message_ids"] == [8, 9, 10])
    moved = by_peer[split["summary_id"]]
    assert (moved.first_seq, moved.last_seq) == (8, 9)
    results_leaf = by_peer[next(s["summary_id"] for s in want["summaries"] if s["source_message_ids"] == [11, 12])]
    assert (results_leaf.first_seq, results_leaf.last_seq) == (10, 12)

    code, out, _ = lcm("import", "lossless-claw", str(copies["lossless-claw"]), "--url", db_url, "--json")
    assert json.loads(out)["messages_added"] == 0


def test_imported_history_works_like_native_history(copies, db_url, lcm, tmp_path):
    Store.open(db_url, upgrade=True)
    for program in ("hermes-lcm", "lossless-claw"):
        code, _, err = lcm("import", program, str(copies[program]), "--url", db_url, "--agent", program)
        assert code == 0, err
    long_message = expected("hermes-lcm")["long_message"]
    for agent, marker in (("hermes-lcm", "zqcsvimport"), ("lossless-claw", "zqkyototrip")):
        code, out, err = lcm("grep", marker, "--url", db_url, "--agent", agent, "--json")
        assert code == 0, err
        hits = [h for h in json.loads(out)["results"] if h["type"] == "message"]
        assert hits and hits[0]["role"] == "user"  # a first-turn fact, found
        code, out, _ = lcm("grep", "zqlongmarker", "--url", db_url, "--agent", agent, "--json")
        [hit] = [h for h in json.loads(out)["results"] if h["type"] == "message"]
        code, out, err = lcm("expand", f"msg:{hit['store_id']}", "--url", db_url, "--agent", agent, "--json")
        assert code == 0, err
        text = json.loads(out)["message"]["content"]
        assert hashlib.sha256(text.encode()).hexdigest() == long_message["sha256_utf8"]
    code, out, err = lcm("doctor", "--deep", "--url", db_url, "--json")
    assert code == 0 and json.loads(out)["overall"] == "healthy", out + err

    # export -> ingest -> export gives the same file
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    again = f"sqlite:///{tmp_path / 'again.db'}"
    for agent in ("hermes-lcm", "lossless-claw"):
        assert lcm("export", "--url", db_url, "--agent", agent, "-o", str(first), "--force")[0] == 0
        assert lcm("ingest", str(first), "--url", again, "--agent", agent)[0] == 0
        assert lcm("export", "--url", again, "--agent", agent, "-o", str(second), "--force")[0] == 0
        assert first.read_bytes() == second.read_bytes()


def test_dry_run_writes_nothing_and_another_format_is_refused(copies, sqlite_url, lcm, tmp_path):
    target = Path(sqlite_url.removeprefix("sqlite:///"))
    code, out, err = lcm("import", "lossless-claw", str(copies["lossless-claw"]), "--url", sqlite_url,
                         "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["messages_added"] == 88
    assert [r["summaries"] for r in plan["sessions"]] == [{"in_file": 13, "placeable": 13, "notes": 0},
                                                         {"in_file": 5, "placeable": 5, "notes": 0}]
    assert not target.exists()

    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 100)
    for fmt, path, says in (
            ("lossless-claw", copies["hermes-lcm"], "looks like a hermes-lcm store (lcm.db): lcm import hermes-lcm"),
            ("hermes-lcm", copies["lossless-claw"], "looks like a lossless-claw store"),
            ("hermes", copies["lossless-claw"], "looks like a lossless-claw store"),
            ("hermes-lcm", text_file, "not an SQLite database"),
            ("lossless-claw", tmp_path / "missing.db", "does not exist")):
        code, _, err = lcm("import", fmt, str(path), "--url", sqlite_url)
        assert code == 1 and says in " ".join(err.split()), err
        assert "nothing was imported" in " ".join(err.split())
    assert not target.exists()


def test_one_session_only(copies, sqlite_url, lcm):
    code, out, err = lcm("import", "lossless-claw", str(copies["lossless-claw"]), "--url", sqlite_url,
                         "--session", "agent:main:telegram:direct:48151623", "--json")
    assert code == 0, err
    assert [r["session_id"] for r in json.loads(out)["sessions"]] == [SESSIONS[1]]
    code, _, err = lcm("import", "hermes-lcm", str(copies["hermes-lcm"]), "--url", sqlite_url, "--session", "nope")
    assert code == 1 and "has no session nope" in err
