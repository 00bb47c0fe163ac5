"""``lcm import FORMAT PATH``: another tool's store into lcm (``lcm.importers``), each session
exactly once, so running it again imports nothing new."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import click
from rich.table import Table

from lcm.cli.common import emit_json, json_option, resumable, say, show_table, url_option
from lcm.cli.stores import context_on, open_store
from lcm.cli.transfer import DEFAULT_CONTEXT, import_plans, ingest_command
from lcm.importers import read_hermes_state
from lcm.transfer import SessionPlan, plan_sessions, read_transcript

FORMATS = ("hermes", "jsonl")


@click.command("import")
@click.argument("format_name", metavar="FORMAT", type=click.Choice(FORMATS))
@click.argument("path", metavar="PATH")
@url_option
@json_option
@click.option("--agent", default=None, metavar="NAME",
              help="Agent to import into (default: hermes: each session's Hermes profile; jsonl: default).")
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
    system prompt) or jsonl (what lcm export writes). Idempotent; the file is only read."""
    by_agent: dict[str, list[SessionPlan]] = defaultdict(list)
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
        rewound = 0
    else:
        found, rewound = read_hermes_state(path, sessions=sessions)  # a wrong file fails here, before any write
        for profile, plan in found:
            by_agent[agent or profile].append(plan)
    store = open_store(url, create=not dry_run)
    rows: list[dict[str, Any]] = []
    for name, plans in by_agent.items():
        if dry_run:
            for plan in plans:
                there = store.sessions.find(name, plan.session_key)
                stored = there.message_count if there is not None else 0
                rows.append({"agent": name, "session_id": plan.session_key, "in_file": len(plan.entries),
                             "already_stored": min(stored, len(plan.entries)),
                             "added": max(0, len(plan.entries) - stored)})
            continue
        context = context_on(store, name, context_length=context_length)
        with resumable("import", "every message stored so far is kept, once"):
            reports, _ = import_plans(context, plans, compact=not no_compact, show_progress=not as_json)
        rows += [{"agent": name, "session_id": r.session_key, "in_file": r.in_file,
                  "already_stored": r.already_stored, "added": r.added, "system_prompts_kept": r.system_prompts}
                 for r in reports]
    if not dry_run and any(r["added"] for r in rows):
        store.health.optimize()
    result = {"format": format_name, "source": path, "dry_run": dry_run, "sessions": rows,
              "messages_added": sum(r["added"] for r in rows), "rewound_not_imported": rewound}
    if as_json:
        emit_json(result)
        return
    table = Table(title=f"lcm import {format_name} {path}" + (" (dry run)" if dry_run else ""))
    for col in ("agent", "session", "in file", "already stored", "added" if not dry_run else "would add"):
        table.add_column(col, justify="left" if col in ("agent", "session") else "right")
    for r in rows:
        table.add_row(r["agent"], r["session_id"], str(r["in_file"]), str(r["already_stored"]), str(r["added"]))
    show_table(table)
    if rewound:
        say(f"{rewound} rewound message(s) (undone in Hermes) were not imported")
