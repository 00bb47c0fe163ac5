"""``lcm db``: the packaged Alembic migrations, without a checkout or an alembic.ini."""

from __future__ import annotations

import click

from lcm.cli.common import emit_json, json_option, say, stderr, url_option
from lcm.cli.guard import name_connections
from lcm.cli.stores import require_existing
from lcm.errors import ConfigError
from lcm.store import connection as dbmod
from lcm.store import migrations


@click.group("db")
@click.pass_context
def db_group(ctx: click.Context) -> None:
    """Create, upgrade and inspect the database schema."""
    name_connections(ctx)


@db_group.command("upgrade")
@url_option
@json_option
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade_command(url: str | None, as_json: bool, revision: str) -> None:
    """Create the lcm schema or upgrade it to this lcm's version (keeps all data)."""
    target = dbmod.resolve_url(url)
    before = migrations.state_at(target)
    if before.status == "unknown":
        raise ConfigError(f"the database has revision {before.current}, unknown to this lcm (made by a newer "
                          "lcm): upgrade lcm")
    known = migrations.KNOWN_REVISIONS
    if revision != "head":
        if revision not in known:
            raise ConfigError(f"no revision {revision!r}; lcm db history lists them")
        if before.current in known and known.index(before.current) > known.index(revision):
            raise ConfigError(f"the database is at {before.current}, ahead of {revision}: an upgrade never goes "
                              f"back (lcm db downgrade {revision} --yes does, and can delete data)")
    migrations.upgrade(target, revision, on_retry=lambda attempt, reason: stderr.print(
        f"lcm: a lock the upgrade needs is held by a running transaction ({reason}); that revision was rolled back, "
        f"trying again (attempt {attempt + 1} of {migrations.UPGRADE_ATTEMPTS})", markup=False))
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
@json_option
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Confirm: a downgrade can drop tables and their data.")
def downgrade_command(url: str | None, as_json: bool, revision: str, yes: bool) -> None:
    """Downgrade the schema to REVISION (``base`` drops every lcm table)."""
    if not yes:
        raise ConfigError("a downgrade can delete data; repeat with --yes to confirm")
    require_existing(url)
    target = dbmod.resolve_url(url)
    before = migrations.state_at(target).current
    migrations.downgrade(target, revision)
    now = migrations.state_at(target).current
    if as_json:
        emit_json({"database": dbmod.display_url(target), "from": before, "to": now})
        return
    say(f"{dbmod.display_url(target)}: now at {now or '(empty)'}")


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
@url_option
@json_option
def history_command(url: str | None, as_json: bool) -> None:
    """List the schema revisions this lcm knows, oldest first (with --url or LCM_DATABASE_URL,
    marking the one the database is at)."""
    revs: list[dict[str, object]] = [dict(r) for r in migrations.history()]
    current = None
    if url is not None:
        require_existing(url)
        current = migrations.state_at(dbmod.resolve_url(url)).current
        for rev in revs:
            rev["current"] = rev["revision"] == current
    if as_json:
        emit_json(revs)
        return
    for rev in revs:
        mark = "  <- the database is here" if current is not None and rev["revision"] == current else ""
        say(f"{rev['revision']}  {str(rev['message'] or '').splitlines()[0]}{mark}")


@db_group.command("secure")
@url_option
@json_option
@click.option("--per-agent-roles", "per_agent", is_flag=True,
              help="PostgreSQL row-level security: a login role per agent that reaches only its own rows.")
@click.option("--agent", "agents", multiple=True, metavar="NAME",
              help="An agent to make a role for (repeatable; default: every stored agent).")
@click.option("--no-passwords", is_flag=True,
              help="Create the roles without passwords (for certificate or peer authentication).")
@click.option("--off", is_flag=True, help="Drop the policies and turn row-level security off (roles stay).")
def secure_command(url: str | None, as_json: bool, per_agent: bool, agents: tuple[str, ...],
                   no_passwords: bool, off: bool) -> None:
    """Wall agents off from each other in the database itself (PostgreSQL, run as the owner).

    Each agent gets a role; connected with it, a process sees and changes only that agent's
    rows, even with raw SQL. Passwords of roles created now are shown once. See docs/storage.md.
    """
    from lcm.store import security

    if not per_agent:
        raise ConfigError("say what to secure: lcm db secure --per-agent-roles (see lcm db secure --help)")
    target = dbmod.resolve_url(url)
    if off:
        security.remove_row_security(target)
        if as_json:
            emit_json({"database": dbmod.display_url(target), "row_level_security": False})
        else:
            say(f"{dbmod.display_url(target)}: row-level security is off; the agent roles remain "
                "(DROP OWNED BY role; DROP ROLE role removes one)")
        return
    roles = security.secure_per_agent_roles(target, agents or None, passwords=not no_passwords)
    rows = [{"agent": r.agent, "role": r.role, "created": r.created, "password": r.password,
             "url": target.set(username=r.role, password=r.password).render_as_string(hide_password=False)}
            for r in roles]
    if as_json:
        emit_json({"database": dbmod.display_url(target), "row_level_security": True, "roles": rows})
        return
    say(f"{dbmod.display_url(target)}: row-level security is on; each role reaches only its agent's rows")
    for row in rows:
        state = "created" if row["created"] else "existing, left as it was"
        say(f"  {row['agent']}: role {row['role']} ({state})")
        say(f"    LCM_DATABASE_URL={row['url']} LCM_AGENT_ID={row['agent']}")
    if any(row["password"] for row in rows):
        say("The passwords above are shown only now: keep them in each agent's secret store.")
