"""SIGKILL at random points of ingest and compaction (the fault suite): a host process killed
again and again while it stores and compacts, restarted each time with its whole transcript,
stores every message exactly once and leaves a healthy store."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from lcm.store import Store
from tests.conftest import REPO_ROOT
from tests.support import workers

pytestmark = pytest.mark.slow

TURNS = 200
KILLS = 12


def test_a_host_killed_at_random_points_loses_and_duplicates_nothing(db_url):
    Store.open(db_url, upgrade=True)
    rng = random.Random(1324)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "tests.support.workers", "host-with-compaction", db_url, "killed", str(TURNS)]
    landed = 0  # kills that hit a running host (start-up ~0.5 s, a whole run ~1-2 s)
    for _ in range(KILLS):
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.4, 1.4))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            landed += 1
        proc.wait(timeout=300)
    final = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert final.stdout.strip().endswith("done"), final.stderr[-2000:]
    assert landed >= KILLS // 2, landed
    store = Store.open(db_url)
    session = store.sessions.find("default", "killed")
    expected = [m for i in range(TURNS) for m in workers.turn("k", i)]
    assert [r.message for r in store.messages.get_range(session.id, limit=10_000)] == expected
    assert store.sessions.forks(session.id) == []
    assert session.covered_seq > 0  # it compacted
    bad = [c for c in store.health.checks(deep=True) if c.status != "ok"]
    assert not bad, bad
