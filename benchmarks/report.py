"""``python -m benchmarks.report results.json [more.json ...]``: the tables of ``--json`` runs as Markdown.

``--compare before.json after.json`` prints search latency per query class side by side.

This is how ``docs/benchmarks.md`` gets its tables: the figures are pasted from a real run,
never typed in.
"""

from __future__ import annotations

import argparse
import json

from benchmarks import tables


def render(data: dict) -> str:
    machine = data.get("machine", {})
    out = [f"_Machine: {machine.get('cpus', '?')} cores, Python {machine.get('python', '?')}, "
           f"{machine.get('platform', '?')}_\n"]
    for phase, results in data["results"].items():
        out += [tables.markdown(spec) for spec in tables.BUILDERS[phase](results)]
    return "\n".join(out)


def compare(before: dict, after: dict) -> str:
    """lcm_grep latency per query class, before and after a change (same backend and size)."""
    earlier = {(r["backend"], r["messages"]): r for r in before["results"].get("search", [])}
    out = []
    for r in after["results"].get("search", []):
        old = earlier.get((r["backend"], r["messages"]))
        if old is None:
            continue
        old_rows = {(x["class"], x["scope"], x["sort"]): x for x in old["rows"]}
        spec = tables.TableSpec(f"lcm_grep before and after, {r['backend']}, {r['messages']:,} messages, ms",
                                ["class", "scope", "sort", "before p50", "before p95", "after p50", "after p95"],
                                left=frozenset({"class", "scope", "sort"}))
        for x in r["rows"]:
            o = old_rows.get((x["class"], x["scope"], x["sort"]))
            spec.rows.append([x["class"], x["scope"], x["sort"],
                              tables.f(o["lcm"]["p50"] if o else None), tables.f(o["lcm"]["p95"] if o else None),
                              tables.f(x["lcm"]["p50"]), tables.f(x["lcm"]["p95"])])
        worst_old = max(x["lcm"]["p95"] for x in old["rows"])
        worst_new = max(x["lcm"]["p95"] for x in r["rows"])
        spec.notes.append(f"worst p95 {worst_old:.1f} ms before, {worst_new:.1f} ms after")
        out.append(tables.markdown(spec))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="files written by python -m benchmarks --json")
    parser.add_argument("--compare", action="store_true",
                        help="two files: search latency of the first (before) against the second (after)")
    args = parser.parse_args()
    loaded = []
    for path in args.results:
        with open(path, encoding="utf-8") as src:
            loaded.append(json.load(src))
    if args.compare:
        if len(loaded) != 2:
            parser.error("--compare takes exactly two files: before and after")
        print(compare(*loaded))
        return
    for data in loaded:
        print(render(data))


if __name__ == "__main__":
    main()
