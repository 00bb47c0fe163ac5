"""Health: integrity checks, repair, statistics, backup and upkeep of one lcm database.

The checks are what ``lcm doctor`` and the ``lcm_doctor`` tool report for storage: the database
itself and its search index (per backend), the session counters, the summary DAG's coverage
and edges, messages two writers stored twice, summaries no shorter than their sources.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, case, func, select, update

from lcm.records import CheckResult
from lcm.store._core import (
    IN_CHUNK,
    StoreCore,
    agents_t,
    carried_t,
    edges_t,
    messages_t,
    payloads_t,
    sessions_t,
    summaries_t,
)

#: A store holding more messages than this is checked by its most recently active sessions up
#: to this many messages, unless every session is asked for (``lcm doctor --all``): the checks
#: cost about 0.3-0.6 s per 100k messages they read, and a doctor that reads ten million
#: messages on every call is one nobody runs (docs/benchmarks.md, issue 35).
BOUNDED_CHECK_MESSAGES = 500_000
#: At most this many sessions in a bounded check (the IN lists its queries carry).
BOUNDED_CHECK_SESSIONS = 500


@dataclass(frozen=True)
class CheckScope:
    """Which sessions the checks read: every one (``sessions`` None) or the most recently
    active ones, with what the store holds in all, for the report."""

    sessions: tuple[int, ...] | None
    messages: int
    total_sessions: int
    total_messages: int

    @property
    def whole(self) -> bool:
        return self.sessions is None

    def as_check(self) -> CheckResult:
        if self.whole:
            return CheckResult("check_scope", "ok", f"every session checked ({self.total_sessions:,} sessions, "
                                                    f"{self.total_messages:,} messages)")
        assert self.sessions is not None
        return CheckResult("check_scope", "ok", (
            f"checked the {len(self.sessions):,} most recently active sessions ({self.messages:,} of "
            f"{self.total_messages:,} messages, {self.total_sessions:,} sessions in all): a bigger store "
            "is checked where it last changed; `lcm doctor --all` reads every session (and, on SQLite, "
            "runs the whole-file integrity and foreign-key checks)"))


class HealthRepository:
    """Checks and upkeep of the whole store (``store.health``)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def check_schema(self) -> CheckResult:
        state = self._core.schema_state()
        if state.status == "current":
            return CheckResult("schema_version", "ok", f"schema at {state.head} (head)")
        return CheckResult("schema_version", "fail",
                           f"schema at {state.current or 'nothing'}, expected {state.head}: "
                           "run `lcm db upgrade`")

    def scope(self, *, everything: bool = False, bound: int | None = None) -> CheckScope:
        """The sessions a check reads: all of them in a store of up to
        ``BOUNDED_CHECK_MESSAGES`` messages (or when ``everything``), else the most recently
        updated ones until that many messages (at least one session). From the sessions'
        counters: no message is read to decide. ``bound`` overrides the message bound."""
        bound = BOUNDED_CHECK_MESSAGES if bound is None else bound
        s = sessions_t
        with self._core.read() as conn:
            count, total = conn.execute(select(func.count(), func.coalesce(func.sum(s.c.message_count), 0))).one()
            if everything or total <= bound:
                return CheckScope(None, int(total), int(count), int(total))
            recent = conn.execute(select(s.c.id, s.c.message_count).order_by(
                s.c.updated_at.desc(), s.c.id.desc()).limit(BOUNDED_CHECK_SESSIONS)).all()
        chosen: list[int] = []
        messages = 0
        for sid, n in recent:
            if chosen and messages + n > bound:
                break
            chosen.append(sid)
            messages += n
        return CheckScope(tuple(chosen), messages, int(count), int(total))

    def checks(self, *, deep: bool = False, everything: bool = False, bound: int | None = None) -> list[CheckResult]:
        """Every storage check the doctor reports, over :meth:`scope`'s sessions. ``deep``
        re-verifies the whole search index (and so reads every session)."""
        scope = self.scope(everything=everything or deep, bound=bound)
        results = [self.check_schema(), scope.as_check()]
        if deep:  # FTS5 compares every row only when none is pending (SQLite's batched index)
            self._core.catch_up_index()
        ids = scope.sessions
        with self._core.read() as conn:
            results.extend(self._core.backend.check_database(conn, whole=scope.whole))
            results.extend(self._core.backend.check_search_index(conn, deep, ids))
            scan = _scan_messages(conn, ids)
            results.extend(self._check_counters(conn, ids, scan))
            results.extend(self._check_coverage(conn, ids))
            results.extend(self._check_edges(conn, ids))
            results.append(self._check_duplicates(scan))
            results.append(self._check_fork_repeats(conn, ids))
            results.append(self._check_summary_sizes(conn, ids))
        return results

    def _check_counters(self, conn: Connection, ids: Sessions, scan: _MessageScan) -> list[CheckResult]:
        bad = [sid for sid, n, top, tok in conn.execute(_within(select(
            sessions_t.c.id, sessions_t.c.message_count, sessions_t.c.last_seq, sessions_t.c.token_count),
            sessions_t, ids, "id")).all()
            if (n, top, tok) != scan.counters.get(sid, (0, 0, 0)) or n != top]
        bad.sort()
        out = [CheckResult(
            "session_counters", "fail" if bad else "ok",
            f"message counters disagree with the rows in sessions {bad[:10]}" if bad
            else "message counts, gapless sequence numbers and token totals match the rows")]
        own = _within(select(summaries_t.c.session_id, func.count().label("n"),
                             func.sum(summaries_t.c.token_count).label("tok")).where(
            summaries_t.c.parent_id.is_(None)), summaries_t, ids).group_by(summaries_t.c.session_id).subquery()
        brought = _within(select(carried_t.c.session_id, func.count().label("n"),
                                 func.sum(summaries_t.c.token_count).label("tok")).join(
            summaries_t, summaries_t.c.id == carried_t.c.summary_id), carried_t, ids).group_by(
            carried_t.c.session_id).subquery()
        drift = conn.execute(_within(select(sessions_t.c.id), sessions_t, ids, "id").outerjoin(
            own, own.c.session_id == sessions_t.c.id).outerjoin(
            brought, brought.c.session_id == sessions_t.c.id).where(
            (sessions_t.c.summary_count != func.coalesce(own.c.n, 0) + func.coalesce(brought.c.n, 0))
            | (sessions_t.c.summary_tokens != func.coalesce(own.c.tok, 0) + func.coalesce(brought.c.tok, 0))
        )).scalars().all()
        out.append(CheckResult(
            "summary_counters", "fail" if drift else "ok",
            f"summary counters disagree with the DAG in sessions {drift[:10]}" if drift
            else "each session's summary count and tokens match its uncondensed and carried summaries"))
        misfiled = scan.misfiled + conn.execute(_within(select(func.count()).select_from(summaries_t).join(
            sessions_t, sessions_t.c.id == summaries_t.c.session_id).where(
            summaries_t.c.agent_id != sessions_t.c.agent_id), summaries_t, ids)).scalar_one()
        out.append(CheckResult(
            "agent_scope", "fail" if misfiled else "ok",
            f"{misfiled} rows carry another agent than their session's" if misfiled
            else "every row carries its session's agent"))
        return out

    def _check_coverage(self, conn: Connection, ids: Sessions) -> list[CheckResult]:
        """Every message is raw or in exactly one leaf; leaves cover each session's prefix."""
        m, e, s = messages_t, edges_t, summaries_t
        problems: list[str] = []
        covered = _within(select(m.c.session_id, func.count().label("n"),
                                 func.sum(m.c.token_count).label("tok"), func.max(m.c.seq).label("top")).join(
            e, e.c.message_id == m.c.id), m, ids).group_by(m.c.session_id).subquery()
        prefix = _within(select(m.c.session_id, func.count().label("n")).join(
            sessions_t, sessions_t.c.id == m.c.session_id).where(
            m.c.seq <= sessions_t.c.covered_seq), m, ids).group_by(m.c.session_id).subquery()
        rows = conn.execute(_within(select(
            sessions_t.c.id, sessions_t.c.covered_seq, sessions_t.c.covered_tokens,
            func.coalesce(covered.c.n, 0), func.coalesce(covered.c.tok, 0),
            func.coalesce(covered.c.top, 0), func.coalesce(prefix.c.n, 0)), sessions_t, ids, "id").outerjoin(
            covered, covered.c.session_id == sessions_t.c.id).outerjoin(
            prefix, prefix.c.session_id == sessions_t.c.id)).all()
        for sid, cseq, ctok, n_cov, tok_cov, top_cov, n_prefix in rows:
            if n_cov != n_prefix or top_cov != cseq:
                problems.append(f"session {sid}: {n_cov} messages in leaves but {n_prefix} "
                                f"up to the covered mark (seq {cseq})")
            elif tok_cov != ctok:
                problems.append(f"session {sid}: covered token total {ctok} != {tok_cov}")
        cross = conn.execute(_within(select(func.count()).select_from(e).join(
            s, s.c.id == e.c.summary_id).join(m, m.c.id == e.c.message_id).where(
            m.c.session_id != s.c.session_id), s, ids)).scalar_one()
        if cross:
            problems.append(f"{cross} leaf edges point at another session's messages")
        leaves = _within(select(e.c.summary_id, func.count().label("n"), func.min(m.c.seq).label("lo"),
                                func.max(m.c.seq).label("hi")).join(m, m.c.id == e.c.message_id), m, ids).group_by(
            e.c.summary_id).subquery()
        broken = conn.execute(select(s.c.id).join(leaves, leaves.c.summary_id == s.c.id).where(
            (leaves.c.n != s.c.source_count) | (leaves.c.lo != s.c.first_seq)
            | (leaves.c.hi != s.c.last_seq))).scalars().all()
        empty_leaves = conn.execute(_within(select(s.c.id).where(s.c.depth == 0, ~select(e.c.summary_id).where(
            e.c.summary_id == s.c.id).exists()), s, ids)).scalars().all()
        if broken or empty_leaves:
            problems.append(f"leaves whose edges disagree with their recorded range: "
                            f"{[*broken, *empty_leaves][:10]}")
        gaps = conn.execute(select(s.c.id).join(leaves, leaves.c.summary_id == s.c.id).where(
            leaves.c.n != select(func.count()).select_from(m).where(
                m.c.session_id == s.c.session_id, m.c.seq >= leaves.c.lo,
                m.c.seq <= leaves.c.hi).scalar_subquery())).scalars().all()
        if gaps:
            problems.append(f"leaves not covering a contiguous run: {gaps[:10]}")
        return [CheckResult("coverage", "fail" if problems else "ok",
                            "; ".join(problems[:5]) if problems else
                            "every message is raw or in exactly one leaf; leaves are contiguous")]

    def _check_edges(self, conn: Connection, ids: Sessions) -> list[CheckResult]:
        """Condensed nodes: children one depth lower, same session, consecutive, linked back.
        (Edges from missing summaries are looked for only over the whole store: a bounded check
        finds its edges through its sessions' summaries.)"""
        e, s = edges_t, summaries_t
        child = s.alias("child")
        problems = []
        orphans = 0 if ids is not None else conn.execute(select(func.count()).select_from(e).outerjoin(
            s, s.c.id == e.c.summary_id).where(s.c.id.is_(None))).scalar_one()
        if orphans:
            problems.append(f"{orphans} edges from missing summaries")
        wrong = conn.execute(_within(select(s.c.id).join(e, e.c.summary_id == s.c.id).join(
            child, child.c.id == e.c.child_id).where(
            (child.c.depth != s.c.depth - 1) | (child.c.session_id != s.c.session_id)
            | (child.c.parent_id.is_(None)) | (child.c.parent_id != s.c.id)), s, ids).distinct()).scalars().all()
        if wrong:
            problems.append(f"condensed nodes with inconsistent children: {wrong[:10]}")
        dangling = conn.execute(_within(select(child.c.id).where(child.c.parent_id.is_not(None), ~select(
            e.c.child_id).where(e.c.child_id == child.c.id).exists()), child, ids)).scalars().all()
        if dangling:
            problems.append(f"summaries marked condensed without an edge: {dangling[:10]}")
        counted = select(e.c.summary_id, func.count().label("n"))
        if ids is not None:  # a bounded check counts the children of its sessions' nodes only
            counted = _within(counted.join(s, s.c.id == e.c.summary_id), s, ids)
        kids = counted.group_by(e.c.summary_id).subquery()
        miscount = conn.execute(_within(select(s.c.id).outerjoin(kids, kids.c.summary_id == s.c.id).where(
            func.coalesce(kids.c.n, 0) != s.c.source_count), s, ids)).scalars().all()
        if miscount:
            problems.append(f"nodes whose edge count differs from source_count: {miscount[:10]}")
        return [CheckResult("dag_edges", "fail" if problems else "ok",
                            "; ".join(problems) if problems else
                            "edges are consistent: no orphans, depth+1 parents, one parent each")]

    @staticmethod
    def _check_duplicates(scan: _MessageScan) -> CheckResult:
        """Messages stored twice in one session. A tool result answers one call id, which a
        model issues once: the same result for the same id twice in a session is a copy.
        Text alone ("ok", "ok") is never taken for one: people repeat themselves."""
        rows = sorted(scan.copies.items())[:10]
        if not rows:
            return CheckResult("duplicate_messages", "ok",
                               "no tool result is stored twice for the same call in a session")
        listed = ", ".join(f"session {sid}: {int(extra)}" for sid, extra in rows)
        return CheckResult("duplicate_messages", "warn",
                           f"tool results stored more than once for the same call in one session ({listed}): "
                           "a model answers a call once, so the later ones are copies of messages already "
                           "stored; nothing is lost; `lcm doctor --repair` removes copies not yet summarized")

    def _check_fork_repeats(self, conn: Connection, ids: Sessions) -> CheckResult:
        """A fork claims that two hosts disagree after its fork point. A tool result the fork
        holds that its parent also holds after the fork point (same call, same result: a model
        answers a call once) says they agreed there: that conversation is stored twice, once
        in each session."""
        fork, own, theirs = sessions_t.alias("fork"), messages_t.alias("own"), messages_t.alias("theirs")
        rows = conn.execute(_within(select(fork.c.id, fork.c.parent_id, func.count()).join(
            own, own.c.session_id == fork.c.id).join(theirs, (theirs.c.session_id == fork.c.parent_id)
                                                     & (theirs.c.seq > fork.c.fork_seq)
                                                     & (theirs.c.tool_call_id == own.c.tool_call_id)
                                                     & (theirs.c.content_hash == own.c.content_hash)).where(
            fork.c.parent_id.is_not(None), own.c.role == "tool", own.c.tool_call_id.is_not(None),
            theirs.c.role == "tool"), fork, ids, "id").group_by(fork.c.id, fork.c.parent_id).order_by(
            fork.c.id).limit(10)).all()
        if not rows:
            return CheckResult("fork_repeats", "ok",
                               "no fork repeats its parent's messages after the fork point")
        listed = ", ".join(f"session {sid} (fork of {parent}): {int(n)}" for sid, parent, n in rows)
        return CheckResult("fork_repeats", "warn",
                           f"forks holding tool results their parent also holds after the fork point ({listed}): "
                           "the two sessions store the same conversation from there, each once; nothing is lost")

    def _check_summary_sizes(self, conn: Connection, ids: Sessions) -> CheckResult:
        s = summaries_t
        n = conn.execute(_within(select(func.count()).select_from(s).where(
            s.c.token_count >= s.c.source_token_count), s, ids)).scalar_one()
        return CheckResult("summary_sizes", "warn" if n else "ok",
                           f"{n} summaries are not shorter than their sources" if n
                           else "every summary is shorter than what it summarizes")

    def backup(self, destination: str | None = None) -> str | None:
        """A consistent copy of a SQLite store (default: next to it, timestamped); None on
        PostgreSQL, where backups belong to the server's tools."""
        if destination is None and self._core.backend.name == "sqlite":
            stamp = time.strftime("%Y%m%d-%H%M%S")
            destination = f"{self._core.url.database}.bak-{stamp}"
        return self._core.backend.backup(self._core.engine, destination) if destination else None

    def remove_duplicate_runs(self) -> list[dict[str, Any]]:
        """Remove the copies ``_check_duplicates`` reports, where that is safe.

        A copy is the later of two runs of messages with the same substance, found around a tool
        result stored twice for one call (a call id is issued once): the run extends either way
        while each message equals the one a fixed distance before it. Only a run that is still
        raw (not under a summary) is removed; the messages after it move up so ``seq`` stays
        gapless, and the session's counters follow. Each session is repaired in its own locked
        transaction. Returns what was done per session, runs left alone included (with why)."""
        m = messages_t
        with self._core.read() as conn:
            sessions = list(conn.execute(select(m.c.session_id).where(
                m.c.role == "tool", m.c.tool_call_id.is_not(None)).group_by(
                m.c.session_id, m.c.tool_call_id, m.c.content_hash).having(
                func.count() > 1)).scalars())
        report = []
        for session_pk in dict.fromkeys(sessions):
            with self._core.write() as conn:
                session = self._core.lock_session(conn, session_pk)
                rows = conn.execute(select(m.c.id, m.c.seq, m.c.content_hash, m.c.role,
                                           m.c.tool_call_id, m.c.token_count).where(
                    m.c.session_id == session_pk).order_by(m.c.seq)).all()
                runs, kept = _duplicate_runs(rows, session["covered_seq"])
                doomed = [r.id for lo, hi in runs for r in rows[lo:hi + 1]]
                if doomed:
                    gone = set(doomed)
                    for i in range(0, len(doomed), IN_CHUNK):  # raw messages: no summary edges
                        conn.execute(m.delete().where(m.c.id.in_(doomed[i:i + IN_CHUNK])))
                    survivors = [r for r in rows if r.id not in gone]
                    moved = [{"rid": r.id, "nseq": seq} for seq, r in enumerate(survivors, start=1)
                             if r.seq != seq]
                    # Two steps, so no (session, seq) pair is ever taken twice mid-way.
                    conn.execute(update(m).where(m.c.session_id == session_pk, m.c.seq > rows[runs[0][0]].seq)
                                 .values(seq=-m.c.seq))
                    conn.execute(update(m).where(m.c.id == bindparam("rid")).values(seq=bindparam("nseq")), moved)
                    count = len(survivors)
                    conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                        last_seq=count, message_count=count,
                        token_count=sessions_t.c.token_count - sum(r.token_count for r in rows if r.id in gone),
                        host_view_seq=case((sessions_t.c.host_view_seq > count + 1, count + 1),
                                           else_=sessions_t.c.host_view_seq)))
                report.append({"session": session_pk, "removed": len(doomed),
                               "runs": [[rows[lo].seq, rows[hi].seq] for lo, hi in runs],
                               "left_alone": kept})
        return report

    def rebuild_index(self) -> dict[str, int]:
        """Re-index every message and summary (the doctor's repair)."""
        with self._core.write() as conn:
            return self._core.backend.rebuild_search_index(conn)

    def optimize(self) -> None:
        """Refresh the query planner's statistics (and, on PostgreSQL, merge the GIN indexes'
        pending rows; on SQLite, index the messages still pending); call after a bulk import."""
        self._core.catch_up_index()
        with self._core.engine.connect() as conn:
            self._core.backend.optimize(conn)
            conn.commit()

    def stats(self) -> dict[str, Any]:
        """Store-wide counts and size (for status output), without reading the messages."""
        with self._core.read() as conn:
            counts = {
                name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for name, t in (("agents", agents_t), ("sessions", sessions_t),
                                ("summaries", summaries_t), ("payloads", payloads_t))
            }
            # The sessions' counters (exact, kept with every write; the doctor checks them), not
            # a count of the messages table: that reads every row (seconds at ten million).
            messages = conn.execute(select(func.coalesce(func.sum(sessions_t.c.message_count), 0))).scalar_one()
            counts = {"agents": counts["agents"], "sessions": counts["sessions"], "messages": int(messages),
                      "summaries": counts["summaries"], "payloads": counts["payloads"]}
            size = self._core.backend.database_size(conn)
        return {**counts, "bytes": size, "backend": self._core.backend.name, "database": self._core.location}


