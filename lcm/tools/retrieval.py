"""Retrieval: the search behind ``lcm_grep``, ``lcm_expand_query`` and auto-recall.

One ranking for all three, tuned on real conversations (LoCoMo's development split,
``benchmarks/locomo.py``; the numbers are in docs/recall.md):

- **words**: the store's full-text search (every query word first, then any content word by
  BM25-style weight), over raw messages and, in the current session's scope, summaries;
- **neighbours**: in a ranked search a message also scores part of what the messages just before
  and after it in its session scored (``NEIGHBOUR_SHARE``), and a message next to hits can be
  returned itself (``match="neighbour"``): a question's answer is often the turn after the one
  that holds the question's words ("Which band did you see?" / "Matt Patterson, so talented");
- **meaning** (with an embedder): the nearest vectors, those below the model's similarity floor
  dropped (a query that means nothing close gets nothing), fused with the words by weighted
  reciprocal rank (``SEMANTIC_WEIGHT``: the small local model helps, but less than the words).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from lcm.config import install_command
from lcm.context.session import ContextSession
from lcm.errors import LcmError
from lcm.records import SearchHit, SortMode
from lcm.textindex import parse_query
from lcm.tools.specs import GREP_LIMIT_CAP

#: Reciprocal-rank fusion constant of hybrid search (the usual 60: ranks, not scores, decide).
FUSION_K = 60
#: How deep each ranked list goes before neighbours and fusion, at least.
FUSION_DEPTH = 30
#: Weight of the semantic ranking against the words' (1.0) in hybrid fusion. On the dev split:
#: 0.3-0.5 best at recall@10, 1.0 (plain RRF) no better than the words alone.
SEMANTIC_WEIGHT = 0.5
#: Share of a message's score that its neighbours in the session add to theirs. On the dev
#: split, recall@10 of full text: 0.68 without, 0.74 at 0.5 (0.72 at 0.2 and 0.3).
NEIGHBOUR_SHARE = 0.5
#: Where a query's embedding is computed, beside its full-text search (see :func:`find`).
_QUERY_EMBEDDING = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lcm-query-embedding")


@dataclass
class Found:
    """What a search found, and how it was answered."""

    hits: list[SearchHit]
    mode: str
    clamped: bool = False
    notes: list[str] = field(default_factory=list)
    degraded_reason: str | None = None
    summaries_omitted: bool = False
    #: Semantic hits left out for being below the similarity floor.
    below_floor: int = 0


def similarity_floor(context: ContextSession) -> float:
    """The cosine below which a semantic hit is not returned: ``LCM_SEMANTIC_FLOOR`` when set,
    else the embedder's calibrated floor (0 when there is none)."""
    configured = context.config.semantic_floor
    if configured is not None:
        return configured
    embedder = context.embedder
    return embedder.floor if embedder is not None else 0.0


