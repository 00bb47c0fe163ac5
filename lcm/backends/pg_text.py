"""PostgreSQL's text-search literals, built by lcm: the ``tsvector`` written with each row and
the ``tsquery`` a search sends, from lexemes lcm computes itself (``lcm.textindex``), with the
scope lexemes (``§s<session>``, ``§a<agent>``, ``§r<role hex>``) that let GIN intersect a
query with its scope before anything is ranked; and what ANALYZE's lexeme statistics say about
how many rows a query matches. Pure: no connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lcm.backends import IndexRow, role_token
from lcm.textindex import Query, Term, normalize_tokens_text

#: PostgreSQL's own guess for a lexeme missing from the statistics (``DEFAULT_TS_MATCH_SEL``
#: in ts_selfuncs.c, used with half the least common listed frequency, as there).
UNLISTED_MAX_FREQ = 0.005


def _quote(lexeme: str) -> str:
    if "'" not in lexeme and "\\" not in lexeme:
        return "'" + lexeme + "'"
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def tsvector_literal(body: str, scope: Sequence[str]) -> str:
    """A literal tsvector: the body's tokens with positions, plus positionless scope lexemes.

    Built in Python (every turn pays for it, so it is kept tight): one ``'token':position``
    entry per token, in order, and PostgreSQL's ``tsvector`` input merges the repeats of a
    lexeme itself, clamping positions past 16383 and keeping the first 256 of each (measured:
    0.06 ms a 4-message turn against 0.29 ms for merging them here; the same vector, byte for
    byte). Tokens are letters and digits (``lcm.textindex``), so they need no quoting unless
    the tokenizer ever lets a quote or a backslash through.
    """
    folded = normalize_tokens_text(body)  # what tokenize() splits
    tokens = folded.split()
    if "'" in folded or "\\" in folded:
        parts = [f"{_quote(t)}:{pos}" for pos, t in enumerate(tokens, start=1)]
    else:
        parts = [f"'{t}':{pos}" for pos, t in enumerate(tokens, start=1)]
    parts.extend(_quote("§" + s) for s in scope)
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class LexemeStats:
    """What ANALYZE knows of a search vector column: the most common lexemes' row frequencies."""

    freqs: dict[str, float]
    floor: float  # the least common listed frequency: a lexeme not listed is rarer
    rows: float  # rows in the table (pg_class.reltuples)

    def freq(self, lexeme: str) -> float:
        listed = self.freqs.get(lexeme)
        return listed if listed is not None else min(UNLISTED_MAX_FREQ, self.floor / 2)


def estimated_matches(query: Query, scope: Sequence[str], stats: LexemeStats | None) -> float | None:
    """Rows of the scope the query's words match, from the statistics (None: unknown).

    A phrase is as rare as its rarest word, an OR group as common as its words together, an
    AND of groups (and the scope lexeme) as their product: independence, the planner's own
    assumption. A prefix could match anything: unknown, so phase 1 runs as before.
    """
    if stats is None:
        return None
    selectivity = 1.0
    for group in query.groups:
        if any(term.prefix for term in group):
            return None
        either = sum(min(stats.freq(tok) for tok in term.tokens) for term in group)
        selectivity *= min(1.0, either)
    for lexeme in scope:
        selectivity *= stats.freq("§" + lexeme)
    return selectivity * stats.rows


def gin_postings(query: Query, scope: Sequence[str], stats: LexemeStats | None) -> float | None:
    """Postings the GIN index reads to answer the query in its scope, from the statistics
    (None: unknown). GIN reads the whole posting list of every lexeme of the query, the scope
    lexeme's included, before it intersects them: two words each in 1% of 10M rows cost 200k
    postings however few rows have both, and the scope lexeme of a 10k-row agent 10k more. A
    prefix can expand to any number of lexemes: unknown."""
    if stats is None:
        return None
    total = 0.0
    for term in [*query.positive_terms(), *query.negatives]:
        if term.prefix:
            return None
        total += sum(stats.freq(tok) for tok in term.tokens)
    total += sum(stats.freq("§" + lexeme) for lexeme in scope)
    return total * stats.rows


def _ts_term(term: Term) -> str:
    lexemes = [_quote(t) for t in term.tokens]
    if term.prefix:
        lexemes[-1] += ":*"
    return lexemes[0] if len(lexemes) == 1 else "(" + " <-> ".join(lexemes) + ")"


def render_tsquery(query: Query, scope: Sequence[str] = (), roles: Sequence[str] = (),
                   with_negatives: bool = True) -> str:
    """The literal tsquery for a query restricted to scope lexemes."""
    parts = []
    for group in query.groups:
        terms = [_ts_term(t) for t in group]
        parts.append(terms[0] if len(terms) == 1 else "(" + " | ".join(terms) + ")")
    parts.extend(_quote("§" + s) for s in scope)
    if roles:
        parts.append("(" + " | ".join(_quote("§" + role_token(r)) for r in roles) + ")")
    if with_negatives:
        parts.extend("!" + _ts_term(n) for n in query.negatives)
    return " & ".join(parts)


def scope_lexemes(row: IndexRow) -> list[str]:
    scope = [f"s{row.session_pk}", f"a{row.agent_pk}"]
    if row.role is not None:
        scope.append(role_token(row.role))
    return scope
