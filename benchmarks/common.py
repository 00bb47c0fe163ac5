"""Shared benchmark plumbing: where the databases live, timing, percentiles, peak memory."""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from lcm.prepare import prepare_messages
from lcm.records import AppendResult
from lcm.store import Store
from lcm.store import connection as db
from lcm.tokens import TokenCounter

_TOKENS = TokenCounter()

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ("sqlite", "postgresql")


def append_messages(store: Store, session_pk: int, messages: Sequence[Mapping[str, Any]],
                    **options: Any) -> AppendResult:
    """Bulk-load plain messages the way ``lcm ingest --no-compact`` stores them."""
    return store.messages.append(session_pk, prepare_messages(messages, _TOKENS), **options)


def timed_turn(engine: Any, transcript: list[dict[str, Any]], current_tokens: int) -> tuple[Any, dict[str, float]]:
    """One host turn through ``engine`` (an ``LcmEngine``): ``on_turn_complete``,
    ``should_compress``, ``compress``; what ``compress`` returned and each step's milliseconds."""
    t0 = time.perf_counter()
    engine.on_turn_complete(transcript)
    t1 = time.perf_counter()
    engine.should_compress(current_tokens)
    t2 = time.perf_counter()
    out = engine.compress(transcript, current_tokens=current_tokens)
    t3 = time.perf_counter()
    return out, {"ingest one turn": (t1 - t0) * 1000, "should_compress": (t2 - t1) * 1000,
                 "compress": (t3 - t2) * 1000, "whole turn": (t3 - t0) * 1000}


def pg_base() -> str:
    raw = os.environ.get("LCM_BENCH_POSTGRES_URL") or os.environ.get("LCM_TEST_POSTGRES_URL") or DEFAULT_PG
    return db.resolve_url(raw).render_as_string(hide_password=False)


def pg_schema_url(base: str | None = None) -> tuple[str, Callable[[], None]]:
    """A fresh PostgreSQL schema for one benchmark (dropped by the returned cleanup)."""
    base = base or pg_base()
    schema = "lcm_bench_" + uuid.uuid4().hex[:8]
    admin = create_engine(base, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False)

    def drop() -> None:
        db.dispose(db.resolve_url(url))
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()

    return url, drop


def backend_url(backend: str) -> tuple[str, Callable[[], None]]:
    """A fresh, empty lcm database URL for ``backend`` and its cleanup."""
    if backend == "postgresql":
        return pg_schema_url()
    tmp = tempfile.mkdtemp(prefix="lcm-bench-")
    url = f"sqlite:///{tmp}/lcm.db"

    def drop() -> None:
        db.dispose(db.resolve_url(url))
        shutil.rmtree(tmp, ignore_errors=True)

    return url, drop


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, ``q`` a fraction (0.95, not 95)."""
    if not 0 <= q <= 1:
        raise ValueError(f"pct takes a fraction of 1, got {q}")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


def summary_ms(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values) if values else 0.0, "p95": pct(values, 0.95)}


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (each phase runs in its own process)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def ratio(ours: float, baseline: float) -> float:
    return ours / baseline if baseline else 0.0
