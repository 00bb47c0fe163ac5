"""Copying a whole store into another database (``lcm migrate --to URL``): SQLite to
PostgreSQL, PostgreSQL to SQLite, or any store into any other.

A sync, not a dump: the target ends up holding every agent, session, alias, message, large
payload, system prompt version, summary, DAG edge, carried summary, generated-message digest and
vector of the source, and running it again copies only what the source gained since (or what an
interrupted run did not finish). That is what makes it resumable and safe to repeat while
agents still write to the source.

How, per session (one write transaction on the target each, so a session is either copied up
to a point or not touched):

* the source is read in one snapshot (a single ``SERIALIZABLE`` read transaction): everything
  copied and verified is consistent as of one moment;
* a session is matched in the target by (agent name, session key). Its messages there must be
  the source's first ones, identical (a content digest over every column); the rest are
  appended in batches with their search index (``Backend.insert_rows``);
* summaries are matched by (depth, first seq, last seq); missing ones are added with their
  edges, and every node's parent is set as in the source (a condensation the source did later);
* the session row's counters and engine state are set to the source's.

A target session that is not a prefix of the source's (another conversation under the same
key) is a conflict: nothing is written to it and the run fails, saying which. A target holding
sessions the source does not have is refused unless ``merge`` (adding this store to a shared
one). At the end both sides are counted per table and each session's content digest compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Table, func, select, update

from lcm import codec
from lcm.backends import IndexRow
from lcm.errors import LcmError
from lcm.store._core import (
    StoreCore,
    agents_t,
    aliases_t,
    carried_t,
    edges_t,
    generated_t,
    messages_t,
    payloads_t,
    sessions_t,
    summaries_t,
    system_prompts_t,
)
from lcm.store.vectors import vectors_t

#: Messages (and vectors) read and written per statement.
BATCH = 1000
#: The columns of a message that its digest covers: everything but ids.
_MESSAGE_COLUMNS = ("seq", "identity", "content_hash", "role", "content_kind", "content", "tool_calls",
                    "tool_call_id", "name", "extra", "key_order", "search_text", "token_count", "ts", "problem")
_SUMMARY_COLUMNS = ("depth", "content", "search_text", "token_count", "source_token_count", "source_count",
                    "first_seq", "last_seq", "earliest_at", "latest_at", "expand_hint", "kind", "model", "meta",
                    "created_at")
_SESSION_STATE = ("platform", "conversation_id", "created_at", "updated_at", "last_seq", "message_count",
                  "token_count", "covered_seq", "covered_tokens", "host_view_seq", "last_compaction",
                  "summary_count", "summary_tokens", "fork_seq", "skipped_count", "origin", "estimated_from")
#: The tables a migration copies, in the order the report lists them.
TABLES: tuple[Table, ...] = (agents_t, sessions_t, aliases_t, payloads_t, messages_t, system_prompts_t,
                             summaries_t, edges_t, carried_t, generated_t, vectors_t)

Progress = Callable[[int], None]


class SyncConflict(LcmError):
    """The target holds data that is not this source's (and merging was not asked for, or a
    session under the same key holds another conversation)."""


@dataclass
class SessionPlan:
    """One source session and what the target already has of it."""

    source_pk: int
    agent: str
    key: str
    messages: int
    target_pk: int | None = None
    target_messages: int = 0

    @property
    def to_copy(self) -> int:
        return self.messages - self.target_messages


@dataclass
class SyncReport:
    """What a sync did and found."""

    sessions: int = 0
    sessions_copied: int = 0
    messages_copied: int = 0
    summaries_copied: int = 0
    vectors_copied: int = 0
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (source, target)
    mismatched_sessions: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return not self.mismatched_sessions and all(s == t for s, t in self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "sessions_copied": self.sessions_copied,
                "messages_copied": self.messages_copied, "summaries_copied": self.summaries_copied,
                "vectors_copied": self.vectors_copied, "verified": self.verified,
                "counts": {t: {"source": s, "target": d} for t, (s, d) in self.counts.items()},
                "mismatched_sessions": self.mismatched_sessions}


def _digest_rows(rows: Any) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(codec.encode_json([None if v is None else v for v in row]).encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


class StoreSync:
    """Copies ``source`` into ``target`` (two stores' cores), session by session."""

    def __init__(self, source: StoreCore, target: StoreCore, *, merge: bool = False, batch: int = BATCH):
        if source.location == target.location:
            raise SyncConflict("the source and the target are the same database")
        self.source, self.target, self.merge, self.batch = source, target, merge, batch
        self._summary_map: dict[int, int] = {}  # source node id -> target node id
        self._session_map: dict[int, int] = {}

    # ------------------------------------------------------------------ reading both sides

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        """The source in one consistent snapshot for the whole run."""
        with self.source.engine.connect().execution_options(isolation_level="SERIALIZABLE") as conn, conn.begin():
            yield conn

    @staticmethod
    def _sessions(conn: Connection) -> list[Any]:
        return list(conn.execute(select(sessions_t, agents_t.c.name.label("agent_name")).join(
            agents_t, agents_t.c.id == sessions_t.c.agent_id).order_by(sessions_t.c.id)))

    def _message_digest(self, conn: Connection, session_pk: int, upto: int) -> str:
        cols = [messages_t.c[c] for c in _MESSAGE_COLUMNS]
        stmt = select(*cols, payloads_t.c.sha256).outerjoin(payloads_t, payloads_t.c.id == messages_t.c.payload_id
                                                            ).where(messages_t.c.session_id == session_pk,
                                                                    messages_t.c.seq <= upto).order_by(messages_t.c.seq)
        return _digest_rows(conn.execute(stmt))

    def _summary_digest(self, conn: Connection, session_pk: int) -> str:
        child = summaries_t.alias("parent")
        stmt = select(*[summaries_t.c[c] for c in _SUMMARY_COLUMNS], child.c.depth, child.c.first_seq).outerjoin(
            child, child.c.id == summaries_t.c.parent_id).where(summaries_t.c.session_id == session_pk).order_by(
            summaries_t.c.depth, summaries_t.c.first_seq, summaries_t.c.last_seq)
        return _digest_rows(conn.execute(stmt))

    def plan(self, src: Connection) -> list[SessionPlan]:
        """Every source session and how much of it the target has; raises SyncConflict when the
        target holds what is not this source's."""
        with self.target.read() as dst:
            target_sessions = {(r.agent_name, r.session_key): r for r in self._sessions(dst)}
            plans: list[SessionPlan] = []
            conflicts: list[str] = []
            for row in self._sessions(src):
                plan = SessionPlan(row.id, row.agent_name, row.session_key, row.message_count)
                found = target_sessions.pop((row.agent_name, row.session_key), None)
                if found is not None:
                    plan.target_pk, plan.target_messages = found.id, found.message_count
                    n = found.message_count
                    if n > row.message_count or self._message_digest(dst, found.id, n) != self._message_digest(
                            src, row.id, n):
                        conflicts.append(f"{row.agent_name}/{row.session_key}")
                plans.append(plan)
        if conflicts:
            raise SyncConflict(
                f"{len(conflicts)} session(s) of the target hold other messages than the source's under the same "
                f"agent and key ({', '.join(conflicts[:5])}{', ...' if len(conflicts) > 5 else ''}): nothing was "
                "copied; migrate into an empty database, or move such a session aside on one side first: "
                "lcm export --agent A --session KEY -o KEY.jsonl, then lcm ingest KEY.jsonl --agent A --session "
                "NEW-KEY, then lcm forget --agent A --session KEY --yes")
        if target_sessions and not self.merge:
            names = ", ".join(f"{a}/{k}" for a, k in list(target_sessions)[:5])
            raise SyncConflict(
                f"the target already holds {len(target_sessions)} session(s) that are not in the source ({names}"
                f"{', ...' if len(target_sessions) > 5 else ''}); pass --merge to add this store to it")
        return plans

    # ------------------------------------------------------------------ copying

    def run(self, *, progress: Progress | None = None, dry_run: bool = False,
            on_plan: Callable[[list[SessionPlan]], None] | None = None) -> SyncReport:
        """Copy what the target lacks, then verify; ``dry_run``: only plan and count.
        ``on_plan`` sees the plan before anything is copied (to size a progress bar)."""
        report = SyncReport()
        with self._snapshot() as src:
            plans = self.plan(src)
            report.sessions = len(plans)
            if on_plan is not None:
                on_plan(plans)
            if dry_run:
                report.messages_copied = sum(p.to_copy for p in plans)
                report.sessions_copied = sum(1 for p in plans if p.to_copy or p.target_pk is None)
                return report
            for plan in plans:
                self._copy_session(src, plan, report, progress)
            with self.target.write() as dst:
                self._copy_carried(src, dst)
                self._copy_generated(src, dst)
            self._verify(src, plans, report)
        return report

    def _copy_session(self, src: Connection, plan: SessionPlan, report: SyncReport,
                      progress: Progress | None) -> None:
        row = src.execute(select(sessions_t).where(sessions_t.c.id == plan.source_pk)).one()
        with self.target.write() as dst:
            agent_pk = self.target.agent_pk(dst, plan.agent, create=True)
            assert agent_pk is not None
            state = {c: row._mapping[c] for c in _SESSION_STATE}
            state["parent_id"] = self._session_map.get(row.parent_id) if row.parent_id is not None else None
            if plan.target_pk is None:
                [(target_pk,)] = dst.execute(sessions_t.insert().values(
                    agent_id=agent_pk, session_key=plan.key, **state).returning(sessions_t.c.id)).all()
                report.sessions_copied += 1
            else:
                target_pk = plan.target_pk
                if plan.to_copy:
                    report.sessions_copied += 1
            self._session_map[plan.source_pk] = target_pk
            self._copy_aliases(src, dst, plan.source_pk, target_pk, agent_pk)
            message_map = self._copy_messages(src, dst, plan, target_pk, agent_pk, report, progress)
            self._copy_system_prompts(src, dst, plan.source_pk, target_pk)
            self._copy_summaries(src, dst, plan.source_pk, target_pk, agent_pk, message_map, report)
            report.vectors_copied += self._copy_vectors(src, dst, plan.source_pk, target_pk, agent_pk, message_map)
            # Counters and engine state last: they describe the rows now there.
            dst.execute(update(sessions_t).where(sessions_t.c.id == target_pk).values(**state))

    def _copy_aliases(self, src: Connection, dst: Connection, source_pk: int, target_pk: int, agent_pk: int) -> None:
        rows = [{"agent_id": agent_pk, "session_key": r.session_key, "session_id": target_pk,
                 "created_at": r.created_at}
                for r in src.execute(select(aliases_t).where(aliases_t.c.session_id == source_pk))]
        self.target.backend.insert_ignore(dst, aliases_t, rows, ["agent_id", "session_key"])

    def _copy_messages(self, src: Connection, dst: Connection, plan: SessionPlan, target_pk: int, agent_pk: int,
                       report: SyncReport, progress: Progress | None) -> dict[int, int]:
        """Append the messages the target lacks; returns source id -> target id for all of them."""
        ids: dict[int, int] = {}
        existing = dict(dst.execute(select(messages_t.c.seq, messages_t.c.id).where(
            messages_t.c.session_id == target_pk)).all())
        after = 0
        while True:
            rows = src.execute(select(messages_t, payloads_t.c.sha256.label("payload_sha"))
                               .outerjoin(payloads_t, payloads_t.c.id == messages_t.c.payload_id)
                               .where(messages_t.c.session_id == plan.source_pk, messages_t.c.seq > after)
                               .order_by(messages_t.c.seq).limit(self.batch)).all()
            if not rows:
                return ids
            after = rows[-1].seq
            new = [r for r in rows if r.seq not in existing]
            ids.update({r.id: existing[r.seq] for r in rows if r.seq in existing})
            if not new:
                continue
            payloads = self._copy_payloads(src, dst, {r.payload_id for r in new if r.payload_id is not None})
            values = [{**{c: r._mapping[c] for c in _MESSAGE_COLUMNS}, "session_id": target_pk, "agent_id": agent_pk,
                       "payload_id": payloads[r.payload_sha] if r.payload_sha else None} for r in new]
            index = [IndexRow(body=r.search_text if r.search_text is not None else (r.content or ""),
                              session_pk=target_pk, agent_pk=agent_pk, role=r.role) for r in new]
            inserted = self.target.backend.insert_rows(dst, messages_t, values, index, ("id", "seq"))
            by_seq = {seq: pk for pk, seq in inserted}
            ids.update({r.id: by_seq[r.seq] for r in new})
            report.messages_copied += len(new)
            if progress is not None:
                progress(len(new))

    def _copy_payloads(self, src: Connection, dst: Connection, source_ids: set[int]) -> dict[str, int]:
        if not source_ids:
            return {}
        rows = src.execute(select(payloads_t).where(payloads_t.c.id.in_(sorted(source_ids)))).all()
        self.target.backend.insert_ignore(dst, payloads_t, [
            {"sha256": r.sha256, "codec": r.codec, "size_chars": r.size_chars, "data": r.data,
             "created_at": r.created_at} for r in rows], ["sha256"])
        return dict(dst.execute(select(payloads_t.c.sha256, payloads_t.c.id).where(
            payloads_t.c.sha256.in_([r.sha256 for r in rows]))).all())

    def _copy_system_prompts(self, src: Connection, dst: Connection, source_pk: int, target_pk: int) -> None:
        rows = [{"session_id": target_pk, "digest": r.digest, "message": r.message, "token_count": r.token_count,
                 "first_seq": r.first_seq, "created_at": r.created_at}
                for r in src.execute(select(system_prompts_t).where(system_prompts_t.c.session_id == source_pk))]
        self.target.backend.insert_ignore(dst, system_prompts_t, rows, ["session_id", "digest"])

    def _copy_summaries(self, src: Connection, dst: Connection, source_pk: int, target_pk: int, agent_pk: int,
                        message_map: dict[int, int], report: SyncReport) -> None:
        def key(r: Any) -> tuple[int, int, int]:
            return (r.depth, r.first_seq, r.last_seq)

        there = {key(r): r.id for r in dst.execute(select(summaries_t).where(summaries_t.c.session_id == target_pk))}
        rows = src.execute(select(summaries_t).where(summaries_t.c.session_id == source_pk)
                           .order_by(summaries_t.c.id)).all()
        added: list[Any] = []
        for r in rows:
            found = there.get(key(r))
            if found is None:
                values = {**{c: r._mapping[c] for c in _SUMMARY_COLUMNS}, "session_id": target_pk,
                          "agent_id": agent_pk, "parent_id": None}
                body = r.search_text if r.search_text is not None else r.content
                [(found,)] = self.target.backend.insert_rows(
                    dst, summaries_t, [values], [IndexRow(body=body, session_pk=target_pk, agent_pk=agent_pk)],
                    ("id",))
                added.append(r)
            self._summary_map[r.id] = int(found)
        report.summaries_copied += len(added)
        if added:
            edges = src.execute(select(edges_t).where(edges_t.c.summary_id.in_([r.id for r in added]))
                                .order_by(edges_t.c.summary_id, edges_t.c.ordinal)).all()
            links = [{"summary_id": self._summary_map[e.summary_id], "ordinal": e.ordinal,
                      "message_id": message_map[e.message_id] if e.message_id is not None else None,
                      "child_id": self._summary_map[e.child_id] if e.child_id is not None else None} for e in edges]
            for i in range(0, len(links), self.batch):
                dst.execute(edges_t.insert(), links[i:i + self.batch])
        for r in rows:  # parents as in the source (a node condensed after an earlier copy too)
            parent = self._summary_map.get(r.parent_id) if r.parent_id is not None else None
            dst.execute(update(summaries_t).where(summaries_t.c.id == self._summary_map[r.id],
                                                  summaries_t.c.parent_id.is_distinct_from(parent))
                        .values(parent_id=parent))

    def _copy_vectors(self, src: Connection, dst: Connection, source_pk: int, target_pk: int, agent_pk: int,
                      message_map: dict[int, int]) -> int:
        """The session's vectors the target lacks; returns how many were written (counted once
        before and once after, not per batch: a count reads every vector of the session)."""
        before = self._count(dst, vectors_t, session_id=target_pk)
        after = 0
        while True:
            rows = src.execute(select(vectors_t).where(vectors_t.c.session_id == source_pk, vectors_t.c.id > after)
                               .order_by(vectors_t.c.id).limit(self.batch)).all()
            if not rows:
                return self._count(dst, vectors_t, session_id=target_pk) - before
            after = rows[-1].id
            for kind in ("message_id", "summary_id"):
                mapping = message_map if kind == "message_id" else self._summary_map
                values = [{"agent_id": agent_pk, "session_id": target_pk,
                           "message_id": mapping[r.message_id] if kind == "message_id" else None,
                           "summary_id": mapping[r.summary_id] if kind == "summary_id" else None,
                           "role": r.role, "ts": r.ts, "model": r.model, "dims": r.dims, "vector": r.vector,
                           "created_at": r.created_at}
                          for r in rows if r._mapping[kind] is not None]
                if values:
                    self.target.backend.insert_ignore(dst, vectors_t, values, [kind, "model"])

    def _copy_carried(self, src: Connection, dst: Connection) -> None:
        rows = [{"session_id": self._session_map[r.session_id], "summary_id": self._summary_map[r.summary_id],
                 "ordinal": r.ordinal}
                for r in src.execute(select(carried_t))
                if r.session_id in self._session_map and r.summary_id in self._summary_map]
        self.target.backend.insert_ignore(dst, carried_t, rows, ["session_id", "summary_id"])

    def _copy_generated(self, src: Connection, dst: Connection) -> None:
        rows = src.execute(select(generated_t, agents_t.c.name).join(agents_t, agents_t.c.id == generated_t.c.agent_id)
                           ).all()
        values: list[dict[str, Any]] = []
        for r in rows:
            agent_pk = self.target.agent_pk(dst, r.name, create=True)
            values.append({"agent_id": agent_pk, "digest": r.digest, "stands_for": r.stands_for,
                           "session_id": self._session_map.get(r.session_id) if r.session_id is not None else None,
                           "through_seq": r.through_seq if r.session_id in self._session_map else None,
                           "created_at": r.created_at})
        for i in range(0, len(values), self.batch):
            self.target.backend.insert_ignore(dst, generated_t, values[i:i + self.batch], ["agent_id", "digest"])

    # ------------------------------------------------------------------ verifying

    @staticmethod
    def _count(conn: Connection, table: Table, **where: Any) -> int:
        stmt = select(func.count()).select_from(table)
        for column, value in where.items():
            stmt = stmt.where(table.c[column] == value)
        return int(conn.execute(stmt).scalar() or 0)

    def _verify(self, src: Connection, plans: list[SessionPlan], report: SyncReport) -> None:
        """Per-table counts of both sides (the target's restricted to what this source maps to
        when merging into a shared store) and a content digest per session."""
        with self.target.read() as dst:
            for table in TABLES:
                if table is payloads_t:  # the payloads messages use (a removed duplicate may leave one behind)
                    source_count = self._used_payloads(src, None)
                    target_count = self._used_payloads(dst, list(self._session_map.values()) if self.merge else None)
                elif self.merge:
                    source_count, target_count = self._count(src, table), self._mapped_count(dst, table)
                else:
                    source_count, target_count = self._count(src, table), self._count(dst, table)
                report.counts[table.name] = (source_count, target_count)
            for plan in plans:
                target_pk = self._session_map[plan.source_pk]
                last = src.execute(select(sessions_t.c.last_seq).where(sessions_t.c.id == plan.source_pk)).scalar_one()
                same = (self._message_digest(src, plan.source_pk, last) == self._message_digest(dst, target_pk, last)
                        and self._summary_digest(src, plan.source_pk) == self._summary_digest(dst, target_pk))
                if not same:
                    report.mismatched_sessions.append(f"{plan.agent}/{plan.key}")

    @staticmethod
    def _used_payloads(conn: Connection, sessions: list[int] | None) -> int:
        stmt = select(func.count(func.distinct(messages_t.c.payload_id)))
        if sessions is not None:
            stmt = stmt.where(messages_t.c.session_id.in_(sessions))
        return int(conn.execute(stmt).scalar() or 0)

    def _mapped_count(self, dst: Connection, table: Table) -> int:
        """Rows of the target that belong to the source's sessions (a merged target holds more)."""
        sessions = list(self._session_map.values())
        if table is agents_t:
            return int(dst.execute(select(func.count(func.distinct(sessions_t.c.agent_id))).where(
                sessions_t.c.id.in_(sessions))).scalar() or 0)
        if table is sessions_t:
            return len(sessions)
        if table is edges_t:
            return int(dst.execute(select(func.count()).select_from(edges_t).join(
                summaries_t, summaries_t.c.id == edges_t.c.summary_id).where(
                summaries_t.c.session_id.in_(sessions))).scalar() or 0)
        if table is generated_t:
            agents = select(sessions_t.c.agent_id).where(sessions_t.c.id.in_(sessions))
            return int(dst.execute(select(func.count()).select_from(generated_t).where(
                generated_t.c.agent_id.in_(agents))).scalar() or 0)
        return int(dst.execute(select(func.count()).select_from(table).where(
            table.c.session_id.in_(sessions))).scalar() or 0)
