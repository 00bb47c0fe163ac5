"""What the full-text index sees, how a user query is read, and how snippets are cut.

Backend-neutral on purpose: both backends index the same *body* per row and read the same query
AST, and each backend only renders them in its own dialect (``lcm/backends``).

Index body (:func:`index_body`): the message's text (content and tool-call arguments), with
characters no database can hold replaced, runs of more than :data:`MAX_TOKEN_CHARS` letters or
digits (base64 blobs, minified data) removed, scripts written without spaces (CJK, Thai, ...)
split into one token per character so that any substring of them can be found as a phrase, and
bounded to :data:`INDEX_MAX_CHARS` characters (the first 96 Ki and the last 32 Ki characters of
longer texts: errors tend to be at the end of a tool result).

Tokens (:func:`tokenize`): a Python mirror of SQLite FTS5's ``unicode61 remove_diacritics 2``
tokenizer: letters, digits and private-use characters form tokens, everything else separates;
lower-cased; diacritics folded on Latin letters only. PostgreSQL is given exactly these tokens
(as a literal ``tsvector``), so a search means the same on both backends; SQLite tokenizes the
same body itself. The two agree on all text in common scripts; they may differ on code points
SQLite's Unicode tables do not know (newer letters, unassigned code points).

Query language (:func:`parse_query`), the same on both backends, and never a syntax error:
  * words: every word must occur (AND); punctuation inside a word separates tokens that must
    then be adjacent (``alembic.ini`` finds "alembic.ini", not "alembic ... ini");
  * ``"a quoted phrase"``: the words in this order, adjacent;
  * ``word*``: prefix match on the last token;
  * ``a OR b``: either (binds tighter than the implicit AND);
  * ``-word`` / ``-"phrase"``: must not occur (ignored when nothing positive is left).
Any other character (``NEAR``, ``:``, ``^``, parentheses, lone operators) is ordinary text.

Any-word form (:func:`any_words`): the same query with its stop words (:data:`STOP_WORDS`)
dropped and every remaining term OR'ed. A question asked in plain words ("which port did we
move the staging database to?") almost never has all its words in one message; its content
words, ranked by BM25, find it. Search runs it after the all-words query, for what that left.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

from lcm import codec

INDEX_MAX_CHARS = 131_072
INDEX_HEAD_CHARS = 98_304
INDEX_TAIL_CHARS = INDEX_MAX_CHARS - INDEX_HEAD_CHARS
MAX_TOKEN_CHARS = 128
MAX_QUERY_TERMS = 16
MAX_NEGATIVE_TERMS = 8
MAX_PHRASE_TOKENS = 32
SNIPPET_CHARS = 200
SNIPPET_SCAN_CHARS = 262_144

_LONG_RUN = re.compile(r"[^\W_]{%d,}" % (MAX_TOKEN_CHARS + 1))
# Scripts written without spaces between words: each character becomes its own token.
_UNSPACED = re.compile(
    "(["
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f"  # Bopomofo
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width Katakana
    "\U00020000-\U0003134f"  # CJK extensions B-H
    "])"
)
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
# Combining marks SQLite's unicode61 removes (remove_diacritics=2) instead of splitting on.
_REMOVED_DIACRITICS = frozenset(
    [0x300, 0x301, 0x302, 0x303, 0x304, 0x306, 0x307, 0x308, 0x309, 0x30A, 0x30B, 0x30C,
     0x30F, 0x311, 0x31B, 0x323, 0x324, 0x325, 0x326, 0x327, 0x328, 0x32D, 0x32E, 0x330,
     0x331]
)


def _fold_char(ch: str) -> str:
    """unicode61's folding of one token character: case-fold, then Latin diacritics off."""
    folded = ch.casefold()
    if len(folded) != 1:
        lower = ch.lower()
        folded = lower if len(lower) == 1 else folded
    decomposed = unicodedata.normalize("NFD", folded)
    if len(decomposed) > 1 and "a" <= decomposed[0] <= "z":
        if all(ord(c) in _REMOVED_DIACRITICS for c in decomposed[1:]):
            return decomposed[0]
    return folded if len(folded) == 1 else ch


def _is_token_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] in "LN" or cat == "Co"


@lru_cache(maxsize=1)
def _bmp_table() -> dict[int, str | None]:
    """str.translate table for the BMP: separators -> space, diacritics -> removed, letters folded."""
    table: dict[int, str | None] = {}
    for cp in range(0x10000):
        ch = chr(cp)
        if cp in _REMOVED_DIACRITICS:
            table[cp] = None
        elif 0xD800 <= cp <= 0xDFFF or not _is_token_char(ch):
            if ch != " ":
                table[cp] = " "
        else:
            folded = _fold_char(ch)
            if folded != ch:
                table[cp] = folded
    return table


