"""Opening what a command works on: the store at ``--url`` (a read refuses a SQLite file that
does not exist), a context session of an agent on it, the agent's latest session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from lcm.cli.common import READ_URL_KEY
from lcm.config import LcmConfig
from lcm.context.ports import StorePorts
from lcm.context.session import ContextSession
from lcm.errors import NotFoundError
from lcm.store import Store
from lcm.store import connection as db


def require_existing(url: str | None) -> None:
    """A command that only reads refuses a SQLite file that does not exist (a typo in a path
    must not quietly create an empty database)."""
    resolved = db.resolve_url(url)
    if resolved.get_backend_name() == "sqlite" and resolved.database not in (None, "", ":memory:"):
        path = Path(resolved.database).expanduser()
        if not path.exists():
            raise NotFoundError(f"no lcm database at {path} (lcm demo or lcm ingest creates one; "
                                "--url or LCM_DATABASE_URL picks another)")


def open_store(url: str | None, *, create: bool = False) -> Store:
    """The store at ``url`` (see :func:`require_existing` unless ``create``)."""
    if not create:
        require_existing(url)
    return Store.open(db.resolve_url(url), read_url=read_url_option())


def read_url_option() -> str | None:
    """``--read-url`` of the running command (None: ``LCM_DATABASE_READ_URL`` decides)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(READ_URL_KEY) if ctx is not None else None


def open_context(url: str | None, agent: str, *, create: bool = False, context_length: int | None = None,
                 **settings: Any) -> ContextSession:
    """A context session of ``agent`` on the store at ``url`` (settings from the environment,
    then ``settings``; ``context_length``: the model window compaction aims for)."""
    return context_on(open_store(url, create=create), agent, context_length=context_length, **settings)


def context_on(store: Store, agent: str, *, context_length: int | None = None, **settings: Any) -> ContextSession:
    """A context session of ``agent`` on an open store (see :func:`open_context`)."""
    config = LcmConfig.from_env(agent_id=agent, **settings)
    # A command is over in seconds: what it stores is embedded before it exits, not by a thread.
    return ContextSession(config, store, agent_id=agent, context_length=context_length or 0,
                          background_embedding=False, apply_filters=False)


def latest_session_key(store: StorePorts, agent: str) -> str:
    """The agent's most recently active session (the default for describe and status)."""
    best = None
    for s in store.sessions.each(agent):
        if best is None or s.updated_at >= best.updated_at:
            best = s
    if best is None:
        raise NotFoundError(f"agent {agent!r} has no sessions in this store (lcm sessions --all-agents lists agents)")
    return best.session_key
