"""Full-text search over an agent's raw messages and summary nodes.

User text is parsed into terms (``lcm.textindex.parse_query``): no query syntax error is
possible, and values are always bound parameters. The backend returns candidate ids (newest
first, scored for ranked sorts) within bounded work; this module orders them, loads the rows
and cuts the snippets, the same way for messages and for summaries.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, Select, Table, and_, bindparam, select

from lcm.backends import Backend, IdsIn, SearchSpec, window_rank
from lcm.errors import NotFoundError
from lcm.messages import message_text
from lcm.records import SORT_MODES, Candidate, MatchKind, SearchHit, SearchResult, SortMode
from lcm.store._core import StoreCore, checked_int, fetch_in, messages_t, sessions_t, summaries_t
from lcm.store.messages import message_select, records
from lcm.store.replica import lag_tolerant
from lcm.store.vectors import Kind, VectorRepository
from lcm.textindex import Query, Term, any_words, make_snippet, parse_query

if TYPE_CHECKING:
    from lcm.vectors import Matrix

MAX_SEARCH_LIMIT = 200
#: Newest matches of each content word (and pair of words) an any-word search looks at, and
#: the rarest words whose pairs it searches (see ``_any_word_hits``).
ANY_TERM_MATCHES = 1000
ANY_PAIR_TERMS = 6
#: Messages waiting for their stems that a search holding its session (auto-recall) leaves to
#: the background catch-up on PostgreSQL, where they are still found by their exact words
#: (``StoreCore.catch_up_index``): what other conversations stored in the last moment. More
#: than that is a backlog (a bulk import, a conversation replayed faster than the stemmer), and
#: is caught up first.
FRESH_PENDING_TOLERATED = 64
#: What a word counts when a row has it only in another form ("moved" for "move").
STEM_WEIGHT = 0.5
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


class _Hits(Protocol):
    """Per kind: the hits for the chosen candidate ids, marked ``match`` as they are made."""

    def __call__(self, conn: Connection, spec: SearchSpec, chosen: list[Candidate], *,
                 match: MatchKind = "all") -> list[SearchHit]: ...


#: The backend's read of rows by id (``Backend.rows_by_ids``).
RowsByIds = Callable[..., list[Any]]


def _in_scope(spec: SearchSpec, rows: Sequence[Any]) -> dict[int, Any]:
    """The rows (read by id, within the agent) that are the scope's, by id: the backends'
    candidates are ids, and what they scope by is checked here once more, so no index or
    counter can put another session's row in a session's result. The session is checked
    here, not in the SQL: with ``session_id = ?`` beside ``id IN (...)``, SQLite walked a
    900k-message session's index instead of looking the ids up (100 ms). Summaries are not
    checked by session: a session's search includes those carried into it from its parent."""
    return {r.id: r for r in rows if spec.session_pk is None or r.session_id == spec.session_pk}


def _hit_places(ids_in: IdsIn) -> Select[Any]:
    """Where messages are (no body): the hits of a search without snippets."""
    return select(messages_t.c.id, messages_t.c.session_id, messages_t.c.ts, messages_t.c.role,
                  sessions_t.c.session_key).join(sessions_t, sessions_t.c.id == messages_t.c.session_id).where(
        ids_in(messages_t.c.id), messages_t.c.agent_id == bindparam("agent"))


def _hit_rows(ids_in: IdsIn) -> Select[Any]:
    """Whole messages and their indexed text: the hits of a search with snippets."""
    return message_select().add_columns(messages_t.c.search_text).where(
        ids_in(messages_t.c.id), messages_t.c.agent_id == bindparam("agent"))


def _placed_hits(chosen: list[Candidate], at: dict[int, Any], match: MatchKind) -> list[SearchHit]:
    """Hits without snippets: where each chosen candidate is (``at``: its row, by id), in the
    candidates' order; one not in ``at`` (out of scope) is left out."""
    return [SearchHit(kind="message", id=r.id, session_pk=r.session_id, session_key=r.session_key,
                      ts=r.ts, role=r.role, score=c.score, snippet="", match=match)
            for c in chosen if (r := at.get(c.id)) is not None]


