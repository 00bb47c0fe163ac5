"""Start-up: a fresh process opens an existing store of a given size and serves the first turn.

The store holds many sessions of one agent, grown with bulk appends until it reaches the
target size on disk. A new Python process (as a restarted Hermes is) then imports lcm, builds
the engine, starts the newest session (database open, schema check), and serves one turn: the
host's resumed transcript (its last 40 messages plus a new turn) through ``on_turn_complete``,
``should_compress`` and ``compress``. Timed inside the child, and as the child's wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks.common import append_messages
from benchmarks.corpus import Corpus
from lcm.store import Store

BATCH = 500
MESSAGES_PER_SESSION = 200  # ~30k tokens: a session that needs no compaction on its first turn

CHILD = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import json, resource, sys
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine
    url, key, transcript_path, agent = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    t_import = time.perf_counter()
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id=agent))
    engine.update_model("bench", 128000)
    engine.on_session_start(key)
    engine.session
    t_open = time.perf_counter()
    transcript = json.load(open(transcript_path))
    before = engine.store.sessions.get(engine.session.id).message_count
    engine.on_turn_complete(transcript)
    engine.should_compress(20000)
    out = engine.compress(transcript, current_tokens=20000)
    t_turn = time.perf_counter()
    assert engine.context.last_error is None, engine.context.last_error
    stored_new = engine.store.sessions.get(engine.session.id).message_count - before
    print(json.dumps({"stored_new": stored_new, "import_s": t_import - t0, "open_s": t_open - t_import,
                      "first_turn_s": t_turn - t_open, "total_s": t_turn - t0,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


def build(url: str, target_bytes: int) -> tuple[Store, str, int]:
    """Grow the store to ``target_bytes`` on disk; returns (store, newest session key, messages)."""
    store = Store.open(url, upgrade=True)
    corpus = Corpus(seed=11)
    total, s, key = 0, 0, ""
    while store.health.stats()["bytes"] < target_bytes:
        key = f"startup-{s:05d}"
        session = store.sessions.get_or_create("bench", key)
        anchor = None
        flat = [m for t in corpus.turns(MESSAGES_PER_SESSION // 4, session=key) for m in t]
        for b in range(0, len(flat), BATCH):
            anchor = append_messages(store, session.id, flat[b:b + BATCH], after_identity=anchor).last_identity
        total += len(flat)
        s += 1
    store.health.optimize()
    return store, key, total


def run(backend: str, url: str, *, target_mb: int) -> dict[str, Any]:
    started = time.perf_counter()
    store, key, total = build(url, target_mb * 1024 * 1024)
    built = time.perf_counter() - started
    size = store.health.stats()["bytes"]
    return {"store_bytes": size, "messages": total, "build_seconds": built, **cold_start(store, "bench", key)}


def cold_start(store: Store, agent: str, key: str) -> dict[str, Any]:
    """A new process resumes session ``key`` of ``agent`` (its last 40 messages plus a new turn)
    and serves one turn; the child's own timings and its wall time seen from here."""
    session = store.sessions.find(agent, key)
    assert session is not None
    tail = [r.message for r in store.messages.get_range(session.id, first_seq=session.last_seq - 39)]
    new_turn = next(Corpus(seed=12).turns(1, session="startup-new"))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"role": "system", "content": "You are a benchmark agent."}, *tail, *new_turn], f)
    from lcm.store import connection as db

    url = store.url.render_as_string(hide_password=False)
    db.dispose(store.url)  # the child must open the store itself, cold
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, url, key, f.name, agent], capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - t
    Path(f.name).unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"start-up child failed: {done.stderr[-2000:]}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    # The resumed tail is already stored: only the new turn may be (a duplicate ingest once hid here).
    assert child.pop("stored_new") == len(new_turn), child
    return {"process_wall_s": wall, **child}
