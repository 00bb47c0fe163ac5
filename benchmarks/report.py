"""``python -m benchmarks.report results.json [more.json ...]``: the tables of ``--json`` runs as Markdown.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="files written by python -m benchmarks --json")
    args = parser.parse_args()
    for path in args.results:
        with open(path, encoding="utf-8") as src:
            print(render(json.load(src)))


if __name__ == "__main__":
    main()
