"""A streaming read replica for the reads that tolerate a little lag (``LCM_DATABASE_READ_URL``).

Which reads: the repository methods marked :func:`lag_tolerant` (search, expand, describe,
listing, export) and every read of a store opened ``read_only`` (the explorer). The turn path
(ingest, compaction, assembly) never reads from a replica.

Never stale for this process's own writes: after each write transaction the store notes the
primary's WAL position (one small query, only when a replica is configured), and a replica
serves a read only once it has replayed up to there (``pg_last_wal_replay_lsn``). Writes by
other processes may be a moment behind: that is the lag a replica costs, bounded by
``LCM_READ_MAX_LAG_S`` (a replica sitting on WAL it has not applied for longer is skipped).

Never an error: a replica that cannot be reached, is behind, or fails in the middle of a read
costs a fallback to the primary (the read runs again there); a replica that failed is left alone
for ``RETRY_S`` seconds, then tried again. ``state()`` counts both (``lcm status``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from lcm.backends import Backend
from lcm.errors import first_line
from lcm.store.connection import display_url

RETRY_S = 5.0
F = TypeVar("F", bound=Callable[..., Any])

_tolerant = threading.local()


class ReplicaFailed(Exception):
    """A read on the replica failed part-way: the caller runs it again on the primary."""


def lag_tolerant(method: F) -> F:
    """Mark a repository method whose reads may come from the replica. If the replica fails
    during the call, the whole call runs again on the primary."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._core.replica is None or getattr(_tolerant, "on", False):
            return method(self, *args, **kwargs)
        _tolerant.on = True
        try:
            return method(self, *args, **kwargs)
        except ReplicaFailed:
            pass
        finally:
            _tolerant.on = False
        return method(self, *args, **kwargs)

    return cast(F, run)


def tolerant_now() -> bool:
    """Whether the current call (this thread) is a lag-tolerant read."""
    return bool(getattr(_tolerant, "on", False))


class ReadReplica:
    def __init__(self, url: URL, engine: Engine, backend: Backend, max_lag_s: float):
        self.url = url
        self.engine = engine
        self.backend = backend
        self.max_lag_s = max_lag_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.reads = 0
        self.fallbacks = 0
        self.last_problem: str | None = None

    def connection(self, since: str | None) -> Connection | None:
        """A connection to the replica when it has replayed ``since`` and is not stale; None
        (use the primary) otherwise."""
        if time.monotonic() < self._down_until:
            self._fell_back(None)
            return None
        try:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except DBAPIError as exc:
            self.failed(exc)
            return None
        try:
            caught_up, stale_s = self.backend.replica_state(conn, since)
        except DBAPIError as exc:
            conn.close()
            self.failed(exc)
            return None
        if not caught_up or stale_s > self.max_lag_s:
            conn.close()
            self._fell_back("behind this process's last write" if not caught_up
                            else f"{stale_s:.0f} s behind (LCM_READ_MAX_LAG_S={self.max_lag_s:g})")
            return None
        with self._lock:
            self.reads += 1
        return conn

    def failed(self, exc: BaseException) -> None:
        """The replica could not serve a read: leave it alone for a while."""
        with self._lock:
            self._down_until = time.monotonic() + RETRY_S
        self._fell_back(f"unreachable: {first_line(exc)}")

    def _fell_back(self, why: str | None) -> None:
        with self._lock:
            self.fallbacks += 1
            if why is not None:
                self.last_problem = why

    def state(self) -> dict[str, Any]:
        with self._lock:
            down = max(0.0, self._down_until - time.monotonic())
            return {"url": display_url(self.url), "reads": self.reads, "fallbacks": self.fallbacks,
                    "skipped_for_s": round(down, 1), "last_problem": self.last_problem}
