"""Full-text search on both backends: one parity table, filters, scopes, sorts, hostile input."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from lcm.errors import NotFoundError
from lcm.store.search import MAX_SEARCH_LIMIT
from lcm.textindex import any_words, parse_query
from tests.support.storing import append_messages

CORPUS = [
    ("user", "Please open /etc/lcm/alembic.ini and check the sqlalchemy.url"),
    ("assistant", "The café serves crème brûlée on Tuesdays"),
    ("user", "数据库连接失败了，请检查配置"),
    ("assistant", "Deployment ID is NEEDLE-7F3A9 for the blue cluster"),
    ("tool", "Traceback: ValueError: invalid literal for int() with base 10: 'abc'"),
    ("user", "run pytest -k test_login --maxfail=1"),
    ("assistant", "Ελληνικά κείμενα και ΑΘΗΝΑ"),
    ("user", "Путь к файлу: /var/log/syslog"),
    ("assistant", "snake_case_name and CamelCaseName and kebab-case-name"),
    ("user", "email me at ops@example.com or see https://example.org/runbook#step-3"),
]

# (query, indexes of CORPUS that must match, in recency order: newest first)
PARITY = [
    ("alembic", [0]),
    ("alembic.ini", [0]),
    ("ALEMBIC INI", [0]),
    ('"alembic ini"', [0]),
    ("ini alembic", [0]),
    ('"ini alembic"', []),
    ("sqlalchemy.url", [0]),
    ("cafe creme brulee", [1]),
    ("Café", [1]),
    ("数据库", [2]),
    ("连接", [2]),
    ("数据库 检查", [2]),
    ("needle-7f3a9", [3]),
    ("7F3A9", [3]),
    ("valueerror", [4]),
    ("int() base", [4]),
    ("test_login", [5]),
    ("maxfail=1", [5]),
    ("αθηνα", [6]),
    ("κείμενα", [6]),
    ("файлу", [7]),
    ("syslog", [7]),
    ("snake", [8]),
    ("case", [8]),
    ("kebab-case-name", [8]),
    ("camelcasename", [8]),
    ("ops@example.com", [9]),
    ("example", [9]),
    ("runbook step", [9]),
    ("exam*", [9]),
    ("alem* NEEDLE*", []),
    ("alembic OR syslog", [7, 0]),
    ("example -runbook", []),
    ("case -kebab", []),
    ("cluster -nothing", [3]),
    ("absent-word", []),
]

HOSTILE = [
    '"', '""', "'", "*", "-", ":", "^", "(", ")", "NEAR", "NEAR(a b)", "a NEAR/2 b", "AND", "OR",
    "NOT", "a:b", "body:alembic", "scope:s1", "{body}: x", "x*y", "**", "-*", "'; DROP TABLE lcm_messages; --",
    "alembic') OR 1=1 --", "\\", "\x00", "\ud800", "§s1", "&", "|", "!", "<->", "a & b | !c",
    "to_tsquery('x')", "a" * 5000, " ".join(["w"] * 500),
]


@pytest.fixture
def corpus(store, session):
    msgs = [{"role": role, "content": text} for role, text in CORPUS]
    ids = append_messages(store, session.id, msgs).store_ids
    return session, list(ids)


@pytest.mark.parametrize("query,expected", PARITY, ids=[q for q, _ in PARITY])
def test_parity_table(store, corpus, query, expected):
    session, ids = corpus
    got = [h.id for h in store.search.messages(query, agent="agent-a", session_pk=session.id, limit=50).hits]
    assert got == [ids[i] for i in expected]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise(store, corpus, query):
    session, _ = corpus
    for sort in ("recency", "relevance", "hybrid"):
        result = store.search.messages(query, agent="agent-a", session_pk=session.id, sort=sort)
        assert isinstance(result.hits, list)
        store.search.summaries(query, agent="agent-a", session_pk=session.id, sort=sort)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=60))
def test_any_text_is_a_valid_query(store, corpus, query):
    session, _ = corpus
    store.search.messages(query, agent="agent-a", session_pk=session.id, sort="relevance")


def test_snippets_mark_the_match(store, corpus):
    session, _ = corpus
    [hit] = store.search.messages("needle-7f3a9", agent="agent-a").hits
    assert "**NEEDLE**-**7F3A9**" in hit.snippet
    assert hit.role == "assistant" and hit.session_key == "session-1"


@pytest.mark.parametrize("query", ["alembic", "cluster OR syslog", "runbook upgrade migration"])
def test_hits_without_snippets_are_the_same_hits(store, corpus, query):
    """Auto-recall asks for hits without snippets (it reads the rows it keeps itself): the same
    rows, scores, matches and places, with no snippet; neighbours alike."""
    session, _ = corpus
    for sort in ("recency", "relevance"):
        kw = {"agent": "agent-a", "sort": sort, "limit": 20, "any_words": True}
        full = store.search.messages(query, **kw).hits
        bare = store.search.messages(query, snippets=False, **kw).hits
        assert full and [replace(h, snippet="") for h in full] == bare
        assert any(h.snippet for h in full) and not any(h.snippet for h in bare)
        # Asked with their neighbours (auto-recall): the same hits, and for each any-word hit
        # the neighbours adjacent_messages gives, read in the same statement.
        alone = store.search.messages(query, snippets=False, every_word_first=False, **kw)
        paired = store.search.messages(query, snippets=False, every_word_first=False, neighbours=True, **kw)
        some = [h.id for h in alone.hits if h.match == "any"]
        assert paired.hits == alone.hits and paired.adjacent is not None and alone.adjacent is None
        # One group (a word, an OR of words): its own search, so no any-word hits.
        assert some or any_words(parse_query(query)) is None
        assert paired.adjacent == store.search.adjacent_messages(query, some, agent="agent-a", snippets=False)
        assert store.search.messages(query, neighbours=True, **kw).adjacent is None  # with snippets: apart
    # The session's ends, a message alone in its session, another agent's, one that does not exist.
    alone = append_messages(store, store.sessions.get_or_create("agent-a", "alone").id,
                            [{"role": "user", "content": "only me"}]).store_ids[0]
    theirs = append_messages(store, store.sessions.get_or_create("agent-b", "s").id,
                             [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]).store_ids
    ids = [h.id for h in full] + [corpus[1][0], corpus[1][-1], alone, *theirs, 10**9]
    near_full = store.search.adjacent_messages(query, ids, agent="agent-a")
    near_bare = store.search.adjacent_messages(query, ids, agent="agent-a", snippets=False)
    assert near_full.keys() == near_bare.keys()
    assert near_bare[alone] == (None, None) and near_bare[corpus[1][0]][0] is None
    assert near_bare[corpus[1][-1]][1] is None and not {*theirs, 10**9} & near_bare.keys()
    for key, pair in near_full.items():
        assert [None if h is None else replace(h, snippet="") for h in pair] == list(near_bare[key])


def test_other_forms_of_words_are_found_only_in_the_scope_and_the_time_window(store, session):
    """The any-word part's stemmed lookups: without a filter PostgreSQL answers them from the
    stems side table alone (the scope is in its vector), with a time filter it reads the rows
    too; either way another agent's rows and rows outside the window are left out."""
    other = store.sessions.get_or_create("agent-b", "s")
    msgs = [{"role": "user", "content": f"the otters escaped again item{i}", "timestamp": 1_000 + i}
            for i in range(10)]
    ids = append_messages(store, session.id, msgs).store_ids
    append_messages(store, other.id, msgs)
    query = "otter escaping"  # neither word as written: found by their stems
    everywhere = store.search.messages(query, agent="agent-a", any_words=True, limit=50).hits
    assert {h.id for h in everywhere} == set(ids)
    window = store.search.messages(query, agent="agent-a", any_words=True, limit=50,
                                   time_from=1_003, time_to=1_006).hits
    assert {h.id for h in window} == set(ids[3:7])


