"""Filling in vectors: what a store holds without a vector of the current model gets one.

The database is the queue. :func:`backfill` asks the store for messages and summaries with no
vector of the embedder's model (``store.vectors.pending``), embeds them in batches and stores
the vectors; run twice, it does nothing the second time; interrupted, it resumes where it
stopped. ``lcm embed`` runs it in the foreground with a progress bar.

Inside a running engine, :class:`BackgroundIndexer` runs the same backfill on a thread of its
own after the turn's messages are committed (the engine only :meth:`~BackgroundIndexer.notify`
it): embedding never delays a turn, and a message is stored whether or not its vector ever
comes. An embedder that fails (an endpoint down) is retried later; the thread ends when idle
and starts again on the next notify.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from lcm.context.embed.protocol import Embedder
from lcm.context.ports import VectorPort
from lcm.vectors import numpy

log = logging.getLogger("lcm")

#: Rows embedded and written per transaction.
BATCH = 256
#: After a failure, the background indexer waits this long before trying again.
RETRY_SECONDS = 30.0
#: An idle background indexer thread ends after this long without news.
IDLE_SECONDS = 60.0
#: Failures in a row after which the thread ends (the next notify starts it again).
MAX_FAILURES = 5

Progress = Callable[[int], None]


@dataclass
class BackfillResult:
    """What one backfill embedded, by kind."""

    messages: int = 0
    summaries: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def embedded(self) -> int:
        return self.messages + self.summaries


def backfill(vectors: VectorPort, embedder: Embedder, *, agent: str | None = None, batch: int = BATCH,
             progress: Progress | None = None, should_stop: Callable[[], bool] | None = None) -> BackfillResult:
    """Embed every message and summary (of ``agent``, or of all agents) that has no vector of
    ``embedder.model`` yet. ``progress(n)`` after each batch of ``n``; ``should_stop()``
    checked between batches. Raises what the embedder raises (nothing written is lost)."""
    np = numpy()
    done = BackfillResult()
    kinds: tuple[Literal["message", "summary"], ...] = ("message", "summary")
    for kind in kinds:
        after = 0
        while not (should_stop and should_stop()):
            items = vectors.pending(embedder.model, kind=kind, agent=agent, after_id=after, limit=batch)
            if not items:
                break
            after = items[-1].id
            with_text = [i for i, it in enumerate(items) if it.text.strip()]
            made = embedder.embed([items[i].text for i in with_text] or ["x"])
            # A row with no text at all gets the zero vector: it never matches, and it is not
            # pending again.
            matrix = np.zeros((len(items), made.shape[1]), dtype=np.float32)
            if with_text:
                matrix[with_text] = made
            written = vectors.put(embedder.model, items, matrix)
            if kind == "message":
                done.messages += written
            else:
                done.summaries += written
            if progress is not None:
                progress(len(items))
    return done


class BackgroundIndexer:
    """Backfills one agent's vectors on a daemon thread, woken by :meth:`notify`."""

    def __init__(self, vectors: VectorPort, embedder: Embedder, agent: str):
        self.vectors, self.embedder, self.agent = vectors, embedder, agent
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.embedded = 0
        self.last_error: str | None = None
        #: ``time.monotonic()`` when the work now in hand arrived (the first notify since the
        #: indexer was last idle); None while idle.
        self.busy_since: float | None = None

    def busy_for(self) -> float | None:
        """Seconds the indexer has had work in hand (None: idle, nothing pending for it)."""
        since = self.busy_since
        return None if since is None else time.monotonic() - since

    def notify(self) -> None:
        """New rows were committed: embed them soon (starts the thread when needed)."""
        if self._idle.is_set():
            self.busy_since = time.monotonic()
        self._idle.clear()
        self._wake.set()
        with self._lock:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name=f"lcm-embed-{self.agent}", daemon=True)
                self._thread.start()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is left to embed (tests, ``lcm`` commands that exit): True when
        the thread went idle within ``timeout`` seconds."""
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set() and failures < MAX_FAILURES:
            if not self._wake.wait(IDLE_SECONDS):
                with self._lock:  # idle: end, unless a notify came meanwhile
                    if not self._wake.is_set():
                        self._thread = None
                        return
                continue
            self._wake.clear()
            try:
                done = backfill(self.vectors, self.embedder, agent=self.agent, should_stop=self._stop.is_set)
                self.embedded += done.embedded
                self.last_error = None
                failures = 0
                if not self._wake.is_set():
                    self.busy_since = None
                    self._idle.set()
            except Exception as exc:  # noqa: BLE001 - vectors are derived: a failure waits and retries
                failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("lcm: embedding failed (%s); retrying in %.0f s", self.last_error, RETRY_SECONDS)
                if self._stop.wait(RETRY_SECONDS):
                    break
                self._wake.set()
        with self._lock:
            self._thread = None
        self.busy_since = None
        self._idle.set()
