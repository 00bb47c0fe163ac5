"""The ``lcm`` command line through its real entry point (``lcm.cli.main``, and ``python -m lcm``
in a subprocess where exit codes and stderr are the point), on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from lcm.demo import generate
from lcm.store import Store
from tests.conftest import REPO_ROOT
from tests.support.faults import drop_from_index

SECRET = "The vault lease id is VL-5501-ZETA; rotate it on Fridays."
BIG = {"patch": "z" * 12_000}


def run_json(lcm, *args: str) -> Any:
    code, out, err = lcm(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def subprocess_lcm(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
                   cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "lcm", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env=full_env, cwd=cwd or REPO_ROOT)


def one_clean_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def transcript(turns: int = 12) -> list[dict[str, Any]]:
    """A host transcript: system prompt, a secret first, tool calls, one huge tool call."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                  {"role": "user", "content": SECRET},
                                  {"role": "assistant", "content": "Understood."}]
    for i in range(turns):
        call = f"c{i}"
        args = BIG if i == 3 else {"cmd": f"make step{i}"}
        msgs += [{"role": "user", "content": f"Run step {i} of the migration plan " + "please " * 40},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": call, "type": "function", "function": {"name": "shell", "arguments": json.dumps(args)}}]},
                 {"role": "tool", "tool_call_id": call, "content": f"step {i} output " + "ok " * 150},
                 {"role": "assistant", "content": f"Step {i} finished without errors."}]
    return msgs


@pytest.fixture
def chat_file(tmp_path) -> Path:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(transcript()), encoding="utf-8")
    return path


@pytest.fixture
def ingested(lcm, db_url, chat_file, monkeypatch) -> str:
    """The transcript ingested into agent ``ops``, session ``s1``, compacted on a small window."""
    for var, value in (("LCM_LEAF_CHUNK_TOKENS", "600"), ("LCM_FRESH_TAIL_COUNT", "6"),
                       ("LCM_LEAF_TARGET_TOKENS", "80"), ("LCM_CONDENSATION_FANIN", "2")):
        monkeypatch.setenv(var, value)
    Store.open(db_url, upgrade=True)
    res = run_json(lcm, "ingest", str(chat_file), "--url", db_url, "--agent", "ops", "--session", "s1",
                   "--platform", "cli", "--context-length", "2000")
    [row] = res["sessions"]
    assert row["added"] == len(transcript()) - 1 and row["not_stored"] == 0
    assert row["system_prompts_kept"] == 1  # the system prompt: kept, not as a message
    assert row["summaries"].get("d0", 0) >= 2
    return db_url


# --------------------------------------------------------------------------- demo


def test_the_shipped_demo_transcript_is_the_generators_output():
    shipped = (REPO_ROOT / "lcm" / "demo" / "transcript.jsonl").read_text(encoding="utf-8")
    assert shipped == "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in generate.lines())


def test_demo_tells_the_whole_story_and_is_idempotent(lcm, db_url):
    Store.open(db_url, upgrade=True)
    first = run_json(lcm, "demo", "--url", db_url)
    total = sum(1 for _ in generate.lines())
    assert first["stored_messages"] == total and first["new_messages"] == total
    assert first["summaries_written"] > 0 and first["recall"]["byte_exact"] is True
    assert generate.BRIDGE_CODE in first["recall"]["text"]
    assert any("d1" in s["summaries"] for s in first["sessions"])
    assert all(0 < s["assembled_tokens"] <= first["context_length"] for s in first["sessions"])
    assert all(s["assembled_tokens"] < s["raw_tokens"] for s in first["sessions"])
    again = run_json(lcm, "demo", "--url", db_url)
    assert again["new_messages"] == 0 and again["already_stored"] == total
    assert again["summaries_written"] == 0
    assert [s["summaries"] for s in again["sessions"]] == [s["summaries"] for s in first["sessions"]]
    code, out, err = lcm("demo", "--url", db_url)
    assert code == 0 and "byte-exact: yes" in out and generate.BRIDGE_CODE in out, err
    doctor = run_json(lcm, "doctor", "--url", db_url, "--agent", "lcm-demo")
    assert doctor["overall"] == "healthy", doctor