def find(context: ContextSession, query: str, *, mode: str | None, scope: str, session_pk: int | None,
         sort: SortMode, limit: int, roles: tuple[str, ...] = (), platform: str | None = None,
         time_from: float | None = None, time_to: float | None = None, snippets: bool = True,
         held_session: int | None = None, every_word_first: bool = True,
         term_matches: int | None = None) -> Found:
    """The search behind ``lcm_grep`` and ``lcm_expand_query``, in one of three modes.

    ``full_text``: every query word first, then any content word by BM25, with neighbours in
    ranked sorts. ``semantic``: nearest vectors by cosine, above the floor. ``hybrid`` (the
    default when embeddings are on): both lists fused by weighted reciprocal rank, so a hit
    either finds stands, and one both find comes first. Semantic and hybrid need an embedder
    and vectors; when the embedder is off or fails, the answer is the full-text one with
    ``degraded_reason`` (never an error). ``snippets`` False: message hits without snippets,
    for a caller that reads the messages it keeps (auto-recall). ``held_session``: a session
    whose newest messages the caller holds and leaves out (auto-recall; see
    ``SearchRepository.messages``). ``every_word_first`` False: the full-text part is the
    any-word search alone (auto-recall; see ``SearchRepository.messages``). ``term_matches``:
    the newest matches the any-word part reads of each word (None: the store's default;
    auto-recall reads fewer).
    """
    embedder = context.embedder
    wanted = mode or ("hybrid" if embedder is not None else "full_text")
    filtered = bool(roles) or platform is not None or time_from is not None or time_to is not None
    with_summaries = scope == "current" and not filtered  # filters apply to raw messages only
    ranked = sort != "recency" or wanted != "full_text"
    depth = min(GREP_LIMIT_CAP, max(limit, FUSION_DEPTH)) if ranked else limit
    rank_sort: SortMode = sort if wanted == "full_text" else "relevance"
    store, agent = context.store, context.agent_id
    # The query's vector is made while the words are searched: the model's forward pass runs in
    # NumPy (or waits on an endpoint) outside the GIL, so the two overlap on a second core.
    wordless = parse_query(query).is_empty  # "", "***", "-word" alone: nothing to embed either
    pending = (_QUERY_EMBEDDING.submit(embedder.embed, [query], timeout=context.config.embedding_timeout_ms / 5000)
               if wanted != "full_text" and embedder is not None and not wordless else None)
    lexical = store.search.messages(query, agent=agent, session_pk=session_pk, sort=rank_sort, limit=depth,
                                    any_words=True, roles=roles, platform=platform, time_from=time_from,
                                    time_to=time_to, snippets=snippets, held_session=held_session,
                                    every_word_first=every_word_first, term_matches=term_matches,
                                    neighbours=ranked and not filtered)
    message_hits = list(lexical.hits)
    if ranked and not filtered:
        adjacent = lexical.adjacent if lexical.adjacent is not None else store.search.adjacent_messages(
            query, [h.id for h in message_hits if h.match == "any"], agent=agent, snippets=snippets)
        message_hits = spread_to_neighbours(message_hits, adjacent, session_pk, depth)
    summary_hits = current_summary_hits(context, query, rank_sort, depth) if with_summaries else []
    words = merge_hits(message_hits, summary_hits, rank_sort, depth)
    found = Found(hits=words[:limit], mode="full_text", clamped=lexical.candidates_clamped,
                  notes=list(lexical.notes), summaries_omitted=scope == "current" and filtered)
    if lexical.unindexed:
        found.degraded_reason = lexical.unindexed_note  # the backend's own words for what was missed
    if wanted == "full_text" or wordless:
        return found  # a query without a word has no meaning to search either: its notes say so
    if embedder is None or pending is None:
        found.degraded_reason = (f"mode {wanted!r} needs embeddings, and LCM_EMBEDDINGS is off "
                                 f"({install_command('semantic')} for the local model); answered with full_text")
        return found
    try:
        matrix = pending.result()
    except Exception as exc:  # noqa: BLE001 - any embedder failure degrades to full text
        why = str(exc) if isinstance(exc, LcmError) else f"{type(exc).__name__}: {exc}"
        found.degraded_reason = f"the embedder failed ({why}); answered with full_text"
        return found
    near = store.search.similar_messages(query, matrix, model=embedder.model, agent=agent, session_pk=session_pk,
                                         roles=roles, platform=platform, time_from=time_from, time_to=time_to,
                                         limit=depth, snippets=snippets).hits
    if with_summaries:
        session = context.session
        carried = [n.id for n in store.summaries.carried(session.id)]
        near += store.search.similar_summaries(query, matrix, model=embedder.model, agent=agent,
                                               session_pk=session.id, node_ids=carried, limit=depth).hits
        near.sort(key=lambda h: -(h.score or 0.0))
    if not near:
        found.degraded_reason = (f"mode {wanted!r}: no stored vector matches yet (the background indexer or "
                                 "`lcm embed` fills them in); answered with full_text")
        return found
    floor = similarity_floor(context)
    close = [h for h in near if (h.score or 0.0) >= floor]
    found.below_floor = len(near) - len(close)
    if not close and near:
        found.notes.append(f"nothing stored is close in meaning (every vector below the similarity floor "
                           f"{floor:g}, LCM_SEMANTIC_FLOOR)")
    hits = (close if wanted == "semantic" else fuse(words, close, limit))[:limit]
    if sort == "recency":
        # As in full text: of the best hits, those with every query word first, newest first;
        # then the rest in their fused order (by meaning, or with only some of the words).
        every = sorted((h for h in hits if h.match == "all"), key=lambda h: (-h.ts, h.kind != "message", -h.id))
        hits = every + [h for h in hits if h.match != "all"]
    found.hits, found.mode = hits, wanted
    return found