#: The sessions a check reads (None: every one).
Sessions = tuple[int, ...] | None


@dataclass
class _MessageScan:
    """What the checks need from the scoped messages, read in one pass: per session its rows,
    highest seq and token total (``counters``), the tool results stored more than once for the
    same call (``copies``, extra rows per session), and the rows filed under another agent
    than their session's (``misfiled``). Three passes over every scoped row before (counters,
    copies, agent scope: 250-360 ms each at 500k messages on PostgreSQL)."""

    counters: dict[int, tuple[int, int, int]]
    copies: dict[int, int]
    misfiled: int


def _scan_messages(conn: Connection, ids: Sessions) -> _MessageScan:
    """One read of the scoped messages, grouped by session. Copies: a session's tool results
    less its distinct (content, call) pairs; the pair is one value because count(DISTINCT)
    takes one expression on SQLite, and unambiguous because the hash is fixed-length hex. Of
    the shapes measured (200k messages, alternated), this one was the fastest on SQLite and
    on a par on PostgreSQL with a hash aggregate by (session, agent, call, content) first,
    which on SQLite sorts every row."""
    m, s = messages_t, sessions_t
    copy_key = case((m.c.role == "tool", m.c.content_hash.concat(":").concat(m.c.tool_call_id)), else_=None)
    rows = conn.execute(_within(select(
        m.c.session_id, func.count(), func.max(m.c.seq), func.sum(m.c.token_count),
        func.count(copy_key) - func.count(copy_key.distinct()),
        func.sum(case((m.c.agent_id != s.c.agent_id, 1), else_=0))).select_from(m).join(
        s, s.c.id == m.c.session_id), m, ids).group_by(m.c.session_id)).all()
    return _MessageScan(counters={sid: (int(n), int(top), int(tok or 0)) for sid, n, top, tok, _, _ in rows},
                        copies={sid: int(extra) for sid, _, _, _, extra, _ in rows if extra},
                        misfiled=sum(int(other or 0) for *_, other in rows))


