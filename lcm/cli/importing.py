"""``lcm import FORMAT PATH``: another tool's store into lcm (``lcm.importers``), each session
exactly once, so running it again imports nothing new; the summaries hermes-lcm and
lossless-claw wrote go into lcm's DAG where they map cleanly (``lcm.importers.dag``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import click
from rich.table import Table

from lcm.cli.common import emit_json, json_option, resumable, say, show_table, url_option
from lcm.cli.stores import context_on, open_store
from lcm.cli.transfer import DEFAULT_CONTEXT, import_plans, ingest_command
from lcm.errors import NotFoundError
from lcm.importers import plan_dag, read_hermes_lcm, read_hermes_state, read_lossless_claw
from lcm.store import Store
from lcm.transfer import SessionPlan, plan_sessions, read_transcript

#: ``hermes-state`` is the contract's name for ``hermes`` (docs/contract.md); both work.
FORMATS = ("hermes", "hermes-state", "hermes-lcm", "lossless-claw", "jsonl")


@click.command("import")
@click.argument("format_name", metavar="FORMAT", type=click.Choice(FORMATS))
@click.argument("path", metavar="PATH")
@url_option
@json_option
@click.option("--agent", default=None, metavar="NAME",
              help="Agent to import into (default: hermes: each session's Hermes profile; lossless-claw: the "
                   "OpenClaw agent of each conversation; hermes-lcm, jsonl: default).")
@click.option("--session", "sessions", multiple=True, metavar="ID", help="Only this session (repeatable).")
@click.option("--dry-run", is_flag=True, help="Only count what would be imported.")
@click.option("--no-compact", is_flag=True, help="Only store; do not summarize.")
@click.option("--context-length", type=click.IntRange(1_000), default=DEFAULT_CONTEXT, show_default=True,
              help="Model window the compaction aims for.")
@click.pass_context
def import_command(ctx: click.Context, format_name: str, path: str, url: str | None, as_json: bool,
                   agent: str | None, sessions: tuple[str, ...], dry_run: bool, no_compact: bool,
                   context_length: int) -> None:
    """Import another store: hermes (Hermes' state.db: every session, message, tool call and
    system prompt), hermes-lcm or lossless-claw (their lcm.db: every message and their summary
    DAG), or jsonl (what lcm export writes). Idempotent; the file is only read."""
    by_agent: dict[str, list[SessionPlan]] = defaultdict(list)
    rewound = 0
    left_out: dict[str, int] = {}
    if format_name == "jsonl":
        if len(sessions) > 1:
            raise click.UsageError("lcm import jsonl takes at most one --session (the session the file goes to, "
                                   "as for lcm ingest)")
        if not dry_run:
            ctx.invoke(ingest_command, source=path, url=url, agent=agent or "default", as_json=as_json,
                       session_key=sessions[0] if sessions else None, platform=None, skip_bad=False,
                       no_compact=no_compact, context_length=context_length)
            return
        transcript = read_transcript(path, skip_bad=False)  # a bad file fails here, line by line
        by_agent[agent or "default"] = plan_sessions(transcript, session_key=sessions[0] if sessions else None)
    else:
        if format_name in ("hermes", "hermes-state"):
            hermes = read_hermes_state(path, sessions=sessions)  # a wrong file fails here, before any write
            found, rewound = hermes.plans, hermes.rewound
            left_out = {"compaction_copies_not_stored": hermes.copies,
                        "hermes_summaries_kept_as_notes": hermes.summaries}
        elif format_name == "hermes-lcm":
            found = read_hermes_lcm(path, sessions=sessions)
        else:
            found = read_lossless_claw(path, sessions=sessions)
        for owner, plan in found:
            by_agent[agent or owner].append(plan)
    try:
        store: Store | None = open_store(url, create=not dry_run)
    except NotFoundError:
        if not dry_run:
            raise
        store = None  # a dry run into a store that does not exist yet: everything would be added
    rows: list[dict[str, Any]] = []
    for name, plans in by_agent.items():
        if dry_run:
            for plan in plans:
                there = store.sessions.find(name, plan.session_key) if store is not None else None
                stored = there.message_count if there is not None else 0
                row = {"agent": name, "session_id": plan.session_key, "in_file": len(plan.entries),
                       "already_stored": min(stored, len(plan.entries)), "added": max(0, len(plan.entries) - stored)}
                if plan.summaries:
                    dag = plan_dag([e.message for e in plan.entries], plan.summaries)
                    row["summaries"] = {"in_file": len(plan.summaries), "placeable": len(dag.nodes),
                                        "notes": len(dag.notes)}
                rows.append(row)
            continue
        assert store is not None
        context = context_on(store, name, context_length=context_length)
        with resumable("import", "every message stored so far is kept, once"):
            reports, _ = import_plans(context, plans, compact=not no_compact, show_progress=not as_json,
                                      label="import")
        rows += [{"agent": name, "session_id": r.session_key, "in_file": r.in_file,
                  "already_stored": r.already_stored, "added": r.added, "system_prompts_kept": r.system_prompts,
                  **({"summaries": r.imported_summaries} if r.imported_summaries is not None else {})}
                 for r in reports]
    if store is not None and not dry_run and any(r["added"] for r in rows):
        store.health.optimize()
    result = {"format": format_name, "source": path, "dry_run": dry_run, "sessions": rows,
              "messages_added": sum(r["added"] for r in rows), "rewound_not_imported": rewound, **left_out}
    if as_json:
        emit_json(result)
        return
    table = Table(title=f"lcm import {format_name} {path}" + (" (dry run)" if dry_run else ""))
    with_summaries = any("summaries" in r for r in rows)
    columns = ["agent", "session", "in file", "already stored", "added" if not dry_run else "would add"]
    for col in columns + (["summaries"] if with_summaries else []):
        table.add_column(col, justify="left" if col in ("agent", "session", "summaries") else "right")
    for r in rows:
        cells = [r["agent"], r["session_id"], str(r["in_file"]), str(r["already_stored"]), str(r["added"])]
        if with_summaries:
            cells.append(_summaries_cell(r.get("summaries"), dry_run))
        table.add_row(*cells)
    show_table(table)
    notes = sum((r.get("summaries") or {}).get("notes", 0) for r in rows)
    if notes:
        say(f"{notes} summary(ies) did not map onto lcm's DAG and are kept as the session's imported notes "
            "(lcm sessions --json shows them under origin.notes)")
    if rewound:
        say(f"{rewound} rewound message(s) (undone in Hermes) were not imported")
    if left_out.get("compaction_copies_not_stored"):
        say(f"{left_out['compaction_copies_not_stored']} row(s) were copies Hermes' compressor re-inserted: "
            "each message is stored once")
    if left_out.get("hermes_summaries_kept_as_notes"):
        say(f"{left_out['hermes_summaries_kept_as_notes']} Hermes compressor summary(ies) kept as the session's "
            "imported notes, not as messages (lcm sessions --json shows them under origin.notes)")


def _summaries_cell(summaries: dict[str, int] | None, dry_run: bool) -> str:
    if not summaries:
        return "-"
    if dry_run:
        return f"{summaries['placeable']} of {summaries['in_file']} placeable, {summaries['notes']} note(s)"
    parts = [f"{summaries['placed']} placed"]
    if summaries["already_placed"]:
        parts.append(f"{summaries['already_placed']} already")
    if summaries["not_placed"]:
        parts.append(f"{summaries['not_placed']} not placed (already summarized)")
    if summaries["notes"]:
        parts.append(f"{summaries['notes']} note(s)")
    return ", ".join(parts)