def _message_hits(conn: Connection, spec: SearchSpec, chosen: list[Candidate], rows_by_ids: RowsByIds, *,
                  match: MatchKind = "all") -> list[SearchHit]:
    """The chosen candidates as hits (``rows_by_ids``: the backend's read of rows by id)."""
    ids = [c.id for c in chosen]
    if not spec.snippets:  # where the hits are, not what they say: no row decoded
        at = _in_scope(spec, rows_by_ids(conn, "search.hit_places", _hit_places, ids, {"agent": spec.agent_pk}))
        return _placed_hits(chosen, at, match)
    by_id = _in_scope(spec, rows_by_ids(conn, "search.hit_rows", _hit_rows, ids, {"agent": spec.agent_pk}))
    rows = list(by_id.values())
    # Snippets come from the message's own text; a large payload is not decompressed for
    # that: its indexed excerpt is used instead.
    inline = [r for r in rows if r.payload_id is None]
    texts = {rec.store_id: message_text(rec.message) for rec in records(conn, inline)}
    texts.update({r.id: r.search_text or "" for r in rows if r.payload_id is not None})
    return [SearchHit(kind="message", id=r.id, session_pk=r.session_id, session_key=r.session_key,
                      ts=r.ts, role=r.role, score=c.score, match=match,
                      snippet=make_snippet(texts[r.id], spec.query, loose=spec.stemmed))
            for c in chosen if (r := by_id.get(c.id)) is not None]


def _summary_hits(conn: Connection, spec: SearchSpec, chosen: list[Candidate], *,
                  match: MatchKind = "all") -> list[SearchHit]:
    rows = fetch_in(conn, (c.id for c in chosen), lambda chunk: select(
        summaries_t, sessions_t.c.session_key).join(sessions_t, sessions_t.c.id == summaries_t.c.session_id).where(
        summaries_t.c.id.in_(chunk), summaries_t.c.agent_id == spec.agent_pk))
    by_id = {r.id: r for r in rows}
    return [SearchHit(kind="summary", id=r.id, session_pk=r.session_id, session_key=r.session_key,
                      ts=r.latest_at, depth=r.depth, score=c.score, match=match,
                      snippet=make_snippet(r.content, spec.query, loose=spec.stemmed))
            for c in chosen if (r := by_id.get(c.id)) is not None]


#: Recall's neighbouring turns: each placed message (by id) with the messages just before and
#: after it in its session (NULLs at either end), in one statement: one search of
#: ``UNIQUE(session_id, seq)`` per side (an ``IN`` of both seqs made PostgreSQL AND two bitmaps
#: of the whole session).
_PLACED, _BEFORE, _AFTER = (messages_t.alias(name) for name in ("placed", "before", "after"))
_ADJACENT = select(
    _PLACED.c.id, sessions_t.c.session_key, *(side.c[col].label(f"{name}_{col}") for name, side in
                                              (("before", _BEFORE), ("after", _AFTER))
                                              for col in ("id", "session_id", "ts", "role")),
).select_from(_PLACED.join(sessions_t, sessions_t.c.id == _PLACED.c.session_id).outerjoin(_BEFORE, and_(
    _BEFORE.c.session_id == _PLACED.c.session_id, _BEFORE.c.seq == _PLACED.c.seq - 1)).outerjoin(_AFTER, and_(
    _AFTER.c.session_id == _PLACED.c.session_id, _AFTER.c.seq == _PLACED.c.seq + 1)))


def _adjacent(ids_in: IdsIn) -> Select[Any]:
    return _ADJACENT.where(ids_in(_PLACED.c.id), _PLACED.c.agent_id == bindparam("agent"))


def _placed_and_adjacent(ids_in: IdsIn) -> Select[Any]:
    """Hits without snippets and their neighbours, in one statement (``_hits_with_neighbours``)."""
    return _ADJACENT.add_columns(_PLACED.c.session_id, _PLACED.c.ts, _PLACED.c.role).where(
        ids_in(_PLACED.c.id), _PLACED.c.agent_id == bindparam("agent"))


def _sides(rows: Sequence[Any]) -> dict[tuple[int, str], SearchHit]:
    """The neighbours in rows of ``_ADJACENT``, by (placed id, "before" / "after")."""
    sides: dict[tuple[int, str], SearchHit] = {}
    for r in rows:
        if r.before_id is not None:
            sides[r.id, "before"] = SearchHit(
                kind="message", id=r.before_id, session_pk=r.before_session_id, session_key=r.session_key,
                ts=r.before_ts, role=r.before_role, snippet="", match="neighbour")
        if r.after_id is not None:
            sides[r.id, "after"] = SearchHit(
                kind="message", id=r.after_id, session_pk=r.after_session_id, session_key=r.session_key,
                ts=r.after_ts, role=r.after_role, snippet="", match="neighbour")
    return sides


