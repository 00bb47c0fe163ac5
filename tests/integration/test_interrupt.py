"""Ctrl-C in a long import says what is kept and that the same command continues (issue 33.5),
on the real console script: a real SIGINT to a real process, then the same command again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lcm.store import Store
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

MESSAGES = 6_000


def test_ctrl_c_in_ingest_keeps_what_is_stored_and_the_same_command_continues(tmp_path):
    chat = tmp_path / "long.jsonl"
    with chat.open("w", encoding="utf-8") as out:
        for i in range(MESSAGES):
            role = "user" if i % 2 == 0 else "assistant"
            out.write(json.dumps({"role": role, "content": f"turn {i}: the build of service s{i % 37} "
                                                            f"took {i % 500} ms and printed token t{i}"}) + "\n")
    url = f"sqlite:///{tmp_path / 'lcm.db'}"
    command = [sys.executable, "-m", "lcm", "ingest", str(chat), "--url", url, "--agent", "a", "--session", "s1"]
    env = {**os.environ, "LCM_EMBEDDINGS": "off", "LCM_SUMMARIZER": "extractive"}
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        stored = 0
        while time.monotonic() < deadline and proc.poll() is None:
            if (tmp_path / "lcm.db").exists():
                session = Store.open(url).sessions.find("a", "s1")
                stored = session.message_count if session is not None else 0
                if stored:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, "the ingest finished before it could be interrupted: make it longer"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "ingest: interrupted; every message stored so far is kept, once: run the same command again to continue" \
        in err
    kept = Store.open(url).sessions.find("a", "s1").message_count
    assert 0 < kept < MESSAGES
    again = subprocess.run([*command, "--json"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    [row] = json.loads(again.stdout)["sessions"]
    assert row["already_stored"] == kept and row["added"] == MESSAGES - kept
    store = Store.open(url)
    records = store.messages.get_range(store.sessions.find("a", "s1").id)
    assert [r.message["content"].split(":")[0] for r in records] == [f"turn {i}" for i in range(MESSAGES)]
