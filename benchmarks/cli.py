"""The command line's start-up: whole ``lcm`` processes, timed from outside, several times each.

Every command pays for what it imports before it does anything; ``lcm --version`` and
``lcm --help`` should pay for almost nothing (goal: under 0.2 s on this machine). Measured in
the same run, as baselines: a bare interpreter (``python -c pass``), the engine's own import
(``python -c "import lcm.engine"``), and one command that does real work on an empty store of
the backend (``lcm sessions --json``), for what a command that opens a database costs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

RUNS = 15


def _timed(argv: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """Wall seconds of ``argv`` as a new process, ``runs`` times (after one warm-up run that
    fills the OS page cache): median, 90th percentile and the fastest."""
    def once() -> float:
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
        return elapsed

    once()
    times = sorted(once() for _ in range(runs))
    return {"p50": statistics.median(times), "p90": times[max(0, int(len(times) * 0.9) - 1)], "min": times[0]}


def run(backend: str, url: str, runs: int = RUNS) -> dict[str, Any]:
    lcm = shutil.which("lcm") or ""
    env = {**os.environ, "LCM_DATABASE_URL": url}
    from lcm.store import Store

    Store.open(url, upgrade=True)  # an empty store at head: `lcm sessions` reads it
    commands = {
        "python -c pass (interpreter)": [sys.executable, "-c", "pass"],
        "python -c 'import lcm.engine'": [sys.executable, "-c", "import lcm.engine"],
        "lcm --version": [lcm, "--version"],
        "lcm --help": [lcm, "--help"],
        "lcm grep --help": [lcm, "grep", "--help"],
        "lcm sessions --json (empty store)": [lcm, "sessions", "--json"],
    }
    if not lcm:
        raise SystemExit("the lcm command is not on PATH (pip install the checkout first)")
    return {"runs": runs, "commands": {name: _timed(argv, env, runs) for name, argv in commands.items()}}
