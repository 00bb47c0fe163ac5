"""``python -m benchmarks``: every benchmark, both backends, one run, printed as tables.

    python -m benchmarks                  # default sizes (about 10 minutes on 2 cores)
    python -m benchmarks --large          # adds search at 1M messages and start-up on a 1 GB store
    python -m benchmarks --smoke          # tiny sizes: a check that nothing rotted (CI runs it)
    python -m benchmarks --backend sqlite --only search,startup --json results.json

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

from benchmarks.common import BACKENDS

console = Console()

SIZES: dict[str, dict[str, list[dict[str, Any]]]] = {
    "smoke": {
        "ingest": [{"turns": 40, "bulk_messages": 1_000}],
        "search": [{"messages": 2_000, "sessions": 8, "runs": 5}],
        "turn_overhead": [{"size": 1_000}],
        "compaction": [{"messages": 2_000}],
        "startup": [{"target_mb": 5}],
    },
    "default": {
        "ingest": [{"turns": 1_000, "bulk_messages": 20_000}],
        "search": [{"messages": 10_000, "sessions": 20, "runs": 40},
                   {"messages": 100_000, "sessions": 50, "runs": 40}],
        "turn_overhead": [{"size": 1_000}, {"size": 10_000}, {"size": 100_000}],
        "compaction": [{"messages": 20_000}],
        "startup": [{"target_mb": 100}],
    },
}
LARGE_EXTRA = {"search": [{"messages": 1_000_000, "sessions": 200, "runs": 40}],
               "startup": [{"target_mb": 1_024}]}


def run_worker(phase: str, backend: str, params: dict[str, Any]) -> dict[str, Any]:
    label = f"{phase} {backend} {json.dumps(params)}"
    console.print(f"[dim]running {label} ...[/]")
    done = subprocess.run([sys.executable, "-m", "benchmarks.worker", phase, backend, json.dumps(params)],
                          capture_output=True, text=True, timeout=6 * 3600)
    if done.returncode != 0:
        raise SystemExit(f"benchmark {label} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def f(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def show_ingest(results: list[dict[str, Any]]) -> None:
    table = Table(title="ingest: lcm against the raw driver (same corpus, same machine, same run)")
    for col in ("backend", "per-turn lcm turns/s", "raw turns/s", "ratio", "lcm p50/p95 ms",
                "bulk lcm msgs/s", "raw msgs/s", "ratio", "peak RSS MB"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        t, b = r["per_turn"], r["bulk"]
        table.add_row(r["backend"], f(t["lcm_turns_per_s"], 0), f(t["raw_turns_per_s"], 0), f"{t['ratio']:.0%}",
                      f"{f(t['lcm_ms']['p50'])} / {f(t['lcm_ms']['p95'])}", f(b["lcm_msgs_per_s"], 0),
                      f(b["raw_msgs_per_s"], 0), f"{b['ratio']:.0%}", f(r["peak_rss_mb"], 0))
    console.print(table)
    console.print("goal: per-turn ingest at >= 50% of the raw driver's rate")


def show_search(results: list[dict[str, Any]]) -> None:
    for r in results:
        table = Table(title=f"lcm_grep against the raw FTS query, {r['backend']}, {r['messages']:,} messages "
                            f"({r['store_bytes'] / 1_048_576:,.0f} MB, loaded at {r['messages'] / r['load_seconds']:,.0f} msg/s), ms")
        for col in ("class", "scope", "sort", "lcm p50", "lcm p95", "raw p50", "raw p95", "p95 ratio", "avg hits"):
            table.add_column(col, justify="left" if col in ("class", "scope", "sort") else "right")
        for row in r["rows"]:
            lcm, raw = row["lcm"], row["raw"]
            table.add_row(row["class"], row["scope"], row["sort"], f(lcm["p50"]), f(lcm["p95"]), f(raw["p50"]),
                          f(raw["p95"]), f"{lcm['p95'] / raw['p95']:.2f}x" if raw["p95"] else "-", f(row["hits"], 1))
        console.print(table)
        rec = r["recall"]
        worst = max(row["lcm"]["p95"] for row in r["rows"])
        console.print(f"needle recall {rec['found']}/{rec['total']} "
                      f"({100.0 * rec['found'] / max(rec['total'], 1):.1f}%); worst lcm_grep p95 {worst:.1f} ms; "
                      f"peak RSS {r['peak_rss_mb']:.0f} MB (goal: p95 <= 50 ms at 1M, recall 100%)")


def show_overhead(results: list[dict[str, Any]]) -> None:
    table = Table(title="per-turn overhead (ms, p50 / p95) as history grows")
    ops = ["ingest one turn", "should_compress", "compress (nothing to do)", "whole turn"]
    for col in ("backend", "stored", *ops, "peak RSS MB"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        table.add_row(r["backend"], f"{r['stored']:,}",
                      *(f"{f(r['ops'][op]['p50'])} / {f(r['ops'][op]['p95'])}" for op in ops), f(r["peak_rss_mb"], 0))
    console.print(table)
    console.print("goal: flat in history size, <= 5 ms at 100k messages")


def show_compaction(results: list[dict[str, Any]]) -> None:
    table = Table(title="compaction with the extractive summarizer (LLM time excluded)")
    for col in ("backend", "messages", "compacted", "seconds", "msgs/s", "summaries", "DAG", "peak RSS MB"):
        table.add_column(col, justify="left" if col in ("backend", "DAG") else "right")
    for r in results:
        table.add_row(r["backend"], f"{r['messages']:,}", f"{r['compacted']:,}", f(r["seconds"]),
                      f(r["msgs_per_s"], 0), str(r["leaves"] + r["condensed"]),
                      " ".join(f"{k}:{v}" for k, v in sorted(r["depths"].items())), f(r["peak_rss_mb"], 0))
    console.print(table)


def show_startup(results: list[dict[str, Any]]) -> None:
    table = Table(title="start-up: a new process opens an existing store and serves the first turn (s)")
    for col in ("backend", "store MB", "messages", "import", "open", "first turn", "total in process",
                "process wall", "child RSS MB"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        table.add_row(r["backend"], f(r["store_bytes"] / 1_048_576, 0), f"{r['messages']:,}", f(r["import_s"], 3),
                      f(r["open_s"], 3), f(r["first_turn_s"], 3), f(r["total_s"], 3), f(r["process_wall_s"], 3),
                      f(r["peak_rss_mb"], 0))
    console.print(table)
    console.print("goal: under 1 s on a 1 GB store")


SHOW = {"ingest": show_ingest, "search": show_search, "turn_overhead": show_overhead,
        "compaction": show_compaction, "startup": show_startup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): nothing rotted")
    size.add_argument("--large", action="store_true", help="also 1M-message search and a 1 GB start-up")
    parser.add_argument("--only", default="", help=f"comma list of phases: {', '.join(SHOW)}")
    parser.add_argument("--json", dest="json_out", help="also write every result to this file")
    args = parser.parse_args()
    plan = {k: list(v) for k, v in SIZES["smoke" if args.smoke else "default"].items()}
    if args.large:
        for phase, extra in LARGE_EXTRA.items():
            plan[phase] = plan[phase] + extra
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
        for params in plan[phase]:
            for backend in backends:
                results.setdefault(phase, []).append(run_worker(phase, backend, params))
        SHOW[phase](results[phase])
    console.print(f"all benchmarks done in {time.perf_counter() - started:,.0f} s")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                                   "python": platform.python_version(), "platform": platform.platform()},
                       "results": results}, out, indent=1)


if __name__ == "__main__":
    main()