def _hits_with_neighbours(conn: Connection, spec: SearchSpec, chosen: list[Candidate], rows_by_ids: RowsByIds,
                          adjacent: dict[int, tuple[SearchHit | None, SearchHit | None]], *,
                          match: MatchKind = "all") -> list[SearchHit]:
    """``_message_hits`` without snippets, and each hit's neighbours put in ``adjacent`` (as
    ``adjacent_messages`` gives them): one statement where the two took two (a round trip and
    about 1 ms of a recall)."""
    at = _in_scope(spec, rows_by_ids(conn, "search.placed_and_adjacent", _placed_and_adjacent,
                                     [c.id for c in chosen], {"agent": spec.agent_pk}))
    sides = _sides(list(at.values()))
    adjacent.update({i: (sides.get((i, "before")), sides.get((i, "after"))) for i in at})
    return _placed_hits(chosen, at, match)


class SearchRepository:
    """Search over messages and summaries (``store.search``)."""

    def __init__(self, core: StoreCore, vectors: VectorRepository):
        self._core = core
        self._vectors = vectors
        self._message_hits: _Hits = functools.partial(_message_hits, rows_by_ids=core.backend.rows_by_ids)

    def catch_up(self) -> int:
        """Index the messages the backend left pending (every search does this first); how
        many stay unindexed (0 unless the store may not write)."""
        return self._core.catch_up_index()

    @lag_tolerant
    def adjacent_messages(self, query: str, store_ids: Collection[int], *, agent: str, snippets: bool = True,
                          ) -> dict[int, tuple[SearchHit | None, SearchHit | None]]:
        """For each of the agent's messages ``store_ids``: the message just before it and the one
        just after it in its session (None at either end), as hits with ``match="neighbour"``
        and snippets for ``query`` (unless ``snippets`` is False). Recall ranks a turn by the
        words around it too: the answer to a question often follows the turn that holds the
        question's words."""
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None or not store_ids:
                return {}
            rows = self._core.backend.rows_by_ids(conn, "search.adjacent", _adjacent, list(store_ids),
                                                  {"agent": agent_pk})
            sides = _sides(rows)
            if snippets:  # exact-word snippets: a neighbour is returned for where it is, not for its words
                spec = SearchSpec(query=parse_query(query), agent_pk=agent_pk, session_pk=None, ranked=True,
                                  limit=len(sides) or 1)
                found = {h.id: h for h in self._message_hits(
                    conn, spec, [Candidate(h.id, None) for h in sides.values()], match="neighbour")}
                sides = {key: found[h.id] for key, h in sides.items() if h.id in found}
        return {r.id: (sides.get((r.id, "before")), sides.get((r.id, "after"))) for r in rows}

    @lag_tolerant
    def similar_messages(self, query: str, vector: Matrix, *, model: str, agent: str,
                         session_pk: int | None = None, roles: Sequence[str] = (), platform: str | None = None,
                         time_from: float | None = None, time_to: float | None = None,
                         limit: int = 10, snippets: bool = True) -> SearchResult:
        """The agent's messages nearest in meaning to ``vector`` (the embedding of ``query`` by
        ``model``), best first, scored by cosine similarity (``match="semantic"``), with the
        scope and filters of :meth:`messages`. Only messages with a vector of ``model`` can be
        found (``store.vectors.coverage`` says how many have one). ``snippets``: as in
        :meth:`messages`."""
        return self._similar(query, vector, model, agent, "message", session_pk, limit, (), self._message_hits,
                             roles=tuple(roles), platform=platform, time_from=time_from, time_to=time_to,
                             snippets=snippets)

    @lag_tolerant
    def similar_summaries(self, query: str, vector: Matrix, *, model: str, agent: str,
                          session_pk: int | None = None, node_ids: Collection[int] = (),
                          limit: int = 10) -> SearchResult:
        """As :meth:`similar_messages` for summary nodes: of one session (plus ``node_ids``,
        the summaries carried into it) or of every session of the agent."""
        return self._similar(query, vector, model, agent, "summary", session_pk, limit, node_ids, _summary_hits)

    def _similar(self, query: str, vector: Matrix, model: str, agent: str, kind: Kind, session_pk: int | None,
                 limit: int, item_ids: Collection[int], hits_of: _Hits, **filters: Any) -> SearchResult:
        checked_int("limit", limit, low=1, high=MAX_SEARCH_LIMIT)
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return SearchResult(hits=[])
            spec = SearchSpec(query=parse_query(query), agent_pk=agent_pk, session_pk=session_pk,
                              ranked=True, limit=limit, stemmed=True, **filters)
            chosen = self._vectors.nearest(
                conn, model, vector, agent_pk=agent_pk, kind=kind, limit=limit,
                session_pks=None if session_pk is None else (session_pk,), item_ids=item_ids,
                roles=spec.roles, platform=spec.platform, time_from=spec.time_from, time_to=spec.time_to)
            hits = hits_of(conn, spec, chosen, match="semantic")
        return SearchResult(hits=hits)

    @lag_tolerant
    def messages(self, query: str, *, agent: str, session_pk: int | None = None,
                 roles: Sequence[str] = (), platform: str | None = None, time_from: float | None = None,
                 time_to: float | None = None, sort: SortMode = "recency", limit: int = 10,
                 any_words: bool = False, snippets: bool = True, held_session: int | None = None,
                 every_word_first: bool = True, term_matches: int | None = None,
                 neighbours: bool = False) -> SearchResult:
        """Full-text search over the agent's raw messages (one session, or all when None).

        ``recency``: newest matches first, exact. ``relevance`` / ``hybrid``: the newest
        ``RANK_WINDOW`` matches, ranked (BM25 / ts_rank_cd) or fused with recency; the result
        says when more matched than were ranked (``candidates_clamped``). Then, when fewer than
        ``limit`` rows have every word and ``any_words``, rows with some of the query's content
        words, best BM25 first (``match="any"``). ``snippets`` False: hits without snippets (no
        row is decoded for them), for a caller that reads the rows it keeps itself.
        ``held_session``: a session whose raw region (past its coverage) the caller holds in
        its context and leaves out of what it takes (auto-recall): on PostgreSQL, where a
        message waiting for its stems is found by its exact words, the search does not stop to
        stem that region's messages (a write of 1-3 ms), nor up to ``FRESH_PENDING_TOLERATED``
        that other conversations have just stored; the background catch-up stems them within
        about a second (``StoreCore.catch_up_index``). On SQLite, where a waiting message is
        not found at all, it does not stop to index that region's messages either (a write
        transaction: about 0.4 ms of a 6.5 ms recall): they may be missing from the result,
        which the caller leaves out.
        ``every_word_first`` False (with ``any_words``): only the any-word part, every hit
        ``match="any"``. A row with every word still comes first there (it scores each word's
        IDF), by that score rather than BM25; what is skipped is a search that, for a question
        the caller has just stored (auto-recall), always finds at least the question itself.
        ``term_matches``: the newest matches the any-word part reads of each word and pair
        (None: ``ANY_TERM_MATCHES``; auto-recall reads fewer, see ``lcm.tools.autorecall``).
        ``neighbours`` (with ``snippets`` False): the any-word hits come with the messages just
        before and after each (``SearchResult.adjacent``, as :meth:`adjacent_messages` gives
        them), read in the statement that reads the hits.
        """
        backend = self._core.backend
        adjacent: dict[int, tuple[SearchHit | None, SearchHit | None]] | None = (
            {} if neighbours and not snippets else None)
        any_hits_of = (self._message_hits if adjacent is None else functools.partial(
            _hits_with_neighbours, rows_by_ids=backend.rows_by_ids, adjacent=adjacent))
        found = self._run(query, agent, session_pk, sort, limit, backend.search_messages,
                          self._message_hits, messages_t, any_words, roles=tuple(roles), platform=platform,
                          time_from=time_from, time_to=time_to, snippets=snippets, held_session=held_session,
                          every_word_first=every_word_first or not any_words, any_hits_of=any_hits_of,
                          term_matches=ANY_TERM_MATCHES if term_matches is None else checked_int(
                              "term_matches", term_matches, low=1, high=ANY_TERM_MATCHES))
        return replace(found, adjacent=adjacent) if adjacent is not None else found

    @lag_tolerant
    def summaries(self, query: str, *, agent: str, session_pk: int | None = None, sort: SortMode = "recency",
                  limit: int = 10, time_from: float | None = None, time_to: float | None = None,
                  any_words: bool = False) -> SearchResult:
        """Full-text search over the agent's summary nodes (one session, or all when None)."""
        backend = self._core.backend
        return self._run(query, agent, session_pk, sort, limit, backend.search_summaries,
                         _summary_hits, summaries_t, any_words, time_from=time_from, time_to=time_to)

    def _run(self, query: str, agent: str, session_pk: int | None, sort: SortMode, limit: int,
             candidates_of: Callable[[Connection, SearchSpec], tuple[list[Candidate], bool]],
             hits_of: _Hits, table: Table, with_any: bool, *, held_session: int | None = None,
             every_word_first: bool = True, term_matches: int = ANY_TERM_MATCHES, any_hits_of: _Hits | None = None,
             **filters: Any) -> SearchResult:
        """The search; ``any_hits_of``: how the any-word part's hits are read (``hits_of`` when None)."""
        if sort not in SORT_MODES:
            raise ValueError(f"sort must be one of {', '.join(SORT_MODES)}, got {sort!r}")
        checked_int("limit", limit, low=1, high=MAX_SEARCH_LIMIT)
        unindexed = self._core.catch_up_index(except_session=held_session,
                                              tolerate=FRESH_PENDING_TOLERATED if held_session is not None else 0)
        note = self._core.backend.unindexed_note(unindexed) if unindexed else ""
        notes = (note,) if note else ()
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return SearchResult(hits=[], notes=notes, unindexed=unindexed, unindexed_note=note)
            if session_pk is not None:
                owner = conn.execute(select(sessions_t.c.agent_id).where(sessions_t.c.id == session_pk)).scalar()
                if owner != agent_pk:
                    raise NotFoundError(f"session {session_pk} not found")
            spec = SearchSpec(query=parse_query(query), agent_pk=agent_pk, session_pk=session_pk,
                              ranked=sort != "recency", limit=limit, **filters)
            if spec.query.is_empty:
                return SearchResult(hits=[], notes=spec.query.notes + notes, unindexed=unindexed, unindexed_note=note)
            if not every_word_first and any_words(spec.query) is None:
                # One word (or one phrase): nothing is wider than the query, so the any-word part
                # is the query's own search. Skipping it found nothing for a one-word message.
                every_word_first = True
            found, clamped = candidates_of(conn, spec) if every_word_first else ([], False)
            chosen = order_candidates(found, sort, limit)
            hits = hits_of(conn, spec, chosen) if chosen else []
            wider = any_words(spec.query) if with_any and len(chosen) < limit else None
            if wider is not None:
                newest = self._core.backend.newest_id(conn, spec, table.name)
                kind = "messages" if table is messages_t else "summaries"
                more, more_clamped = _any_word_hits(conn, replace(spec, query=wider), limit - len(chosen),
                                                    {c.id for c in chosen}, int(newest), self._core.backend,
                                                    kind, any_hits_of or hits_of, term_matches)
                hits += more
                clamped = clamped or more_clamped
        return SearchResult(hits=hits, candidates_clamped=clamped, notes=spec.query.notes + notes,
                            unindexed=unindexed, unindexed_note=note)