# --------------------------------------------------------------------------- ingest and export


def test_ingest_twice_adds_nothing_and_export_round_trips_exactly(lcm, ingested, tmp_path):
    again = run_json(lcm, "ingest", str(tmp_path / "chat.json"), "--url", ingested, "--agent", "ops",
                     "--session", "s1")
    assert again["sessions"][0]["added"] == 0 and again["sessions"][0]["already_stored"] == len(transcript()) - 1
    first = tmp_path / "first.jsonl"
    code, out, err = lcm("export", "--url", ingested, "--agent", "ops", "-o", str(first))
    assert code == 0 and f"exported {len(transcript()) - 1} message(s) and 1 system prompt" in out, err
    copy = run_json(lcm, "ingest", str(first), "--url", ingested, "--agent", "copy")
    assert copy["sessions"][0]["added"] == len(transcript()) - 1 and copy["sessions"][0]["not_stored"] == 0
    assert copy["sessions"][0]["system_prompts_kept"] == 1
    code, second, err = lcm("export", "--url", ingested, "--agent", "copy")
    assert code == 0, err
    assert second == first.read_text(encoding="utf-8")  # byte for byte, times and key order included
    lines = [json.loads(line) for line in second.splitlines()]
    # The session's system prompt leads, marked as such, then every message in order.
    assert lines[0]["system_prompt"] is True and lines[0]["seq"] == 1
    assert lines[0]["message"] == transcript()[0]
    assert [line["message"] for line in lines] == transcript()
    assert lines[1]["message"] == {"role": "user", "content": SECRET} and lines[1]["platform"] == "cli"
    assert [line["seq"] for line in lines[1:]] == list(range(1, len(lines)))


def test_every_system_prompt_version_is_exported_where_it_started_and_round_trips(lcm, db_url, tmp_path):
    """A host that changed its system prompt mid-session: each version comes back right before
    the first message it was sent with, and export → ingest → export is identical."""
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine

    Store.open(db_url, upgrade=True)
    engine = LcmEngine(LcmConfig.from_env({}, database_url=db_url, agent_id="live"))
    engine.update_model("m", 100_000)
    engine.on_session_start("chat")
    v1, v2 = {"role": "system", "content": "version one"}, {"role": "system", "content": "version two"}
    turn1 = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "first answer"}]
    turn2 = [{"role": "user", "content": "second question"}, {"role": "assistant", "content": "second answer"}]
    engine.compress([v1, *turn1])
    engine.compress([v2, *turn1, *turn2])
    first = tmp_path / "live.jsonl"
    code, out, err = lcm("export", "--url", db_url, "--agent", "live", "-o", str(first))
    assert code == 0 and "exported 4 message(s) and 2 system prompt version(s)" in out, err
    lines = [json.loads(line) for line in first.read_text(encoding="utf-8").splitlines()]
    assert [line["message"] for line in lines] == [v1, *turn1, v2, *turn2]
    assert [line.get("system_prompt", False) for line in lines] == [True, False, False, True, False, False]
    assert [line["seq"] for line in lines] == [1, 1, 2, 3, 3, 4]
    run_json(lcm, "ingest", str(first), "--url", db_url, "--agent", "copy")
    code, second, err = lcm("export", "--url", db_url, "--agent", "copy")
    assert code == 0 and second == first.read_text(encoding="utf-8"), err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"session_id": "x", "system_prompt": True, "message": turn1[0]}) + "\n",
                   encoding="utf-8")
    code, _, err = lcm("ingest", str(bad), "--url", db_url, "--agent", "copy")
    assert code == 1 and "must hold a system message" in err