def _fold_astral(match: re.Match[str]) -> str:
    ch = match.group(0)
    return ch.lower() if _is_token_char(ch) and len(ch.lower()) == 1 else " "


def normalize_tokens_text(text: str) -> str:
    """Tokens of ``text`` joined by single spaces (the shape both backends index)."""
    folded = text.translate(_bmp_table())
    if not folded.isascii() and _ASTRAL.search(folded):
        folded = _ASTRAL.sub(_fold_astral, folded)
    return folded


def tokenize(text: str) -> list[str]:
    """The tokens SQLite's unicode61 (remove_diacritics 2) would produce for ``text``."""
    return normalize_tokens_text(text).split()


def space_unspaced_scripts(text: str) -> str:
    """Split CJK/Thai/... runs into one token per character."""
    if text.isascii() or _UNSPACED.search(text) is None:
        return text
    return _UNSPACED.sub(r" \1 ", text)


def index_body(text: str) -> str:
    """The text the full-text index covers for one row (see module docstring)."""
    if len(text) > INDEX_MAX_CHARS:
        text = text[:INDEX_HEAD_CHARS] + "\n…\n" + text[-INDEX_TAIL_CHARS:]
    text = codec.strip_unstorable(text)
    # A run of word characters that long needs a whitespace-free chunk at least that long: the
    # C-speed length check spares the regex scan on almost every message.
    if max(map(len, text.split()), default=0) > MAX_TOKEN_CHARS and _LONG_RUN.search(text):
        text = _LONG_RUN.sub(" ", text)
    return space_unspaced_scripts(text)


# --------------------------------------------------------------------------- query language


@dataclass(frozen=True, slots=True)
class Term:
    """One word or phrase of a query: its tokens must appear adjacent and in order."""

    raw: str  # the cleaned query text of this term: SQLite's tokenizer reads it like the index
    tokens: tuple[str, ...]  # the Python tokens (what PostgreSQL matches)
    prefix: bool = False  # the last token is a prefix


