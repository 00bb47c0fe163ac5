"""The store: the only part of lcm that touches a database (with the dialects it uses, ``lcm.backends``).

``Store.open(url)`` gives one facade over a database, with one repository per aggregate:

==================  ================================================================
``store.sessions``  agents, sessions, aliases, forks; the conversation lock (``family``)
``store.messages``  append exactly once; read back exactly as sent; lcm's own digests
``store.summaries`` the summary DAG: write with its invariants, read, carry, expand
``store.search``    full-text search over messages and summaries
``store.health``    integrity checks, repair, statistics, backup, planner upkeep
==================  ================================================================

The engine core (``lcm.context``) sees these only through the Protocols of
``lcm.context.ports``, which this facade satisfies structurally; every value that crosses is a
plain record (``lcm.records``). Which database is underneath is the business of
``lcm.backends`` (one class per dialect) and of the Alembic revisions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from lcm.backends import Backend
from lcm.config import database_read_url_from_env, read_replica_max_lag_s
from lcm.errors import ConfigError, SchemaMismatchError
from lcm.store import connection, migrations
from lcm.store._core import StoreCore
from lcm.store.catchup import BackgroundCatchUp
from lcm.store.forget import ForgetRepository
from lcm.store.health import HealthRepository
from lcm.store.messages import MessageRepository
from lcm.store.replica import ReadReplica
from lcm.store.search import SearchRepository
from lcm.store.sessions import SessionRepository
from lcm.store.summaries import SummaryRepository
from lcm.store.vectors import VectorRepository

__all__ = ["Store"]


class Store:
    """A handle on one lcm database. Cheap to share; safe to use from several threads."""

    def __init__(self, url: URL, *, read_url: URL | None = None):
        self._core = core = StoreCore(url, connection.get_engine(url))
        if read_url is not None:
            if not core.backend.supports_replica or read_url.get_backend_name() != url.get_backend_name():
                raise ConfigError(
                    f"a read replica ({connection.display_url(read_url)}) serves a PostgreSQL store, and "
                    f"{connection.display_url(url)} is not one: unset LCM_DATABASE_READ_URL / --read-url")
            core.replica = ReadReplica(read_url, connection.replica_engine(read_url), core.backend,
                                       read_replica_max_lag_s())
        self.sessions = SessionRepository(core)
        self.messages = MessageRepository(core)
        self.summaries = SummaryRepository(core)
        self.vectors = VectorRepository(core)
        self.search = SearchRepository(core, self.vectors)
        self.health = HealthRepository(core)
        self.forget = ForgetRepository(core)

    @classmethod
    def open(cls, url: str | URL | None = None, *, upgrade: bool | None = None, read_only: bool = False,
             read_url: str | URL | None = None) -> Store:
        """Open (and for SQLite create or upgrade) the lcm database at ``url`` (default:
        ``LCM_DATABASE_URL``, else ``~/.lcm/lcm.db``).

        ``upgrade=None`` (the default) upgrades a SQLite file automatically and refuses a
        PostgreSQL schema that is not at this lcm's head (run ``lcm db upgrade``: on a shared
        server, schema changes are an operator's decision). ``upgrade=True`` upgrades either;
        ``upgrade=False`` never does.

        ``read_url`` (default: ``LCM_DATABASE_READ_URL``): a streaming replica of a PostgreSQL
        store for the reads that tolerate a little lag (``lcm.store.replica``).

        ``read_only=True`` (``lcm ui``): lcm itself writes nothing, not even derived data, so
        messages a writer stored since the search index last caught up (fewer than
        ``INDEX_BATCH`` on SQLite) are not found by search (on PostgreSQL: only by their exact
        words), which says so in its notes.
        """
        resolved = url if isinstance(url, URL) else connection.resolve_url(url)
        raw_read = read_url if read_url is not None else database_read_url_from_env()
        replica = raw_read if isinstance(raw_read, URL) or raw_read is None else connection.resolve_url(raw_read)
        store = cls(resolved, read_url=replica)
        store._core.read_only = read_only
        state = store._core.schema_state()
        if state.status == "current":
            return store
        where = connection.display_url(resolved)
        if state.status == "unknown":
            raise SchemaMismatchError(
                f"the database at {where} has schema revision {state.current}, which this lcm "
                f"does not know (it was created by a newer lcm): upgrade lcm")
        auto = upgrade if upgrade is not None else resolved.get_backend_name() == "sqlite"
        if not auto:
            found = "no lcm schema" if state.current is None else f"schema revision {state.current}"
            raise SchemaMismatchError(
                f"the database at {where} has {found}; this lcm needs {state.head}: "
                "run `lcm db upgrade` (or `alembic upgrade head`) first")
        migrations.upgrade(resolved)
        return store

    @property
    def url(self) -> URL:
        return self._core.url

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for tests and tools that inspect the database directly)."""
        return self._core.engine

    @property
    def backend(self) -> Backend:
        return self._core.backend

    @property
    def background(self) -> BackgroundCatchUp | None:
        """The thread that catches up derived search data after writes (PostgreSQL), if any."""
        return self._core.background

    @property
    def backend_name(self) -> str:
        return self._core.backend.name

    @property
    def location(self) -> str:
        """Where the data lives (a file path, or the URL without its password)."""
        return self._core.location

    @property
    def fault_hook(self) -> Callable[[str], None] | None:
        """Tests: ``hook(step)`` runs at named points inside write transactions."""
        return self._core.on_write_step

    @fault_hook.setter
    def fault_hook(self, hook: Callable[[str], None] | None) -> None:
        self._core.on_write_step = hook

    def replica_state(self) -> dict[str, Any] | None:
        """The read replica's use so far (reads served, fallbacks, last problem), if one is set."""
        return self._core.replica.state() if self._core.replica is not None else None

    def __deepcopy__(self, memo: dict[int, Any]) -> Store:
        return self  # a store is a shared handle on a process-wide engine, never copied
