"""Full-text search over an agent's raw messages and summary nodes.

User text is parsed into terms (``lcm.textindex.parse_query``): no query syntax error is
possible, and values are always bound parameters. The backend returns candidate ids (newest
first, scored for ranked sorts) within bounded work; this module orders them, loads the rows
and cuts the snippets, the same way for messages and for summaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, select

from lcm.errors import NotFoundError
from lcm.messages import message_text
from lcm.records import SORT_MODES, Candidate, SearchHit, SearchResult, SortMode
from lcm.store._core import StoreCore, checked_int, fetch_in, messages_t, sessions_t, summaries_t
from lcm.store.backends import SearchSpec
from lcm.store.messages import message_select, records
from lcm.textindex import make_snippet, parse_query

MAX_SEARCH_LIMIT = 200
#: Reciprocal-rank fusion constant of the hybrid sort.
HYBRID_RRF_K = 60


def order_candidates(candidates: list[Candidate], sort: SortMode, limit: int) -> list[Candidate]:
    """The ``limit`` best candidates for ``sort`` (candidates come newest first)."""
    if sort == "recency":
        return candidates[:limit]
    by_score = sorted(candidates, key=lambda c: (-(c.score or 0.0), -c.id))
    if sort == "relevance":
        return by_score[:limit]
    # Reciprocal-rank fusion of the relevance order and the recency order, so neither score
    # scale dominates and both backends fuse alike.
    rel_rank = {c.id: i for i, c in enumerate(by_score)}
    fused = sorted(enumerate(candidates), key=lambda ic: -(
        1.0 / (HYBRID_RRF_K + rel_rank[ic[1].id]) + 1.0 / (HYBRID_RRF_K + ic[0])))
    return [c for _, c in fused[:limit]]


#: Per kind: the backend's candidate search, and the hits for the chosen candidate ids.
_Hits = Callable[[Connection, SearchSpec, list[Candidate]], list[SearchHit]]


def _message_hits(conn: Connection, spec: SearchSpec, chosen: list[Candidate]) -> list[SearchHit]:
    rows = fetch_in(conn, (c.id for c in chosen), lambda chunk: message_select().add_columns(
        messages_t.c.search_text).where(messages_t.c.id.in_(chunk), messages_t.c.agent_id == spec.agent_pk))
    # Snippets come from the message's own text; a large payload is not decompressed for
    # that: its indexed excerpt is used instead.
    inline = [r for r in rows if r.payload_id is None]
    texts = {rec.store_id: message_text(rec.message) for rec in records(conn, inline)}
    texts.update({r.id: r.search_text or "" for r in rows if r.payload_id is not None})
    by_id = {r.id: r for r in rows}
    return [SearchHit(kind="message", id=r.id, session_pk=r.session_id, session_key=r.session_key,
                      ts=r.ts, role=r.role, score=c.score, snippet=make_snippet(texts[r.id], spec.query))
            for c in chosen if (r := by_id.get(c.id)) is not None]


def _summary_hits(conn: Connection, spec: SearchSpec, chosen: list[Candidate]) -> list[SearchHit]:
    rows = fetch_in(conn, (c.id for c in chosen), lambda chunk: select(
        summaries_t, sessions_t.c.session_key).join(sessions_t, sessions_t.c.id == summaries_t.c.session_id).where(
        summaries_t.c.id.in_(chunk), summaries_t.c.agent_id == spec.agent_pk))
    by_id = {r.id: r for r in rows}
    return [SearchHit(kind="summary", id=r.id, session_pk=r.session_id, session_key=r.session_key,
                      ts=r.latest_at, depth=r.depth, score=c.score, snippet=make_snippet(r.content, spec.query))
            for c in chosen if (r := by_id.get(c.id)) is not None]


class SearchRepository:
    """Search over messages and summaries (``store.search``)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def messages(self, query: str, *, agent: str, session_pk: int | None = None,
                 roles: Sequence[str] = (), platform: str | None = None, time_from: float | None = None,
                 time_to: float | None = None, sort: SortMode = "recency", limit: int = 10) -> SearchResult:
        """Full-text search over the agent's raw messages (one session, or all when None).

        ``recency``: newest matches first, exact. ``relevance`` / ``hybrid``: the newest
        ``RANK_WINDOW`` matches, ranked (BM25 / ts_rank_cd) or fused with recency; the result
        says when more matched than were ranked (``candidates_clamped``).
        """
        return self._run(query, agent, session_pk, sort, limit, self._core.backend.search_messages,
                         _message_hits, roles=tuple(roles), platform=platform,
                         time_from=time_from, time_to=time_to)

    def summaries(self, query: str, *, agent: str, session_pk: int | None = None, sort: SortMode = "recency",
                  limit: int = 10, time_from: float | None = None, time_to: float | None = None) -> SearchResult:
        """Full-text search over the agent's summary nodes (one session, or all when None)."""
        return self._run(query, agent, session_pk, sort, limit, self._core.backend.search_summaries,
                         _summary_hits, time_from=time_from, time_to=time_to)

    def _run(self, query: str, agent: str, session_pk: int | None, sort: SortMode, limit: int,
             candidates_of: Callable[[Connection, SearchSpec], tuple[list[Candidate], bool]],
             hits_of: _Hits, **filters: Any) -> SearchResult:
        if sort not in SORT_MODES:
            raise ValueError(f"sort must be one of {', '.join(SORT_MODES)}, got {sort!r}")
        checked_int("limit", limit, low=1, high=MAX_SEARCH_LIMIT)
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return SearchResult(hits=[])
            if session_pk is not None:
                owner = conn.execute(select(sessions_t.c.agent_id).where(sessions_t.c.id == session_pk)).scalar()
                if owner != agent_pk:
                    raise NotFoundError(f"session {session_pk} not found")
            spec = SearchSpec(query=parse_query(query), agent_pk=agent_pk, session_pk=session_pk,
                              ranked=sort != "recency", limit=limit, **filters)
            if spec.query.is_empty:
                return SearchResult(hits=[], notes=spec.query.notes)
            found, clamped = candidates_of(conn, spec)
            hits = hits_of(conn, spec, order_candidates(found, sort, limit))
        return SearchResult(hits=hits, candidates_clamped=clamped, notes=spec.query.notes)
