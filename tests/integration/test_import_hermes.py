"""``lcm import hermes state.db``: Hermes' own session store, written by hermes-agent 0.19.0's
real ``SessionDB`` (in the Hermes test venv), imported into lcm on both backends: every active
message with its tool calls, decoded content and fields, the system prompt, the platform and
provenance; idempotent; a dry run writes nothing; another file is refused before any write."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from lcm.store import Store
from tests.support.hermes_host import ensure_venv

# Run by the Hermes venv's Python: Hermes' SessionDB writes its own schema and rows.
BUILD = r'''
import json, sys
from pathlib import Path
from hermes_state import SessionDB
db = SessionDB(Path(sys.argv[1]))
db.create_session("20261101_090000_cli", "cli", model="test-model", system_prompt="You are Hermes.")
db.append_message("20261101_090000_cli", "user", "deploy the billing service  ")
db.append_message("20261101_090000_cli", "assistant", None, tool_calls=[{"id": "call_1", "type": "function",
    "function": {"name": "terminal", "arguments": json.dumps({"command": "make deploy"})}}], finish_reason="tool_calls")
db.append_message("20261101_090000_cli", "tool", "deployed to port 6543", tool_call_id="call_1", tool_name="terminal")
shot = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
db.append_message("20261101_090000_cli", "user", [{"type": "text", "text": "and this screenshot?"}, shot])
db.append_message("20261101_090000_cli", "assistant", "Deployed; the screenshot shows the dashboard.",
                  reasoning="checked the logs")
undone = db.append_message("20261101_090000_cli", "user", "oops, ignore this")
db.rewind_to_message("20261101_090000_cli", undone)
db.create_session("20261102_100000_tg", "telegram", chat_id="4242", system_prompt="You are Hermes on Telegram.")
db.append_message("20261102_100000_tg", "user", "hello from telegram", platform_message_id="77")
db.append_message("20261102_100000_tg", "assistant", "Hi!")
db.close()
'''


@pytest.fixture(scope="module")
def state_db(tmp_path_factory) -> Path:
    venv, why = ensure_venv()
    if venv is None:
        if os.environ.get("LCM_REQUIRE_HERMES"):
            pytest.fail(why)
        pytest.skip(f"Hermes importer tests skipped: {why}")
    path = tmp_path_factory.mktemp("hermes") / "state.db"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", BUILD, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return path


def test_every_hermes_session_and_message_comes_in_once(state_db, db_url, lcm):
    Store.open(db_url, upgrade=True)
    before = state_db.read_bytes()
    code, out, err = lcm("import", "hermes", str(state_db), "--url", db_url, "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["messages_added"] == 7 and plan["rewound_not_imported"] == 1
    assert Store.open(db_url).sessions.agents() == []  # a dry run writes nothing
    code, out, err = lcm("import", "hermes", str(state_db), "--url", db_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["messages_added"] == 7
    assert {(r["session_id"], r["added"]) for r in report["sessions"]} == {
        ("20261101_090000_cli", 5), ("20261102_100000_tg", 2)}
    assert state_db.read_bytes() == before  # read only
    code, out, _ = lcm("import", "hermes", str(state_db), "--url", db_url, "--json")
    assert json.loads(out)["messages_added"] == 0  # idempotent

    store = Store.open(db_url)
    cli = store.sessions.find("default", "20261101_090000_cli")
    assert cli.platform == "cli" and cli.origin["format"] == "hermes-state" and cli.origin["id"] == cli.session_key
    assert cli.origin["path"] == str(state_db.resolve())
    messages = [m.message for m in store.messages.get_range(cli.id)]
    assert messages[0]["content"] == "deploy the billing service  "  # verbatim, not cleaned up
    assert messages[1]["tool_calls"][0]["function"]["name"] == "terminal"
    assert messages[1]["finish_reason"] == "tool_calls"
    assert messages[2] == {**messages[2], "role": "tool", "tool_call_id": "call_1", "tool_name": "terminal",
                           "content": "deployed to port 6543"}
    assert messages[3]["content"][1]["type"] == "image_url"  # Hermes' JSON content, decoded
    assert messages[4]["reasoning"] == "checked the logs"
    assert all("timestamp" in m for m in messages) and "oops" not in json.dumps(messages)
    assert [p.message["content"] for p in store.sessions.system_prompts(cli.id)] == ["You are Hermes."]
    tg = store.sessions.find("default", "20261102_100000_tg")
    assert tg.platform == "telegram" and tg.conversation_id == "4242"
    assert store.messages.get_range(tg.id)[0].message["message_id"] == "77"
    assert store.search.messages("billing", agent="default").hits
    code, out, _ = lcm("sessions", "--url", db_url, "--json")
    listed = {r["session_id"]: r for r in json.loads(out)["sessions"]}
    assert {k: r["origin"]["format"] for k, r in listed.items()} == {
        "20261101_090000_cli": "hermes-state", "20261102_100000_tg": "hermes-state"}
    # Last activity is when the conversation happened, not when it was imported (issue 33.7).
    last = store.messages.get_range(cli.id)[-1]
    assert listed["20261101_090000_cli"]["last_activity"] == last.ts < listed["20261101_090000_cli"]["updated_at"]


def test_only_some_sessions_and_into_a_named_agent(state_db, sqlite_url, lcm):
    code, out, err = lcm("import", "hermes", str(state_db), "--url", sqlite_url, "--agent", "hermes-main",
                         "--session", "20261102_100000_tg", "--json")
    assert code == 0, err
    assert [r["session_id"] for r in json.loads(out)["sessions"]] == ["20261102_100000_tg"]
    assert [s.session_key for s in Store.open(sqlite_url).sessions.each("hermes-main")] == ["20261102_100000_tg"]


def test_a_file_that_is_not_a_hermes_store_is_refused_before_any_write(tmp_path, sqlite_url, lcm):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
    text_file = tmp_path / "notes.txt"
    text_file.write_text("just some text, not a database\n" * 100)
    for path, says in ((other, "not a Hermes session store"), (text_file, "not a Hermes session store"),
                       (tmp_path / "missing.db", "does not exist")):
        code, _, err = lcm("import", "hermes", str(path), "--url", sqlite_url)
        assert code == 1 and says in err, err
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # nothing was created either
