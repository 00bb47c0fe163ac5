"""PostgreSQL's full-text search: fenced phases over the ``search_vector`` GIN indexes (and the
messages' stemmed side table), so no plan depends on the planner guessing term frequencies.
``PgSearch`` is the part of ``PostgresBackend`` that answers searches; it keeps the lexeme
statistics and the stemmed query words it has looked up."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from lcm.backends import SearchSpec, post_filters
from lcm.backends.pg_driver import driver_rows
from lcm.backends.pg_text import LexemeStats, _quote, estimated_matches, gin_postings, render_tsquery
from lcm.records import Candidate
from lcm.textindex import Term

#: Phase 1 of a search looks at this many newest rows of the scope (see ``PgSearch.search``).
PROBE_ROWS = 2000
#: Phase 2 (GIN over older rows) of a ranked or filtered search runs only below this estimate.
PHASE2_MAX_MATCHES = 10_000
#: A query the lexeme statistics say matches at most this many rows of its scope goes straight
#: to the GIN index (its cost is those matches); commoner ones start with phase 1, which finds
#: a common word's newest matches in the first rows it reads.
GIN_DIRECT_MAX = 2_000
#: A scope of at most this many rows (from the session counters) may be searched by reading
#: every row of it, newest first, instead of through the GIN index (see ``PgSearch.search``).
SCOPE_SCAN_MAX = 20_000
#: What reading one row of the scope costs against reading one posting of the GIN index, for
#: that choice. Measured at 9M messages on a store larger than memory: a 10k-row agent read
#: cold cost 100+ ms, GIN's ~500k postings for two mid-frequency words 50 ms.
SCAN_ROW_COST = 100.0
#: Seconds the lexeme statistics (``pg_stats``, refreshed by ANALYZE) are reused.
STATS_TTL_S = 300.0
#: Stemmed query words remembered per process (cleared when it grows past this).
STEM_CACHE_SIZE = 50_000


@dataclass(frozen=True)
class _PhaseQuery:
    """One search, rendered once for every phase that runs it."""

    base: str  # the table
    scope: list[str]  # its scope lexemes
    score: str  # SQL of the rank (NULL for a recency sort)
    filters: list[str]  # time and platform conditions
    params: dict[str, Any]
    platform_join: str
    need: int  # candidates wanted
    ranked: bool
    column: str  # search_vector (exact tokens) or search_stems (english configuration)
    source: str  # the FROM clause, the searched rows as ``t``
    vector: str  # the searched vector, qualified
    order_col: str  # the scope's own order: seq for one session's messages, else id
    where_scope: str


#: Whether the agent's messages are the only ones in the table, and nothing but this search's
#: own scope lexeme could keep another agent's rows out: row-level security is off (under it an
#: agent's role sees only its own rows, so the check below would always say "alone", while the
#: scope lexeme is what keeps the index from reading every agent's matches). Two probes of the
#: (agent_id, id) index and a catalog row: once per search. (min and max of the index's leading
#: column are always its two ends; ``NOT EXISTS (... WHERE agent_id > :aid)`` was planned as a
#: table scan expected to stop early, and read all 100k rows when nothing matched: 65 ms.)
_AGENT_ALONE_SQL = (
    "SELECT NOT c.relrowsecurity "
    "AND coalesce((SELECT min(agent_id) FROM lcm_messages) = :aid "
    "AND (SELECT max(agent_id) FROM lcm_messages) = :aid, false) "
    "FROM pg_class c WHERE c.oid = to_regclass('lcm_messages')")
_AGENT_ALONE = text(_AGENT_ALONE_SQL)
#: The messages in a scope, from the session counters (kept with every append, checked by the
#: doctor), by the scope's column.
_MESSAGE_ROWS_SQL = "SELECT coalesce(sum(message_count), 0) FROM lcm_sessions WHERE {column} = :{param}"


#: ``PgSearch.newest_id``: the messages' newest id, the scope's rows (the session counters, as
#: ``PgSearch._scope_rows``) and, agent-wide, ``_AGENT_ALONE``'s answer, in one statement.
_NEWEST_AND_SCOPE = (
    "SELECT (SELECT coalesce(max(id), 0) FROM lcm_messages), "
    f"({_MESSAGE_ROWS_SQL.format(column='agent_id', param='aid')}), coalesce(({_AGENT_ALONE_SQL}), false)")
_NEWEST_AND_SCOPE_IN_SESSION = (
    "SELECT (SELECT coalesce(max(id), 0) FROM lcm_messages), "
    f"({_MESSAGE_ROWS_SQL.format(column='id', param='sid')})")


def scope_lexemes_for(spec: SearchSpec, alone: bool) -> list[str]:
    """The scope lexemes a search's GIN query carries: its session's, else its agent's, except
    for an agent alone in the store (``PgSearch.agent_alone``, which only says so for an
    agent-wide search of messages)."""
    if spec.session_pk is not None:
        return [f"s{spec.session_pk}"]
    return [] if alone else [f"a{spec.agent_pk}"]


class PgSearch:
    """Searches of one backend instance (its caches are per process, like the backend)."""

    def __init__(self) -> None:
        self._stats_cache: dict[str, tuple[float, LexemeStats | None]] = {}
        self._stems: dict[str, str] = {}  # to_tsquery('english', word) per word, see _stemmed_tsquery

    @staticmethod
    def agent_alone(conn: Connection, spec: SearchSpec, base: str) -> bool:
        """Whether an agent-wide search of messages may leave its agent's scope lexeme out of
        the GIN query: no other agent has a message (and row-level security is off).

        The scope lexeme makes GIN intersect each word's postings with the agent's, which in a
        store of one agent is every row: at 100k messages that intersection was 0.6-1.0 ms of a
        1.4 ms word lookup, and auto-recall makes about 20 of them (64-89 -> 47-75 ms a recall).
        Every phase still reads only the agent's rows where it reads rows (``where_scope``), and
        hits are read back within the agent: an agent that starts writing while this search
        runs costs at most a candidate that is then dropped, never a row of its."""
        if spec.session_pk is not None or base != "lcm_messages":
            return False
        return bool(spec.remembered(("agent_alone", spec.agent_pk), lambda: conn.execute(
            _AGENT_ALONE, {"aid": spec.agent_pk}).scalar()))

    @staticmethod
    def newest_id(conn: Connection, spec: SearchSpec, table: str) -> int:
        """The newest id of ``table``, and for a search of messages what its phases will ask
        next, in one round trip (the any-word part asks for the newest id first, then every
        word's route asks whether the agent is alone and how many rows its scope has: three
        statements of ~0.25 ms each, plus SQLAlchemy's per-statement work, in every recall).
        Each answer is the one its own statement gives (``_AGENT_ALONE``, ``_scope_rows``).
        A search that routed its every-word part first knows the scope already: the newest id
        alone is asked then."""
        key = ("newest_id", table)
        known = ("rows", table, spec.agent_pk, spec.session_pk) in spec.scope_memo
        if table != "lcm_messages" or key in spec.scope_memo or known:
            return spec.newest_id(conn, table)
        by_session = spec.session_pk is not None
        [row] = driver_rows(conn, _NEWEST_AND_SCOPE_IN_SESSION if by_session else _NEWEST_AND_SCOPE,
                            {"aid": spec.agent_pk} if not by_session else {"sid": spec.session_pk})
        spec.scope_memo[key] = int(row[0])
        spec.scope_memo[("rows", table, spec.agent_pk, spec.session_pk)] = int(row[1])
        if not by_session:
            spec.scope_memo[("agent_alone", spec.agent_pk)] = bool(row[2])
        return int(row[0])

    def search(self, conn: Connection, spec: SearchSpec, base: str, ts_col: str,
                roles: Sequence[str]) -> tuple[list[Candidate], bool]:
        """Fenced phases, so no plan depends on the planner guessing term frequencies.

        S. A small scope (a session or an agent of at most ``SCOPE_SCAN_MAX`` rows, from the
           session counters) where reading its rows, newest first, until the matches needed
           are found costs less than the postings GIN would read (``gin_postings``: every
           posting of each query word and of the scope lexeme, store-wide): a common word,
           whose newest thousand matches are in the scope's newest rows. Exact (the scan
           stops only when it has enough, or at the scope's end). Without statistics, any
           small scope is scanned (bounded by its size).
        0. When the lexeme statistics say the query matches few rows of its scope (a needle, a
           rare word, two mid-frequency words together): the GIN index at once.
        1. Otherwise the newest ``PROBE_ROWS`` rows of the scope (bounded work) filtered by the
           query: common words are answered here.
        2. Only if that found too few: the GIN index over the older rows. For a recency sort
           this means the term is rare (fewer than ``limit`` hits in the probe), so the GIN
           bitmap is small. For a ranked sort it runs only when phase 1's hit rate predicts at
           most ``PHASE2_MAX_MATCHES`` older matches; otherwise the ranking covers the probe
           window and the result says so (clamped).

        Phase 0 needs statistics (ANALYZE; autovacuum keeps them fresh). Without them, or if
        they are stale and a word grew common since, the cost is that word's GIN matches once,
        never a plan that walks the table.
        """
        return self._answer(conn, spec, *self._route(conn, spec, base, ts_col, roles))

    def search_many(self, conn: Connection, specs: Sequence[SearchSpec], base: str, ts_col: str
                    ) -> list[tuple[list[Candidate], bool]]:
        """:meth:`search` of each spec, the same answers; the plain lookups that go straight to
        the GIN index (the any-word part's words alone: no rank, no filter) in one statement
        (:meth:`_gin_ids`). An auto-recall looks up about 20 words this way: one round trip
        and one executor start instead of 20 (measured at 100k messages: 26 -> 19 ms for the
        lookups of one recall, when each word was its own statement)."""
        batched, others = self._many(conn, specs, base, ts_col)
        return [(list(map(Candidate, batched[i])), False) if i in batched else others[i] for i in range(len(specs))]

    def newest_ids_many(self, conn: Connection, specs: Sequence[SearchSpec], base: str, ts_col: str
                        ) -> list[list[int]]:
        """The ids :meth:`search_many` finds for each unranked spec, newest first, without a
        ``Candidate`` per id (an auto-recall reads about 2,000)."""
        batched, others = self._many(conn, specs, base, ts_col)
        return [batched[i] if i in batched else [c.id for c in others[i][0]] for i in range(len(specs))]

    def _many(self, conn: Connection, specs: Sequence[SearchSpec], base: str, ts_col: str
              ) -> tuple[dict[int, list[int]], dict[int, tuple[list[Candidate], bool]]]:
        """The specs' answers by position: the plain lookups' ids (:meth:`_gin_ids`, all of
        them at once, a single one too: the statement is prepared), and every other search's
        candidates."""
        routes = [self._route(conn, spec, base, ts_col, spec.roles) for spec in specs]
        plain = {i: q for i, (route, q) in enumerate(routes)
                 if route == "gin" and q is not None and not q.ranked and not q.filters and not q.platform_join}
        batched = self._gin_ids(conn, plain) if plain else {}
        others = {i: self._answer(conn, spec, route, q)
                  for i, (spec, (route, q)) in enumerate(zip(specs, routes, strict=True)) if i not in batched}
        return batched, others

    def _route(self, conn: Connection, spec: SearchSpec, base: str, ts_col: str,
               roles: Sequence[str]) -> tuple[str, _PhaseQuery | None]:
        """Which phase answers ``spec`` (see :meth:`search`): ``gin`` (phase 0), ``scope``
        (phase S) or ``probe`` (phases 1 and 2), with the rendered query; None for a query
        that cannot match."""
        scope = scope_lexemes_for(spec, self.agent_alone(conn, spec, base))
        if spec.stemmed:
            rendered = self._stemmed_tsquery(conn, spec, roles, scope)
            if rendered is None:  # a word that must match is a stop word of the configuration
                return "gin", None
            # Stemmed searches are the any-word part's per-word lookups of words that are not
            # common: the GIN index at once (the statistics are the exact column's, not these).
            return "gin", self._phase_query(spec, base, ts_col, roles, scope, stemmed=rendered)
        q = self._phase_query(spec, base, ts_col, roles, scope)
        stats = self._lexeme_stats(conn, base)
        scope_rows = spec.remembered(("rows", base, spec.agent_pk, spec.session_pk),
                                     lambda: self._scope_rows(conn, base, spec))
        estimated = estimated_matches(spec.query, q.scope, stats)
        if scope_rows <= SCOPE_SCAN_MAX:  # phase S
            postings = gin_postings(spec.query, q.scope, stats)
            everywhere = estimated_matches(spec.query, (), stats)  # the words alone, store-wide
            in_scope = None if everywhere is None or stats is None else everywhere / stats.rows * scope_rows
            if postings is None or scanned_rows(scope_rows, in_scope, q.need + 1) * SCAN_ROW_COST < postings:
                return "scope", q
        if estimated is not None and estimated <= GIN_DIRECT_MAX:  # phase 0
            return "gin", q
        return "probe", q

    def _answer(self, conn: Connection, spec: SearchSpec, route: str, q: _PhaseQuery | None
                ) -> tuple[list[Candidate], bool]:
        """``spec`` answered by the phases :meth:`_route` chose (see :meth:`search`)."""
        if q is None:
            return [], False
        if route == "gin":  # phase 0
            found = self._gin_phase(conn, q, None, q.need)
            return found, spec.ranked and len(found) >= q.need
        if route == "scope":
            return self._scope_phase(conn, q)
        rows, found = self._probe_phase(conn, q)
        if len(found) >= q.need:
            return found, spec.ranked
        return self._older_phase(conn, q, spec, len(rows), found)

    def _stemmed_tsquery(self, conn: Connection, spec: SearchSpec, roles: Sequence[str],
                         scope: Sequence[str]) -> tuple[str, str] | None:
        """(the query with its scope, without it) for ``search_stems``: each term stemmed by
        the server's ``english`` configuration (the one that built the column), assembled like
        :func:`render_tsquery`. None when a group that must match has no lexeme left."""
        terms = [*spec.query.positive_terms(), *spec.query.negatives]
        stemmed = dict(zip(terms, self.stem_terms(conn, terms), strict=True))
        groups = []
        for group in spec.query.groups:
            either = [f"({stemmed[t]})" for t in group if stemmed[t]]
            if not either:
                return None
            groups.append(either[0] if len(either) == 1 else "(" + " | ".join(either) + ")")
        parts = [*groups, *(_quote("§" + tok) for tok in scope)]
        if roles:
            parts.append("(" + " | ".join(_quote("§r:" + r) for r in roles) + ")")
        parts += [f"!({stemmed[n]})" for n in spec.query.negatives if stemmed[n]]
        return " & ".join(parts), " & ".join(groups)

    def stem_terms(self, conn: Connection, terms: Sequence[Term]) -> list[str]:
        """Each term's stemmed query (``to_tsquery('english', ...)``), in order; the words not
        yet known are looked up in one statement (the configuration is fixed: a word's stemmed
        query never changes, so they are remembered)."""
        sources = [" <-> ".join(f"'{tok}'" for tok in t.tokens) + (":*" if t.prefix else "") for t in terms]
        known: dict[str, str | None] = {src: self._stems.get(src) for src in sources}
        unknown = [src for src, stem in known.items() if stem is None]
        if unknown:
            found = dict(zip(unknown, (r[0] for r in conn.execute(text(
                "SELECT to_tsquery('english'::regconfig, s)::text FROM unnest(CAST(:s AS text[])) "
                "WITH ORDINALITY AS u(s, n) ORDER BY n"), {"s": unknown}).all()), strict=True))
            known.update(found)
            if len(self._stems) + len(found) > STEM_CACHE_SIZE:
                self._stems.clear()
            self._stems.update(found)
        return [known[src] or "" for src in sources]

    @staticmethod
    def _phase_query(spec: SearchSpec, base: str, ts_col: str, roles: Sequence[str], scope: list[str],
                     stemmed: tuple[str, str] | None = None) -> _PhaseQuery:
        column = "search_stems" if stemmed is not None else "search_vector"
        source, vector = f"{base} t", f"t.{column}"
        filters, filter_params = post_filters(spec, ts_col)
        if stemmed is not None and base == "lcm_messages":  # stemmed after the turn (0012)
            if filters:  # the time and platform filters read the message row
                source, vector = ("lcm_message_stems st JOIN lcm_messages t ON t.id = st.message_id",
                                  "st.search_stems")
            else:  # the scope is in the stemmed vector: the narrow side table alone answers
                # (at 100k messages a 700-match word: 3.3 ms, against 5.3 ms joined to its rows)
                source = "(SELECT message_id AS id, search_stems FROM lcm_message_stems) t"
        params: dict[str, Any] = {"q": stemmed[0] if stemmed else render_tsquery(spec.query, scope, roles),
                                  "probe": PROBE_ROWS, "sid": spec.session_pk, "aid": spec.agent_pk}
        score = "NULL::real"
        if spec.ranked:
            params["bq"] = stemmed[1] if stemmed else render_tsquery(spec.query, with_negatives=False)
            score = f"ts_rank_cd({vector}, CAST(:bq AS tsquery), 1)"
        params.update(filter_params)
        # Newest rows of the scope: a session's by its (session_id, seq) index, an agent's
        # (all sessions) by the primary key.
        session_scoped = spec.session_pk is not None
        return _PhaseQuery(
            base=base, scope=scope, score=score, filters=filters, params=params,
            platform_join="JOIN lcm_sessions s ON s.id = t.session_id " if spec.platform is not None else "",
            need=spec.window if spec.ranked else spec.limit, ranked=spec.ranked, column=column,
            source=source, vector=vector,
            order_col="seq" if session_scoped and base == "lcm_messages" else "id",
            where_scope="WHERE session_id = :sid " if session_scoped else "WHERE agent_id = :aid ")

    @staticmethod
    def _scope_phase(conn: Connection, q: _PhaseQuery) -> tuple[list[Candidate], bool]:
        """Phase S: every row of the (small) scope, newest first, filtered by the query and the
        filters; the newest ``need`` matches (one more says the ranking is clamped), and only
        they are ranked: ranking all 9,500 rows of a 10k-message agent that have the commonest
        word cost 70 ms, reading the rows 25 (measured on a 7M-message store, cold pages)."""
        window = f"SELECT * FROM {q.base} {q.where_scope}ORDER BY {q.order_col} DESC LIMIT :probe"
        score = q.score.replace(q.vector, "m.v")
        rows = conn.execute(text(
            f"SELECT m.id, {score} FROM (SELECT t.id, t.{q.order_col} AS ord, t.{q.column} AS v "
            f"FROM ({window}) t {q.platform_join}WHERE t.{q.column} @@ CAST(:q AS tsquery)"
            f"{''.join(' AND ' + f for f in q.filters)} ORDER BY t.{q.order_col} DESC LIMIT :first) m "
            "ORDER BY m.ord DESC"), {**q.params, "probe": SCOPE_SCAN_MAX, "first": q.need + 1}).all()
        return [Candidate(int(r[0]), _score(r[1])) for r in rows[:q.need]], q.ranked and len(rows) > q.need

    @staticmethod
    def _scope_rows(conn: Connection, base: str, spec: SearchSpec) -> int:
        """Rows in the search's scope: messages from the session counters (kept with every
        append, checked by the doctor), summaries counted up to ``SCOPE_SCAN_MAX`` + 1."""
        if base == "lcm_messages":
            by = ("id", "sid") if spec.session_pk is not None else ("agent_id", "aid")
            return int(conn.execute(text(_MESSAGE_ROWS_SQL.format(column=by[0], param=by[1])),
                                    {"sid": spec.session_pk, "aid": spec.agent_pk}).scalar_one())
        where = "session_id = :sid" if spec.session_pk is not None else "agent_id = :aid"
        return int(conn.execute(text(
            f"SELECT count(*) FROM (SELECT 1 FROM {base} WHERE {where} LIMIT :cap) c"),
            {"sid": spec.session_pk, "aid": spec.agent_pk, "cap": SCOPE_SCAN_MAX + 1}).scalar_one())

    @staticmethod
    def _probe_phase(conn: Connection, q: _PhaseQuery) -> tuple[Sequence[Any], list[Candidate]]:
        """Phase 1: every match inside the newest ``PROBE_ROWS`` rows of the scope (the rows
        matched, filters not applied, are the hit-rate sample; and the candidates).

        The predicate is applied to a LIMITed subquery, which no index can answer: the window
        is scanned row by row, whatever the statistics say. A plain recency search needs no hit
        rate and stops at its `limit`-th match (LIMIT NULL: no limit); it is ordered by the
        window's own order (a session's seq rises with its ids), so no sort has to read the
        whole window first."""
        window = f"SELECT * FROM {q.base} {q.where_scope}ORDER BY {q.order_col} DESC LIMIT :probe"
        params = {**q.params, "first": q.need if not q.ranked and not q.filters else None}
        rows = conn.execute(text(
            f"SELECT t.id, {q.score}, ({' AND '.join(q.filters) or 'TRUE'}) AS keep "
            f"FROM ({window}) t {q.platform_join}"
            f"WHERE t.{q.column} @@ CAST(:q AS tsquery) ORDER BY t.{q.order_col} DESC LIMIT :first"),
            params).all()
        return rows, [Candidate(int(r[0]), _score(r[1])) for r in rows if r[2]][:q.need]

    def _older_phase(self, conn: Connection, q: _PhaseQuery, spec: SearchSpec, sampled: int,
                     found: list[Candidate]) -> tuple[list[Candidate], bool]:
        """Phase 2: the GIN index over the rows older than the probe window, when the probe's
        hit rate says the older matches are few enough (else the result says it is clamped)."""
        floor_id, scanned = conn.execute(text(
            f"SELECT min(id), count(*) FROM (SELECT id FROM {q.base} {q.where_scope}"
            f"ORDER BY {q.order_col} DESC LIMIT :probe) w"), q.params).one()
        if scanned < PROBE_ROWS or floor_id is None:
            return found, False  # the window held the whole scope: nothing older to search
        older_rows = self._older_rows(conn, q.base, spec, floor_id)
        expected = sampled / scanned * older_rows  # phase 1's hit rate, applied to the rest
        if (spec.ranked or q.filters) and expected > PHASE2_MAX_MATCHES:
            return found, True
        found = found + self._gin_phase(conn, q, floor_id, q.need - len(found))
        return found, spec.ranked and len(found) >= q.need

    @staticmethod
    def _gin_phase(conn: Connection, q: _PhaseQuery, floor_id: int | None, need: int) -> list[Candidate]:
        """The newest ``need`` matches (below ``floor_id`` if given) through the GIN index.

        The matches, with their score and filters computed from the row the bitmap scan
        already holds, are materialized before anything is ordered, and `id + 0` keeps the
        primary key out of that scan, so a rare term costs its few matches. (Reads run in
        autocommit, where SET LOCAL does nothing: the plan is fenced by the query's shape. An
        earlier join back to the table let the planner walk the primary key from the newest
        row instead: 115k rows read for 867 matches at 1M messages.)
        """
        below = " AND t.id + 0 < :floor" if floor_id is not None else ""
        rows = driver_rows(  # about 20 an auto-recall: psycopg's own cursor, see pg_driver
            conn, f"WITH g AS MATERIALIZED (SELECT t.id, {q.score} AS score FROM {q.source} {q.platform_join}"
            f"WHERE {q.vector} @@ CAST(:q AS tsquery){below}"
            f"{''.join(' AND ' + f for f in q.filters)}) "
            "SELECT id, score FROM g ORDER BY id DESC LIMIT :need", {**q.params, "floor": floor_id, "need": need})
        if not q.ranked:  # psycopg returns bigint as int, and no score
            return list(map(Candidate, (r[0] for r in rows)))
        return [Candidate(int(r[0]), _score(r[1])) for r in rows]

    @staticmethod
    def _gin_ids(conn: Connection, lookups: dict[int, _PhaseQuery]) -> dict[int, list[int]]:
        """:meth:`_gin_phase` of several plain lookups (no rank, no filter) in one statement:
        each lookup's newest ids, newest first.

        The queries travel as one array; each is that phase's own fenced lookup (``OFFSET 0``:
        its matches are read before anything is ordered), returned as one array of ids. So the
        statement's text depends only on the searched tables, never on the number of words:
        psycopg prepares it after a few runs and the server plans it once. A ``UNION ALL`` with
        a branch per word and a row per id, new text for each count, was planned on every
        recall: measured at 100k messages, 0.6-1.3 ms of planning in a 1.2-2.0 ms statement;
        this form runs in 0.6-1.2 ms, and an array per word reads 10-20% faster than a row per
        id."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, q in lookups.items():
            groups.setdefault((q.source, q.vector), []).append(i)
        branches: list[str] = []
        params: dict[str, Any] = {}
        for g, ((source, vector), keys) in enumerate(sorted(groups.items())):
            params[f"k{g}"] = keys
            params[f"q{g}"] = [lookups[i].params["q"] for i in keys]
            params[f"need{g}"] = [lookups[i].need for i in keys]
            branches.append(
                f"SELECT u.k, ARRAY(SELECT g.id FROM (SELECT t.id FROM {source} WHERE {vector} @@ u.q OFFSET 0) g "
                f"ORDER BY g.id DESC LIMIT u.need) FROM unnest(CAST(:k{g} AS int[]), CAST(:q{g} AS tsquery[]), "
                f"CAST(:need{g} AS int[])) AS u(k, q, need)")
        return dict(driver_rows(conn, " UNION ALL ".join(branches), params))

    def _lexeme_stats(self, conn: Connection, base: str) -> LexemeStats | None:
        """The table's most common lexemes and their row frequencies (cached ``STATS_TTL_S``)."""
        now = time.monotonic()
        cached = self._stats_cache.get(base)
        if cached is not None and now - cached[0] < STATS_TTL_S:
            return cached[1]
        row = conn.execute(text(
            "SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples "
            "FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema() "
            "AND s.tablename = c.relname AND s.attname = 'search_vector' "
            "WHERE c.oid = to_regclass(:t)"), {"t": base}).first()
        stats = None
        if row is not None and row[0] and row[1] and row[2] is not None and row[2] > 0:
            elems, freqs = list(row[0]), [float(x) for x in row[1]]
            # The frequencies list ends with the minimum, the maximum and the null frequency.
            stats = LexemeStats(dict(zip(elems, freqs, strict=False)), freqs[len(elems)], float(row[2]))
        self._stats_cache[base] = (now, stats)
        return stats

    @staticmethod
    def _older_rows(conn: Connection, base: str, spec: SearchSpec, floor_id: int) -> int:
        """Rows of the scope below the probe window, from counters rather than a scan."""
        if base == "lcm_messages":
            if spec.session_pk is not None:  # seq is gapless per session
                return int(conn.execute(text("SELECT seq - 1 FROM lcm_messages WHERE id = :floor"),
                                        {"floor": floor_id}).scalar_one())
            total = conn.execute(text(
                "SELECT coalesce(sum(message_count), 0) FROM lcm_sessions WHERE agent_id = :aid"),
                {"aid": spec.agent_pk}).scalar_one()
            return max(0, int(total) - PROBE_ROWS)
        scope = "session_id = :sid" if spec.session_pk is not None else "agent_id = :aid"
        return int(conn.execute(text(  # summaries are few
            f"SELECT count(*) FROM {base} WHERE {scope} AND id < :floor"),
            {"sid": spec.session_pk, "aid": spec.agent_pk, "floor": floor_id}).scalar_one())

    def term_rows(self, conn: Connection, kind: str, term: Term) -> float | None:
        """From ANALYZE's lexeme statistics (cached): a phrase is as rare as its rarest word."""
        if term.prefix:
            return None
        stats = self._lexeme_stats(conn, f"lcm_{kind}")
        if stats is None:
            return None
        return min(stats.freq(tok) for tok in term.tokens) * stats.rows


def scanned_rows(scope_rows: int, estimated_matches: float | None, need: int) -> float:
    """Rows a newest-first scan of a scope reads to find ``need`` matches, when the scope
    holds about ``estimated_matches`` of them (all of it when they are fewer; unknown: all)."""
    if estimated_matches is None or estimated_matches <= need or scope_rows <= 0:
        return float(scope_rows)
    return min(float(scope_rows), need * scope_rows / estimated_matches)


def _score(raw: Any) -> float | None:
    return None if raw is None else float(raw)
