"""Several host processes on one session, at a size worth reporting (the CI tests run it small).

    python -m tests.support.faults_writers --url sqlite:////tmp/w.db --turns 150 [--json]

Two scenarios, each with real processes (spawned) running real engines:
  * ``same``: 4 hosts grow one transcript at their own pace, restarting now and then;
  * ``diverging``: 3 hosts share a first turn, then each says its own things.
Each reports messages expected / stored / lost / duplicated / misplaced (a host's message in a
session that is not on that host's lineage, or out of order). Every figure but the first two
must be zero.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

from lcm.store import Store
from lcm.store import connection as db
from tests.support import workers
from tests.support.storing import family_of, lineage_of


def _key(m: dict) -> str:
    return json.dumps(m, sort_keys=True)


def run(url: str, turns: int) -> list[dict]:
    Store.open(url, upgrade=True)
    ctx = multiprocessing.get_context("spawn")
    rows = []
    # same transcript
    key = f"same-{time.time_ns()}"
    with ProcessPoolExecutor(4, mp_context=ctx) as ex:
        start = time.time() + 4
        list(ex.map(workers.host_same_transcript, [url] * 4, [key] * 4, [turns] * 4, range(4), [start] * 4))
    store = Store.open(url)
    expected = [m for i in range(turns) for m in workers.turn("shared", i)]
    sessions = family_of(store, "default", key)
    stored = [r.message for s in sessions for r in store.messages.get_range(s.id, limit=1_000_000)]
    rows.append(_figures("same transcript, 4 processes", expected, stored,
                         misplaced=0 if lineage_of(store, sessions[0]) == expected else 1,
                         sessions=len(sessions)))
    # diverging transcripts
    key = f"div-{time.time_ns()}"
    with ProcessPoolExecutor(3, mp_context=ctx) as ex:
        start = time.time() + 4
        results = list(ex.map(workers.host_own_transcript, [url] * 3, [key] * 3,
                              [f"h{w}" for w in range(3)], [turns] * 3, [start] * 3))
    common = workers.turn("common", 0)
    expected = common + [m for w, _ in results for i in range(1, turns) for m in workers.turn(w, i)]
    sessions = family_of(store, "default", key)
    stored = [r.message for s in sessions for r in store.messages.get_range(s.id, limit=1_000_000)]
    misplaced = 0
    for worker, session_key in results:
        own = common + [m for i in range(1, turns) for m in workers.turn(worker, i)]
        line = lineage_of(store, store.sessions.find("default", session_key))
        misplaced += sum(1 for a, b in zip(line, own, strict=False) if a != b) + abs(len(line) - len(own))
    rows.append(_figures("diverging transcripts, 3 processes", expected, stored, misplaced=misplaced,
                         sessions=len(sessions)))
    return rows


def _figures(name: str, expected: list[dict], stored: list[dict], *, misplaced: int, sessions: int) -> dict:
    want, have = Counter(map(_key, expected)), Counter(map(_key, stored))
    lost = sum((want - have).values())
    duplicated = sum((have - want).values())
    return {"scenario": name, "expected": len(expected), "stored": len(stored), "lost": lost,
            "duplicated": duplicated, "misplaced": misplaced, "sessions": sessions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.url, args.turns)
    db.dispose(db.resolve_url(args.url))
    if args.json:
        print(json.dumps({"backend": db.resolve_url(args.url).get_backend_name(), "rows": rows}, indent=2))
        return
    print(f"backend: {db.resolve_url(args.url).get_backend_name()}")
    print("| scenario | expected | stored | lost | duplicated | misplaced | sessions |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['expected']} | {r['stored']} | {r['lost']} | {r['duplicated']} "
              f"| {r['misplaced']} | {r['sessions']} |")


if __name__ == "__main__":
    main()
