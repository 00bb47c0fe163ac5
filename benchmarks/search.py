"""Search latency of ``Store.search_messages`` on SQLite and PostgreSQL, on the same corpus.

    python -m benchmarks.search --messages 100000            # both backends
    python -m benchmarks.search --messages 10000 --backend sqlite

Query classes: a unique needle, a rare word, two mid-frequency words, the most common word;
each session-scoped and across all of an agent's sessions, sorted by recency and by relevance.
Prints p50/p95 per class and the needle recall (must be 100%). Figures are printed, never
asserted: a noisy machine changes them, not their meaning.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from benchmarks.corpus import Corpus, plant_needles
from lcm import db
from lcm.store import Store

console = Console()
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@dataclass
class Loaded:
    store: Store
    sessions: dict[str, int]  # session key -> pk (agent "bench-0" and "bench-1")
    needles: dict[int, tuple[str, int]]  # needle index -> (agent, store id)
    seconds: float
    messages: int


def load(url: str, corpus: Corpus, messages: int, sessions: int, batch_turns: int = 50) -> Loaded:
    store = Store.open(url, upgrade=True)
    per_session = max(1, messages // 4 // sessions)
    keys: dict[str, int] = {}
    needles: dict[int, tuple[str, int]] = {}
    index = 0
    started = time.perf_counter()
    for s in range(sessions):
        agent = f"bench-{s % 2}"
        key = f"session-{s:04d}"
        session = store.get_or_create_session(agent, key, platform="cli")
        keys[key] = session.id
        anchor = None
        turns = list(corpus.turns(per_session, session=key))
        for b in range(0, len(turns), batch_turns):
            batch, firsts = [], []
            for turn in turns[b:b + batch_turns]:
                firsts.append((index, plant_needles(turn, index)))
                batch.extend(turn)
                index += len(turn)
            result = store.append_messages(session.id, batch, after_identity=anchor)
            anchor = result.last_identity
            base = firsts[0][0]
            for _, planted in firsts:
                for needle_index in planted:
                    needles[needle_index] = (agent, result.store_ids[needle_index - base])
    elapsed = time.perf_counter() - started
    store.optimize()  # as a bulk import does: fresh planner statistics
    return Loaded(store, keys, needles, elapsed, index)


def timed(fn, runs: int) -> tuple[list[float], object]:
    out, last = [], None
    for _ in range(runs):
        t = time.perf_counter()
        last = fn()
        out.append((time.perf_counter() - t) * 1000)
    return out, last


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def bench(loaded: Loaded, corpus: Corpus, runs: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    store = loaded.store
    agent = "bench-0"
    own_sessions = [pk for key, pk in loaded.sessions.items() if int(key.split("-")[1]) % 2 == 0]
    rows = []
    classes = {
        "needle": lambda: Corpus.needle(rng.choice([i for i, (a, _) in needle_list if a == agent])),
        "rare word": lambda: corpus.word_at_rank(rng.randint(12_000, 20_000)),
        "two mid words": lambda: f"{corpus.word_at_rank(rng.randint(150, 400))} "
                                 f"{corpus.word_at_rank(rng.randint(150, 400))}",
        "most common": lambda: corpus.word_at_rank(1),
    }
    needle_list = list(loaded.needles.items())
    for name, make_query in classes.items():
        for scope in ("session", "agent"):
            for sort in ("recency", "relevance"):
                timings, hits = [], 0
                for _ in range(runs):
                    query = make_query()
                    session_pk = rng.choice(own_sessions) if scope == "session" else None
                    t = time.perf_counter()
                    result = store.search_messages(query, agent=agent, session_pk=session_pk,
                                                   sort=sort, limit=10)
                    timings.append((time.perf_counter() - t) * 1000)
                    hits += len(result.hits)
                rows.append({"class": name, "scope": scope, "sort": sort,
                             "p50": statistics.median(timings), "p95": pct(timings, 0.95),
                             "hits": hits / runs})
    return rows


def recall(loaded: Loaded) -> tuple[int, int]:
    found = 0
    for index, (agent, store_id) in loaded.needles.items():
        hits = loaded.store.search_messages(Corpus.needle(index), agent=agent, limit=5).hits
        found += any(h.id == store_id for h in hits)
    return found, len(loaded.needles)


def pg_schema_url(base: str) -> tuple[str, callable]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("LCM_BENCH_POSTGRES_URL",
                                                          os.environ.get("LCM_TEST_POSTGRES_URL", DEFAULT_PG)))
    args = parser.parse_args()
    corpus = Corpus()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    for backend in backends:
        cleanup = None
        if backend == "sqlite":
            tmp = tempfile.mkdtemp(prefix="lcm-bench-")
            url = f"sqlite:///{tmp}/bench.db"
        else:
            url, cleanup = pg_schema_url(db.resolve_url(args.pg_url).render_as_string(hide_password=False))
        try:
            console.print(f"[bold]{backend}[/]: loading {args.messages:,} messages "
                          f"in {args.sessions} sessions of 2 agents ...")
            loaded = load(url, corpus, args.messages, args.sessions)
            console.print(f"loaded {loaded.messages:,} messages in {loaded.seconds:.1f} s "
                          f"({loaded.messages / loaded.seconds:,.0f} msg/s, batches of 200)")
            rows = bench(loaded, corpus, args.runs)
            found, total = recall(loaded)
            table = Table(title=f"lcm_grep latency, {backend}, {loaded.messages:,} messages (ms)")
            for col in ("class", "scope", "sort", "p50", "p95", "avg hits"):
                table.add_column(col, justify="right" if col in ("p50", "p95", "avg hits") else "left")
            for r in rows:
                table.add_row(r["class"], r["scope"], r["sort"], f"{r['p50']:.2f}",
                              f"{r['p95']:.2f}", f"{r['hits']:.1f}")
            console.print(table)
            console.print(f"needle recall: {found}/{total} ({100.0 * found / max(total, 1):.1f}%)")
        finally:
            if cleanup:
                cleanup()


if __name__ == "__main__":
    main()