def spread_to_neighbours(hits: list[SearchHit], adjacent: dict[int, tuple[SearchHit | None, SearchHit | None]],
                         session_pk: int | None, limit: int) -> list[SearchHit]:
    """Ranked message hits with the hits of some content words (``match="any"``) re-scored by
    their neighbours: each adds ``NEIGHBOUR_SHARE`` of its score to the message before and the
    one after it in its session, which join the list (``match="neighbour"``) when they were not
    hits themselves (within ``session_pk`` when the search had one). Hits with every query word
    stay first, in their order: they matched the whole query. The first ``limit`` of that list
    (only they are re-made with their new score: ~90 candidates an auto-recall, ~30 kept)."""
    every = [h for h in hits if h.match == "all"]
    some = [h for h in hits if h.match == "any"]
    rest = [h for h in hits if h.match not in ("all", "any")]
    taken = {h.id for h in every}
    scores = {h.id: h.score or 0.0 for h in some}
    best: dict[int, SearchHit] = {h.id: h for h in some}
    for h in some:
        for side in adjacent.get(h.id, (None, None)):
            if side is None or side.id in taken or (session_pk is not None and side.session_pk != session_pk):
                continue
            scores[side.id] = scores.get(side.id, 0.0) + NEIGHBOUR_SHARE * (h.score or 0.0)
            best.setdefault(side.id, side)
    order = sorted(scores, key=lambda i: (-scores[i], -i))[:max(0, limit - len(every))]
    return (every + [_scored(best[i], round(scores[i], 6)) for i in order] + rest)[:limit]


def _scored(hit: SearchHit, score: float) -> SearchHit:
    """``hit`` with ``score`` (the same object when that is its score already: most hits no
    neighbour added to, and a re-made hit costs ~7 µs)."""
    return hit if hit.score == score else replace(hit, score=score)


def merge_hits(messages: list[SearchHit], summaries: list[SearchHit], sort: SortMode,
               limit: int) -> list[SearchHit]:
    """Message and summary hits in one list: first the hits with every query word, newest first
    (``recency``) or by rank; then the hits with some of its content words (and their
    neighbours), by rank (the store ranks those by BM25 whatever the sort). Messages before
    summaries of the same rank."""
    def by_rank(msgs: list[SearchHit], sums: list[SearchHit]) -> list[SearchHit]:
        ranked = [(i, 0, h) for i, h in enumerate(msgs)] + [(i, 1, h) for i, h in enumerate(sums)]
        return [h for _, _, h in sorted(ranked, key=lambda t: (t[0], t[1]))]

    def part(*matches: str) -> tuple[list[SearchHit], list[SearchHit]]:
        return [h for h in messages if h.match in matches], [h for h in summaries if h.match in matches]

    every_m, every_s = part("all")
    if sort == "recency":
        every = sorted(every_m + every_s, key=lambda h: (-h.ts, h.kind != "message", -h.id))
    else:
        every = by_rank(every_m, every_s)
    return (every + by_rank(*part("any", "neighbour")))[:limit]


def fuse(words: list[SearchHit], near: list[SearchHit], limit: int) -> list[SearchHit]:
    """Weighted reciprocal-rank fusion of the full-text and the semantic ranking. A hit both
    found keeps its full-text form (its snippet marks the words) and scores the sum of both."""
    scores: dict[tuple[str, int], float] = {}
    best: dict[tuple[str, int], SearchHit] = {}
    for ranking, weight in ((words, 1.0), (near, SEMANTIC_WEIGHT)):
        for rank, hit in enumerate(ranking):
            key = (hit.kind, hit.id)
            scores[key] = scores.get(key, 0.0) + weight / (FUSION_K + rank + 1)
            best.setdefault(key, hit)
    order = sorted(scores, key=lambda k: -scores[k])[:limit]
    return [replace(best[k], score=round(scores[k], 6)) for k in order]


def current_summary_hits(context: ContextSession, query: str, sort: SortMode, limit: int) -> list[SearchHit]:
    """Summaries of the current session, plus those carried into it from earlier sessions."""
    store, agent, session = context.store, context.agent_id, context.session
    hits = list(store.search.summaries(query, agent=agent, session_pk=session.id, sort=sort, limit=limit,
                                       any_words=True).hits)
    carried = {n.id for n in store.summaries.carried(session.id)}
    if carried:
        wider = store.search.summaries(query, agent=agent, sort=sort, limit=GREP_LIMIT_CAP, any_words=True).hits
        hits.extend(h for h in wider if h.id in carried)
        if sort == "recency":
            hits.sort(key=lambda h: -h.ts)
    return hits[:limit]
