"""Vectors: embeddings of messages and summaries, kept beside them (``lcm_vectors``), and the
nearest ones to a query within an agent's scope.

Vectors are derived data. Messages and summaries are stored first; what has no vector for the
current model is listed by :meth:`VectorRepository.pending` and filled by whoever embeds (the
engine's background indexer, ``lcm embed``), any number of times, idempotently. Vectors of
another model are never compared with the current one's (:meth:`coverage` counts them so that
``lcm doctor`` can offer re-embedding; :meth:`prune` removes them).

Nearest neighbours, portable on both backends: exact cosine with numpy over the agent's vectors,
held in memory per (agent, model, kind) and refreshed incrementally (new rows by id on every
search, a full reload when rows went away or arrived out of id order, checked by count at most
every ``RECOUNT_SECONDS``). 256 float32 dimensions cost 1 KB per row: 100 MB for an agent with
100k messages. A search is one matrix-vector product and a partial sort: a few milliseconds at
100k rows, bounded work whatever the scope.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from sqlalchemy import Connection, Table, delete, exists, func, select

from lcm.records import Candidate, EmbedItem, VectorCoverage
from lcm.store._core import StoreCore, checked_int, messages_t, sessions_t, summaries_t
from lcm.store.schema import Vector
from lcm.vectors import from_blobs, numpy

if TYPE_CHECKING:
    from lcm.vectors import Matrix

vectors_t = cast(Table, Vector.__table__)

Kind = Literal["message", "summary"]
#: Rows of the agent's vectors checked by count (deletions, late commits) at most this often.
RECOUNT_SECONDS = 30.0
#: Rows read per query when loading an agent's vectors into memory.
LOAD_CHUNK = 5_000
MAX_PENDING = 5_000


@dataclass
class _Loaded:
    """One agent's vectors of one model and kind, in memory (arrays grow by doubling)."""

    dims: int = 0
    size: int = 0
    last_vector_id: int = 0
    counted_at: float = 0.0
    item_ids: Any = None  # int64[capacity]
    sessions: Any = None  # int64[capacity]
    roles: Any = None  # int16[capacity], codes of ``role_codes``
    ts: Any = None  # float64[capacity]
    matrix: Any = None  # float32[capacity, dims]
    role_codes: dict[str | None, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, rows: Sequence[Any]) -> None:
        np = numpy()
        if not rows:
            return
        dims = rows[0].dims
        if self.matrix is None or dims != self.dims:
            self.dims, self.size = dims, 0
            cap = max(1024, len(rows))
            self.item_ids = np.zeros(cap, dtype=np.int64)
            self.sessions = np.zeros(cap, dtype=np.int64)
            self.roles = np.zeros(cap, dtype=np.int16)
            self.ts = np.zeros(cap, dtype=np.float64)
            self.matrix = np.zeros((cap, dims), dtype=np.float32)
        rows = [r for r in rows if r.dims == self.dims]  # one model has one size
        need = self.size + len(rows)
        if need > len(self.item_ids):
            cap = max(need, 2 * len(self.item_ids))
            for name in ("item_ids", "sessions", "roles", "ts"):
                grown = np.zeros(cap, dtype=getattr(self, name).dtype)
                grown[: self.size] = getattr(self, name)[: self.size]
                setattr(self, name, grown)
            grown_m = np.zeros((cap, self.dims), dtype=np.float32)
            grown_m[: self.size] = self.matrix[: self.size]
            self.matrix = grown_m
        end = self.size + len(rows)
        self.item_ids[self.size:end] = [r.item_id for r in rows]
        self.sessions[self.size:end] = [r.session_id for r in rows]
        self.roles[self.size:end] = [self.role_codes.setdefault(r.role, len(self.role_codes)) for r in rows]
        self.ts[self.size:end] = [r.ts for r in rows]
        self.matrix[self.size:end] = from_blobs([r.vector for r in rows], self.dims)
        self.size = end
        self.last_vector_id = max(self.last_vector_id, max(r.id for r in rows))