def test_ingest_continues_a_grown_transcript_and_refuses_a_different_one(lcm, ingested, tmp_path):
    grown = tmp_path / "grown.jsonl"
    msgs = transcript() + [{"role": "user", "content": "one more thing"}, {"role": "assistant", "content": "sure"}]
    grown.write_text("".join(json.dumps(m) + "\n" for m in msgs), encoding="utf-8")
    res = run_json(lcm, "ingest", str(grown), "--url", ingested, "--agent", "ops", "--session", "s1")
    assert res["sessions"][0]["added"] == 2
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"role": "user", "content": "a different conversation"}]), encoding="utf-8")
    code, _, err = lcm("ingest", str(other), "--url", ingested, "--agent", "ops", "--session", "s1")
    assert code == 1 and "already holds different messages" in err and "another session" in err
    assert Store.open(ingested).sessions.find("ops", "s1").message_count == len(msgs) - 1


def test_a_bad_line_is_reported_by_number_and_nothing_is_imported(lcm, db_url, tmp_path):
    Store.open(db_url, upgrade=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "fine"}\n\n{"role": "assistant", "content": "cut\n'
                   '{"content": "no role"}\n{"role": "assistant", "content": "also fine"}\n', encoding="utf-8")
    code, out, err = lcm("ingest", str(bad), "--url", db_url, "--session", "s")
    assert code == 1 and "line 3" in err and "line 4" in err and "nothing imported" in err
    assert len(err.strip().splitlines()) == 1 and out == ""
    assert Store.open(db_url).sessions.find("default", "s") is None
    res = run_json(lcm, "ingest", str(bad), "--url", db_url, "--session", "s", "--skip-bad")
    assert [s["line"] for s in res["skipped"]] == [3, 4] and res["sessions"][0]["added"] == 2


def test_ingest_reads_stdin_and_drops_lcm_summaries(db_url, tmp_path):
    Store.open(db_url, upgrade=True)
    body = {"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "[LCM CONTEXT SUMMARY — REFERENCE ONLY]\nolder stuff"},
        {"role": "user", "content": "hello from stdin"}, {"role": "assistant", "content": "hi"}]}
    proc = subprocess_lcm("ingest", "-", "--url", db_url, "--session", "piped", "--json", stdin=json.dumps(body))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["sessions"][0]
    assert row["added"] == 2 and row["not_stored"] == 1 and row["system_prompts_kept"] == 1


def test_plain_messages_need_a_session(lcm, db_url, chat_file):
    Store.open(db_url, upgrade=True)
    code, _, err = lcm("ingest", str(chat_file), "--url", db_url)
    assert code == 1 and "--session" in err


def test_line_separators_inside_messages_survive_ingest_and_export(lcm, db_url, tmp_path):
    """Issue 16.3: another tool's JSONL with raw U+2028 / U+2029 / U+0085 inside strings is one
    message per line; lcm's export escapes them, so every line reader sees one line."""
    tricky = [{"role": "user", "content": "para\u2028graph\u2029 end\x85 next"},
              {"role": "assistant", "content": "ok\u2028"}]
    Store.open(db_url, upgrade=True)  # a PostgreSQL schema is an operator's to upgrade
    source = tmp_path / "raw.jsonl"
    source.write_text("".join(json.dumps(m, ensure_ascii=False) + "\n" for m in tricky), encoding="utf-8")
    assert "\u2028" in source.read_text(encoding="utf-8")  # raw, as other writers leave it
    done = run_json(lcm, "ingest", str(source), "--url", db_url, "--agent", "seps", "--session", "s",
                    "--no-compact")
    assert done["sessions"][0]["added"] == 2
    out = tmp_path / "out.jsonl"
    code, _, err = lcm("export", "--url", db_url, "--agent", "seps", "-o", str(out))
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 2 and "\u2028" not in text and "\\u2028" in text
    assert [json.loads(line)["message"] for line in text.splitlines()] == tricky


def test_export_never_overwrites_without_force_and_keeps_the_files_permissions(lcm, ingested, tmp_path):
    """Issue 17.3: a new export is owner-only (it holds whole conversations); an existing file
    is refused without --force, and replaced with it keeping the mode it had."""
    target = tmp_path / "out.jsonl"
    args = ("export", "--url", ingested, "--agent", "ops", "-o", str(target))
    code, _, err = lcm(*args)
    assert code == 0, err
    assert target.stat().st_mode & 0o777 == 0o600
    first = target.read_text(encoding="utf-8")
    target.write_text("keep me\n", encoding="utf-8")
    target.chmod(0o644)
    code, _, err = lcm(*args)
    assert code == 1 and "exists; pass --force" in err and err.startswith("lcm: error:")
    assert target.read_text(encoding="utf-8") == "keep me\n"  # untouched
    code, _, err = lcm(*args, "--force")
    assert code == 0, err
    assert target.read_text(encoding="utf-8") == first and target.stat().st_mode & 0o777 == 0o644