def test_messages_at_finds_each_place_that_exists_once(store):
    """The neighbouring turns' lookup (and the explorer's last message per session): more
    places than one statement holds, a place asked twice, places that do not exist."""
    a = store.sessions.get_or_create("agent-a", "one")
    b = store.sessions.get_or_create("agent-a", "two")
    in_a = append_messages(store, a.id, [{"role": "user", "content": f"m{i}"} for i in range(70)]).store_ids
    in_b = append_messages(store, b.id, [{"role": "user", "content": f"n{i}"} for i in range(3)]).store_ids
    places = [(a.id, seq) for seq in range(1, 71)] + [(a.id, 5), (b.id, 2), (b.id, 99), (10**9, 1)]
    with store.engine.connect() as conn:
        rows = store.backend.messages_at(conn, places)
        assert store.backend.messages_at(conn, []) == []
    assert sorted(r.id for r in rows) == sorted([*in_a, in_b[1]])
    assert {(r.session_id, r.seq) for r in rows} == {*((a.id, seq) for seq in range(1, 71)), (b.id, 2)}
    assert all(isinstance(r.ts, float) for r in rows)


def test_role_time_and_platform_filters(store, session):
    msgs = [{"role": "user" if i % 2 else "assistant", "content": f"shared word item{i}",
             "timestamp": 1_000 + i} for i in range(20)]
    ids = append_messages(store, session.id, msgs).store_ids
    users = store.search.messages("shared", agent="agent-a", roles=["user"], limit=50).hits
    assert [h.id for h in users] == [ids[i] for i in range(19, 0, -2)]
    window = store.search.messages("shared", agent="agent-a", time_from=1_005, time_to=1_009, limit=50).hits
    assert [h.id for h in window] == [ids[i] for i in range(9, 4, -1)]
    both = store.search.messages("shared", agent="agent-a", roles=["assistant"], time_from=1_010, limit=50)
    assert [h.id for h in both.hits] == [ids[i] for i in range(18, 9, -2)]
    assert store.search.messages("shared", agent="agent-a", platform="cli").hits
    assert store.search.messages("shared", agent="agent-a", platform="telegram").hits == []


def test_scope_current_session_versus_all_sessions(store, session):
    other = store.sessions.get_or_create("agent-a", "session-2", platform="telegram")
    a = append_messages(store, session.id, [{"role": "user", "content": "zebra one"}]).store_ids
    b = append_messages(store, other.id, [{"role": "user", "content": "zebra two"}]).store_ids
    assert [h.id for h in store.search.messages("zebra", agent="agent-a", session_pk=session.id).hits] == list(a)
    assert [h.id for h in store.search.messages("zebra", agent="agent-a").hits] == [b[0], a[0]]
    assert [h.session_key for h in store.search.messages("zebra", agent="agent-a").hits] == ["session-2", "session-1"]


def test_agents_never_see_each_other(store):
    mine = store.sessions.get_or_create("agent-a", "s")
    theirs = store.sessions.get_or_create("agent-b", "s")
    append_messages(store, mine.id, [{"role": "user", "content": "platypus mine"}])
    append_messages(store, theirs.id, [{"role": "user", "content": "platypus theirs"}])
    hits = store.search.messages("platypus", agent="agent-a", limit=200).hits
    assert [h.snippet for h in hits] == ["**platypus** mine"]
    with pytest.raises(NotFoundError):  # another agent's session id, guessed
        store.search.messages("platypus", agent="agent-a", session_pk=theirs.id)
    assert store.search.messages("platypus", agent="nobody").hits == []


def test_a_scope_alone_in_its_id_range_is_searched_without_its_token_and_stays_its_own(store):
    """Whether an agent's or a session's rows fill their id range (and SQLite then scopes by
    the range alone) or not, a search returns that scope's rows only: after another agent
    wrote (not alone), before it (alone), and with session counters made wrong on purpose
    (the hits are read back within the scope)."""
    mine = store.sessions.get_or_create("agent-a", "s1")
    other_session = store.sessions.get_or_create("agent-a", "s2")
    theirs = store.sessions.get_or_create("agent-b", "s")
    first = append_messages(store, mine.id, [{"role": "user", "content": f"okapi mine {i}"} for i in range(3)])
    assert [h.id for h in store.search.messages("okapi", agent="agent-a", limit=50).hits] == \
        list(reversed(first.store_ids))
    append_messages(store, theirs.id, [{"role": "user", "content": "okapi theirs"}])
    second = append_messages(store, other_session.id, [{"role": "user", "content": "okapi mine again"}])
    for sort in ("recency", "relevance"):
        got = store.search.messages("okapi", agent="agent-a", sort=sort, limit=50, any_words=True).hits
        assert sorted(h.id for h in got) == sorted([*first.store_ids, *second.store_ids])
        in_session = store.search.messages("okapi", agent="agent-a", session_pk=mine.id, sort=sort, limit=50).hits
        assert sorted(h.id for h in in_session) == sorted(first.store_ids)
    with store.engine.begin() as conn:  # agent-a's counters now add up to its id range: "alone"
        conn.exec_driver_sql(f"UPDATE lcm_sessions SET message_count = 4 WHERE id = {mine.id}")
    got = store.search.messages("okapi", agent="agent-a", limit=50).hits
    assert "theirs" not in " ".join(h.snippet for h in got)
    assert {h.id for h in got} <= {*first.store_ids, *second.store_ids}
    in_session = store.search.messages("okapi", agent="agent-a", session_pk=mine.id, limit=50).hits
    assert {h.id for h in in_session} <= set(first.store_ids)