@dataclass(frozen=True, slots=True)
class Query:
    """AND of groups; each group is an OR of terms; negatives must not match."""

    groups: tuple[tuple[Term, ...], ...] = ()
    negatives: tuple[Term, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def is_empty(self) -> bool:
        return not self.groups

    def positive_terms(self) -> list[Term]:
        return [t for g in self.groups for t in g]


#: Words that carry no topic in an English question: dropped from the any-word form of a query
#: (a quoted phrase keeps them). Pronouns, articles, auxiliaries, question words, prepositions
#: and conjunctions, and the verbs people wrap a request in ("tell me", "show", "find").
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing done down during each else ever few for
from further get got had has have having he her here hers herself him himself his how i if in into
is it its itself just let me might mine more most much must my myself no nor not now of off on
once only or other our ours ourselves out over own please same shall she should so some such than
that the their theirs them themselves then there these they this those through to too under until
up us very was we were what whatever when where whether which while who whom whose why will with
would yes yet you your yours yourself yourselves
find tell show give know remember recall said say mentioned earlier previously last time ago
""".split())

_QUERY_CHUNK = re.compile(r'(-?)"([^"]*)"?(\*?)|(\S+)')


def _make_term(raw: str, prefix: bool) -> Term | None:
    spaced = space_unspaced_scripts(codec.strip_unstorable(raw))
    tokens = tuple(t[:MAX_TOKEN_CHARS] for t in tokenize(spaced))[:MAX_PHRASE_TOKENS]
    if not tokens:
        return None
    return Term(raw=spaced, tokens=tokens, prefix=prefix)


#: Queries parsed lately (a search and its caller parse the same text: auto-recall's find
#: checks a message is not wordless, then its search reads it, ~0.4 ms each at 24 terms).
PARSED_QUERIES_KEPT = 128


def parse_query(text: object) -> Query:
    """Read a user query (never raises; an unusable query, or no text at all, gives an empty
    Query). A Query is immutable, so one parse serves every caller of the same text."""
    if not isinstance(text, str):
        return Query(notes=("query must be text",))
    return _parse_text(text)


@lru_cache(maxsize=PARSED_QUERIES_KEPT)
def _parse_text(text: str) -> Query:
    groups: list[list[Term]] = []
    negatives: list[Term] = []
    notes: list[str] = []
    pending_or = False
    kept = 0  # terms in groups
    for m in _QUERY_CHUNK.finditer(text):
        neg_quote, quoted, quote_star, word = m.group(1), m.group(2), m.group(3), m.group(4)
        negative = False
        if word is not None:
            if word == "OR":
                pending_or = bool(groups)
                continue
            prefix = word.endswith("*") and len(word.rstrip("*")) > 0
            body = word.rstrip("*") if prefix else word
            if body.startswith("-") and len(body) > 1:
                negative, body = True, body[1:]
            term = _make_term(body, prefix)
        else:
            negative = neg_quote == "-"
            term = _make_term(quoted, bool(quote_star))
        if term is None:
            continue
        if negative and not pending_or:
            if len(negatives) < MAX_NEGATIVE_TERMS:
                negatives.append(term)
            continue
        if pending_or and groups:
            groups[-1].append(term)
            kept += 1
        elif kept < MAX_QUERY_TERMS:
            groups.append([term])
            kept += 1
        else:
            notes.append(f"only the first {MAX_QUERY_TERMS} query terms were used")
        pending_or = False
    if not groups:
        notes.append("a query needs at least one word that must match" if negatives else
                     'the query has no word to search for: give words, a "quoted phrase" or a prefix*')
        return Query(notes=tuple(notes))
    return Query(
        groups=tuple(tuple(g) for g in groups), negatives=tuple(negatives), notes=tuple(notes)
    )


def is_stop_word(term: Term) -> bool:
    return len(term.tokens) == 1 and not term.prefix and term.tokens[0] in STOP_WORDS


#: Content terms the any-word form keeps at most. Each is looked up on its own (exact and
#: stemmed, ``lcm.store.search``), so a pasted paragraph of 40 content words cost 80 index
#: lookups a search (auto-recall runs one per user message: 80 ms a request through lcm proxy,
#: measured); the longest words are kept, as rarer on the whole, which is what ranks.
ANY_WORDS_MAX_TERMS = 12


def any_words(query: Query) -> Query | None:
    """The any-word form of ``query`` (see the module docstring): one OR group of its distinct
    content terms, phrases, prefixes and code-like terms kept whole, the same negatives. None
    when it would find nothing the query itself does not (one group, or no content word)."""
    if len(query.groups) < 2:
        return None
    terms = tuple(dict.fromkeys(t for t in query.positive_terms() if not is_stop_word(t)))
    if not terms:
        return None
    if len(terms) > ANY_WORDS_MAX_TERMS:  # the longest words, in the query's order
        longest = set(sorted(terms, key=lambda t: -len(t.raw))[:ANY_WORDS_MAX_TERMS])
        terms = tuple(t for t in terms if t in longest)
    return Query(groups=(terms,), negatives=query.negatives, notes=query.notes)


# --------------------------------------------------------------------------- snippets

_TOKEN_RUN = re.compile(r"[^\W_]+")


def _near(word: str, token: str) -> bool:
    """Forms of one word, as a stemmer would have matched them ("moved" for "move", "staging"
    for "stage"): a common start of at least 4 characters, missing at most 3 of the shorter."""
    n = 0
    for a, b in zip(word, token, strict=False):
        if a != b:
            break
        n += 1
    return n >= 4 and n >= min(len(word), len(token)) - 3


def make_snippet(body: str, query: Query, width: int = SNIPPET_CHARS, *, loose: bool = False) -> str:
    """A window of ``body`` around the first match, matched words marked ``**like this**``.

    Cut in Python from the final page of hits only, the same on both backends (the databases'
    own highlighters would see raw text while the index sees normalised tokens). ``loose``: the
    hit came from the stemmed index, so other forms of a query word count too (:func:`_near`).
    """
    if not body:
        return ""
    first_tokens = {t.tokens[0] for t in query.positive_terms() if not (t.prefix and len(t.tokens) == 1)}
    all_tokens = {tok for t in query.positive_terms() for tok in t.tokens}
    prefixes = tuple(t.tokens[-1] for t in query.positive_terms() if t.prefix)
    scan = body[:SNIPPET_SCAN_CHARS]

    seen: dict[tuple[str, bool], bool] = {}  # a body repeats its words: decide each once

    def matches(word: str, anchor_only: bool) -> bool:
        known = seen.get((word, anchor_only))
        if known is None:
            known = seen[word, anchor_only] = decide(word, anchor_only)
        return known

    def decide(word: str, anchor_only: bool) -> bool:
        wanted = first_tokens if anchor_only else all_tokens
        for tok in tokenize(space_unspaced_scripts(word)):
            if tok in wanted:
                return True
            if prefixes and tok.startswith(prefixes):
                return True
            if loose and any(_near(tok, w) for w in wanted):
                return True
        return False

    hit = None
    for m in _TOKEN_RUN.finditer(scan):
        if matches(m.group(0), anchor_only=True):
            hit = m
            break
    if hit is None:
        window = scan[:width]
        return _squash(window) + ("…" if len(body) > width else "")
    start = max(0, hit.start() - width // 3)
    end = min(len(scan), start + width)
    window = scan[start:end]
    marked = _TOKEN_RUN.sub(
        lambda m: f"**{m.group(0)}**" if matches(m.group(0), anchor_only=False) else m.group(0),
        window,
    )
    return ("…" if start > 0 else "") + _squash(marked) + ("…" if end < len(body) else "")


def _squash(text: str) -> str:
    return " ".join(codec.strip_unstorable(text, "\ufffd").split())