def test_not_found_names_the_agent_searched_and_the_others_there(lcm, ingested):
    """Issue 33.8: no agent-tool words on the command line, and the way to the right agent."""
    url = ["--url", ingested]
    code, _, err = lcm("expand", "msg:99999", *url, "--agent", "nobody")
    assert code == 1 and "msg:99999 is not a message of agent 'nobody'" in err
    assert "other agents: ops" in err and "--agent NAME" in err and "store_id" not in err and "lcm_grep" not in err
    code, _, err = lcm("expand", "node:99999", *url, "--agent", "ops")
    assert code == 1 and "node:99999 is not a summary of agent 'ops'" in err and "other agents" not in err
    code, out, _ = lcm("sessions", *url, "--agent", "nobody")
    assert code == 0 and "no sessions for agent 'nobody'" in out and "other agents: ops" in out
    code, out, _ = lcm("grep", "zzzyx", *url, "--agent", "nobody")
    assert code == 0 and "no match for 'zzzyx' in the messages of agent 'nobody'" in out and "ops" in out
    code, out, _ = lcm("grep", *url, "--agent", "ops", "--", "***")
    assert code == 0 and "note: the query has no word to search for" in out and "no match for '***'" in out
    code, _, err = lcm("load", "nope", *url, "--agent", "ops")
    assert code == 1 and "no session 'nope' for agent 'ops'" in err


def test_piped_tables_end_no_line_in_spaces(lcm, ingested):
    """Issue 33.10: plain columns for grep, cut and awk, without trailing blanks."""
    for args in (("status", "--session", "s1"), ("sessions",), ("status",)):
        code, out, err = lcm(*args, "--url", ingested, "--agent", "ops")
        assert code == 0, err
        assert out.strip() and all(line == line.rstrip() for line in out.splitlines()), args


def test_import_jsonl_dry_run_counts_and_writes_nothing(lcm, ingested, tmp_path):
    """Issue 33.4: --dry-run, documented for lcm import, works for jsonl too."""
    exported = tmp_path / "all.jsonl"
    assert lcm("export", "--url", ingested, "--agent", "ops", "-o", str(exported))[0] == 0
    same = run_json(lcm, "import", "jsonl", str(exported), "--url", ingested, "--agent", "ops", "--dry-run")
    [row] = same["sessions"]
    assert same["dry_run"] and row["session_id"] == "s1" and row["added"] == 0 and row["already_stored"] > 0
    other = run_json(lcm, "import", "jsonl", str(exported), "--url", ingested, "--agent", "elsewhere", "--dry-run")
    assert other["messages_added"] == row["in_file"] > 0
    assert Store.open(ingested).sessions.find("elsewhere", "s1") is None  # nothing was written
    code, _, err = lcm("import", "jsonl", str(exported), "--url", ingested, "--session", "a", "--session", "b")
    assert code == 2 and "at most one --session" in err


def test_a_failed_export_leaves_no_partial_file(lcm, ingested, tmp_path):
    target = tmp_path / "missing-dir" / "out.jsonl"
    code, _, err = lcm("export", "--url", ingested, "--agent", "ops", "-o", str(target))
    assert code != 0 and not target.exists()
    code, _, err = lcm("export", "--url", ingested, "--agent", "ops", "--session", "nope")
    assert code == 1 and "no session 'nope'" in err


# --------------------------------------------------------------------------- the tools for people


