"""Per-agent database roles with row-level security (PostgreSQL; ``lcm db secure``).

The policies and roles themselves are in ``lcm.backends.pg_security``; this module opens
the database as its owner, checks it can be secured, and runs the change in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Engine, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from lcm.errors import ConfigError, DatabaseUnavailableError, SchemaMismatchError, first_line
from lcm.store import connection, migrations
from lcm.store._core import agents_t, checked_text

if TYPE_CHECKING:
    from lcm.backends.pg_security import AgentRole


def _owner_engine(url: URL) -> Engine:
    if url.get_backend_name() != "postgresql":
        raise ConfigError("per-agent roles are a PostgreSQL feature: a SQLite file belongs to one user, "
                          "protect it with file permissions (chmod 600)")
    state = migrations.state_at(url)
    if state.status != "current":
        raise SchemaMismatchError(f"the schema is {state.status} ({state.current or 'none'}); run "
                                  "`lcm db upgrade` first, then secure it")
    return connection.standalone_engine(url)


def secure_per_agent_roles(url: URL, agents: Sequence[str] | None = None, *, passwords: bool = True
                           ) -> list[AgentRole]:
    """Row-level security on, and a login role for each agent (every stored agent when
    ``agents`` is None). Idempotent: existing roles are kept as they are."""
    from lcm.backends import pg_security

    engine = _owner_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            names = list(agents) if agents else list(conn.execute(
                select(agents_t.c.name).order_by(agents_t.c.id)).scalars())
            if not names:
                raise ConfigError("no agents are stored yet: name them with --agent NAME (repeatable); "
                                  "an agent's role may then create its agent on first use")
            for name in names:
                checked_text("agent id", name, 128)
            return pg_security.enable(conn, names, passwords=passwords)
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == "42501":
            raise ConfigError(f"{first_line(exc)}: run this as the owner of the lcm tables (the role that "
                              "ran `lcm db upgrade`), with CREATEROLE") from exc
        raise DatabaseUnavailableError(f"securing {connection.display_url(url)} failed: {first_line(exc)}") from exc
    finally:
        engine.dispose()


def remove_row_security(url: URL) -> None:
    """Policies dropped and row-level security off (the roles stay; see pg_security.disable)."""
    from lcm.backends import pg_security

    engine = _owner_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            pg_security.disable(conn)
    finally:
        engine.dispose()
