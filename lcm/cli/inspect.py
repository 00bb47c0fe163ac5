"""``lcm status``, ``lcm doctor`` and ``lcm backup``: what is stored, whether it is healthy, a copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from lcm.cli.common import agent_option, emit_json, json_option, say, show_table, url_option
from lcm.cli.stores import context_on, open_context, open_store
from lcm.errors import ConfigError
from lcm.tools import call_tool
from lcm.tools.health import health_report


@click.command("status")
@url_option
@agent_option
@json_option
@click.option("--session", "session_key", metavar="ID",
              help="Show one session's context status (the lcm_status tool) instead of the store.")
def status_command(url: str | None, agent: str, as_json: bool, session_key: str | None) -> None:
    """Show the store (backend, location, size, row counts) or one session's state."""
    if session_key is not None:
        context = open_context(url, agent)
        context.attach(session_key)
        res = call_tool(context, "lcm_status")
        if as_json:
            emit_json(res)
            return
        table = Table(title=f"lcm status: {agent}/{session_key}", show_header=False)
        for key, value in res.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            table.add_row(key, Text(shown))  # JSON for structured values, never Python reprs
        show_table(table)
        return
    store = open_store(url)
    stats = store.health.stats()
    replica = store.replica_state()
    if replica is not None:
        store.sessions.agents()  # one lag-tolerant read: is the replica answering, and caught up?
        stats["read_replica"] = store.replica_state()
    if as_json:
        emit_json(stats)
        return
    table = Table(title="lcm store", show_header=False)
    for key in ("backend", "database", "agents", "sessions", "messages", "summaries", "payloads"):
        table.add_row(key, Text(str(stats[key])))
    table.add_row("size", f"{(stats['bytes'] or 0) / 1_048_576:.1f} MiB")
    if replica is not None:
        r = stats["read_replica"]
        table.add_row("read replica", Text(f"{r['url']}: " + ("answering" if r["reads"] else
                                                               f"not used ({r['last_problem']})")))
    show_table(table)


@click.command("doctor")
@url_option
@agent_option
@json_option
@click.option("--deep", is_flag=True, help="Verify every row of the search index (slow on big stores; implies --all).")
@click.option("--all", "everything", is_flag=True,
              help="Check every session: a store of over 500,000 messages is otherwise checked by its most "
                   "recently active sessions (up to 500,000 messages), so the doctor stays quick at any size.")
@click.option("--repair", is_flag=True,
              help="Back the store up (SQLite), remove messages two writers stored twice (while not "
                   "yet summarized), rebuild the search index from the rows, check again.")
def doctor_command(url: str | None, agent: str, as_json: bool, deep: bool, everything: bool, repair: bool) -> None:
    """Check database integrity, schema, search index, the summary DAG and the settings.

    A store of over 500,000 messages is checked by its most recently active sessions, unless
    --all."""
    store = open_store(url)
    context = context_on(store, agent)
    repaired = None
    if repair:
        backup = store.health.backup()
        duplicates = store.health.remove_duplicate_runs()
        counts = store.health.rebuild_index()
        store.health.optimize()  # fresh statistics for the rebuilt index (PostgreSQL plans searches by them)
        repaired = {"backup": backup, "reindexed": counts, "duplicates": duplicates}
        if not as_json:
            say(f"backup: {backup or 'none (PostgreSQL: use pg_dump)'}; reindexed "
                + ", ".join(f"{n} {k}" for k, n in counts.items()))
            for d in duplicates:
                say(f"session {d['session']}: removed {d['removed']} duplicated messages "
                    f"(runs {d['runs']})" + (f"; left alone: {'; '.join(d['left_alone'])}"
                                             if d["left_alone"] else ""))
    report = health_report(context, store.health.checks(deep=deep or repair, everything=everything))
    overall, checks = report["overall"], report["checks"]
    if as_json:
        payload: dict[str, Any] = {**report}
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
            table.add_row(c["name"], Text(c["status"], style=colour[c["status"]]), Text(c["detail"]))
        show_table(table)
        if overall == "unhealthy" and not repair:
            say("a failing search index check is fixed by: lcm doctor --repair")
    if overall == "unhealthy":
        raise click.exceptions.Exit(1)


@click.command("backup")
@click.argument("destination", metavar="DEST")
@url_option
@json_option
@click.option("--force", is_flag=True, help="Overwrite DEST if it exists.")
def backup_command(destination: str, url: str | None, as_json: bool, force: bool) -> None:
    """A consistent copy of a SQLite store, taken while it is in use (SQLite's backup API)."""
    store = open_store(url)
    if store.backend_name != "sqlite":
        raise ConfigError("lcm backup copies SQLite stores; back PostgreSQL up with pg_dump "
                          "(or the server's point-in-time recovery)")
    target = Path(destination).expanduser()
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; pass --force to overwrite it")
    if target.is_dir():
        raise ConfigError(f"{target} is a directory; give a file name")
    if not target.parent.is_dir():
        raise ConfigError(f"{target.parent} is not a folder; create it first (lcm backup creates no folders)")
    if Path(store.location).resolve() == target.resolve():
        raise ConfigError("the backup cannot overwrite the store itself")
    tmp = target.with_name(f".{target.name}.partial")
    written = store.health.backup(str(tmp))
    if written is None:  # pragma: no cover - SQLite always copies (checked above)
        raise ConfigError(f"{store.location} could not be copied")
    Path(written).replace(target)  # a finished copy, or nothing
    size = target.stat().st_size
    if as_json:
        emit_json({"backup": str(target), "bytes": size, "source": store.location})
    else:
        say(f"backed up {store.location} to {target} ({size / 1_048_576:.1f} MiB)")
