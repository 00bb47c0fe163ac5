"""Plots of benchmark results where a curve says more than a table.

    python -m benchmarks.plot results.json docs/results/fleet.png   # the fleet phase
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def fleet(results: list[dict[str, Any]], out: Path) -> None:
    """Throughput and turn p95 against the number of agent processes, per backend."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        agents = [row["agents"] for row in r["rows"]]
        left.plot(agents, [row["turns_per_s"] for row in r["rows"]], marker="o", label=r["backend"])
        right.plot(agents, [row["turn_ms"]["p95"] for row in r["rows"]], marker="o", label=f"{r['backend']} turn p95")
        right.plot(agents, [row["search_p95_ms"] or 0 for row in r["rows"]], marker="x", linestyle="--",
                   label=f"{r['backend']} lcm_grep p95")
    for ax, label in ((left, "turns/s, all agents"), (right, "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("agent processes (2 cores)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    right.set_yscale("log")
    left.set_title("throughput")
    right.set_title("latency under load")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    data = json.loads(source.read_text())
    results = data["results"] if isinstance(data, dict) and "results" in data else data
    fleet(results["fleet"] if isinstance(results, dict) else [r for r in results if r.get("phase") == "fleet"], out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