def _any_word_hits(conn: Connection, spec: SearchSpec, room: int, seen: set[int], newest_id: int,
                   backend: Backend, kind: str, hits_of: _Hits,
                   term_matches: int = ANY_TERM_MATCHES) -> tuple[list[SearchHit], bool]:
    """Rows with some of the query's content words that the all-words search did not return,
    best first whatever the sort (newest first would bury a question's answer under every
    recent row that shares one common word with it).

    Bounded work whatever the history size, and the same on both backends: each content term
    alone is searched newest first, up to ``term_matches`` rows (a rare term gives all its
    rows, a common one its newest), in the exact index and in the stemmed one ("moved" finds
    "move"). A row scores the inverse document frequency of each term it has as written, and
    ``STEM_WEIGHT`` of it for a term it has only in another form (BM25 with term frequency and
    length left out: short messages, and no row text to read). A term that reached the cap is
    common: its document frequency is estimated from the id span of its newest matches
    (``window_rank.estimate_doc_freq``), and every pair of the rarest terms that includes it is
    searched too (an AND of two words is selective when each word alone is not), so an older
    row with a common word *and* another content word is still found. Rarer terms decide, as
    in BM25. A word the backend already knows to be common (``term_rows``: statistics or a
    bounded sample) is not looked up alone at all: its rows are reached through its pairs.
    """
    terms = spec.query.groups[0]
    # What a row has is one bit mask: a bit per term as written (in the query's order), then a
    # bit per term in some form (stemmed). About 2,000 rows per auto-recall at 100k messages,
    # where sets of terms cost a third of the search.
    bits = {t: 1 << i for i, t in enumerate(terms)}
    formed_shift = len(terms)
    has: dict[int, int] = {}  # row id -> its mask
    idfs: dict[tuple[Term, bool], float] = {}
    common: set[Term] = set()

    def lookup(group: tuple[Term, ...], stemmed: bool) -> SearchSpec:
        """Rows with every term of ``group``, newest first, capped."""
        return replace(spec, query=Query(groups=tuple((t,) for t in group), negatives=spec.query.negatives),
                       ranked=False, limit=term_matches, stemmed=stemmed)

    def looked_up_at_once(groups: list[tuple[tuple[Term, ...], bool]]) -> list[bool]:
        """Each group looked up (lookups independent of each other: at once) and its rows
        taken; for each, whether it was capped."""
        if not groups:
            return []
        found = backend.newest_ids_many(conn, kind, [lookup(group, stemmed) for group, stemmed in groups])
        return [take(group, stemmed, ids) for (group, stemmed), ids in zip(groups, found, strict=True)]

    def take(group: tuple[Term, ...], stemmed: bool, found: list[int]) -> bool:
        """The rows of ``group``'s lookup (ids, newest first) noted for scoring; True when capped."""
        mask = sum(bits[t] for t in group) << (formed_shift if stemmed else 0)
        had = has.get
        for row_id in found:
            has[row_id] = had(row_id, 0) | mask
        capped = len(found) >= term_matches
        if len(group) == 1:
            doc_freq = window_rank.estimate_doc_freq(len(found), min(found), newest_id) if capped else float(len(found))
            idfs[group[0], stemmed] = window_rank.idf(doc_freq, newest_id)
            if capped and not stemmed:
                common.add(group[0])
        return capped

    known = dict(zip(terms, backend.term_rows_many(conn, spec, kind, terms), strict=True))
    for t, rows_with in known.items():
        if rows_with is not None and rows_with >= term_matches:
            common.add(t)
            idfs[t, False] = window_rank.idf(rows_with, newest_id)
    if common and len(common) == len(terms):  # every word is common: still look up the rarest
        common.discard(min(terms, key=lambda t: known[t] or 0.0))
    looked_up = [t for t in terms if t not in common]
    backend.prepare_terms(conn, looked_up)
    # Each word as written and in its other forms, in one statement (two before: a round trip
    # and its statement's work a recall). A word capped as written is common: its other forms
    # are commoner still, little to gain, so what was read of them is dropped (about one word
    # in fifty recalls on the proxy benchmark's store).
    found = backend.newest_ids_many(conn, kind, [lookup((t,), stemmed) for stemmed in (False, True)
                                                 for t in looked_up]) if looked_up else []
    for t, ids in zip(looked_up, found[:len(looked_up)], strict=True):
        take((t,), False, ids)
    for t, ids in zip(looked_up, found[len(looked_up):], strict=True):
        if t not in common:
            take((t,), True, ids)
    rarest = sorted(terms, key=lambda t: -idfs[t, False])[:ANY_PAIR_TERMS]
    clamped = len(rarest) < 2 and bool(common)  # one common word: only its newest rows were seen
    pairs = [(a, b) for i, a in enumerate(rarest) for b in rarest[i + 1:] if a in common or b in common]
    clamped = any(looked_up_at_once([(pair, False) for pair in pairs])) or clamped

    as_written = [idfs[t, False] for t in terms]
    other_form = [STEM_WEIGHT * idfs.get((t, True), 0.0) for t in terms]

    def score(mask: int) -> float:
        written = mask & ((1 << formed_shift) - 1)
        formed = (mask >> formed_shift) & ~written
        return sum(as_written[i] for i in range(len(terms)) if written >> i & 1) + sum(
            other_form[i] for i in range(len(terms)) if formed >> i & 1)

    # Rows grouped by mask (few distinct ones), each mask scored once; the best rows taken from
    # the best scores down, newest first within a score.
    by_mask: dict[int, list[int]] = {}
    for row_id, mask in has.items():
        if row_id not in seen:
            by_mask.setdefault(mask, []).append(row_id)
    by_score: dict[float, list[int]] = {}
    for mask, ids in by_mask.items():
        by_score.setdefault(score(mask), []).extend(ids)
    chosen: list[Candidate] = []
    for value in sorted(by_score, reverse=True):
        rounded = round(value, 6)
        chosen += [Candidate(row_id, rounded) for row_id in heapq.nlargest(room - len(chosen), by_score[value])]
        if len(chosen) >= room:
            break
    return hits_of(conn, replace(spec, stemmed=True), chosen, match="any"), clamped