def test_sorts(store, session):
    msgs = [
        {"role": "user", "content": "kiwi"},
        {"role": "user", "content": "kiwi kiwi kiwi kiwi kiwi banana"},
        {"role": "user", "content": "apple with one kiwi among many other words here " * 3},
    ]
    ids = append_messages(store, session.id, msgs).store_ids
    recency = [h.id for h in store.search.messages("kiwi", agent="agent-a").hits]
    assert recency == [ids[2], ids[1], ids[0]]
    relevance = store.search.messages("kiwi", agent="agent-a", sort="relevance").hits
    # BM25 over the window (SQLite) and ts_rank_cd (PostgreSQL) order the weaker matches differently; both put
    # the document dense with the term first and give every hit a score.
    assert relevance[0].id == ids[1] and sorted(h.id for h in relevance) == sorted(ids)
    assert all(h.score is not None for h in relevance)
    assert [h.score for h in relevance] == sorted((h.score for h in relevance), reverse=True)
    hybrid = [h.id for h in store.search.messages("kiwi", agent="agent-a", sort="hybrid").hits]
    assert sorted(hybrid) == sorted(ids)


@pytest.mark.parametrize("kwargs", [
    {"limit": 0}, {"limit": MAX_SEARCH_LIMIT + 1}, {"limit": "5"}, {"limit": True},
    {"sort": "newest"},
])
def test_bad_search_arguments(store, session, kwargs):
    with pytest.raises(ValueError):
        store.search.messages("x", agent="agent-a", **kwargs)


def test_limit_is_honoured_and_recency_is_exact_at_scale(store, session):
    msgs = [{"role": "user", "content": f"common word number {i}"} for i in range(500)]
    ids = append_messages(store, session.id, msgs).store_ids
    hits = store.search.messages("common", agent="agent-a", limit=MAX_SEARCH_LIMIT).hits
    assert [h.id for h in hits] == list(reversed(ids))[:MAX_SEARCH_LIMIT]
    assert [h.id for h in store.search.messages("number 137", agent="agent-a").hits] == [ids[137]]


@pytest.fixture
def tiny_windows(monkeypatch):
    """Shrink PostgreSQL's probe window so its GIN phase runs on small data (SQLite's
    streaming FTS5 search has no phases; these tests then repeat the SQLite results)."""
    import lcm.backends.pg_search as pg

    monkeypatch.setattr(pg, "PROBE_ROWS", 2)
    monkeypatch.setattr(pg, "PHASE2_MAX_MATCHES", 10**9)
    monkeypatch.setattr(pg, "GIN_DIRECT_MAX", -1)  # never phase 0, even if autovacuum analyzed
    monkeypatch.setattr(pg, "SCOPE_SCAN_MAX", -1)  # never phase S: these scopes are all small


@pytest.fixture
def gin_direct(store, monkeypatch):
    """Statistics collected and every query rare enough for PostgreSQL's phase 0 (the GIN index
    at once); SQLite has no phases and repeats its results."""
    import lcm.backends.pg_search as pg

    monkeypatch.setattr(pg, "GIN_DIRECT_MAX", 10**9)
    monkeypatch.setattr(pg, "SCOPE_SCAN_MAX", -1)

    def analyzed() -> None:
        store.health.optimize()
        if store.backend.name == "postgresql":
            with store.engine.connect() as conn:
                assert store.backend._searches._lexeme_stats(conn, "lcm_messages") is not None

    return analyzed


@pytest.fixture
def scope_first(monkeypatch):
    """The paths a big store takes for a small scope: PostgreSQL reads every row of the scope
    (phase S) whatever the statistics say, and SQLite ranks every window itself (window_rank)
    instead of with bm25(); both within the scope's id range."""
    import lcm.backends.pg_search as pg
    from lcm.backends import window_rank

    monkeypatch.setattr(pg, "SCAN_ROW_COST", 0.0)
    monkeypatch.setattr(window_rank, "NATIVE_RANK_MAX_ROWS", 0)


@pytest.mark.parametrize("extent_sessions", [256, 1], ids=["id-range", "no-id-range"])
def test_filters_and_scopes_through_the_scope_phase(store, scope_first, monkeypatch, extent_sessions):
    """Interleaved sessions and agents: a scope's id range holds other scopes' rows, which its
    search must skip; filters and roles apply; a ranked search over more matches than it ranks
    says so. (SQLite: an agent of more sessions than EXTENT_SESSIONS is searched without a range.)"""
    import lcm.backends.sqlite_search as sqlite_search

    monkeypatch.setattr(sqlite_search, "EXTENT_SESSIONS", extent_sessions)
    mine = [store.sessions.get_or_create("agent-a", f"s{i}") for i in range(2)]
    theirs = store.sessions.get_or_create("agent-b", "s0")
    ids: dict[int, list[int]] = {s.id: [] for s in (*mine, theirs)}
    for i in range(12):
        for s in (*mine, theirs):
            ids[s.id] += append_messages(store, s.id, [
                {"role": "user" if i % 2 else "assistant", "content": f"shared word item{i}",
                 "timestamp": 1_000 + i}], after_identity=str(i)).store_ids
    first = mine[0].id
    got = store.search.messages("shared", agent="agent-a", session_pk=first, limit=50).hits
    assert [h.id for h in got] == list(reversed(ids[first]))
    everywhere = store.search.messages("shared", agent="agent-a", limit=50).hits
    assert sorted(h.id for h in everywhere) == sorted(ids[mine[0].id] + ids[mine[1].id])
    window = store.search.messages("shared", agent="agent-a", session_pk=first, time_from=1_005,
                                   time_to=1_009, roles=["user"], limit=50).hits
    assert [h.id for h in window] == [ids[first][i] for i in (9, 7, 5)]
    ranked = store.search.messages("item3 shared", agent="agent-a", sort="relevance", limit=5)
    assert sorted(h.id for h in ranked.hits) == sorted([ids[mine[0].id][3], ids[mine[1].id][3]])
    assert not ranked.candidates_clamped
    many = append_messages(store, first, [{"role": "user", "content": f"plenty {i}"} for i in range(1_001)],
                           after_identity="many").store_ids
    clamped = store.search.messages("plenty", agent="agent-a", session_pk=first, sort="relevance", limit=3)
    assert clamped.candidates_clamped and {h.id for h in clamped.hits} <= set(many)
    assert not store.search.messages("plenty", agent="agent-b", limit=3).hits


@pytest.mark.parametrize("path", ["scope_first", "tiny_windows", "gin_direct"])
@pytest.mark.parametrize("query,expected", PARITY, ids=[q for q, _ in PARITY])
def test_parity_table_through_each_search_path(store, corpus, request, path, query, expected):
    """The same answers whichever path a search takes (each fixture forces one)."""
    session, ids = corpus
    forced = request.getfixturevalue(path)
    if path == "gin_direct":
        forced()  # statistics collected for the stored corpus
    for scope in (session.id, None):
        got = [h.id for h in store.search.messages(query, agent="agent-a", session_pk=scope, limit=50).hits]
        assert got == [ids[i] for i in expected]
        ranked = store.search.messages(query, agent="agent-a", session_pk=scope, sort="relevance", limit=50)
        assert sorted(h.id for h in ranked.hits) == sorted(ids[i] for i in expected)


