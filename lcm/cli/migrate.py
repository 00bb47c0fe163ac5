"""``lcm migrate --to URL``: copy a whole store into another database (SQLite to PostgreSQL and
back), resumable, verified (``lcm.store.sync``)."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from lcm.cli.common import emit_json, json_option, progress_bar, say, show_table, stderr, url_option
from lcm.cli.stores import open_store
from lcm.store import Store
from lcm.store import connection as db
from lcm.store.sync import SessionPlan, StoreSync, SyncReport


@click.command("migrate")
@url_option
@click.option("--to", "target_url", required=True, metavar="URL",
              help="The database to copy into (created or upgraded to this lcm's schema).")
@json_option
@click.option("--merge", is_flag=True, help="Add this store to a target that already holds other sessions.")
@click.option("--dry-run", is_flag=True, help="Only say what would be copied.")
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1, 10_000),
              help="Messages per statement.")
def migrate_command(url: str | None, target_url: str, as_json: bool, merge: bool, dry_run: bool,
                    batch: int) -> None:
    """Copy every agent, session, message, summary and vector of the store into another
    database (e.g. SQLite to a team's PostgreSQL), then verify both sides. Run it again to
    copy what was added since, or to finish an interrupted run."""
    source = open_store(url)
    target = Store.open(db.resolve_url(target_url), upgrade=True)
    sync = StoreSync(source._core, target._core, merge=merge, batch=batch)
    with progress_bar(not as_json and not dry_run) as bar:
        task: Any = None

        def sized(plans: list[SessionPlan]) -> None:
            nonlocal task
            total = sum(p.to_copy for p in plans)
            if bar is not None and total:
                task = bar.add_task(f"migrate {len(plans)} sessions", total=total, unit="messages")

        def advance(n: int) -> None:
            if task is not None:
                bar.advance(task, n)

        try:
            report = sync.run(progress=advance, dry_run=dry_run, on_plan=sized)
        except KeyboardInterrupt:
            stderr.print("migrate: interrupted; the sessions copied so far are kept: run the same command again "
                         "to continue", markup=False)
            raise
    _show(report, source, target, as_json=as_json, dry_run=dry_run)
    if not dry_run and not report.verified:
        raise click.exceptions.Exit(1)


def _show(report: SyncReport, source: Store, target: Store, *, as_json: bool, dry_run: bool) -> None:
    if as_json:
        emit_json({"source": source.location, "target": target.location, "dry_run": dry_run, **report.as_dict()})
        return
    if dry_run:
        say(f"would copy {report.messages_copied} messages in {report.sessions_copied} of {report.sessions} "
            f"sessions from {source.location} to {target.location}")
        return
    table = Table(title=f"lcm migrate: {source.location} -> {target.location}")
    table.add_column("table")
    table.add_column("source", justify="right")
    table.add_column("target", justify="right")
    for name, (src, dst) in report.counts.items():
        table.add_row(name, str(src), str(dst), style=None if src == dst else "red")
    show_table(table)
    say(f"copied {report.messages_copied} messages, {report.summaries_copied} summaries and "
        f"{report.vectors_copied} vectors in {report.sessions_copied} of {report.sessions} sessions")
    if report.verified:
        say(f"verified: every table's count and each session's content digest match ({report.sessions} sessions)")
    else:
        say("NOT verified: " + ("; ".join(f"{n}: {s} vs {d}" for n, (s, d) in report.counts.items() if s != d)
                                or "") + (f" sessions that differ: {', '.join(report.mismatched_sessions[:10])}"
                                          if report.mismatched_sessions else "")
            + " (was the source written to meanwhile? run again)")
