"""``python -m benchmarks.report results.json [more.json ...]``: the tables of ``--json`` runs as Markdown.

``--compare before.json after.json`` prints every phase's figures side by side (ingest, per-turn
overhead, compaction, start-up, and search latency per query class), each with the raw-driver
baseline of its own run where there is one.

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


def _by(data: dict, phase: str, *keys: str) -> dict[tuple, dict]:
    return {tuple([r["backend"], *(r.get(k) for k in keys)]): r for r in data["results"].get(phase, [])}


def compare_phases(before: dict, after: dict) -> str:
    """Ingest, per-turn overhead, compaction and start-up, before and after a change."""
    out = []
    spec = tables.TableSpec("ingest, before and after (each with its own run's raw driver)",
                            ["backend", "per turn lcm/raw before", "after", "bulk lcm/raw before", "after"])
    old = _by(before, "ingest")
    for key, r in _by(after, "ingest").items():
        o = old.get(key)

        def cell(x: dict | None, part: str, unit: str) -> str:
            if x is None:
                return "-"
            return (f"{x[part][f'lcm_{unit}_per_s']:,.0f} / {x[part][f'raw_{unit}_per_s']:,.0f} "
                    f"({x[part]['ratio']:.0%})")

        spec.rows.append([key[0], cell(o, "per_turn", "turns"), cell(r, "per_turn", "turns"),
                          cell(o, "bulk", "msgs"), cell(r, "bulk", "msgs")])
    out.append(tables.markdown(spec))
    spec = tables.TableSpec("whole turn (ingest one turn, should_compress, compress with nothing to do), ms",
                            ["backend", "stored", "before p50", "before p95", "after p50", "after p95"])
    old = _by(before, "turn_overhead", "stored")
    for key, r in _by(after, "turn_overhead", "stored").items():
        o = old.get(key, {}).get("ops", {}).get("whole turn")
        n = r["ops"]["whole turn"]
        spec.rows.append([key[0], f"{key[1]:,}", tables.f(o and o["p50"]), tables.f(o and o["p95"]),
                          tables.f(n["p50"]), tables.f(n["p95"])])
    out.append(tables.markdown(spec))
    spec = tables.TableSpec("compaction and start-up", ["backend", "figure", "before", "after"],
                            left=frozenset({"backend", "figure"}))
    figures_of = {"compaction": (("msgs_per_s", "compaction, messages/s"),),
                  "startup": (("total_s", "start-up in process, s"), ("process_wall_s", "start-up wall, s"))}
    for phase, figures in figures_of.items():
        old = _by(before, phase)
        for key, r in _by(after, phase).items():
            for field, label in figures:
                o = old.get(key)
                spec.rows.append([key[0], label, tables.f(o and o.get(field)), tables.f(r.get(field))])
    out.append(tables.markdown(spec))
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
                        help="two files: every phase of the first (before) against the second (after)")
    args = parser.parse_args()
    loaded = []
    for path in args.results:
        with open(path, encoding="utf-8") as src:
            loaded.append(json.load(src))
    if args.compare:
        if len(loaded) != 2:
            parser.error("--compare takes exactly two files: before and after")
        print(compare_phases(*loaded))
        print(compare(*loaded))
        return
    for data in loaded:
        print(render(data))


if __name__ == "__main__":
    main()
