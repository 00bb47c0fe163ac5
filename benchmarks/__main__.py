"""``python -m benchmarks``: every benchmark, both backends, one run, printed as tables.

    python -m benchmarks                  # default sizes (about 15 minutes on 2 cores)
    python -m benchmarks --large          # adds search and lcm ui at 1M messages, start-up on a 1 GB store,
                                          # and the 10M-message store (scale)
    python -m benchmarks --large-only     # only those (skips the default sizes)
    python -m benchmarks --smoke          # tiny sizes: a check that nothing rotted (CI runs it)
    python -m benchmarks --only cache     # prompt-cache cost against Hermes' compressor (Hermes venv)
    python -m benchmarks --only recall    # questions in plain words: recall@5/10 against bm25s
    python -m benchmarks --only fleet     # 1-32 agent processes on one database, against raw commits
    python -m benchmarks --only ui        # lcm ui page times over HTTP on a big store
    python -m benchmarks --only cli       # lcm --version / --help / a command, as whole processes
    python -m benchmarks --only locomo    # lcm_grep recall@5/10 on LoCoMo conversations (LCM_LOCOMO_DIR)
    python -m benchmarks --only locomo_prompt  # evidence in the prompt, with and without auto-recall
    python -m benchmarks --only server_cost --backend postgresql  # what the server spends per turn
    python -m benchmarks --only pooler --backend postgresql       # 500 agent connections through PgBouncer
    python -m benchmarks --large-only --only scale   # 10M messages: search, turns, start-up, doctor, forget
    python -m benchmarks --only proxy     # lcm proxy's added latency and throughput, against the upstream direct
    python -m benchmarks --backend sqlite --only search,startup --json results.json
    python -m benchmarks.report results.json   # the same tables as Markdown (docs/benchmarks.md)

PostgreSQL comes from LCM_BENCH_POSTGRES_URL (else LCM_TEST_POSTGRES_URL, else the local
server); each run uses a fresh schema and drops it. Every lcm figure that has a raw-driver
baseline is printed with the ratio to it, measured in the same run: ratios hold on a noisy
machine where absolute numbers do not. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks import tables
from benchmarks.common import BACKENDS

console = Console()

SIZES: dict[str, dict[str, list[dict[str, Any]]]] = {
    "smoke": {
        "ingest": [{"turns": 40, "bulk_messages": 1_000}],
        "search": [{"messages": 2_000, "sessions": 8, "runs": 5}],
        "turn_overhead": [{"size": 1_000}],
        "compaction": [{"messages": 2_000}],
        "startup": [{"target_mb": 5}],
        "cache": [{"turns": 30, "windows": [64_000], "sweep": [0.4]}],
        "recall": [{"messages": 600, "questions": 100}],
        "fleet": [{"seconds": 2, "counts": [1, 2]}],
        "ui": [{"messages": 2_000, "sessions": 8, "runs": 3}],
        "cli": [{"runs": 3}],
        "locomo": [{"conversations": 1, "semantic": False}],
        "locomo_prompt": [{"conversations": 1, "semantic": False}],
        "server_cost": [{"turns": 20, "repeats": 1}],
        "pooler": [{"agents": 12, "processes": 2, "turns": 3, "pool_size": 2, "think_s": 0.1}],
        "scale": [{"agents": 6, "per_agent": 400, "big": 2_000, "templates": 3, "runs": 3, "recall_sample": 5,
                   "startups": 1}],
        "proxy": [{"sizes": [200], "runs": 4, "concurrency": [1, 2], "seconds": 1.0}],
    },
    "default": {
        "ingest": [{"turns": 1_000, "bulk_messages": 20_000}],
        "search": [{"messages": 10_000, "sessions": 20, "runs": 40},
                   {"messages": 100_000, "sessions": 50, "runs": 40}],
        "turn_overhead": [{"size": 1_000}, {"size": 10_000}, {"size": 100_000}],
        "compaction": [{"messages": 20_000}],
        "startup": [{"target_mb": 100}],
        "cache": [{"turns": 400}],
        "recall": [{"messages": 10_000}, {"messages": 100_000}],
        "fleet": [{"seconds": 15}],
        "ui": [{"messages": 100_000, "sessions": 50}],
        "cli": [{"runs": 15}],
        "locomo": [{}],
        "locomo_prompt": [{}],
        "server_cost": [{"turns": 300, "repeats": 5}],
        "pooler": [{"agents": 500, "processes": 10, "turns": 6, "pool_size": 10, "think_s": 10.0}],
        "scale": [],  # ten million messages: --large only
        "proxy": [{"sizes": [1_000, 100_000], "runs": 60, "concurrency": [1, 4, 16, 64], "seconds": 10.0}],
    },
}
#: Phases that drive hermes-agent (Hermes' own compressor side by side with lcm): they run in
#: the Hermes test venv, built on first use (tests/support/hermes_host.py).
HERMES_PHASES = frozenset({"cache"})
LARGE_EXTRA = {"search": [{"messages": 1_000_000, "sessions": 200, "runs": 40}],
               "startup": [{"target_mb": 1_024}],
               "ui": [{"messages": 1_000_000, "sessions": 200}],
               # 1,000 agents x 10k messages and one agent with 1M: 40 agents and the big one
               # through lcm, the rest copied in SQL (benchmarks/scale.py); about 1.5 h per backend.
               "scale": [{"agents": 1_000, "per_agent": 10_000, "big": 1_000_000, "templates": 40}]}


def worker_python(phase: str) -> str:
    """The interpreter a phase runs in: this one, or the Hermes venv for a Hermes phase."""
    if phase not in HERMES_PHASES:
        return sys.executable
    from tests.support.hermes_host import ensure_venv

    console.print("[dim]finding (or building) the hermes-agent venv ...[/]")
    venv, why = ensure_venv()
    if venv is None:
        raise SystemExit(f"the {phase} phase needs hermes-agent: {why}")
    return str(venv / "bin" / "python")


def run_worker(phase: str, backend: str, params: dict[str, Any]) -> dict[str, Any]:
    label = f"{phase} {backend} {json.dumps(params)}"
    console.print(f"[dim]running {label} ...[/]")
    done = subprocess.run([worker_python(phase), "-m", "benchmarks.worker", phase, backend, json.dumps(params)],
                          capture_output=True, text=True, timeout=6 * 3600)
    if done.returncode != 0:
        raise SystemExit(f"benchmark {label} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def show(phase: str, results: list[dict[str, Any]]) -> None:
    for spec in tables.BUILDERS[phase](results):
        table = Table(title=spec.title)
        for col in spec.columns:
            table.add_column(col, justify="left" if col in spec.left else "right")
        for row in spec.rows:
            table.add_row(*row)
        console.print(table)
        for note in spec.notes:
            console.print(note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): nothing rotted")
    size.add_argument("--large", action="store_true", help="also 1M-message search and ui, and a 1 GB start-up")
    size.add_argument("--large-only", action="store_true", help="only the 1M-message runs and the 1 GB start-up")
    parser.add_argument("--only", default="", help=f"comma list of phases: {', '.join(tables.BUILDERS)}")
    parser.add_argument("--json", dest="json_out", help="also write every result to this file")
    args = parser.parse_args()
    plan = {k: list(v) for k, v in SIZES["smoke" if args.smoke else "default"].items()}
    if args.large:
        for phase, extra in LARGE_EXTRA.items():
            plan[phase] = plan[phase] + extra
    if args.large_only:
        plan = {phase: list(extra) for phase, extra in LARGE_EXTRA.items()}
    phases = [p for p in plan if not args.only or p in args.only.split(",")]
    unknown = set(args.only.split(",")) - set(plan) - {""}
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    console.print(f"lcm benchmarks on {platform.node()}: {platform.processor() or platform.machine()}, "
                  f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    started = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    for phase in phases:
        if phase.startswith("locomo") and not os.environ.get("LCM_LOCOMO_DIR"):
            console.print(f"[yellow]{phase} skipped: LCM_LOCOMO_DIR is not set (the folder of LoCoMo <id>.json "
                          "files; .ci/run sets it when the data is beside the checkout)[/]")
            continue
        if not plan[phase]:
            continue
        for params in plan[phase]:
            for backend in backends:
                results.setdefault(phase, []).append(run_worker(phase, backend, params))
        show(phase, results[phase])
    console.print(f"all benchmarks done in {time.perf_counter() - started:,.0f} s")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                                   "python": platform.python_version(), "platform": platform.platform()},
                       "results": results}, out, indent=1)


if __name__ == "__main__":
    main()
