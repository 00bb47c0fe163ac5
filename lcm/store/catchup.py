"""Derived search data computed after the turn, on a thread of the process's own.

On PostgreSQL a turn stores each message with its exact search vector and leaves the stemmed
one to a catch-up (revision 0012): the statement the catch-up sends makes the server stem the
messages on a core of its own while the agent goes on with its next turn. This thread sends it
once ``batch`` messages wait, or once the writes pause for ``idle_s`` with any waiting, so a
search rarely finds work left (it catches up first itself when it does: a search never misses
a message). The thread waits on the database with the GIL released; it starts with the first
write and ends after an idle spell, so an idle process holds no thread.

A failure is logged and left for the next catch-up (the search's own, or the next batch): the
messages themselves are stored by then, and stay findable by their exact words.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("lcm")

#: Messages written before the thread catches up while writes keep coming (SQLite's index
#: batch too). Measured on 2 cores, 500 turns in a closed loop, stems included: batches of 64
#: made a turn 2.1-2.4 ms, of 1,024 1.95-2.0 ms (fewer catch-ups to interleave with the turns);
#: an agent between model calls is idle for seconds, so its catch-ups run at ``idle_s``.
CATCH_UP_BATCH = 1024
#: Seconds of no writes after which waiting messages are caught up anyway.
CATCH_UP_IDLE_S = 1.0


class BackgroundCatchUp:
    """Calls ``run`` on a thread of its own when enough derived work waits (see module)."""

    def __init__(self, run: Callable[[], object], *, batch: int = CATCH_UP_BATCH,
                 idle_s: float = CATCH_UP_IDLE_S):
        self._run = run
        self._batch = batch
        self._idle_s = idle_s
        self._reset()

    def _reset(self) -> None:
        # Also after a fork: the child has none of the parent's threads, and its locks may
        # have been copied held.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._waiting = 0
        self._thread: threading.Thread | None = None

    def added(self, count: int) -> None:
        """``count`` more messages wait for the catch-up."""
        if count <= 0:
            return
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            self._waiting += count
            self._idle.clear()
            if self._waiting >= self._batch:
                self._wake.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lcm-catch-up", daemon=True)
                self._thread.start()

    def drop_waiting(self) -> None:
        """Forget what waits and let the thread end (the engine was disposed: a database going
        away, or a forked child's copy). The next write starts afresh; a search still catches
        up everything itself."""
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            self._waiting = 0
            self._wake.set()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing waits and no catch-up runs (tests, benchmarks, shutdown)."""
        with self._lock:
            if self._waiting and self._thread is not None:
                self._wake.set()
        return self._idle.wait(timeout)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._idle_s)
            with self._lock:
                self._wake.clear()
                if not self._waiting:
                    self._thread = None  # idle: end; the next write starts another
                    self._idle.set()
                    return
                taken, self._waiting = self._waiting, 0
            try:
                self._run()
            except Exception as exc:  # noqa: BLE001 - a background failure must not kill the thread
                log.warning("lcm: background catch-up of %d messages failed (the next search "
                            "catches them up): %s", taken, exc)
            with self._lock:
                if not self._waiting:
                    self._idle.set()