def test_sessions_grep_describe_expand_and_load(lcm, ingested):
    url = ["--url", ingested, "--agent", "ops"]
    sessions = run_json(lcm, "sessions", *url)["sessions"]
    assert [(s["session_id"], s["platform"], s["messages"]) for s in sessions] == [("s1", "cli", len(transcript()) - 1)]
    assert run_json(lcm, "sessions", "--url", ingested, "--all-agents")["sessions"][0]["agent"] == "ops"
    found = run_json(lcm, "grep", "VL-5501-ZETA", *url)
    [hit] = [h for h in found["results"] if h["type"] == "message"]
    code, raw, _ = lcm("expand", f"msg:{hit['store_id']}", "--raw", *url)
    assert code == 0 and raw == SECRET
    code, human, _ = lcm("grep", "VL-5501-ZETA", *url)
    assert code == 0 and f"msg:{hit['store_id']}" in human and "lcm expand" in human
    big_id = next(i for i in run_json(lcm, "load", "s1", *url)["messages"] if "fields_truncated" in i)["store_id"]
    whole = run_json(lcm, "expand", f"msg:{big_id}", *url)["message"]
    assert json.loads(whole["tool_calls"][0]["function"]["arguments"]) == BIG  # cut fields paged back
    overview = run_json(lcm, "describe", *url)
    assert overview["session_id"] == "s1" and overview["depths"]["d0"]["count"] >= 2
    leaf = overview["depths"]["d0"]["nodes"][0]["node_id"]
    detail = run_json(lcm, "describe", f"node:{leaf}", *url)
    sources = run_json(lcm, "expand", f"node:{leaf}", *url)
    assert [s["store_id"] for s in sources["expanded"]] == detail["source_ids"]
    code, tree, _ = lcm("describe", *url)
    assert code == 0 and f"node:{leaf}" in tree
    loaded = run_json(lcm, "load", "s1", "--max-chars", "20000", *url)
    stored = Store.open(ingested).messages.get_range(Store.open(ingested).sessions.find("ops", "s1").id)
    assert [i["store_id"] for i in loaded["messages"]] == [r.store_id for r in stored]
    users = run_json(lcm, "load", "s1", "--roles", "user", *url)["messages"]
    assert {i["message"]["role"] for i in users} == {"user"}
    page = run_json(lcm, "load", "s1", "--limit", "5", *url)
    assert len(page["messages"]) == 5 and page["more_after"] == page["messages"][-1]["store_id"]


def test_grep_filters_and_bad_arguments(lcm, ingested):
    url = ["--url", ingested, "--agent", "ops"]
    tools = run_json(lcm, "grep", "output", "--role", "tool", *url)["results"]
    assert tools and {h["role"] for h in tools} == {"tool"}
    assert run_json(lcm, "grep", "VL-5501-ZETA", "--since", "2999-01-01T00:00:00Z", *url)["results"] == []
    assert run_json(lcm, "grep", "VL-5501-ZETA", "--session", "s1", *url)["results"]
    # Times in people's words (issue 33.3): a bare date is that day's start in UTC, ages count back.
    assert run_json(lcm, "grep", "VL-5501-ZETA", "--since", "2999-01-01", *url)["results"] == []
    assert run_json(lcm, "grep", "VL-5501-ZETA", "--since", "2d", "--until", "now", *url)["results"]
    assert run_json(lcm, "grep", "VL-5501-ZETA", "--until", "yesterday", *url)["results"] == []
    code, _, err = lcm("grep", "x", "--since", "last tuesday", *url)
    assert code == 2 and "Invalid value for '--since'" in err and "2d" in err and "time_from" not in err
    code, _, err = lcm("grep", "x", "--session", "nope", *url)
    assert code == 1 and "no session 'nope'" in err
    code, _, err = lcm("expand", "42", *url)
    assert code == 2 and "msg:ID" in err
    code, _, err = lcm("expand", "msg:999999", *url)
    assert code == 1 and "msg:999999 is not a message of agent 'ops'" in err
    code, _, err = lcm("describe", *url[:2], "--agent", "nobody")
    assert code == 1 and "no sessions" in err


