"""Every command of the command line, walked: its help, a bad option, and a --json run on a fresh
store. One option vocabulary, one error style (``lcm: error: ...`` on one line, exit 1; usage
errors exit 2 and say where the help is), JSON whenever --json succeeds, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from lcm.cli import cli
from lcm.store import migrations


def leaf_commands() -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []

    def walk(group: click.Group, prefix: tuple[str, ...]) -> None:
        ctx = click.Context(group)  # through click's listing: lcm's commands load lazily
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                walk(command, (*prefix, name))
            else:
                out.append((*prefix, name))

    walk(cli, ())
    return out


COMMANDS = leaf_commands()
assert len(COMMANDS) > 20, COMMANDS  # the walk itself works: every command is run below
#: A --json invocation of each command on a fresh store ({url}: the store, {tmp}: a folder).
RUNS: dict[tuple[str, ...], list[str]] = {
    ("backup",): ["{tmp}/copy.db"],
    ("db", "current"): [],
    ("db", "downgrade"): ["base"],  # refused: no --yes
    ("db", "history"): [],
    ("db", "secure"): ["--per-agent-roles", "--agent", "a"],  # SQLite: refused, PostgreSQL only
    ("db", "upgrade"): [],
    ("demo",): [],
    ("describe",): [],
    ("doctor",): [],
    ("embed",): [],  # embeddings are off in the tests: refused with what to set
    ("expand",): ["msg:1"],
    ("export",): ["-o", "{tmp}/out.jsonl"],
    ("forget",): ["--match", "nothing-like-this", "--dry-run"],
    ("grep",): ["anything"],
    ("recall",): ["anything"],
    ("hermes", "install"): ["--hermes-home", "{tmp}/hermes-home"],
    ("hermes", "uninstall"): ["--hermes-home", "{tmp}/hermes-home"],
    ("import",): ["hermes", "{tmp}/missing-state.db"],
    ("ingest",): ["{tmp}/one.jsonl", "--session", "s1"],
    ("load",): ["s1"],
    ("migrate",): ["--to", "sqlite:///{tmp}/other.db", "--dry-run"],
    ("sessions",): [],
    ("status",): [],
    ("ui",): ["--host", "203.0.113.7", "--no-browser"],  # not an address of this machine: refused
    ("proxy",): ["--upstream", "ftp://example.org/v1"],  # not an http(s) URL: refused
}


def test_the_walk_covers_every_command():
    assert set(RUNS) == set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_and_a_bad_option(lcm, path):
    code, out, err = lcm(*path, "--help")
    assert code == 0 and out.startswith("Usage: lcm " + " ".join(path)), err
    assert "--json" in out, f"lcm {' '.join(path)} has no --json"
    code, out, err = lcm(*path, "--no-such-option")
    assert code == 2 and err.startswith("lcm: error: No such option '--no-such-option'"), err
    assert f"lcm {' '.join(path)} --help" in err and err.count("\n") == 1


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_json_or_one_clear_line(lcm, path, tmp_path: Path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    assert lcm("db", "upgrade", "--url", url)[0] == 0
    (tmp_path / "one.jsonl").write_text(json.dumps({"role": "user", "content": "hello"}) + "\n")
    monkeypatch.setenv("LCM_DATABASE_URL", url)
    args = [a.format(url=url, tmp=tmp_path) for a in RUNS[path]]
    code, out, err = lcm(*path, *args, "--json")
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 0:
        json.loads(out)  # a JSON document, nothing else on stdout
    else:
        assert code == 1 and err.startswith("lcm: error: ") and err.count("\n") == 1, (code, err)


def test_db_upgrade_says_when_the_database_is_ahead_or_the_revision_unknown(lcm, tmp_path):
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    assert lcm("db", "upgrade", "--url", url)[0] == 0
    code, _, err = lcm("db", "upgrade", "--url", url, "--revision", "0001_core_schema")
    assert code == 1 and "ahead of 0001_core_schema" in err and "lcm db downgrade" in err
    code, _, err = lcm("db", "upgrade", "--url", url, "--revision", "0001_typo")
    assert code == 1 and "no revision '0001_typo'; lcm db history lists them" in err
    code, out, _ = lcm("db", "history", "--url", url, "--json")
    assert code == 0 and [r["revision"] for r in json.loads(out) if r["current"]] == [migrations.HEAD]


def test_status_of_a_session_shows_json_not_python_reprs(lcm, tmp_path):
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    (tmp_path / "one.jsonl").write_text(json.dumps({"role": "user", "content": "hello"}) + "\n")
    assert lcm("ingest", str(tmp_path / "one.jsonl"), "--url", url, "--session", "s1")[0] == 0
    code, out, err = lcm("status", "--url", url, "--session", "s1")
    assert code == 0, err
    assert "None" not in out and "{'" not in out and '"route"' in out


@pytest.mark.parametrize(("line", "says"), [
    ({"role": "wizard", "content": "abracadabra"}, "role 'wizard' is not a chat role"),
    ({"role": "user", "content": 42}, "content must be text or a list of parts, got int"),
    ({"role": "user", "content": {"text": "x"}}, "content must be text or a list of parts, got dict"),
    ({"role": "user"}, "a message needs content"),
])
def test_ingest_checks_each_line_against_the_message_shape(lcm, tmp_path, line, says):
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"role": "user", "content": "fine"}) + "\n" + json.dumps(line) + "\n")
    code, _, err = lcm("ingest", str(path), "--url", url, "--session", "s1")
    assert code == 1 and "line 2: " + says in err and "nothing imported" in err, err
    code, out, err = lcm("ingest", str(path), "--url", url, "--session", "s1", "--skip-bad", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["sessions"][0]["added"] == 1 and report["skipped"][0]["line"] == 2


def test_ingest_of_nothing_is_an_error_and_a_byte_order_mark_is_fine(lcm, tmp_path):
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    code, _, err = lcm("ingest", str(empty), "--url", url, "--session", "s1")
    assert code == 1 and "no messages in it" in err
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes("\ufeff".encode() + json.dumps({"role": "user", "content": "from notepad"}).encode() + b"\r\n")
    code, out, err = lcm("ingest", str(bom), "--url", url, "--session", "s1", "--json")
    assert code == 0 and json.loads(out)["sessions"][0]["added"] == 1, err


def test_progress_outside_a_terminal_keeps_talking_during_a_long_session(tmp_path):
    """Outside a terminal, ingest prints a line per session and, within a long one, a line every
    few seconds (here every 0 s), in plain words: "1 turn", "N turns"."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"role": role, "content": f"{role} {i}"}) + "\n"
                            for i in range(3) for role in ("user", "assistant")))
    done = subprocess.run([sys.executable, "-c", "import sys; from lcm.cli import common, main; "
                           "common.LineProgress.LINE_EVERY = 0.0; "
                           f"main(['ingest', {str(path)!r}, '--url', 'sqlite:///{tmp_path / 'lcm.db'}', "
                           "'--session', 's1', '--no-compact'])"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert "ingest: 3 turns" in done.stderr and "  3/3 turns" in done.stderr, done.stderr


def test_sessions_and_grep_print_tab_separated_values_for_scripts(lcm, tmp_path):
    import csv
    import io

    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    (tmp_path / "chat.jsonl").write_text(json.dumps({"role": "user", "content": "line one\n\tand the marmot"}) + "\n")
    assert lcm("ingest", str(tmp_path / "chat.jsonl"), "--url", url, "--session", "s1")[0] == 0
    code, out, _ = lcm("sessions", "--url", url, "--tsv")
    rows = list(csv.reader(io.StringIO(out), delimiter="\t"))
    assert code == 0 and rows[0][:2] == ["agent", "session_id"] and rows[1][1] == "s1" and rows[1][4] == "1"
    code, out, _ = lcm("grep", "marmot", "--url", url, "--tsv")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].startswith("ref\tsession_id")
    ref, session, kind, *_, snippet = lines[1].split("\t")
    assert (ref[:4], session, kind) == ("msg:", "s1", "user") and snippet.endswith("**marmot**")


def test_tsv_values_stay_on_one_line(capsys):
    from lcm.cli.common import emit_tsv

    emit_tsv(["a", "b"], [["x\ty\nz\\", None]])
    assert capsys.readouterr().out == "a\tb\nx\\ty\\nz\\\\\t\n"


def test_tables_piped_to_another_program_are_plain_and_unwrapped(tmp_path):
    """Issue 17.6: through a pipe, tables lose their box characters and keep each row on one
    line whatever its width (the real console script, its stdout a pipe)."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    key = "a-session-key-long-enough-to-push-the-table-past-eighty-columns-" + "x" * 40
    (tmp_path / "one.jsonl").write_text(json.dumps({"role": "user", "content": "hello"}) + "\n")
    run = [sys.executable, "-m", "lcm"]
    assert subprocess.run([*run, "ingest", str(tmp_path / "one.jsonl"), "--url", url, "--session", key],
                          capture_output=True, text=True).returncode == 0
    done = subprocess.run([*run, "sessions", "--url", url], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not set("┃━│─┏┓┗┛┡┩└┘") & set(done.stdout), done.stdout
    [row] = [line for line in done.stdout.splitlines() if key in line]
    assert row.split()[0] == key and row.split()[-1].endswith("Z")  # the whole row on one line


def test_loading_a_big_session_shows_progress_on_stderr(tmp_path):
    """Issue 17.4: `lcm load` of a session that takes several pages says how far it is (on
    stderr: stdout stays the session's text)."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    lines = [json.dumps({"role": "user" if i % 2 == 0 else "assistant", "content": f"line {i}"}) for i in range(450)]
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    run = [sys.executable, "-m", "lcm"]
    assert subprocess.run([*run, "ingest", str(tmp_path / "big.jsonl"), "--url", url, "--session", "big",
                           "--no-compact"], capture_output=True, text=True).returncode == 0
    done = subprocess.run([*run, "load", "big", "--url", url], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "load big: 450 messages" in done.stderr
    assert done.stdout.count("── msg:") == 450 and "load big" not in done.stdout
