"""The backend-neutral search text: tokenizer parity with SQLite, query language, snippets."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcm.backends.pg_text import render_tsquery
from lcm.backends.sqlite_search import render_match
from lcm.textindex import (
    INDEX_MAX_CHARS,
    MAX_TOKEN_CHARS,
    index_body,
    make_snippet,
    parse_query,
    tokenize,
)

# Text in the scripts people write in, with the punctuation agent transcripts are full of.
# (Unassigned code points are left out: SQLite's Unicode tables predate Python's.)
COMMON = st.text(
    alphabet=st.one_of(
        st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_categories=("Cn", "Cs")),  # ASCII
        st.characters(min_codepoint=0xC0, max_codepoint=0x17F, exclude_categories=("Cn", "Cs")),  # Latin-1 + Extended-A
        st.characters(min_codepoint=0x391, max_codepoint=0x3C9, exclude_categories=("Cn", "Cs")),  # Greek
        st.characters(min_codepoint=0x410, max_codepoint=0x44F, exclude_categories=("Cn", "Cs")),  # Cyrillic
        st.characters(min_codepoint=0x5D0, max_codepoint=0x5EA, exclude_categories=("Cn", "Cs")),  # Hebrew
        st.characters(min_codepoint=0x621, max_codepoint=0x64A, exclude_categories=("Cn", "Cs")),  # Arabic
        st.sampled_from(list("数据库日本語한국어 \n\t_-./:\"'`()[]{}<>@#$%^&*+=|\\~,;!?ß µ ſ ς İ ﬁ")),
    ),
    max_size=120,
)


@pytest.fixture(scope="module")
def fts():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(b, tokenize='unicode61 remove_diacritics 2')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, 'instance')")
    return conn


def sqlite_tokens(conn, text: str) -> list[str]:
    conn.execute("DELETE FROM f")
    conn.execute("INSERT INTO f(rowid, b) VALUES (1, ?)", (text,))
    return [r[0] for r in conn.execute("SELECT term FROM v ORDER BY offset")]


@settings(max_examples=400, deadline=None)
@given(COMMON)
def test_tokenizer_matches_sqlite_unicode61(fts, text):
    body = index_body(text)
    assert tokenize(body) == sqlite_tokens(fts, body)


def test_index_body_splits_cjk_and_drops_blobs():
    body = index_body("查询数据库 then " + "A" * (MAX_TOKEN_CHARS + 5) + " end")
    assert tokenize(body) == ["查", "询", "数", "据", "库", "then", "end"]


def test_index_body_is_bounded_head_and_tail():
    text = "start " + "word " * 60_000 + " finalerror"
    body = index_body(text)
    assert len(body) <= INDEX_MAX_CHARS + 10
    assert body.startswith("start") and body.rstrip().endswith("finalerror")


@given(st.text())
def test_parse_query_never_raises_and_renders(text):
    q = parse_query(text)
    if not q.is_empty:
        assert render_match(q, ["s1"])
        assert render_tsquery(q, ["s1"])


def test_a_query_starts_at_most_its_term_limit_and_is_parsed_once():
    from lcm.textindex import MAX_QUERY_TERMS

    text = " ".join(f"w{i}" for i in range(MAX_QUERY_TERMS - 1)) + " x OR y more words"
    q = parse_query(text)
    # The last group started within the limit keeps its OR alternatives; later words are dropped.
    assert [t.raw for g in q.groups for t in g][-3:] == [f"w{MAX_QUERY_TERMS - 2}", "x", "y"]
    assert len(q.groups) == MAX_QUERY_TERMS and q.notes[0] == f"only the first {MAX_QUERY_TERMS} query terms were used"
    assert parse_query(text) is q  # an immutable Query: one parse serves every caller
    assert parse_query(["not", "text"]).notes == ("query must be text",)


def test_query_language():
    q = parse_query('alembic.ini "exact phrase" conf* foo OR bar -skip NEAR( :^')
    groups = [[(t.tokens, t.prefix) for t in g] for g in q.groups]
    assert groups == [
        [(("alembic", "ini"), False)],
        [(("exact", "phrase"), False)],
        [(("conf",), True)],
        [(("foo",), False), (("bar",), False)],
        [(("near",), False)],
    ]
    assert [t.tokens for t in q.negatives] == [("skip",)]


@pytest.mark.parametrize("text", ["", "   ", "***", "-", "-x", "OR", '""', "(", ":"])
def test_queries_without_a_positive_word_are_empty(text):
    """Empty, and saying why: a search that finds nothing tells the caller what to change."""
    query = parse_query(text)
    assert query.is_empty and query.notes
    assert ("must match" if text.startswith("-") and len(text) > 1 else "no word to search for") in query.notes[0]


def test_cjk_query_is_a_character_phrase():
    (term,), = parse_query("数据库").groups
    assert term.tokens == ("数", "据", "库")


def test_snippet_marks_matches_around_the_first_hit():
    text = "x " * 300 + "the Café served alembic.ini to NEEDLE42 " + "y " * 300
    snip = make_snippet(text, parse_query("cafe needle42"))
    assert "**Café**" in snip and "**NEEDLE42**" in snip
    assert snip.startswith("…") and snip.endswith("…")
    assert len(snip) < 260


def test_any_words_keeps_the_content_terms_of_a_question():
    from lcm.textindex import any_words

    asked = any_words(parse_query("Which port did we move the staging database to?"))
    assert asked is not None and len(asked.groups) == 1
    assert [t.tokens for t in asked.groups[0]] == [("port",), ("move",), ("staging",), ("database",)]
    # Phrases, prefixes, ids and negatives are kept whole; repeated words once.
    kept = any_words(parse_query('"the deploy" fp-7q2k alemb* port port -staging'))
    assert kept is not None
    assert [(t.tokens, t.prefix) for t in kept.groups[0]] == [
        (("the", "deploy"), False), (("fp", "7q2k"), False), (("alemb",), True), (("port",), False)]
    assert [t.tokens for t in kept.negatives] == [("staging",)]
    # Nothing to widen: one word, or nothing but stop words.
    assert any_words(parse_query("database")) is None
    assert any_words(parse_query("what is it that we did")) is None
    assert any_words(parse_query("")) is None


def test_a_snippet_from_the_stemmed_index_marks_other_forms_of_the_words():
    query = parse_query("moved deployments")
    text = "Yesterday we " + "x " * 150 + "move the deployment to staging."
    assert "**move**" not in make_snippet(text, query)  # exact: nothing to anchor on
    loose = make_snippet(text, query, loose=True)
    assert "**move**" in loose and "**deployment**" in loose and "**staging**" not in loose


def test_any_words_keeps_the_longest_content_terms_of_a_long_message():
    from lcm.textindex import ANY_WORDS_MAX_TERMS, any_words

    letters = "bcdfghjklmnpqrstvwxz"
    words = [letters[i % 20] + "a" * (2 + i % 7) + letters[(i * 7) % 20] for i in range(30)]
    query = parse_query(" ".join(words))
    asked = [t.raw for t in query.positive_terms()]
    assert len(asked) > ANY_WORDS_MAX_TERMS
    kept = any_words(query)
    assert kept is not None and len(kept.groups[0]) == ANY_WORDS_MAX_TERMS
    raws = [t.raw for t in kept.groups[0]]
    assert raws == [w for w in asked if w in raws]  # the query's order
    assert min(len(r) for r in raws) >= max(len(w) for w in asked if w not in raws)
