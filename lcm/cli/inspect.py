"""``lcm status`` and ``lcm doctor``: what is stored, and whether it is healthy."""

from __future__ import annotations

import click
from rich.table import Table

from lcm.cli.common import emit_json, json_option, say, stdout, url_option
from lcm.store import Store


@click.command("status")
@url_option
@json_option
def status_command(url: str | None, as_json: bool) -> None:
    """Show the store: backend, location, size and row counts."""
    store = Store.open(url)
    stats = store.stats()
    if as_json:
        emit_json(stats)
        return
    table = Table(title="lcm store", show_header=False)
    for key in ("backend", "database", "agents", "sessions", "messages", "summaries", "payloads"):
        table.add_row(key, str(stats[key]))
    table.add_row("size", f"{(stats['bytes'] or 0) / 1_048_576:.1f} MiB")
    stdout.print(table)


@click.command("doctor")
@url_option
@json_option
@click.option("--deep", is_flag=True, help="Verify every row of the search index (slow on big stores).")
@click.option("--repair", is_flag=True,
              help="Back the store up (SQLite), rebuild the search index from the rows, check again.")
def doctor_command(url: str | None, as_json: bool, deep: bool, repair: bool) -> None:
    """Check database integrity, schema, search index and the summary DAG."""
    store = Store.open(url)
    repaired = None
    if repair:
        backup = store.backup()
        counts = store.rebuild_search_index()
        repaired = {"backup": backup, "reindexed": counts}
        if not as_json:
            say(f"backup: {backup or 'none (PostgreSQL: use pg_dump)'}; reindexed "
                + ", ".join(f"{n} {k}" for k, n in counts.items()))
    checks = store.integrity_checks(deep=deep or repair)
    worst = "fail" if any(c.status == "fail" for c in checks) else (
        "warn" if any(c.status == "warn" for c in checks) else "ok")
    overall = {"ok": "healthy", "warn": "warnings", "fail": "unhealthy"}[worst]
    if as_json:
        payload = {"overall": overall, "checks": [c.as_dict() for c in checks]}
        if repaired is not None:
            payload["repair"] = repaired
        emit_json(payload)
    else:
        table = Table(title=f"lcm doctor: {overall}")
        table.add_column("check")
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail)
        stdout.print(table)
    if worst == "fail":
        raise click.exceptions.Exit(1)
