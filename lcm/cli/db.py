"""``lcm db``: the packaged Alembic migrations, without a checkout or an alembic.ini."""

from __future__ import annotations

import click

from lcm.cli.common import emit_json, json_option, require_existing, say, url_option
from lcm.store import connection as dbmod
from lcm.store import migrations


@click.group("db")
def db_group() -> None:
    """Create, upgrade and inspect the database schema."""


@db_group.command("upgrade")
@url_option
@json_option
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade_command(url: str | None, as_json: bool, revision: str) -> None:
    """Create the lcm schema or upgrade it to this lcm's version (keeps all data)."""
    target = dbmod.resolve_url(url)
    before = migrations.state_at(target)
    if before.status == "unknown":
        raise click.ClickException(
            f"the database has revision {before.current}, unknown to this lcm (newer?): upgrade lcm")
    migrations.upgrade(target, revision)
    after = migrations.state_at(target)
    if as_json:
        emit_json({"database": dbmod.display_url(target), "from": before.current, "to": after.current})
        return
    if before.current == after.current:
        say(f"{dbmod.display_url(target)}: already at {after.current}")
    else:
        say(f"{dbmod.display_url(target)}: upgraded {before.current or '(empty)'} -> {after.current}")


@db_group.command("downgrade")
@url_option
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Confirm: a downgrade can drop tables and their data.")
def downgrade_command(url: str | None, revision: str, yes: bool) -> None:
    """Downgrade the schema to REVISION (``base`` drops every lcm table)."""
    if not yes:
        raise click.ClickException("a downgrade can delete data; repeat with --yes to confirm")
    target = dbmod.resolve_url(url)
    migrations.downgrade(target, revision)
    say(f"{dbmod.display_url(target)}: now at {migrations.state_at(target).current or '(empty)'}")


@db_group.command("current")
@url_option
@json_option
def current_command(url: str | None, as_json: bool) -> None:
    """Show the schema revision of the database and whether it is current."""
    require_existing(url)  # reading a revision must not create the file
    target = dbmod.resolve_url(url)
    state = migrations.state_at(target)
    if as_json:
        emit_json({"database": dbmod.display_url(target), "current": state.current,
                   "head": state.head, "status": state.status})
        return
    say(f"{dbmod.display_url(target)}: {state.current or '(no lcm schema)'} "
                 f"[{state.status}; this lcm's head is {state.head}]")


@db_group.command("history")
@json_option
def history_command(as_json: bool) -> None:
    """List the schema revisions this lcm knows, oldest first."""
    revs = migrations.history()
    if as_json:
        emit_json(revs)
        return
    for rev in revs:
        say(f"{rev['revision']}  {(rev['message'] or '').splitlines()[0]}")
