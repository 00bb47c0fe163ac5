"""Files that hold conversation or credentials are their owner's alone (issue 33.1): read the
real modes of what the real commands create, and of what they must leave as it was."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from lcm.store import Store


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def open_umask():
    """The usual umask (022), under which a file is world-readable unless lcm says otherwise."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_a_new_store_and_its_folder_are_owner_only(lcm, tmp_path):
    db = tmp_path / "fresh" / "nested" / "lcm.db"
    tmp_path.chmod(0o755)
    code, _, err = lcm("demo", "--url", f"sqlite:///{db}", "--json")
    assert code == 0, err
    assert mode(db) == 0o600 and mode(db.parent) == 0o700 and mode(db.parent.parent) == 0o700
    for companion in (db.with_name("lcm.db-wal"), db.with_name("lcm.db-shm")):
        if companion.exists():  # SQLite gives them the database file's mode
            assert mode(companion) == 0o600
    assert mode(tmp_path) == 0o755  # a folder that existed is left as it was

    copy = tmp_path / "backup.db"
    code, _, err = lcm("backup", str(copy), "--url", f"sqlite:///{db}")
    assert code == 0, err
    assert mode(copy) == 0o600
    repaired = Path(Store.open(f"sqlite:///{db}").health.backup())  # what doctor --repair keeps
    assert repaired.name.startswith("lcm.db.bak-") and mode(repaired) == 0o600
    code, _, err = lcm("export", "-o", str(tmp_path / "all.jsonl"), "--url", f"sqlite:///{db}", "--agent", "lcm-demo")
    assert code == 0, err
    assert mode(tmp_path / "all.jsonl") == 0o600


def test_an_existing_file_keeps_the_mode_its_owner_gave_it(lcm, tmp_path):
    db = tmp_path / "shared.db"
    db.touch()
    db.chmod(0o640)
    Store.open(f"sqlite:///{db}", upgrade=True)
    assert mode(db) == 0o640


def test_a_password_in_hermes_env_is_owner_only_and_leaves_with_lcm(lcm, tmp_path):
    home = tmp_path / "hermes"
    home.mkdir()
    url = f"sqlite:///{tmp_path / 'team.db'}"  # a PostgreSQL URL with a password goes the same way
    code, out, err = lcm("hermes", "install", "--hermes-home", str(home), "--database-url", url, "--json")
    assert code == 0, err
    env = home / ".env"
    assert env.read_text(encoding="utf-8") == f"LCM_DATABASE_URL={url}\n" and mode(env) == 0o600
    assert mode(tmp_path / "team.db") == 0o600
    code, out, err = lcm("hermes", "uninstall", "--hermes-home", str(home), "--json")
    assert code == 0, err
    assert env.read_text(encoding="utf-8") == "" and any("removed LCM_DATABASE_URL" in c
                                                          for c in json.loads(out)["changes"])
    config = (home / "config.yaml").read_text(encoding="utf-8")
    assert "plugins" not in config and "context" not in config  # no empty sections left behind


def test_an_existing_env_keeps_its_mode_and_its_other_lines(lcm, tmp_path):
    home = tmp_path / "hermes"
    home.mkdir()
    env = home / ".env"
    env.write_text("OPENAI_API_KEY=sk-mine\n", encoding="utf-8")
    env.chmod(0o640)
    url = f"sqlite:///{tmp_path / 'team.db'}"
    assert lcm("hermes", "install", "--hermes-home", str(home), "--database-url", url)[0] == 0
    assert mode(env) == 0o640 and env.read_text(encoding="utf-8") == f"OPENAI_API_KEY=sk-mine\nLCM_DATABASE_URL={url}\n"
    [backup] = home.glob(".env.bak-lcm-*")
    assert backup.read_text(encoding="utf-8") == "OPENAI_API_KEY=sk-mine\n" and mode(backup) == 0o640
    assert lcm("hermes", "uninstall", "--hermes-home", str(home))[0] == 0
    assert env.read_text(encoding="utf-8") == "OPENAI_API_KEY=sk-mine\n" and mode(env) == 0o640