def test_filters_and_limits_through_the_direct_index_phase(store, session, gin_direct):
    msgs = [{"role": "user" if i % 2 else "assistant", "content": f"shared word item{i}",
             "timestamp": 1_000 + i} for i in range(20)]
    ids = append_messages(store, session.id, msgs).store_ids
    gin_direct()
    window = store.search.messages("shared", agent="agent-a", time_from=1_005, time_to=1_009, limit=50).hits
    assert [h.id for h in window] == [ids[i] for i in range(9, 4, -1)]
    users = store.search.messages("shared", agent="agent-a", roles=["user"], time_to=1_006, limit=50).hits
    assert [h.id for h in users] == [ids[i] for i in (5, 3, 1)]
    newest = store.search.messages("shared", agent="agent-a", limit=3)
    assert [h.id for h in newest.hits] == [ids[19], ids[18], ids[17]]
    assert store.search.messages("item7", agent="agent-a", session_pk=session.id).hits[0].id == ids[7]


def test_filters_through_the_index_phase(store, session, tiny_windows):
    msgs = [{"role": "user" if i % 2 else "assistant", "content": f"shared word item{i}",
             "timestamp": 1_000 + i} for i in range(20)]
    ids = append_messages(store, session.id, msgs).store_ids
    window = store.search.messages("shared", agent="agent-a", time_from=1_005, time_to=1_009, limit=50).hits
    assert [h.id for h in window] == [ids[i] for i in range(9, 4, -1)]
    users = store.search.messages("shared", agent="agent-a", roles=["user"], time_to=1_006, limit=50).hits
    assert [h.id for h in users] == [ids[i] for i in (5, 3, 1)]


@pytest.mark.postgres
def test_postgres_ranked_search_of_a_common_word_is_bounded_and_says_so(pg_url, monkeypatch):
    import lcm.backends.pg_search as pg
    from lcm.store import Store

    monkeypatch.setattr(pg, "PROBE_ROWS", 10)
    monkeypatch.setattr(pg, "PHASE2_MAX_MATCHES", 5)
    monkeypatch.setattr(pg, "GIN_DIRECT_MAX", -1)
    monkeypatch.setattr(pg, "SCOPE_SCAN_MAX", -1)  # the phases a big scope takes
    store = Store.open(pg_url, upgrade=True)
    s = store.sessions.get_or_create("agent-a", "s")
    append_messages(store, s.id, [{"role": "user", "content": f"common {i}"} for i in range(100)])
    ranked = store.search.messages("common", agent="agent-a", sort="relevance", limit=50)
    assert ranked.candidates_clamped and len(ranked.hits) == 10
    recency = store.search.messages("common", agent="agent-a", limit=50)
    assert len(recency.hits) == 50 and not recency.candidates_clamped
    assert store.search.messages("42", agent="agent-a").hits[0].snippet == "common **42**"


@pytest.mark.postgres
def test_postgres_leaves_the_agent_lexeme_out_only_while_the_agent_is_alone(pg_url, monkeypatch):
    """An agent alone in the store is searched without its scope lexeme (GIN would intersect
    every word with all of the table's rows); once another agent has a message, or row-level
    security is on, the lexeme is back. Whatever the check says, no other agent's row is
    returned: a check that raced another agent's first write ("alone" while it is not) costs
    candidates that are dropped when the hits are read back within the agent."""
    from sqlalchemy import event

    import lcm.backends.pg_search as pg
    from lcm.store import Store

    store = Store.open(pg_url, upgrade=True)
    mine = store.sessions.get_or_create("agent-a", "s")
    ids = append_messages(store, mine.id, [{"role": "user", "content": f"wombat burrow {i}"} for i in range(5)]
                          + [{"role": "assistant", "content": "burrows of a wombat"}]).store_ids
    agent_pk = mine.agent_pk
    queries: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _seen(conn, cursor, statement, parameters, context, executemany):
        if isinstance(parameters, dict) and isinstance(parameters.get("q"), str):
            queries.append(parameters["q"])

    def search(**kwargs):
        queries.clear()
        return store.search.messages("wombat burrow", agent="agent-a", limit=50, **kwargs)

    alone = search(sort="relevance", any_words=True)
    assert {h.id for h in alone.hits} == set(ids)
    assert queries and not any(f"§a{agent_pk}" in q for q in queries)
    in_session = search(session_pk=mine.id)
    assert {h.id for h in in_session.hits} == set(ids[:5])
    assert all(f"§s{mine.id}" in q for q in queries)

    theirs = store.sessions.get_or_create("agent-b", "s")
    append_messages(store, theirs.id, [{"role": "user", "content": "wombat burrow theirs"}])
    for sort in ("recency", "relevance"):
        got = search(sort=sort, any_words=True)
        assert {h.id for h in got.hits} == set(ids)
        assert queries and all(f"§a{agent_pk}" in q for q in queries)

    monkeypatch.setattr(pg.PgSearch, "agent_alone", staticmethod(lambda conn, spec, base: True))  # the race
    for sort in ("recency", "relevance"):
        got = search(sort=sort, any_words=True)
        assert {h.id for h in got.hits} <= set(ids) and "theirs" not in " ".join(h.snippet for h in got.hits)
    monkeypatch.undo()

    with store.engine.begin() as conn:  # agent-b gone, row-level security on: the lexeme stays
        conn.exec_driver_sql(f"DELETE FROM lcm_message_stems WHERE agent_id <> {agent_pk}")
        conn.exec_driver_sql(f"DELETE FROM lcm_messages WHERE agent_id <> {agent_pk}")
        conn.exec_driver_sql("ALTER TABLE lcm_messages ENABLE ROW LEVEL SECURITY")
    assert {h.id for h in search(sort="relevance", any_words=True).hits} == set(ids)
    assert queries and all(f"§a{agent_pk}" in q for q in queries)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE lcm_messages DISABLE ROW LEVEL SECURITY")
    search()
    assert queries and not any(f"§a{agent_pk}" in q for q in queries)


