"""Run one benchmark phase on one backend in this process and print its result as JSON.

``python -m benchmarks`` starts one worker per (phase, backend, size), so every phase starts
cold and its peak memory is its own.

    python -m benchmarks.worker search sqlite '{"messages": 10000, "sessions": 20, "runs": 10}'
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

from benchmarks.common import backend_url, peak_rss_mb

#: Phase name -> the module whose ``run(backend, url, **params)`` measures it. Imported on
#: demand: the cache phase runs in the Hermes venv, which has no use for the others.
PHASES = ("ingest", "search", "turn_overhead", "compaction", "startup", "cache", "recall", "fleet", "ui", "cli",
          "locomo", "locomo_prompt", "server_cost", "pooler", "scale", "proxy")


def main() -> None:
    phase, backend, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if phase not in PHASES:
        raise SystemExit(f"unknown phase {phase!r}: one of {', '.join(PHASES)}")
    # Embeddings are measured by the recall phase (which turns them on itself); the other
    # phases measure storage, as before embeddings existed, whatever extras are installed.
    os.environ.setdefault("LCM_EMBEDDINGS", "off")
    run = importlib.import_module(f"benchmarks.{phase}").run
    url, cleanup = backend_url(backend)
    started = time.perf_counter()
    try:
        result = run(backend, url, **params)
    finally:
        cleanup()
    result.update({"phase": phase, "backend": backend, "params": params,
                   "peak_rss_mb": peak_rss_mb(), "wall_s": time.perf_counter() - started})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