def test_status_doctor_and_repair(lcm, ingested):
    url = ["--url", ingested]
    stats = run_json(lcm, "status", *url)
    assert stats["messages"] == len(transcript()) - 1 and stats["backend"] in ("sqlite", "postgresql")
    session = run_json(lcm, "status", *url, "--agent", "ops", "--session", "s1")
    assert session["stored_messages"] == len(transcript()) - 1 and session["nodes_by_depth"]["d0"] >= 2
    assert run_json(lcm, "doctor", *url)["overall"] == "healthy"
    store = Store.open(ingested)
    newest = store.messages.get_range(store.sessions.find("ops", "s1").id)[-1].store_id
    drop_from_index(store, newest)
    code, out, _ = lcm("doctor", *url, "--json")
    assert code == 1 and json.loads(out)["overall"] == "unhealthy"
    code, out, _ = lcm("doctor", *url)
    assert code == 1 and "lcm doctor --repair" in out
    repaired = run_json(lcm, "doctor", *url, "--repair")
    assert repaired["overall"] == "healthy" and repaired["repair"]["reindexed"]["messages"] == len(transcript()) - 1


def test_backup_is_a_consistent_copy(lcm, ingested, tmp_path):
    dest = tmp_path / "copy.db"
    code, out, err = lcm("backup", str(dest), "--url", ingested)
    if Store.open(ingested).backend_name == "postgresql":
        assert code == 1 and "pg_dump" in err and not dest.exists()
        return
    assert code == 0 and str(dest) in out, err
    copy = Store.open(f"sqlite:///{dest}")
    assert copy.health.stats()["messages"] == len(transcript()) - 1
    assert {c.status for c in copy.health.checks(deep=True)} == {"ok"}
    code, _, err = lcm("backup", str(dest), "--url", ingested)
    assert code == 1 and "--force" in err
    assert lcm("backup", str(dest), "--url", ingested, "--force")[0] == 0
    nowhere = tmp_path / "no" / "such" / "dir" / "b.db"
    code, _, err = lcm("backup", str(nowhere), "--url", ingested)  # issue 17.3: no folders created
    assert code == 1 and "create it first" in err and not (tmp_path / "no").exists()


def test_reading_a_schema_revision_creates_no_database(tmp_path):
    """Issue 17.3: `lcm db current` on a mistyped SQLite path said "(no lcm schema)", exit 0, and
    left an empty database file behind; read commands on that path then saw an empty store."""
    typo = tmp_path / "typo.db"
    line = one_clean_line(subprocess_lcm("db", "current", "--url", f"sqlite:///{typo}"))
    assert line.startswith("lcm: error: no lcm database at") and str(typo) in line
    assert not typo.exists()
    made = tmp_path / "real.db"
    assert subprocess_lcm("db", "upgrade", "--url", f"sqlite:///{made}").returncode == 0
    shown = subprocess_lcm("db", "current", "--url", f"sqlite:///{made}", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "current"


# --------------------------------------------------------------------------- failures: one line, no traceback


def test_failures_are_one_line_and_a_nonzero_exit(tmp_path, db_url):
    assert "no such file" in one_clean_line(subprocess_lcm("ingest", str(tmp_path / "missing.jsonl"),
                                                           "--session", "s", "--url", f"sqlite:///{tmp_path}/x.db"))
    assert "no lcm database" in one_clean_line(subprocess_lcm("grep", "x", "--url", f"sqlite:///{tmp_path}/typo.db"))
    refused = one_clean_line(subprocess_lcm("status", "--url", "postgresql://lcm:secret@127.0.0.1:1/lcm"))
    assert "cannot open" in refused and "secret" not in refused
    store = Store.open(db_url, upgrade=True)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE lcm_alembic_version SET version_num = '9999_from_the_future'"))
    newer = one_clean_line(subprocess_lcm("sessions", "--url", db_url))
    assert "newer lcm" in newer and "upgrade lcm" in newer


def test_a_bad_setting_is_one_line(tmp_path):
    proc = subprocess_lcm("demo", "--url", f"sqlite:///{tmp_path}/d.db", env={"LCM_FRESH_TAIL_COUNT": "many"})
    assert "LCM_FRESH_TAIL_COUNT" in one_clean_line(proc)