@pytest.mark.postgres
def test_postgres_answers_many_lookups_at_once_as_it_answers_each(pg_url, monkeypatch):
    """``search_messages_many`` (the any-word part's words alone, at once) gives what
    ``search_messages`` gives for each spec: the plain GIN lookups in one statement, whatever
    else (a ranked search, a filtered one, a stop word's stems, a phrase) one by one."""
    import lcm.backends.pg_search as pg
    from lcm.backends import SearchSpec
    from lcm.store import Store
    from lcm.textindex import parse_query

    store = Store.open(pg_url, upgrade=True)
    mine = store.sessions.get_or_create("agent-a", "s")
    words = ["wombat", "burrow", "eucalyptus", "koala", "the", "nothingmatches"]
    append_messages(store, mine.id, [{"role": "user", "content": f"the {w} {i} burrowing wombats"}
                                     for i in range(40) for w in words[:4] if i % (words.index(w) + 1) == 0])
    theirs = store.sessions.get_or_create("agent-b", "s")
    append_messages(store, theirs.id, [{"role": "user", "content": "wombat burrow koala theirs"}])
    statements: list[str] = []
    real = pg.driver_rows

    def counted(conn, sql, params):
        statements.append(sql)
        return real(conn, sql, params)

    monkeypatch.setattr(pg, "driver_rows", counted)
    specs = []
    for w in words:
        for stemmed in (False, True):
            specs.append(SearchSpec(query=parse_query(w), agent_pk=mine.agent_pk, session_pk=None, ranked=False,
                                    limit=7, stemmed=stemmed))
    specs.append(SearchSpec(query=parse_query("wombat burrow"), agent_pk=mine.agent_pk, session_pk=None,
                            ranked=True, limit=5))
    specs.append(SearchSpec(query=parse_query('"the wombat"'), agent_pk=mine.agent_pk, session_pk=mine.id,
                            ranked=False, limit=50, time_from=0.0))
    backend = store._core.backend
    store.search.catch_up()  # the stems are written after the turn (revision 0012)
    with store.engine.connect() as conn:
        one_by_one = [backend.search_messages(conn, spec) for spec in specs]
        statements.clear()
        at_once = backend.search_messages_many(conn, specs)
    assert at_once == one_by_one
    [batched] = [sql for sql in statements if "AS u(k, q, need)" in sql]
    # Its text does not depend on how many words it looks up (so the server plans it once).
    with store.engine.connect() as conn:
        statements.clear()
        fewer = backend.search_messages_many(conn, specs[:6])
    assert fewer == one_by_one[:6] and [sql for sql in statements if "AS u(k, q, need)" in sql] == [batched]
    # A single lookup takes the same statement; the ids alone are the candidates' ids.
    with store.engine.connect() as conn:
        statements.clear()
        assert backend.search_messages_many(conn, specs[1:2]) == one_by_one[1:2]
        assert statements == [batched]
        ids = backend.newest_ids_many(conn, "messages", specs)
    assert ids == [[c.id for c in found] for found, _ in one_by_one]
    stemmed = [found for (found, _), spec in zip(at_once, specs, strict=True) if spec.stemmed]
    assert all(stemmed[:4]) and not any(stemmed[4:])  # four words' forms; "the" and no match: none
    for found in stemmed[:4]:  # capped at the limit, newest first
        assert len(found) == 7 and [c.id for c in found] == sorted((c.id for c in found), reverse=True)


def test_postgres_learns_a_searchs_scope_with_its_newest_id_as_each_statement_says(pg_url):
    """``PgSearch.newest_id`` answers, in one statement, what a search's phases would ask one
    by one: the newest id, the scope's rows, whether the agent is alone (agent-wide). Each must
    be what its own statement says, for an agent alone, one beside another, and a session."""
    from lcm.backends import SearchSpec
    from lcm.backends.pg_search import _AGENT_ALONE, PgSearch
    from lcm.store import Store
    from lcm.textindex import parse_query

    store = Store.open(pg_url, upgrade=True)
    mine = store.sessions.get_or_create("agent-a", "s")
    append_messages(store, mine.id, [{"role": "user", "content": f"wombat {i}"} for i in range(5)])
    other_session = store.sessions.get_or_create("agent-a", "t")
    append_messages(store, other_session.id, [{"role": "user", "content": "koala"}])

    def spec(session_pk):
        return SearchSpec(query=parse_query("wombat"), agent_pk=mine.agent_pk, session_pk=session_pk)

    def each_alone(session_pk):
        with store.engine.connect() as conn:
            s = spec(session_pk)
            alone = None if session_pk is not None else bool(conn.execute(_AGENT_ALONE, {"aid": s.agent_pk}).scalar())
            return s.newest_id(conn, "lcm_messages"), PgSearch._scope_rows(conn, "lcm_messages", s), alone

    def at_once(session_pk):
        with store.engine.connect() as conn:
            s = spec(session_pk)
            newest = PgSearch.newest_id(conn, s, "lcm_messages")
            memo = s.scope_memo
            return newest, memo[("rows", "lcm_messages", s.agent_pk, session_pk)], memo.get(("agent_alone", s.agent_pk))

    assert at_once(None) == each_alone(None) == (each_alone(None)[0], 6, True)
    assert at_once(mine.id) == each_alone(mine.id) == (each_alone(None)[0], 5, None)
    theirs = store.sessions.get_or_create("agent-b", "s")
    append_messages(store, theirs.id, [{"role": "user", "content": "wombat theirs"}])
    assert at_once(None) == each_alone(None) == (each_alone(None)[0], 6, False)


def test_agent_wide_search_finds_old_rows_among_many_sessions(store, tiny_windows):
    """Regression: the agent-wide window must be the newest rows by store order, not by seq."""
    sessions = [store.sessions.get_or_create("agent-a", f"s{i}") for i in range(3)]
    for round_ in range(4):
        for i, s in enumerate(sessions):
            append_messages(store, s.id, [{"role": "user", "content": f"r{round_} s{i} filler"}],
                                  after_identity=f"{round_}")
    old = append_messages(store, sessions[0].id, [{"role": "user", "content": "ancient marker"}],
                                after_identity="x").store_ids[0]
    for s in sessions[1:]:
        append_messages(store, s.id, [{"role": "user", "content": f"late {s.id}"} for _ in range(5)],
                              after_identity="y")
    assert [h.id for h in store.search.messages("ancient", agent="agent-a").hits] == [old]
    assert len(store.search.messages("filler", agent="agent-a", limit=50).hits) == 12


def test_lexeme_statistics_estimate_matches():
    """PostgreSQL's phase-0 decision: a phrase is as rare as its rarest word, an OR group adds
    up, AND groups multiply, a prefix is unknown."""
    from lcm.backends.pg_text import LexemeStats, estimated_matches
    from lcm.textindex import parse_query

    stats = LexemeStats({"common": 0.6, "mid": 0.01, "other": 0.02, "§a1": 0.5, "§s7": 0.01},
                        floor=0.002, rows=1_000_000)
    assert estimated_matches(parse_query("common"), [], stats) == pytest.approx(600_000)
    assert estimated_matches(parse_query("common"), ["a1"], stats) == pytest.approx(300_000)
    assert estimated_matches(parse_query("common"), ["s7"], stats) == pytest.approx(6_000)
    assert estimated_matches(parse_query("mid other"), [], stats) == pytest.approx(200)
    assert estimated_matches(parse_query("mid OR other"), [], stats) == pytest.approx(30_000)
    # Not listed: half the least common listed frequency (at most PostgreSQL's 0.5% default).
    assert estimated_matches(parse_query('"common needle"'), [], stats) == pytest.approx(1_000)
    assert estimated_matches(parse_query("needle"), ["s99"], stats) == pytest.approx(1)
    assert estimated_matches(parse_query("comm*"), [], stats) is None
    assert estimated_matches(parse_query("common"), [], None) is None