class VectorRepository:
    """Embeddings of an agent's messages and summaries (``store.vectors``)."""

    def __init__(self, core: StoreCore):
        self._core = core
        self._loaded: dict[tuple[int, str, Kind], _Loaded] = {}
        self._loaded_lock = threading.Lock()

    # ------------------------------------------------------------------ writing

    def pending(self, model: str, *, kind: Kind, agent: str | None = None, after_id: int = 0,
                limit: int = 256) -> list[EmbedItem]:
        """Messages (or summaries) with no vector of ``model`` yet, oldest first from
        ``after_id``: what an embedder is to fill next (all agents when ``agent`` is None)."""
        checked_int("limit", limit, low=1, high=MAX_PENDING)
        table = messages_t if kind == "message" else summaries_t
        column = vectors_t.c.message_id if kind == "message" else vectors_t.c.summary_id
        with self._core.read() as conn:
            role = table.c.role if kind == "message" else None
            ts = table.c.ts if kind == "message" else table.c.latest_at
            stmt = select(table.c.id, table.c.agent_id, table.c.session_id, ts.label("ts"),
                          func.coalesce(table.c.search_text, table.c.content).label("text"),
                          *([role.label("role")] if role is not None else [])).where(
                table.c.id > after_id,
                ~exists().where(column == table.c.id, vectors_t.c.model == model)).order_by(table.c.id).limit(limit)
            if agent is not None:
                agent_pk = self._core.agent_pk(conn, agent, create=False)
                if agent_pk is None:
                    return []
                stmt = stmt.where(table.c.agent_id == agent_pk)
            return [EmbedItem(kind=kind, id=r.id, agent_pk=r.agent_id, session_pk=r.session_id,
                              role=getattr(r, "role", None), ts=r.ts, text=r.text or "")
                    for r in conn.execute(stmt)]

    def put(self, model: str, items: Sequence[EmbedItem], vectors: Matrix) -> int:
        """Store ``vectors`` (one unit row per item, from ``model``); an item that already has
        one, or whose row was deleted meanwhile, is left alone. Returns the rows written."""
        if len(items) != len(vectors):
            raise ValueError(f"{len(items)} items but {len(vectors)} vectors")
        if not items:
            return 0
        np = numpy()
        dims = int(vectors.shape[1])
        now = time.time()
        blobs = np.ascontiguousarray(vectors, dtype="<f4")
        written = 0
        with self._core.write() as conn:
            for kind, column in (("message", "message_id"), ("summary", "summary_id")):
                mine = [(i, it) for i, it in enumerate(items) if it.kind == kind]
                if not mine:
                    continue
                table = messages_t if kind == "message" else summaries_t
                alive = {r[0] for r in conn.execute(select(table.c.id).where(
                    table.c.id.in_([it.id for _, it in mine])))}
                rows = [{"agent_id": it.agent_pk, "session_id": it.session_pk, column: it.id,
                         "role": it.role, "ts": it.ts, "model": model, "dims": dims,
                         "vector": blobs[i].tobytes(), "created_at": now,
                         "message_id" if kind == "summary" else "summary_id": None}
                        for i, it in mine if it.id in alive]
                if rows:
                    self._core.backend.insert_ignore(conn, vectors_t, rows, [column, "model"])
                    written += len(rows)
        return written

    def prune(self, model: str, *, agent: str | None = None) -> int:
        """Delete the vectors of every model but ``model``; returns how many went."""
        with self._core.write() as conn:
            stmt = delete(vectors_t).where(vectors_t.c.model != model)
            if agent is not None:
                agent_pk = self._core.agent_pk(conn, agent, create=False)
                if agent_pk is None:
                    return 0
                stmt = stmt.where(vectors_t.c.agent_id == agent_pk)
            gone = conn.execute(stmt).rowcount or 0
        with self._loaded_lock:
            self._loaded.clear()
        return int(gone)

    # ------------------------------------------------------------------ reading

    def coverage(self, model: str | None, *, agent: str | None = None) -> VectorCoverage:
        """How many messages and summaries there are, how many have a vector of ``model``, and
        the vectors of other models (by model)."""
        with self._core.read() as conn:
            agent_pk: int | None = None
            if agent is not None:
                agent_pk = self._core.agent_pk(conn, agent, create=False)
                if agent_pk is None:
                    return VectorCoverage(model=model, messages=0, messages_embedded=0, summaries=0,
                                          summaries_embedded=0, other_models={})

            def count(table: Table) -> int:
                stmt = select(func.count()).select_from(table)
                if agent_pk is not None:
                    stmt = stmt.where(table.c.agent_id == agent_pk)
                return int(conn.execute(stmt).scalar() or 0)

            by_model = select(vectors_t.c.model, func.count(vectors_t.c.message_id),
                              func.count(vectors_t.c.summary_id)).group_by(vectors_t.c.model)
            if agent_pk is not None:
                by_model = by_model.where(vectors_t.c.agent_id == agent_pk)
            counts = {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(by_model)}
            mine = counts.pop(model, (0, 0)) if model is not None else (0, 0)
            return VectorCoverage(model=model, messages=count(messages_t), messages_embedded=mine[0],
                                  summaries=count(summaries_t), summaries_embedded=mine[1],
                                  other_models={m: a + b for m, (a, b) in sorted(counts.items())})

    def nearest(self, conn: Connection, model: str, query: Matrix, *, agent_pk: int, kind: Kind,
                limit: int, session_pks: Collection[int] | None = None, item_ids: Collection[int] = (),
                roles: Sequence[str] = (), platform: str | None = None, time_from: float | None = None,
                time_to: float | None = None) -> list[Candidate]:
        """The ``limit`` items of the agent most similar to ``query`` (one unit vector), best
        first, scored by cosine similarity: within ``session_pks`` (or also ``item_ids``) when
        given, and the role, platform and time filters."""
        np = numpy()
        loaded = self._refresh(conn, model, agent_pk, kind)
        with loaded.lock:
            n = loaded.size
            if n == 0 or query.shape[-1] != loaded.dims:
                return []
            scores = loaded.matrix[:n] @ np.asarray(query, dtype=np.float32).reshape(-1)
            keep = np.ones(n, dtype=bool)
            if session_pks is not None:
                keep = np.isin(loaded.sessions[:n], np.fromiter(session_pks, dtype=np.int64))
                if item_ids:
                    keep |= np.isin(loaded.item_ids[:n], np.fromiter(item_ids, dtype=np.int64))
            if roles:
                codes = [loaded.role_codes[r] for r in roles if r in loaded.role_codes]
                keep &= np.isin(loaded.roles[:n], np.array(codes, dtype=np.int16))
            if platform is not None:
                ids = conn.execute(select(sessions_t.c.id).where(
                    sessions_t.c.agent_id == agent_pk, sessions_t.c.platform == platform)).scalars().all()
                keep &= np.isin(loaded.sessions[:n], np.array(ids, dtype=np.int64))
            if time_from is not None:
                keep &= loaded.ts[:n] >= time_from
            if time_to is not None:
                keep &= loaded.ts[:n] <= time_to
            scores = np.where(keep, scores, -np.inf)
            k = min(limit, int(keep.sum()))
            if k <= 0:
                return []
            top = np.argpartition(-scores, k - 1)[:k]
            top = top[np.argsort(-scores[top], kind="stable")]
            return [Candidate(int(loaded.item_ids[i]), round(float(scores[i]), 6)) for i in top]

    def _refresh(self, conn: Connection, model: str, agent_pk: int, kind: Kind) -> _Loaded:
        """The agent's vectors in memory, brought up to date with the table."""
        key = (agent_pk, model, kind)
        with self._loaded_lock:
            loaded = self._loaded.setdefault(key, _Loaded())
        item = vectors_t.c.message_id if kind == "message" else vectors_t.c.summary_id
        scope = (vectors_t.c.agent_id == agent_pk, vectors_t.c.model == model, item.is_not(None))
        with loaded.lock:
            now = time.monotonic()
            if now - loaded.counted_at > RECOUNT_SECONDS:
                total = conn.execute(select(func.count()).select_from(vectors_t).where(*scope)).scalar() or 0
                loaded.counted_at = now
                if total != loaded.size:  # rows went away, or committed behind the newest id
                    loaded.matrix, loaded.size, loaded.last_vector_id = None, 0, 0
            while True:
                rows = conn.execute(select(vectors_t.c.id, item.label("item_id"), vectors_t.c.session_id,
                                           vectors_t.c.role, vectors_t.c.ts, vectors_t.c.dims, vectors_t.c.vector)
                                    .where(*scope, vectors_t.c.id > loaded.last_vector_id)
                                    .order_by(vectors_t.c.id).limit(LOAD_CHUNK)).all()
                loaded.append(rows)
                if len(rows) < LOAD_CHUNK:
                    break
        return loaded

    def forget_cached(self) -> None:
        """Drop every agent's vectors held in memory (they reload on the next search)."""
        with self._loaded_lock:
            self._loaded.clear()
