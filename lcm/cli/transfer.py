"""``lcm ingest`` and ``lcm export``: transcripts in and out (formats in ``lcm.transfer``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from lcm.cli.common import (
    agent_option,
    emit_json,
    json_option,
    progress_bar,
    resumable,
    say,
    show_table,
    stderr,
    url_option,
)
from lcm.cli.stores import context_on, open_store
from lcm.context.embed import backfill
from lcm.context.session import ContextSession
from lcm.errors import ConfigError
from lcm.files import atomic_writer
from lcm.importers import plan_dag, write_dag
from lcm.transfer import (
    ImportReport,
    SessionPlan,
    dump_line,
    export_sessions,
    import_session,
    plan_sessions,
    read_transcript,
    turns,
)

DEFAULT_CONTEXT = 128_000


def import_plans(context: ContextSession, plans: Sequence[SessionPlan], *, compact: bool, show_progress: bool,
                 label: str = "ingest", carry: bool = False,
                 on_session: Callable[[SessionPlan], None] | None = None,
                 ) -> tuple[list[ImportReport], list[dict[str, Any]]]:
    """Import each session, compacting after every turn as a live host would; returns the
    reports and the compaction outcomes that did something. ``carry``: start each session like
    a host's /new after the previous one (summaries carried over). A session that comes with
    another program's summaries (``plan.summaries``) is stored first, those summaries are
    placed into the DAG (``lcm.importers.dag``), and lcm compacts only what is left."""
    reports: list[ImportReport] = []
    outcomes: list[dict[str, Any]] = []
    total = sum(len(turns(p.entries)) for p in plans)
    with progress_bar(show_progress) as progress:
        task = progress.add_task(label, total=total) if progress is not None else None
        for index, plan in enumerate(plans):
            if carry and index > 0:
                context.reset()
            context.start(plan.session_key, platform=plan.platform, conversation_id=plan.conversation_id)
            if progress is not None:
                progress.update(task, description=f"{label} {plan.session_key}")

            deferred = bool(plan.summaries)  # the program's own summaries go in before lcm's

            def after_turn(session: Any, added: int, deferred: bool = deferred) -> None:
                if compact and added and not deferred:
                    done = context.compact_stored()
                    if done.get("passes"):
                        outcomes.append(done)
                if progress is not None:
                    progress.advance(task)

            report = import_session(context.store, context.agent_id, plan, context.tokens, after_turn=after_turn,
                                    redact=context.redactor.message if context.redactor is not None else None)
            if progress is not None and report.added == 0:
                progress.advance(task, len(turns(plan.entries)))
            session = (context.store.sessions.find(context.agent_id, plan.session_key)
                       if plan.aliases or plan.summaries else None)
            if session is not None:
                for alias in plan.aliases:
                    context.store.sessions.alias(context.agent_id, alias, session.id)
                if plan.summaries:
                    placed = write_dag(context.store, session, plan_dag([e.message for e in plan.entries],
                                                                        plan.summaries),
                                       context.tokens, fmt=(plan.origin or {}).get("format", "import"))
                    report.imported_summaries = {"placed": placed.placed, "already_placed": placed.already,
                                                 "not_placed": placed.skipped, "notes": placed.notes}
            if compact:
                outcomes.extend(settle(context))
            reports.append(report)
            if on_session is not None:
                on_session(plan)
        embedder = context.embedder
        if embedder is not None and any(r.added for r in reports):
            # What `lcm embed` does, for what was just stored (and anything missed before).
            if progress is not None:
                progress.update(task, description=f"embedding with {embedder.model}")
            backfill(context.store.vectors, embedder, agent=context.agent_id)
    return reports, outcomes


def settle(context: ContextSession, max_rounds: int = 50) -> list[dict[str, Any]]:
    """Compact until the session fits (or nothing more can be done)."""
    done = []
    for _ in range(max_rounds):
        outcome = context.compact_stored()
        if not outcome.get("passes"):
            break
        done.append(outcome)
    return done


@click.command("ingest")
@click.argument("source", metavar="FILE")
@url_option
@agent_option
@json_option
@click.option("--session", "session_key", metavar="ID",
              help="Session to store into (required for plain messages; overrides the file's).")
@click.option("--platform", help="Platform of a new session (cli, telegram, ...).")
@click.option("--skip-bad", is_flag=True, help="Import the valid lines and list the bad ones.")
@click.option("--no-compact", is_flag=True, help="Only store; do not summarize.")
@click.option("--context-length", type=click.IntRange(1_000), default=DEFAULT_CONTEXT, show_default=True,
              help="Model window the compaction aims for.")
def ingest_command(source: str, url: str | None, agent: str, as_json: bool, session_key: str | None,
                   platform: str | None, skip_bad: bool, no_compact: bool, context_length: int) -> None:
    """Store a transcript (OpenAI-format JSON or JSONL, or - for stdin), each message once."""
    transcript = read_transcript(source, skip_bad=skip_bad)  # validates everything first
    plans = plan_sessions(transcript, session_key=session_key)
    for plan in plans:
        plan.platform = plan.platform or platform
    store = open_store(url, create=True)
    context = context_on(store, agent, context_length=context_length)
    with resumable("ingest", "every message stored so far is kept, once"):
        reports, outcomes = import_plans(context, plans, compact=not no_compact,
                                         show_progress=not as_json and bool(plans))
    if any(r.added for r in reports):
        store.health.optimize()  # a bulk import changes word frequencies: refresh the statistics
    depth_counts: dict[str, dict[str, int]] = {}
    for plan in plans:
        session = store.sessions.find(context.agent_id, plan.session_key)
        depths = store.summaries.depth_stats(session.id) if session is not None else []
        depth_counts[plan.session_key] = {f"d{d.depth}": d.count for d in depths}
    result = {"source": transcript.source, "agent": context.agent_id,
              "skipped": [{transcript.unit: w, "reason": why} for w, why in transcript.skipped],
              "sessions": [{"session_id": r.session_key, "in_file": r.in_file, "already_stored": r.already_stored,
                            "added": r.added, "not_stored": r.dropped, "system_prompts_kept": r.system_prompts,
                            "summaries": depth_counts[r.session_key]}
                           for r in reports],
              "summaries_written": sum(o.get("leaves", 0) + o.get("condensed", 0) for o in outcomes)}
    if as_json:
        emit_json(result)
        return
    for where, why in transcript.skipped:
        stderr.print(f"skipped {transcript.unit} {where}: {why}", markup=False)
    table = Table(title=f"lcm ingest {transcript.source}")
    for col in ("session", "in file", "already stored", "added", "summaries"):
        table.add_column(col, justify="left" if col in ("session", "summaries") else "right")
    for row in result["sessions"]:
        table.add_row(row["session_id"], str(row["in_file"]), str(row["already_stored"]), str(row["added"]),
                      " ".join(f"{k}:{v}" for k, v in row["summaries"].items()) or "-")
    show_table(table)
    prompts = sum(r.system_prompts for r in reports)
    if prompts:
        say(f"{prompts} system prompt version(s) kept with their session (not as messages; "
            "lcm export writes them back)")
    dropped = sum(r.dropped for r in reports)
    if dropped:
        say(f"{dropped} message(s) not stored: lcm's own summaries (hosts resend those; lcm never "
            "stores them)")


@click.command("export")
@url_option
@agent_option
@click.option("--session", "session_key", metavar="ID", help="One session; default: all of the agent's.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default="-",
              show_default=True, help="File to write (JSONL); - for stdout.")
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists (keeping its permissions).")
@json_option
def export_command(url: str | None, agent: str, session_key: str | None, output: str, force: bool,
                   as_json: bool) -> None:
    """Write sessions as JSONL that `lcm ingest` reads back into an identical store.

    A new file is readable by its owner only (0600): an export holds whole conversations, and
    conversations hold secrets. An existing file is only replaced with --force, and keeps the
    permissions it had."""
    target = Path(output).expanduser()
    if as_json and output == "-":
        raise ConfigError("--json reports on an export written to a file (-o FILE); without -o, stdout "
                          "carries the export itself, one JSON object per line")
    if output != "-" and target.exists() and not force:
        raise ConfigError(f"{target} exists; pass --force to overwrite it")
    store = open_store(url)
    lines = export_sessions(store, agent, session_key)
    if output == "-":
        for line in lines:
            click.echo(dump_line(line))
        return
    count = prompts = 0
    with atomic_writer(target, private=True) as out:  # all or nothing: a failed export leaves no partial file
        for line in lines:
            out.write(dump_line(line) + "\n")
            if line.get("system_prompt"):
                prompts += 1
            else:
                count += 1
    if as_json:
        emit_json({"output": str(target), "agent": agent, "messages": count, "system_prompts": prompts,
                   "bytes": target.stat().st_size})
        return
    extra = f" and {prompts} system prompt version(s)" if prompts else ""
    say(f"exported {count} message(s){extra} to {target}")