def test_gin_postings_count_every_list_the_index_reads():
    """PostgreSQL's phase-S decision: GIN reads each query word's whole posting list and the
    scope lexeme's, however few rows have them all; a prefix is unknown."""
    from lcm.backends.pg_text import LexemeStats, gin_postings
    from lcm.textindex import parse_query

    stats = LexemeStats({"common": 0.3, "mid": 0.01, "other": 0.02, "§a1": 0.001},
                        floor=0.002, rows=10_000_000)
    assert gin_postings(parse_query("mid other"), ["a1"], stats) == pytest.approx(310_000)
    assert gin_postings(parse_query("common"), [], stats) == pytest.approx(3_000_000)
    assert gin_postings(parse_query('"mid other" -common'), [], stats) == pytest.approx(3_300_000)
    assert gin_postings(parse_query("needle"), ["a1"], stats) == pytest.approx(20_000)
    assert gin_postings(parse_query("mi*"), [], stats) is None
    assert gin_postings(parse_query("mid"), [], None) is None


# ----------------------------------------------------------------- SQLite's batched message index


def test_a_stored_message_is_found_by_the_next_search_before_its_batch_is_indexed(store, monkeypatch):
    """Derived index data waits for a catch-up: SQLite indexes messages in batches (revision
    0010), PostgreSQL stems them after the turn (0012; its exact vector comes with the row). A
    turn leaves its rows pending, and the next search catches them up first, so it never misses
    one, by exact words or by other forms of them."""
    if store.background is not None:
        store.background._batch = 10**9  # this test catches up by searching
        store.background._idle_s = 3600
    s = store.sessions.get_or_create("agent", "s")
    ids = append_messages(store, s.id, [{"role": "user", "content": "the capybara escaped"},
                                        {"role": "assistant", "content": "find the capybara"}]).store_ids
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 2
    found = store.search.messages("capybaras escaping at night", agent="agent", any_words=True).hits
    assert {h.id for h in found} == set(ids)  # by stems: neither row has "capybaras" or "escaping"
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 0
    assert {h.id for h in store.search.messages("capybara", agent="agent").hits} == set(ids)


def test_a_search_for_a_held_session_writes_nothing_when_only_that_sessions_stems_wait(store, monkeypatch):
    """Auto-recall holds its own session's newest messages in the context: its search does not
    stop to stem them where a waiting message is still found by its exact words (PostgreSQL),
    nor a few that other conversations have just stored (``FRESH_PENDING_TOLERATED``: the
    background catch-up stems them within a second). A backlog bigger than that is caught up
    first, all of it. On SQLite a waiting message is not found at all: it is indexed first,
    except the held session's own newest ones (the caller leaves them out of what it finds).
    A compacted message (not in the context verbatim) is indexed or stemmed first unless it is
    one of those few. Either way the search finds every stored message it may return."""
    import lcm.store.search as search_module

    if store.background is not None:
        store.background._batch = 10**9  # only the searches below catch up
        store.background._idle_s = 3600
    postgres = store.backend.name == "postgresql"
    held = store.sessions.get_or_create("agent", "held")
    other = store.sessions.get_or_create("agent", "other")
    mine = append_messages(store, held.id, [{"role": "user", "content": "the capybara escaped"}])
    theirs = append_messages(store, other.id, [{"role": "user", "content": "a capybara slept"}]).store_ids
    # another session's message waits: found by its exact words, its stems left to the background
    found = store.search.messages("capybara slept", agent="agent", any_words=True, held_session=held.id).hits
    assert {h.id for h in found} == {*mine.store_ids, *theirs}
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == (2 if postgres else 0)
    # more waiting than a held search leaves: the catch-up runs (and stems the held one's too)
    monkeypatch.setattr(search_module, "FRESH_PENDING_TOLERATED", 0)
    found = store.search.messages("sleeping capybaras", agent="agent", any_words=True, held_session=held.id).hits
    assert {h.id for h in found} == {*mine.store_ids, *theirs}  # by stems
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 0
    newer = append_messages(store, held.id, [{"role": "user", "content": "the capybara came back"}],
                            after_identity=mine.last_identity).store_ids
    found = {h.id for h in store.search.messages("capybara", agent="agent", held_session=held.id).hits}
    if postgres:  # only its stems wait: found by its exact word
        assert set(newer) <= found
    else:  # SQLite: not indexed yet, and not indexed for a caller that holds it in its context
        assert not set(newer) & found
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 1
        assert store.backend.pending_index(conn, except_session=held.id) == 0
    if not postgres:  # a search that holds nothing indexes it first, and finds it
        assert set(newer) <= {h.id for h in store.search.messages("capybara", agent="agent").hits}
        with store.engine.connect() as conn:
            assert store.backend.pending_index(conn) == 0
        newer = append_messages(store, held.id, [{"role": "user", "content": "the capybara hid again"}],
                                after_identity=store.messages.get_range(held.id)[-1].identity).store_ids
    # once compaction covers a waiting message, it is not in the context verbatim any more:
    # the held search stems it first (a conversation played faster than the background stemmer)
    with store.engine.connect().execution_options(lcm_write=True) as conn, conn.begin():
        conn.execute(text("UPDATE lcm_sessions SET covered_seq = last_seq WHERE id = :s"), {"s": held.id})
    found = store.search.messages("capybaras returning", agent="agent", any_words=True, held_session=held.id).hits
    assert set(newer) <= {h.id for h in found}
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 0


def test_postgres_stems_in_the_background_and_keeps_the_watermark_exact(pg_url):
    """The background catch-up stems what turns leave behind without any search; a forget that
    renumbers a session keeps every message below the watermark stemmed (the doctor agrees)."""
    from lcm.store import Store

    store = Store.open(pg_url, upgrade=True)
    assert store.background is not None
    s = store.sessions.get_or_create("agent", "s")
    after = None
    for i in range(5):
        after = append_messages(store, s.id, [{"role": "user", "content": f"walrus report {i}"},
                                              {"role": "assistant", "content": f"noted {i}"}],
                                after_identity=after).last_identity
    assert store.background.wait_idle(30)
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM lcm_message_stems").scalar_one() == 10
    store.background._batch, store.background._idle_s = 10**9, 3600  # the rest stays pending
    append_messages(store, s.id, [{"role": "user", "content": "the tardy walruses"}], after_identity=after)
    with store.engine.connect().execution_options(lcm_write=True) as conn, conn.begin():
        conn.exec_driver_sql(f"DELETE FROM lcm_messages WHERE session_id = {s.id} AND seq <= 4")
        conn.exec_driver_sql(f"UPDATE lcm_messages SET seq = -seq WHERE session_id = {s.id}")  # as forget does
        conn.exec_driver_sql(f"UPDATE lcm_messages SET seq = -seq - 4 WHERE session_id = {s.id}")
        conn.exec_driver_sql(f"UPDATE lcm_sessions SET last_seq = last_seq - 4, message_count = message_count - 4 "
                             f"WHERE id = {s.id}")
        row = conn.exec_driver_sql(f"SELECT last_seq, stemmed_seq FROM lcm_sessions WHERE id = {s.id}").one()
    assert tuple(row) == (7, 6)  # the one unstemmed message is still above the watermark
    # Only the stemmed index knows "tardiness" and "sealions" for the message with "tardy".
    hits = store.search.messages("tardiness sealions", agent="agent", any_words=True).hits
    assert [h.snippet for h in hits] == ["the **tardy** walruses"] and hits[0].match == "any"
    checks = {c.name: c for c in store.health.checks(deep=True)}
    assert checks["search_index_messages"].status == "ok", checks["search_index_messages"]