def _within(query: Any, table: Any, ids: Sessions, column: str = "session_id") -> Any:
    """``query`` limited to rows of ``table`` in the sessions checked (unchanged for all)."""
    return query if ids is None else query.where(table.c[column].in_(ids))


def _duplicate_runs(rows: Sequence[Any], covered_seq: int) -> tuple[list[tuple[int, int]], list[str]]:
    """(index ranges of later copies safe to remove, why other copies were left alone).

    ``rows`` are one session's messages in seq order."""
    first_at: dict[tuple[str, str], int] = {}
    runs: list[tuple[int, int]] = []
    kept: list[str] = []
    taken = -1  # index up to which runs were already found
    for i, r in enumerate(rows):
        if r.role != "tool" or r.tool_call_id is None:
            continue
        key = (r.tool_call_id, r.content_hash)
        if key not in first_at:
            first_at[key] = i
            continue
        if i <= taken:
            continue
        d = i - first_at[key]
        lo = hi = i
        while hi + 1 < len(rows) and hi + 1 - lo < d and rows[hi + 1].content_hash == rows[hi + 1 - d].content_hash:
            hi += 1
        while lo - 1 - d >= 0 and lo - 1 > taken and hi - (lo - 1) < d and \
                rows[lo - 1].content_hash == rows[lo - 1 - d].content_hash:
            lo -= 1
        taken = hi
        if rows[lo].seq <= covered_seq:
            kept.append(f"messages {rows[lo].seq}-{rows[hi].seq}: already summarized")
            continue
        runs.append((lo, hi))
    return runs, kept
