"""``lcm hermes install / uninstall``: put lcm into a Hermes home, or take it out again."""

from __future__ import annotations

from pathlib import Path

import click

from lcm.cli.common import emit_json, json_option, say, stderr
from lcm.cli.guard import name_connections
from lcm.hermes.install import SetupReport, default_home, install, uninstall


def _home(hermes_home: str | None, profile: str | None) -> Path:
    if hermes_home and profile:
        raise click.UsageError("give --hermes-home or --profile, not both")
    return Path(hermes_home).expanduser() if hermes_home else default_home(profile)


home_option = click.option("--hermes-home", metavar="PATH",
                           help="The Hermes home (default: $HERMES_HOME, else ~/.hermes).")
profile_option = click.option("--profile", metavar="NAME", help="A Hermes profile (~/.hermes/profiles/NAME).")


def _show(report: SetupReport, verb: str) -> None:
    if not report.changes:
        say(f"lcm is already {verb} in {report.home}: nothing changed")
    for change in report.changes:
        say(f"  {change}")
    for backup in report.backups:
        say(f"  backup: {backup}")
    say(f"database: {report.database}")
    for warning in report.warnings:
        stderr.print(f"lcm: warning: {warning}", markup=False)


@click.group("hermes")
@click.pass_context
def hermes_group(ctx: click.Context) -> None:
    """Install lcm as the Hermes agent's context engine, or remove it."""
    name_connections(ctx)


@hermes_group.command("install")
@home_option
@profile_option
@click.option("--database-url", metavar="URL",
              help="Store in this database (e.g. PostgreSQL) instead of lcm.db in the Hermes home: "
                   "written to the home's .env as LCM_DATABASE_URL, schema created or upgraded now.")
@json_option
def install_command(hermes_home: str | None, profile: str | None, database_url: str | None, as_json: bool) -> None:
    """Copy the plugin into the Hermes home, enable it, select context.engine: lcm."""
    report = install(_home(hermes_home, profile), database_url=database_url)
    if as_json:
        emit_json(report.as_dict())
        return
    if report.changes:
        say(f"lcm installed into {report.home}:")
    _show(report, "installed")
    say("restart Hermes; check with: hermes plugins (lcm enabled) and the lcm_status tool")


@hermes_group.command("uninstall")
@home_option
@profile_option
@json_option
def uninstall_command(hermes_home: str | None, profile: str | None, as_json: bool) -> None:
    """Remove the plugin and restore the previous context engine (the database is kept)."""
    report = uninstall(_home(hermes_home, profile))
    if as_json:
        emit_json(report.as_dict())
        return
    if report.changes:
        say(f"lcm removed from {report.home}:")
    _show(report, "uninstalled")
    say("the stored history was kept (delete the database yourself if you want it gone)")