def test_postgres_catch_ups_take_turns_instead_of_deadlocking(pg_url):
    """Every agent process stems in the background; two catch-ups at once inserted overlapping
    message ids in different orders and deadlocked (met with two bulk loaders in a minute). One
    catch-up stems at a time: a second waits for the first's transaction, then finds only what
    is left, and both succeed."""
    import threading

    from lcm.backends.postgres import STEM_LOCK_KEY
    from lcm.store import Store

    store = Store.open(pg_url, upgrade=True)
    store.background._batch, store.background._idle_s = 10**9, 3600  # only the catch-ups below stem
    sessions = [store.sessions.get_or_create("agent", f"s{n}") for n in range(4)]
    for turn in range(3):  # interleaved: each session's ids are spread between the others'
        for n, s in enumerate(sessions):
            append_messages(store, s.id, [{"role": "user", "content": f"otter {n} {turn} {i}"} for i in range(50)])
    holder = store.engine.connect()
    holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": STEM_LOCK_KEY})  # a catch-up in progress
    done: list[int] = []
    threads = [threading.Thread(target=lambda: done.append(store.search.catch_up())) for _ in range(2)]
    for t in threads:
        t.start()
    threads[0].join(1.0)
    assert not done, "a catch-up stemmed while another held the lock"
    holder.rollback()
    holder.close()
    for t in threads:
        t.join(30)
    assert done == [0, 0]
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM lcm_message_stems").scalar_one() == 600
        assert store.backend.pending_index(conn) == 0


def test_a_full_batch_is_indexed_by_the_write_that_fills_it(sqlite_url):
    from lcm.backends.sqlite import INDEX_BATCH
    from lcm.store import Store

    store = Store.open(sqlite_url)
    s = store.sessions.get_or_create("agent", "s")
    first = append_messages(store, s.id, [{"role": "user", "content": f"row {i}"} for i in range(INDEX_BATCH - 1)])
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == INDEX_BATCH - 1
    append_messages(store, s.id, [{"role": "user", "content": "the last of the batch"}],
                    after_identity=first.last_identity)
    with store.engine.connect() as conn:
        assert store.backend.pending_index(conn) == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM lcm_messages_stems_docsize").scalar_one() == INDEX_BATCH


def test_a_read_only_store_says_which_messages_its_search_could_not_see(sqlite_url):
    """``lcm ui`` writes nothing, not even the index backlog: its search reports the pending
    messages it could not search, and finds them once a writer's search indexed them."""
    from lcm.store import Store

    writer = Store.open(sqlite_url)
    reader = Store.open(sqlite_url, read_only=True)
    s = writer.sessions.get_or_create("agent", "s")
    [row] = append_messages(writer, s.id, [{"role": "user", "content": "the okapi sleeps"}]).store_ids
    seen = reader.search.messages("okapi", agent="agent")
    assert seen.hits == [] and any("newest 1 message stored since" in n for n in seen.notes)
    assert seen.unindexed == 1 and seen.unindexed_note in seen.notes  # what lcm_grep reports as degraded
    assert [h.id for h in writer.search.messages("okapi", agent="agent").hits] == [row]
    seen = reader.search.messages("okapi", agent="agent")
    assert [h.id for h in seen.hits] == [row] and not seen.notes


def test_a_scope_scan_reads_rows_until_it_has_enough_matches():
    """PostgreSQL's phase-S cost: a common word's newest matches are in the scope's newest rows
    (the scan stops early); sparse matches mean reading the whole scope; unknown means all."""
    from lcm.backends.pg_search import SCAN_ROW_COST, scanned_rows
    from lcm.backends.pg_text import LexemeStats, gin_postings
    from lcm.textindex import parse_query

    assert scanned_rows(10_000, 9_500, 1_001) == pytest.approx(1_053.7, rel=1e-3)
    assert scanned_rows(10_000, 25, 1_001) == scanned_rows(10_000, None, 11) == 10_000
    stats = LexemeStats({"common": 0.95, "mid": 0.03, "other": 0.03}, floor=0.0067, rows=9_000_000)
    # the commonest word in a 10k agent: about 1,050 rows read against 8.6M postings
    assert scanned_rows(10_000, 9_500, 1_001) * SCAN_ROW_COST < gin_postings(parse_query("common"), ["a1"], stats)
    # two mid words (25 matches in the agent): the whole agent read costs more than GIN's postings
    assert scanned_rows(10_000, 9, 1_001) * SCAN_ROW_COST > gin_postings(parse_query("mid other"), ["a1"], stats)


def test_the_any_word_search_alone_puts_a_row_with_every_word_first(store):
    """``every_word_first=False`` (auto-recall): no every-word search, only the any-word part,
    and a row with every word still leads it. Another agent's row with every word stays out."""
    mine = store.sessions.get_or_create("agent-a", "s")
    ids = append_messages(store, mine.id, [
        {"role": "user", "content": "the quokka enclosure needs a new gate"},
        {"role": "assistant", "content": "the enclosure gate at the quokka pen was replaced in May"},
        {"role": "user", "content": "what about the gate code"},
        {"role": "assistant", "content": "nothing related here at all"},
    ] + [{"role": "user", "content": f"filler message {i} about gates"} for i in range(6)]).store_ids
    theirs = store.sessions.get_or_create("agent-b", "s")
    append_messages(store, theirs.id, [{"role": "user", "content": "quokka enclosure gate replaced"}])

    both = store.search.messages("quokka enclosure gate replaced", agent="agent-a", sort="relevance",
                                 limit=5, any_words=True)
    alone = store.search.messages("quokka enclosure gate replaced", agent="agent-a", sort="relevance",
                                  limit=5, any_words=True, every_word_first=False)
    assert both.hits[0].id == alone.hits[0].id == ids[1]  # the one row with every word
    assert both.hits[0].match == "all" and {h.match for h in alone.hits} == {"any"}
    assert [h.id for h in alone.hits][:2] == [ids[1], ids[0]]  # then the row with three of them
    assert ids[3] not in {h.id for h in alone.hits}
    assert all(h.session_pk == mine.id for h in alone.hits)


