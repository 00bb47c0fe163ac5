"""The store's own files stopping writes (issue 13.12): a SQLite database that was read-only
for a while, and a write lock held by another process. Real files, real processes.

Root ignores file modes, so the host runs in forked child processes as ``nobody`` (each child
is a host process: a restart is a new child). Skipped, with the reason, where this process
cannot change user.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from tests.support.conversation import SYSTEM, conversation

NOBODY = 65534


def _engine(url: str) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url))
    engine.update_model("test-model", 10_000_000)
    engine.on_session_start("s")
    return engine


def host_turn(url: str, turns: int) -> dict:
    """One host process: hand over the transcript of ``turns`` turns, report what happened."""
    engine = _engine(url)
    engine.on_turn_complete([SYSTEM, *conversation(turns)])
    doctor = json.loads(engine.handle_tool_call("lcm_doctor", {}))
    status = engine.get_status()
    try:
        stored = len(engine.store.messages.get_range(engine.session.id, limit=10_000))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        stored = f"{type(exc).__name__}: {exc}"
    return {"stored": stored, "last_error": status["last_error"],
            "checks": {c["name"]: (c["status"], c["detail"]) for c in doctor.get("checks", [])}}


def as_nobody(fn, *args):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def run() -> None:
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            queue.put(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            queue.put(("error", f"{type(exc).__name__}: {exc}"))

    child = ctx.Process(target=run)
    child.start()
    kind, value = queue.get(timeout=120)
    child.join(30)
    assert kind == "ok", value
    return value


@pytest.fixture
def nobody_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the host as another user (file modes do not stop root)")
    home = tmp_path / "store"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    for parent in (tmp_path, *tmp_path.parents):  # the child must reach the folder
        if not os.access(parent, os.X_OK) or not parent.stat().st_mode & stat.S_IXOTH:
            parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
    # Everything lcm imports is loaded here, before the children fork.
    Store.open(f"sqlite:///{tmp_path / 'warm.db'}").sessions.get_or_create("a", "s")
    return home


def test_a_store_that_was_read_only_recovers_by_itself(nobody_dir: Path):
    url = f"sqlite:///{nobody_dir / 'lcm.db'}"
    db_file = nobody_dir / "lcm.db"
    first = as_nobody(host_turn, url, 2)
    assert first["stored"] == len(conversation(2)) and first["last_error"] is None
    last = sqlite3.connect(db_file)  # the last connection closing removes -wal and -shm
    last.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    last.close()
    assert not (nobody_dir / "lcm.db-shm").exists()
    db_file.chmod(0o444)
    read_only = as_nobody(host_turn, url, 4)
    assert "read-only" in (read_only["last_error"] or ""), read_only
    assert str(db_file) in read_only["last_error"]
    assert read_only["checks"]["sqlite_writable"][0] == "fail"
    db_file.chmod(0o644)
    companions = [p for p in nobody_dir.iterdir() if p.name.endswith(("-wal", "-shm"))]
    assert all(not os.stat(p).st_mode & stat.S_IWUSR for p in companions), \
        "the read-only period should have left read-only companion files (the bug's trigger)"
    again = as_nobody(host_turn, url, 5)
    assert again["last_error"] is None, again
    assert again["stored"] == len(conversation(5))  # every message of the read-only period too
    assert again["checks"]["sqlite_writable"][0] == "ok"


def test_the_doctor_names_a_write_lock_held_by_another_process(sqlite_url: str):
    store = Store.open(sqlite_url)
    path = store.url.database
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        checks = {c.name: c for c in store.health.checks()}
        assert checks["sqlite_write_lock"].status == "warn"
        assert "another process holds the write lock" in checks["sqlite_write_lock"].detail
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert {c.name: c.status for c in store.health.checks()}["sqlite_write_lock"] == "ok"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MB tmpfs: a disk that fills up."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        from lcm.store import connection as db

        db.dispose(db.resolve_url(f"sqlite:///{mount / 'lcm.db'}"))
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_loses_nothing_and_writes_resume_when_there_is_room(small_disk: Path):
    url = f"sqlite:///{small_disk / 'lcm.db'}"
    engine = _engine(url)
    transcript = [SYSTEM, *conversation(2)]
    engine.on_turn_complete(transcript)
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # take every free byte
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    big = [{"role": "tool", "tool_call_id": f"x{i}", "content": f"output {i} " + "data " * 20_000}
           for i in range(3)]
    full = transcript + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": f"x{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        for i in range(3)]}, *big, {"role": "assistant", "content": "read them"}]
    engine.on_turn_complete(full)  # no room: not stored, nothing raised
    error = engine.get_status()["last_error"] or ""
    assert "full" in error, error
    filler.unlink()
    full = full + conversation(4)[len(conversation(2)):]
    engine.on_turn_complete(full)
    assert engine.get_status()["last_error"] == error  # no new failure
    stored = [r.message for r in engine.store.messages.get_range(engine.session.id, limit=10_000)]
    assert stored == full[1:]
    assert all(c.status == "ok" for c in engine.store.health.checks(deep=True)
               if c.name != "summary_sizes"), engine.store.health.checks(deep=True)
