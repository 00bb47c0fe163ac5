"""Database URLs and the process-wide registry of SQLAlchemy engines.

One engine per URL per process: every ``Store`` (and every deep-copied context engine inside a
host) opened on the same URL shares one connection pool. After ``os.fork()`` the child drops the
parent's pooled connections (a connection must never be used by two processes).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from lcm.backends import backend_for_url
from lcm.config import database_url_from_env, default_sqlite_path
from lcm.errors import ConfigError

_registry: dict[str, Engine] = {}
_lock = threading.Lock()


def resolve_url(url: str | None = None) -> URL:
    """The SQLAlchemy URL to use: the argument, else ``LCM_DATABASE_URL``, else the default file.

    ``postgres://`` and ``postgresql://`` are read as ``postgresql+psycopg://`` (psycopg 3 is
    the driver lcm ships with); a bare filesystem path is read as a SQLite file.
    """
    raw = url if url is not None else database_url_from_env()
    if raw is None:
        return URL.create("sqlite", database=str(default_sqlite_path()))
    raw = raw.strip()
    if "://" not in raw:
        return URL.create("sqlite", database=str(Path(raw).expanduser()))
    try:
        parsed = make_url(raw)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"LCM_DATABASE_URL is not a valid database URL: {raw!r}") from exc
    backend = parsed.get_backend_name()
    if backend in ("postgres", "postgresql"):
        driver = parsed.drivername.partition("+")[2]
        if driver not in ("", "psycopg"):
            raise ConfigError(
                f"unsupported PostgreSQL driver {driver!r}: lcm uses psycopg 3 "
                "(postgresql+psycopg://user@host/dbname)"
            )
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:") or str(parsed.database).startswith("file:"):
            raise ConfigError(
                "lcm needs a SQLite file (sqlite:///path/to/lcm.db); in-memory databases "
                "cannot be shared between connections"
            )
        return parsed.set(database=str(Path(parsed.database).expanduser()))
    raise ConfigError(
        f"unsupported database {backend!r}: use sqlite:///path/to/lcm.db or "
        "postgresql+psycopg://user@host/dbname"
    )


def display_url(url: URL) -> str:
    """The URL with any password hidden (for status output and error messages)."""
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return url.render_as_string(hide_password=True)


def get_engine(url: URL) -> Engine:
    """The shared engine for ``url``, created and configured on first use."""
    return _shared(url.render_as_string(hide_password=False), lambda: _create(url))


def _shared(key: str, create: Callable[[], Engine]) -> Engine:
    """The engine registered under ``key``, created on first use."""
    with _lock:
        engine = _registry.get(key)
        if engine is None:
            engine = _registry[key] = create()
        return engine


def _create(url: URL, *, pooled: bool = True, **extra: Any) -> Engine:
    backend = backend_for_url(url)
    backend.prepare_location(url)
    options = backend.engine_options(url)
    if pooled:
        options.update(backend.pool_options)
    else:
        options["poolclass"] = NullPool
    engine = create_engine(url, **options, **extra)
    backend.configure_engine(engine)
    return engine


#: How long a read waits to reach the replica before it goes to the primary instead.
REPLICA_CONNECT_TIMEOUT_S = 2


def replica_engine(url: URL) -> Engine:
    """The shared engine for a read replica: pinged on every checkout (a replica that went away
    must cost a fallback, not a failed read) and quick to give up connecting."""
    key = "replica:" + url.render_as_string(hide_password=False)
    if "connect_timeout" not in url.query:
        url = url.update_query_dict({"connect_timeout": str(REPLICA_CONNECT_TIMEOUT_S)})
    return _shared(key, lambda: _create(url, pool_pre_ping=True))


def standalone_engine(url: URL) -> Engine:
    """An unpooled engine with lcm's connection setup (migrations, one-off tools)."""
    return _create(url, pooled=False)


def dispose(url: URL) -> None:
    """Close and forget the shared engine for ``url`` (a test's database going away)."""
    with _lock:
        engine = _registry.pop(url.render_as_string(hide_password=False), None)
    if engine is not None:
        engine.dispose()


def _after_fork_in_child() -> None:
    for engine in list(_registry.values()):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
