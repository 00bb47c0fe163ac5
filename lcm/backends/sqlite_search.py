"""SQLite's full-text search: FTS5 queries scoped by tokens and id ranges, ranked by FTS5's own
``bm25()`` where its posting lists are short and by ``window_rank`` where they are not.
``Fts5Search`` is the part of ``SQLiteBackend`` that answers searches (as ``PgSearch`` is
PostgreSQL's); the indexes it reads are described in ``lcm.backends.sqlite``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, text

from lcm.backends import SearchSpec, post_filters, role_token, window_rank
from lcm.backends.sqlite_driver import driver_execute
from lcm.records import Candidate
from lcm.textindex import Query, Term

FTS_TABLES = {"messages": "lcm_messages_fts", "summaries": "lcm_summaries_fts"}
#: The stemmed twins (FTS5's porter tokenizer over the same content views; revision 0007).
STEM_TABLES = {"messages": "lcm_messages_stems", "summaries": "lcm_summaries_stems"}
BASE_TABLES = {"messages": "lcm_messages", "summaries": "lcm_summaries"}
#: An agent with more sessions than this is searched without an id range (finding it costs
#: two index seeks a session).
EXTENT_SESSIONS = 256


def _doc_freqs(conn: Connection, spec: SearchSpec, kind: str, terms: Sequence[Term]) -> list[float]:
    """Each term's document frequency in ``kind``'s index, estimated from its newest matches (a
    walk of at most ``window_rank.DF_SAMPLE`` postings, see ``window_rank.estimate_doc_freq``);
    once per search (the ranked all-words search and its any-word part ask for the same words),
    the walks not yet made in one statement."""
    missing = [t for t in dict.fromkeys(terms) if ("doc_freq", kind, t) not in spec.scope_memo]
    if missing:
        fts = FTS_TABLES[kind]
        params: dict[str, Any] = {"n": window_rank.DF_SAMPLE}
        parts = []
        for i, term in enumerate(missing):
            params[f"m{i}"] = _fts5_term(term)
            parts.append(f"SELECT {i}, count(*), min(id), CASE WHEN count(*) < :n THEN group_concat(id) END "
                         f"FROM (SELECT rowid AS id FROM {fts} WHERE {fts} MATCH :m{i} ORDER BY rowid DESC LIMIT :n)")
        newest = spec.newest_id(conn, BASE_TABLES[kind])
        for i, sampled, oldest, every in driver_execute(conn, " UNION ALL ".join(parts), params).fetchall():
            spec.scope_memo["doc_freq", kind, missing[i]] = window_rank.estimate_doc_freq(
                int(sampled), oldest, newest)
            if sampled < window_rank.DF_SAMPLE:  # the walk read every row with the word
                spec.scope_memo["postings", kind, missing[i]] = sorted(
                    (int(x) for x in every.split(",")) if every else (), reverse=True)
    return [float(spec.scope_memo["doc_freq", kind, t]) for t in terms]


def _walked(spec: SearchSpec, kind: str, where: _Where) -> list[int] | None:
    """A plain lookup of one word as written, answered from what :func:`_doc_freqs` read: every
    row of the store with that word, when it has fewer than ``DF_SAMPLE`` (a rare word). Only
    where the scope fills its id range (``_Where.alone``): its rows there are all the scope's.
    None when the walk cannot answer it. A recall's rare words (about nine a message) were read
    twice, once for their frequency and once for their rows."""
    if (kind != "messages" or spec.stemmed or spec.ranked or spec.has_post_filters or spec.roles
            or spec.query.negatives or len(spec.query.groups) != 1 or len(spec.query.groups[0]) != 1
            or not where.alone or where.first_id is None or where.last_id is None):
        return None
    rows = spec.scope_memo.get(("postings", kind, spec.query.groups[0][0]))
    if rows is None:
        return None
    lo, hi = where.first_id, where.last_id
    return [i for i in rows if lo <= i <= hi][:spec.limit]


def _fts5_term(term: Term) -> str:
    phrase = 'body:"' + term.raw.replace('"', '""') + '"'
    return phrase + "*" if term.prefix else phrase


def render_match(query: Query, scope: Sequence[str], roles: Sequence[str] = ()) -> str:
    """The FTS5 MATCH expression for a query restricted to scope tokens (never a syntax error:
    every user-derived string is a quoted phrase with quotes doubled)."""
    parts: list[str] = []
    for group in query.groups:
        terms = [_fts5_term(t) for t in group]
        parts.append(terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")")
    parts.extend(f'scope:"{tok}"' for tok in scope)
    if roles:
        parts.append("(" + " OR ".join(f'scope:"{role_token(r)}"' for r in roles) + ")")
    expr = "(" + " AND ".join(parts) + ")"
    for neg in query.negatives:
        expr += " NOT " + _fts5_term(neg)
    return expr


class _Where(NamedTuple):
    """Where a search reads (see ``Fts5Search._where``)."""

    fts: str
    match: str
    first_id: int | None
    last_id: int | None
    alone: bool
    scope_rows: int

    def within(self, tag: str = "") -> tuple[str, dict[str, Any]]:
        """The WHERE condition (the MATCH, and the id range when there is one) and its
        parameters, named with ``tag`` so that several can share a statement."""
        params: dict[str, Any] = {f"match{tag}": self.match}
        if self.first_id is None:
            return f"{self.fts} MATCH :match{tag}", params
        params[f"lo{tag}"], params[f"hi{tag}"] = self.first_id, self.last_id
        return f"{self.fts} MATCH :match{tag} AND rowid BETWEEN :lo{tag} AND :hi{tag}", params


class Fts5Search:
    """Searches over the FTS5 indexes (no state: one per backend, like ``PgSearch``)."""

    def search(self, conn: Connection, spec: SearchSpec, kind: str) -> tuple[list[Candidate], bool]:
        where = self._where(conn, spec, kind)
        if where is None:  # the scope holds no row
            return [], False
        fts, alone, scope_rows = where.fts, where.alone, where.scope_rows
        want = spec.window if spec.ranked else spec.limit
        # Ranking: FTS5's bm25() unless that reads long posting lists (see window_rank): it
        # counts, before scoring anything, the rows of the whole index with each query word
        # and with the scope token, so a common word or a big scope costs their whole lists.
        idfs, postings, share = self._term_stats(conn, spec, kind) if spec.ranked else ({}, 0.0, 0.0)
        native = (spec.ranked and postings + (0 if alone else scope_rows) < window_rank.NATIVE_RANK_MAX_ROWS
                  and share < window_rank.WINDOW_RANK_MIN_SHARE)
        score = f"bm25({fts}, 1.0, 0.0)" if native else "NULL"
        # The scope's id range: FTS5 seeks its posting lists to it, so the query words' matches
        # elsewhere in the store are skipped, not read (its own rows are the only ones in it
        # that also carry its scope token).
        within, params = where.within()
        params["want"] = want
        if not spec.has_post_filters:  # the hot path (lcm_grep; auto-recall's lookups: newest_ids_many)
            sql = f"SELECT rowid, {score} FROM {fts} WHERE {within} ORDER BY rowid DESC LIMIT :want"
            rows = driver_execute(conn, sql, params).fetchall()
            clamped = spec.ranked and len(rows) >= want
        else:
            base = BASE_TABLES[kind]
            filters, filter_params = post_filters(spec, "ts" if kind == "messages" else "latest_at")
            params.update(filter_params, cap=spec.scan_cap)
            sql = (
                f"WITH c AS (SELECT rowid AS id, {score} AS score FROM {fts} WHERE {within} "
                "ORDER BY rowid DESC LIMIT :cap) "
                f"SELECT c.id, c.score FROM c JOIN {base} t ON t.id = c.id "
                "JOIN lcm_sessions s ON s.id = t.session_id "
                f"WHERE {' AND '.join(filters)} ORDER BY c.id DESC LIMIT :want"
            )
            rows = conn.execute(text(sql), params).all()
            if len(rows) < want:
                inner = conn.execute(text(
                    f"SELECT count(*) FROM (SELECT rowid FROM {fts} WHERE {within} LIMIT :cap)"),
                    params).scalar_one()
                clamped = inner >= spec.scan_cap
            else:
                clamped = spec.ranked
        if not spec.ranked:
            return list(map(Candidate, (r[0] for r in rows))), clamped
        if native:  # bm25() is lower-is-better; lcm reports higher-is-better scores
            return [Candidate(int(r[0]), -float(r[1])) for r in rows], clamped
        ids = [int(r[0]) for r in rows]
        scores = self._rank_window(conn, kind, spec.query, ids, idfs)
        return [Candidate(i, scores.get(i, 0.0)) for i in ids], clamped

    def _where(self, conn: Connection, spec: SearchSpec, kind: str) -> _Where | None:
        """Where ``spec`` searches: its index, MATCH expression and id range (None: its scope
        holds no row)."""
        fts = (STEM_TABLES if spec.stemmed else FTS_TABLES)[kind]
        extent = spec.remembered(("extent", kind, spec.agent_pk, spec.session_pk),
                                 lambda: self._scope_extent(conn, kind, spec))
        if extent is None:
            return None
        first_id, last_id, scope_rows = extent
        # A scope whose rows fill their id range (a store's only agent, a session written alone)
        # is scoped by the range alone: FTS5 reads the words' postings, not their intersection
        # with the scope's own list (a term in a 100k-message agent: 1.1 ms with it, 0.2 without).
        # The session counters say so (messages only), and hits are read back within the scope.
        alone = (kind == "messages" and first_id is not None and last_id is not None
                 and last_id - first_id + 1 == scope_rows)
        scope = [] if alone else [f"a{spec.agent_pk}"] if spec.session_pk is None else [f"s{spec.session_pk}"]
        match = render_match(spec.query, scope, spec.roles if kind == "messages" else ())
        return _Where(fts, match, first_id, last_id, alone, scope_rows)

    @staticmethod
    def _newest(spec: SearchSpec, where: _Where, tag: str, params: dict[str, Any]) -> str:
        """A SELECT of ``spec``'s newest ``spec.limit`` matches (``id``) where ``where`` says,
        its parameters added to ``params`` under names ending in ``tag``."""
        within, own = where.within(tag)
        params.update(own)
        params[f"n{tag}"] = spec.limit
        return f"SELECT rowid AS id FROM {where.fts} WHERE {within} ORDER BY rowid DESC LIMIT :n{tag}"

    def newest_ids_many(self, conn: Connection, kind: str, specs: Sequence[SearchSpec]) -> list[list[int]]:
        """Each unranked search's newest ``spec.limit`` matches (ids, newest first), all in one
        statement: an auto-recall's ~20 word lookups cost one call into SQLite, not 20."""
        params: dict[str, Any] = {}
        parts = []
        out: list[list[int]] = [[] for _ in specs]
        for i, spec in enumerate(specs):
            if spec.ranked or spec.has_post_filters:  # not a plain lookup: on its own
                out[i] = [c.id for c in self.search(conn, spec, kind)[0]]
                continue
            where = self._where(conn, spec, kind)
            if where is None:  # its scope holds no row
                continue
            walked = _walked(spec, kind, where)
            if walked is not None:
                out[i] = walked
                continue
            parts.append(f"SELECT {i}, id FROM ({self._newest(spec, where, str(i), params)})")
        if parts:
            for i, row_id in driver_execute(conn, " UNION ALL ".join(parts), params).fetchall():
                out[i].append(row_id)
        return out

    def term_rows_many(self, conn: Connection, spec: SearchSpec, kind: str, terms: Sequence[Term]) -> list[float]:
        """:func:`_doc_freqs`: the walks not yet made in one statement."""
        return _doc_freqs(conn, spec, kind, terms)

    @staticmethod
    def _scope_extent(conn: Connection, kind: str, spec: SearchSpec) -> tuple[int | None, int | None, int] | None:
        """(first id, last id, rows) of the search's scope, from indexes and counters (index
        seeks, whatever its size; the ids None when they would cost more); None when it is
        empty. A session's messages by seq (its ids rise with it); an agent's messages from its
        sessions' ends (SQLite keeps no (agent_id, id) index: ``min(id)`` of an agent would read
        the table), up to ``EXTENT_SESSIONS`` sessions; summaries (few) by their session index."""
        # On the driver's connection (``driver_execute``): once per search, SQLAlchemy's work
        # around these small statements cost more than SQLite took to answer them.
        if kind == "messages" and spec.session_pk is not None:
            row = driver_execute(
                conn, "SELECT (SELECT id FROM lcm_messages WHERE session_id = :s ORDER BY seq LIMIT 1), "
                "(SELECT id FROM lcm_messages WHERE session_id = :s ORDER BY seq DESC LIMIT 1), "
                "(SELECT message_count FROM lcm_sessions WHERE id = :s)", {"s": spec.session_pk}).fetchone()
            return None if row[0] is None else (int(row[0]), int(row[1]), int(row[2] or 0))
        if kind == "messages":
            count, rows = driver_execute(
                conn, "SELECT count(*), coalesce(sum(message_count), 0) FROM lcm_sessions WHERE agent_id = :a",
                {"a": spec.agent_pk}).fetchone()
            if not rows:
                return None
            if count > EXTENT_SESSIONS:
                return None, None, int(rows)
            first, last = driver_execute(
                conn, "SELECT min((SELECT id FROM lcm_messages m WHERE m.session_id = s.id ORDER BY m.seq LIMIT 1)), "
                "max((SELECT id FROM lcm_messages m WHERE m.session_id = s.id ORDER BY m.seq DESC LIMIT 1)) "
                "FROM lcm_sessions s WHERE s.agent_id = :a AND s.message_count > 0", {"a": spec.agent_pk}).fetchone()
            return None if first is None else (int(first), int(last), int(rows))
        if spec.session_pk is None:
            return None, None, 0  # an agent's summaries: no index to bound them by, and few
        first, last = driver_execute(
            conn, "SELECT min(id), max(id) FROM lcm_summaries WHERE session_id = :s", {"s": spec.session_pk}).fetchone()
        return None if first is None else (int(first), int(last), int(last) - int(first) + 1)

    @staticmethod
    def _term_stats(conn: Connection, spec: SearchSpec, kind: str) -> tuple[dict[Term, float], float, float]:
        """Each query word's IDF, from its document frequency estimated on its newest matches
        (``window_rank.estimate_doc_freq``); those document frequencies added up (the postings
        bm25() would read), and the largest one's share of all rows."""
        newest = spec.newest_id(conn, BASE_TABLES[kind])
        terms = list(dict.fromkeys(spec.query.positive_terms()))
        idfs: dict[Term, float] = {}
        widest = total = 0.0
        for term, doc_freq in zip(terms, _doc_freqs(conn, spec, kind, terms), strict=True):
            idfs[term] = window_rank.idf(doc_freq, newest)
            widest, total = max(widest, doc_freq), total + doc_freq
        return idfs, total, widest / max(newest, 1)

    @staticmethod
    def _rank_window(conn: Connection, kind: str, query: Query, ids: list[int],
                     idfs: dict[Term, float]) -> dict[int, float]:
        """BM25 over the candidate window (``window_rank``), for queries with a common word."""
        if not ids:
            return {}
        rows = [window_rank.WindowRow(int(r[0]), r[1] or "", int(r[2] or 0)) for r in conn.execute(text(
            f"SELECT id, substr(coalesce(search_text, content), 1, :head), token_count FROM {BASE_TABLES[kind]} "
            "WHERE id IN (SELECT value FROM json_each(:ids))"),
            {"head": window_rank.HEAD_CHARS, "ids": json.dumps(ids)})]
        return window_rank.bm25_scores(rows, query, idfs)

    def term_rows(self, conn: Connection, spec: SearchSpec, kind: str, term: Term) -> float | None:
        """From the term's newest matches (a bounded FTS5 walk, ``window_rank.estimate_doc_freq``)."""
        return _doc_freqs(conn, spec, kind, [term])[0]
