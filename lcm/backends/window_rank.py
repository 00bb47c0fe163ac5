"""BM25 over a bounded window of candidates, for an index whose own ranking costs the whole index.

Why: FTS5's ``bm25()`` counts, before it scores a single row, how many documents of the
*entire* index contain each query term (``xQueryPhrase`` over the term's full doclist). For the
most common word of a 1M-message store that is ~100 ms, however few rows are then ranked; the
scope token (a session's or an agent's) is a phrase of the query too, so a 900k-message
session costs its whole list as well. lcm only ever ranks the newest ``RANK_WINDOW`` matches of
a scope (see ``lcm.backends``), so when a query word is in at least ``WINDOW_RANK_MIN_SHARE`` of
all rows, or the query words and the scope are in ``NATIVE_RANK_MAX_ROWS`` rows or more
together, the SQLite backend scores those rows itself with the usual BM25 formula (below that
``bm25()`` is cheap and is kept: reading each candidate's text here would cost more random
reads than the short doclists bm25() walks):

- **term frequency**: occurrences of the term's first token in the case-folded head of the
  row's indexed body (``HEAD_CHARS``), at least 1 for a group the row matched (the index's
  folding, e.g. diacritics, can hide an occurrence from a plain substring count);
- **document length**: the row's stored token count against the window's mean;
- **inverse document frequency**: from each term's document frequency over the whole index,
  estimated by the backend from a bounded sample (:func:`estimate_doc_freq`), so rare terms
  still outweigh common ones in multi-word queries.

Scores are higher-is-better and comparable within one search only, like every lcm score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lcm.textindex import Query, Term

K1 = 1.2
B = 0.75
#: Characters of each candidate's body read for term counts (bounds the work per search).
HEAD_CHARS = 4_000
#: Newest matches sampled per term to estimate its document frequency.
DF_SAMPLE = 256
#: A query with a word in at least this share of all rows is ranked here, not by bm25().
WINDOW_RANK_MIN_SHARE = 0.1
#: ... or whose words and scope together are in at least this many rows: the postings bm25()
#: reads (about 1 µs each: two words each in 1% of 5M rows cost it 110 ms, where the same
#: search ranked here took 2 ms plus the window's rows; measured at 5M messages).
NATIVE_RANK_MAX_ROWS = 20_000


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One candidate: its id, the head of its indexed body, its length in tokens."""

    id: int
    head: str
    tokens: int


def estimate_doc_freq(sampled: int, oldest_sampled_id: int | None, newest_id: int) -> float:
    """Documents containing a term, from its newest ``sampled`` matches.

    Fewer than ``DF_SAMPLE`` matches: that is the exact count. Otherwise the sample's density
    (matches per id in the range it spans) applied to the whole id range.
    """
    if sampled < DF_SAMPLE or oldest_sampled_id is None or newest_id <= 0:
        return float(sampled)
    span = max(1, newest_id - oldest_sampled_id + 1)
    return min(float(newest_id), sampled * newest_id / span)


def idf(doc_freq: float, total_docs: int) -> float:
    """BM25's inverse document frequency, in the always-positive form (a term in most rows
    still counts a little, instead of FTS5's near-zero floor)."""
    n = max(float(total_docs), doc_freq, 1.0)
    return math.log(1.0 + (n - doc_freq + 0.5) / (doc_freq + 0.5))


def bm25_scores(rows: Sequence[WindowRow], query: Query, idfs: dict[Term, float]) -> dict[int, float]:
    """BM25 score of each row for the query's positive terms (a term without an ``idfs``
    entry weighs 1)."""
    if not rows:
        return {}
    mean_len = max(1.0, sum(max(r.tokens, 1) for r in rows) / len(rows))
    scores: dict[int, float] = {}
    for row in rows:
        folded = row.head.casefold()
        norm = K1 * (1.0 - B + B * max(row.tokens, 1) / mean_len)
        total = 0.0
        for group in query.groups:
            counts = [folded.count(term.tokens[0]) for term in group]
            if not any(counts):
                counts[0] = 1  # the row matched this group: the index saw what the count did not
            for term, tf in zip(group, counts, strict=True):
                if tf:
                    total += idfs.get(term, 1.0) * tf * (K1 + 1.0) / (tf + norm)
        scores[row.id] = total
    return scores