def test_the_any_word_search_reads_a_common_words_newest_matches_up_to_term_matches(store):
    """``term_matches`` (auto-recall reads fewer than ``lcm_grep``): a word with more matches is
    common, and only its newest matches are read alone; an old row with it and a rarer word of
    the query is still found through their pair, at any age. Out of bounds: a clear error."""
    from lcm.store.search import ANY_TERM_MATCHES

    s = store.sessions.get_or_create("agent", "s")
    old = append_messages(store, s.id, [{"role": "user", "content": "the walrus sang about kelp"},
                                        {"role": "assistant", "content": "kelp drifting by itself"}]).store_ids
    append_messages(store, s.id, [{"role": "user", "content": f"kelp forest survey note {i}"} for i in range(30)])

    def found(**kw):
        return [h.id for h in store.search.messages("walrus kelp", agent="agent", sort="relevance", limit=50,
                                                    any_words=True, every_word_first=False, **kw).hits]

    capped = found(term_matches=10)
    assert capped[0] == old[0]  # walrus and kelp: through the pair, however old
    assert old[1] not in capped  # kelp alone, older than its newest 10 matches
    everything = found()  # lcm_grep's default reads all 32 kelp rows
    assert everything[0] == old[0] and old[1] in everything
    for bad in (0, ANY_TERM_MATCHES + 1):
        with pytest.raises(ValueError, match="term_matches"):
            found(term_matches=bad)


def test_word_lookups_at_once_are_the_lookups_one_by_one(store):
    """The any-word part's lookups go to the database together (``Backend.newest_ids_many``:
    one statement on SQLite, the GIN branches of one on PostgreSQL): each answer must be what
    that lookup alone returns, newest first and capped, in an agent's scope and in a session's,
    exact and stemmed, for words common, rare, absent and negated, with another agent's rows
    beside them."""
    from lcm.backends import SearchSpec
    from lcm.textindex import Query, parse_query

    mine = [store.sessions.get_or_create("agent-a", f"s{i}") for i in range(2)]
    theirs = store.sessions.get_or_create("agent-b", "s")
    words = ["otter", "otters", "kelp", "harbour", "tide", "moved", "moving"]
    for n, session in enumerate([*mine, theirs]):
        append_messages(store, session.id, [
            {"role": "user", "content": " ".join(words[j] for j in range(len(words)) if (i + n) % (j + 1) == 0)}
            for i in range(40)])
    store.search.catch_up()  # what every search does first (SQLite indexes in batches)
    backend = store.backend
    terms = parse_query("otter kelp harbour tide move absentword").groups
    with store.engine.connect() as conn:
        agent_pk = conn.execute(text("SELECT id FROM lcm_agents WHERE name = 'agent-a'")).scalar_one()
        for session_pk in (None, mine[1].id):
            for stemmed in (False, True):
                specs = [SearchSpec(query=Query(groups=(group,), negatives=negatives), agent_pk=agent_pk,
                                    session_pk=session_pk, limit=limit, stemmed=stemmed)
                         for group in terms for limit in (5, 1000)
                         for negatives in ((), parse_query("tide").groups[0])]
                together = backend.newest_ids_many(conn, "messages", specs)
                alone = [[c.id for c in backend.search_messages(conn, s)[0]] for s in specs]
                assert together == alone
                # After the words' frequencies were read (as a search reads them first, SQLite
                # then answers a rare word's lookup from that walk): the same answers.
                base = specs[0]
                shared = [replace(base, query=s.query, limit=s.limit) for s in specs]
                backend.term_rows_many(conn, base, "messages", [g[0] for g in terms])
                assert backend.newest_ids_many(conn, "messages", shared) == alone
                assert any(len(ids) == 5 for ids in together) and any(len(ids) > 5 for ids in together)
                assert all(ids == sorted(ids, reverse=True) for ids in together)


def test_rows_by_ids_reads_what_an_in_list_reads_in_one_statement_of_constant_text(store, monkeypatch):
    """``Backend.rows_by_ids`` (a recall's hit rows, their neighbours, its records) gives the
    rows SQLAlchemy's ``IN`` list gives, in a statement whose text does not depend on how many
    ids it reads: more ids than one ``IN`` chunk or SQLite's parameter limit, repeated ids,
    ids of another agent and ids that do not exist are all read (or left out) alike, and the
    ids travel as one parameter."""
    from sqlalchemy import bindparam, select

    from lcm.backends import Backend
    from lcm.store._core import messages_t
    from lcm.store.messages import message_select

    mine = store.sessions.get_or_create("agent-a", "s")
    theirs = store.sessions.get_or_create("agent-b", "s")
    append_messages(store, mine.id, [{"role": "user", "content": f"message {i}"} for i in range(1_200)])
    append_messages(store, theirs.id, [{"role": "user", "content": "not yours"}])
    backend = store._core.backend
    with store.engine.connect() as conn:
        ids = [r.id for r in conn.execute(select(messages_t.c.id).order_by(messages_t.c.id)).all()]
    asked = ids[::-1] + ids[:5] + [ids[-1] + 1_000, 2**62]  # every id, some twice, two that do not exist

    def build(ids_in):
        return message_select().where(ids_in(messages_t.c.id), messages_t.c.agent_id == bindparam("agent"))

    seen: list[str] = []
    for module in ("lcm.backends.sqlite", "lcm.backends.pg_driver"):
        import importlib
        mod = importlib.import_module(module)
        name = "driver_execute" if module.endswith("sqlite") else "_cursor"
        real = getattr(mod, name)

        def spied(conn, sql, params, _real=real):
            seen.append(sql)
            return _real(conn, sql, params)

        monkeypatch.setattr(mod, name, spied)
    with store.engine.connect() as conn:
        fast = backend.rows_by_ids(conn, "test.by_id", build, asked, {"agent": mine.agent_pk})
        generic = Backend.rows_by_ids(backend, conn, "test.by_id", build, asked, {"agent": mine.agent_pk})
        one = backend.rows_by_ids(conn, "test.by_id", build, ids[:1], {"agent": mine.agent_pk})
        none = backend.rows_by_ids(conn, "test.by_id", build, ids[-1:], {"agent": mine.agent_pk})  # agent-b's
    assert sorted(map(tuple, fast), key=lambda t: t[0]) == sorted(map(tuple, generic), key=lambda t: t[0])
    assert len(fast) == 1_200 and {r.session_key for r in fast} == {"s"}
    assert sorted(r.id for r in fast) == sorted(r.id for r in generic)
    assert [r.content for r in one] == ["message 0"] and none == []
    assert fast[0]._fields == tuple(generic[0]._fields)
    # One statement for 1,201 ids, one for a single id, one for another: the same text.
    texts = [sql for sql in seen if "lcm_messages" in sql]
    assert len(texts) == 3 and len(set(texts)) == 1


@pytest.mark.parametrize("query", ["alembic", "syslog?", '"blue cluster"'])
def test_a_one_word_query_without_the_every_word_search_is_still_searched(store, corpus, query):
    """Auto-recall skips the every-word search (its any-word part has every word's weight). A
    query of one word or one phrase has nothing wider: its own search is the any-word part, so
    it finds what ``lcm_grep`` finds. Before, a one-word message recalled nothing at all."""
    kw = {"agent": "agent-a", "sort": "relevance", "limit": 20, "any_words": True, "snippets": False}
    grep = store.search.messages(query, **kw).hits
    recall = store.search.messages(query, every_word_first=False, neighbours=True, **kw)
    assert grep and recall.hits == grep and recall.adjacent == {}
