"""``lcm import hermes`` of a ``state.db`` that hermes-agent 0.19.0 wrote while its own compressor
compacted the conversation several times (``tests.support.hermes_compaction``: the real host, a
scripted model on 127.0.0.1), in place (archived generations) and by rotation (child sessions):
lcm stores exactly the conversation that was exchanged, once, in order, with tool calls paired
with their results; the copies each compaction re-inserted are recognised, Hermes' summaries are
kept as notes and never as messages, the rewound turn is left out and counted. Both backends."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from lcm.store import Store
from tests.support.hermes_compaction import CompactedStateDb, write_compacted_state_db
from tests.support.hermes_host import ensure_venv
from tests.support.ui_server import serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[True, False], ids=["in-place", "rotation"])
def written(request, tmp_path_factory) -> CompactedStateDb:
    venv, why = ensure_venv()
    if venv is None:
        if os.environ.get("LCM_REQUIRE_HERMES"):
            pytest.fail(why)
        pytest.skip(f"Hermes importer tests skipped: {why}")
    return write_compacted_state_db(venv, tmp_path_factory.mktemp("hermes-home"), in_place=request.param)


def _shape(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple((c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or [])
    content = message.get("content")
    if calls:
        content = content or None  # Hermes stores a pure tool call's missing text as ''
    return message["role"], content, message.get("tool_call_id"), calls


def test_the_whole_conversation_comes_in_once_in_order(written, db_url, lcm):
    # What the file holds: Hermes compacted at least twice, and kept what it compacted away.
    assert written.summaries >= 2
    if len(written.session_ids) == 1:  # in place: archived generations in the one session
        assert written.rows.get("active=0,compacted=1", 0) > written.rows.get("active=1,compacted=0", 0)
    else:  # rotation: each compaction started a child session
        assert len(written.session_ids) >= 3
    assert written.rewound > 0

    Store.open(db_url, upgrade=True)
    before = written.path.read_bytes()
    code, out, err = lcm("import", "hermes", str(written.path), "--url", db_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert written.path.read_bytes() == before  # only read
    assert report["rewound_not_imported"] == written.rewound
    assert report["hermes_summaries_kept_as_notes"] == written.summaries
    assert report["compaction_copies_not_stored"] > 0
    assert [r["session_id"] for r in report["sessions"]] == [written.session_ids[0]]  # one conversation

    store = Store.open(db_url)
    session = store.sessions.find("default", written.session_ids[0])
    records = store.messages.get_range(session.id)
    stored = [r.message for r in records]
    # Exactly what was exchanged: every user turn, every answer, every call and its result.
    assert [_shape(m) for m in stored] == [_shape(m) for m in written.exchanged]
    assert report["messages_added"] == len(written.exchanged)
    for message in stored:  # Hermes' summaries are notes, never a user or assistant message
        text = message.get("content") or ""
        assert not text.startswith(("[CONTEXT COMPACTION", "[PRIOR CONTEXT")), text[:80]
    notes = session.origin["notes"]
    assert len(notes) == written.summaries
    assert all(n["kind"] == "hermes-compressor-summary" and "compressor summary" in n["content"] for n in notes)
    assert session.origin["compaction_copies"] == report["compaction_copies_not_stored"]
    for key in written.session_ids[1:]:  # a host resuming a continued session finds this one
        assert store.sessions.find("default", key).id == session.id
    code, out, _ = lcm("sessions", "--url", db_url, "--json")
    assert json.loads(out)["sessions"][0]["origin"]["notes"] == notes

    code, out, _ = lcm("import", "hermes", str(written.path), "--url", db_url, "--json")
    assert json.loads(out)["messages_added"] == 0  # idempotent

    with serving(store) as base:  # the explorer shows where the session came from, and the notes
        page = f"{base}/a/default/s/{written.session_ids[0]}"
        assert httpx.get(page, params={"format": "json"}).json()["origin"]["notes"] == notes
        html = httpx.get(page).text
        assert "imported from hermes-state" in html and "compressor summary 1" in html

    code, out, _ = lcm("grep", "zqturn0", "--url", db_url, "--json")
    hits = [h for h in json.loads(out)["results"] if h["type"] == "message"]
    assert hits and hits[0]["role"] == "user"  # the first turn, which the compressor had hidden
    code, out, err = lcm("doctor", "--deep", "--url", db_url, "--json")
    assert json.loads(out)["overall"] == "healthy", out + err


def test_the_generated_file_is_what_the_docs_describe(written):
    """docs/import-hermes.md describes the file this harness writes; keep the two in step."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "import-hermes.md").read_text(encoding="utf-8")
    assert "active = 0, compacted = 1" in doc and "end_reason = 'compression'" in doc
    assert "tests/support/hermes_compaction.py" in doc
