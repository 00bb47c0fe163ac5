"""SQLite relevance ranking: BM25 computed over the candidate window (lcm/backends/window_rank.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lcm.backends import window_rank
from lcm.backends.window_rank import DF_SAMPLE, WindowRow, bm25_scores, estimate_doc_freq, idf
from lcm.store import Store
from lcm.textindex import parse_query
from tests.support.storing import append_messages


def test_doc_freq_is_exact_below_the_sample_and_a_density_estimate_above():
    assert estimate_doc_freq(17, 900, 10_000) == 17
    # The newest DF_SAMPLE matches span the newest 2 * DF_SAMPLE ids: one row in two matches.
    assert estimate_doc_freq(DF_SAMPLE, 10_000 - 2 * DF_SAMPLE + 1, 10_000) == pytest.approx(5_000)
    # Never more documents than there are rows.
    assert estimate_doc_freq(DF_SAMPLE, 9_990, 10_000) == 10_000


@given(df=st.floats(min_value=0, max_value=1e6), extra=st.floats(min_value=0, max_value=1e6))
def test_idf_is_positive_and_falls_as_a_term_gets_commoner(df, extra):
    total = 1_000_000
    assert idf(df, total) > 0
    assert idf(min(df + extra, total), total) <= idf(df, total)


def _rows(*texts: str) -> list[WindowRow]:
    return [WindowRow(i, t, len(t.split())) for i, t in enumerate(texts)]


def test_more_occurrences_and_shorter_rows_rank_higher():
    q = parse_query("kiwi")
    scores = bm25_scores(_rows("kiwi", "kiwi kiwi kiwi banana", "kiwi " + "filler " * 40), q,
                         {t: 1.0 for t in q.positive_terms()})
    assert scores[1] > scores[0] > scores[2] > 0


def test_a_rare_alternative_outweighs_a_common_one():
    q = parse_query("common OR zebra")
    common, zebra = q.groups[0]
    scores = bm25_scores(_rows("common words here", "zebra words here"), q,
                         {common: idf(900_000, 1_000_000), zebra: idf(10, 1_000_000)})
    assert scores[1] > scores[0] > 0


def test_a_match_the_substring_count_misses_still_scores():
    """The index folds diacritics ("cafe" matches "café"); a plain count finds nothing."""
    q = parse_query("cafe")
    assert bm25_scores(_rows("Café au lait"), q, {})[0] > 0


def test_case_is_folded_before_counting():
    q = parse_query("kiwi")
    scores = bm25_scores(_rows("KIWI Kiwi kiwi", "kiwi xx yy"), q, {})
    assert scores[0] > scores[1]


def test_sqlite_ranks_without_reading_whole_doclists(sqlite_url, monkeypatch):
    """Relevance over a real FTS5 index: a rare term in an OR query outranks a common one, the
    document-frequency sample stays bounded, and every candidate gets a score."""
    monkeypatch.setattr(window_rank, "DF_SAMPLE", 50)
    store = Store.open(sqlite_url, upgrade=True)
    s = store.sessions.get_or_create("agent-a", "s1")
    msgs = [{"role": "user", "content": f"common filler number {i}"} for i in range(400)]
    msgs[100] = {"role": "user", "content": "zebra crossing seen once"}
    msgs[300] = {"role": "user", "content": "common common common in one row"}
    ids = append_messages(store, s.id, msgs).store_ids
    ranked = store.search.messages("common OR zebra", agent="agent-a", sort="relevance", limit=5).hits
    assert ranked[0].id == ids[100]  # the rare alternative
    assert ranked[1].id == ids[300]  # then the row dense with the common word
    assert all(h.score is not None and h.score > 0 for h in ranked)
    single = store.search.messages("common", agent="agent-a", sort="relevance", limit=3).hits
    assert single[0].id == ids[300]


def test_sqlite_keeps_fts5_bm25_for_queries_without_a_common_word(sqlite_url, monkeypatch):
    """A rare word's doclist is short, so FTS5's own bm25() ranks it (the window ranker, which
    reads each candidate's text, is for queries with a common word)."""
    from lcm.backends.sqlite_search import Fts5Search

    store = Store.open(sqlite_url, upgrade=True)
    s = store.sessions.get_or_create("agent-a", "s1")
    msgs = [{"role": "user", "content": f"filler number {i}"} for i in range(200)]
    msgs[10] = {"role": "user", "content": "zebra"}
    msgs[50] = {"role": "user", "content": "zebra zebra zebra stripes"}
    msgs[90] = {"role": "user", "content": "one zebra among a great many other words " * 4}
    ids = append_messages(store, s.id, msgs).store_ids

    def not_here(*args, **kwargs):
        raise AssertionError("the window ranker ran for a rare word")

    monkeypatch.setattr(Fts5Search, "_rank_window", staticmethod(not_here))
    ranked = store.search.messages("zebra", agent="agent-a", sort="relevance").hits
    assert ranked[0].id == ids[50] and {h.id for h in ranked} == {ids[10], ids[50], ids[90]}
    assert [h.score for h in ranked] == sorted((h.score for h in ranked), reverse=True)
