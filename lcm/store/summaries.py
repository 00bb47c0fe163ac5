"""The summary DAG: leaves over contiguous runs of a session's oldest raw messages, condensed
summaries over runs of same-depth summaries, and summaries carried into a later session.

Every write checks the DAG's invariants inside its transaction (a leaf covers the oldest raw
messages without gaps; a condensed node takes consecutive uncondensed children one depth lower)
and moves the session's counters in the same transaction (``covered_seq`` / ``covered_tokens``
for leaves, ``summary_count`` / ``summary_tokens`` for what an assembled context shows).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, RowMapping, Select, case, func, select, update
from sqlalchemy.exc import IntegrityError

from lcm import codec
from lcm.backends import IndexRow
from lcm.errors import ConcurrentUpdateError, IntegrityViolation, NotFoundError, first_line
from lcm.records import CompactionView, DepthStats, MessageRecord, NewSummary, SummaryRecord, WrittenSummary
from lcm.store._core import (
    MAX_PAGE_LIMIT,
    StoreCore,
    agents_t,
    carried_t,
    checked_int,
    checked_text,
    edges_t,
    fetch_in,
    messages_t,
    session_record,
    session_select,
    sessions_t,
    storable_id,
    summaries_t,
    summary_record,
)
from lcm.store.messages import message_select, records
from lcm.store.replica import lag_tolerant
from lcm.textindex import index_body


def _uncondensed_select(session_pk: int) -> Select[Any]:
    return select(summaries_t).where(
        summaries_t.c.session_id == session_pk, summaries_t.c.parent_id.is_(None)).order_by(
        summaries_t.c.depth.desc(), summaries_t.c.first_seq)


def _carried_select(session_pk: int) -> Select[Any]:
    return select(summaries_t).join(carried_t, carried_t.c.summary_id == summaries_t.c.id).where(
        carried_t.c.session_id == session_pk).order_by(carried_t.c.ordinal)


def _leaf_span(conn: Connection, session: RowMapping, ids: list[int]) -> dict[str, Any]:
    session_pk = session["id"]
    rows = fetch_in(conn, ids, lambda chunk: select(
        messages_t.c.id, messages_t.c.seq, messages_t.c.token_count, messages_t.c.ts).where(
        messages_t.c.id.in_(chunk), messages_t.c.session_id == session_pk))
    if len(rows) != len(ids):
        raise IntegrityViolation("some source messages do not exist in this session")
    by_id = {r.id: r for r in rows}
    seqs = [by_id[i].seq for i in ids]
    if seqs != sorted(seqs):
        raise IntegrityViolation("leaf sources must be given in conversation order")
    if seqs[0] <= session["covered_seq"]:
        raise IntegrityViolation(
            f"message seq {seqs[0]} is already summarized (covered up to {session['covered_seq']})")
    between = conn.execute(select(func.count()).select_from(messages_t).where(
        messages_t.c.session_id == session_pk, messages_t.c.seq > session["covered_seq"],
        messages_t.c.seq <= seqs[-1])).scalar_one()
    if between != len(ids):
        raise IntegrityViolation("a leaf must cover the oldest raw messages of the session without gaps")
    return {"first_seq": seqs[0], "last_seq": seqs[-1],
            "source_tokens": sum(r.token_count for r in rows),
            "earliest": min(r.ts for r in rows), "latest": max(r.ts for r in rows)}


def _condensed_span(conn: Connection, session_pk: int, depth: int, ids: list[int]) -> dict[str, Any]:
    rows = fetch_in(conn, ids, lambda chunk: select(summaries_t).where(
        summaries_t.c.id.in_(chunk), summaries_t.c.session_id == session_pk))
    if len(rows) != len(ids):
        raise IntegrityViolation("some source summaries do not exist in this session")
    by_id = {r.id: r for r in rows}
    children = [by_id[i] for i in ids]
    if any(c.depth != depth - 1 for c in children):
        raise IntegrityViolation(f"a depth-{depth} summary condenses depth-{depth - 1} summaries only")
    if any(c.parent_id is not None for c in children):
        raise IntegrityViolation("some source summaries are already condensed")
    firsts = [c.first_seq for c in children]
    if firsts != sorted(firsts):
        raise IntegrityViolation("condensed sources must be given in conversation order")
    between = conn.execute(select(func.count()).select_from(summaries_t).where(
        summaries_t.c.session_id == session_pk, summaries_t.c.depth == depth - 1,
        summaries_t.c.first_seq >= firsts[0], summaries_t.c.first_seq <= firsts[-1])).scalar_one()
    if between != len(ids):
        raise IntegrityViolation("condensed sources must be consecutive summaries of their depth")
    return {"first_seq": children[0].first_seq, "last_seq": max(c.last_seq for c in children),
            "source_tokens": sum(c.token_count for c in children),
            "earliest": min(c.earliest_at for c in children),
            "latest": max(c.latest_at for c in children)}


def _checked_sources(new: NewSummary) -> list[int]:
    """The summary's source ids, once the summary is known to be writable at all."""
    checked_int("depth", new.depth, low=0)
    if not isinstance(new.content, str) or not new.content.strip():
        raise ValueError("a summary needs non-empty text")
    ids = list(new.source_ids)
    if not ids or len(set(ids)) != len(ids):
        raise ValueError("a summary needs at least one source, each listed once")
    return ids


def _move_counters(conn: Connection, session_pk: int, new: NewSummary, ids: list[int], node_id: int,
                   span: dict[str, Any], created: float) -> None:
    """A leaf moves the session's coverage; a condensation marks its children condensed (or
    finds another writer did first). Either way the summaries a context shows change."""
    if new.depth == 0:
        conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
            covered_seq=span["last_seq"],
            covered_tokens=sessions_t.c.covered_tokens + span["source_tokens"],
            summary_count=sessions_t.c.summary_count + 1,
            summary_tokens=sessions_t.c.summary_tokens + new.token_count, updated_at=created))
        return
    done = conn.execute(update(summaries_t).where(
        summaries_t.c.id.in_(ids), summaries_t.c.parent_id.is_(None)).values(parent_id=node_id)).rowcount
    if done != len(ids):
        raise ConcurrentUpdateError("another writer condensed these summaries first")
    conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
        summary_count=sessions_t.c.summary_count + 1 - len(ids),
        summary_tokens=sessions_t.c.summary_tokens + new.token_count - span["source_tokens"],
        updated_at=created))


class SummaryRepository:
    """Summary nodes and their edges (``store.summaries``)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def write(self, session_pk: int, new: NewSummary, *, now: float | None = None) -> WrittenSummary:
        """Write a summary and its ordered edges atomically; the node and the session after it.

        Depth 0: ``source_ids`` are the store ids of the oldest raw messages of the session, in
        order, with no gap. Depth d > 0: the ids of uncondensed depth d-1 summaries of the
        session, in order, with no other node of that depth between them. Anything else raises
        IntegrityViolation and writes nothing; a concurrent writer that covered the same
        sources first raises ConcurrentUpdateError.
        """
        ids = _checked_sources(new)
        content = codec.strip_unstorable(new.content)
        created = time.time() if now is None else now
        core = self._core
        try:
            with core.write() as conn:
                session = core.lock_session(conn, session_pk)
                span = _leaf_span(conn, session, ids) if new.depth == 0 else _condensed_span(
                    conn, session_pk, new.depth, ids)
                node_id = self._insert_node(conn, session, new, content, span, len(ids), created)
                column = "message_id" if new.depth == 0 else "child_id"
                conn.execute(edges_t.insert(), [
                    {"summary_id": node_id, "ordinal": i, column: source} for i, source in enumerate(ids)])
                core.fault_point("edges_inserted")
                _move_counters(conn, session_pk, new, ids, node_id, span, created)
                node = summary_record(conn.execute(select(summaries_t).where(summaries_t.c.id == node_id)).one())
                after = core.session_of(conn, session_pk)
        except IntegrityError as exc:
            raise ConcurrentUpdateError(
                f"these sources are already summarized (another writer got there first): "
                f"{first_line(exc)}") from exc
        return WrittenSummary(node, after)

    def _insert_node(self, conn: Connection, session: RowMapping, new: NewSummary, content: str,
                     span: dict[str, Any], sources: int, created: float) -> int:
        """The summary row (and its search index entry); its id."""
        body = index_body(content)
        row = {
            "session_id": session["id"], "agent_id": session["agent_id"], "depth": new.depth,
            "content": content, "search_text": None if body == content else body,
            "token_count": checked_int("token_count", new.token_count, low=0),
            "source_token_count": span["source_tokens"], "source_count": sources,
            "first_seq": span["first_seq"], "last_seq": span["last_seq"],
            "earliest_at": span["earliest"], "latest_at": span["latest"],
            "expand_hint": codec.strip_unstorable(new.expand_hint or ""),
            "kind": checked_text("kind", new.kind, 32), "model": new.model, "parent_id": None,
            "meta": codec.encode_json(new.meta) if new.meta is not None else None,
            "created_at": created,
        }
        index = IndexRow(body=body, session_pk=session["id"], agent_pk=session["agent_id"])
        [(node_id,)] = self._core.backend.insert_rows(conn, summaries_t, [row], [index], ("id",))
        self._core.fault_point("summary_inserted")
        return int(node_id)

    @lag_tolerant
    def get(self, node_id: int, *, agent: str | None = None) -> SummaryRecord | None:
        """The summary node (of ``agent`` when given), or None."""
        if not storable_id(node_id):
            return None
        stmt = select(summaries_t).where(summaries_t.c.id == node_id)
        if agent is not None:
            stmt = stmt.join(agents_t, agents_t.c.id == summaries_t.c.agent_id).where(agents_t.c.name == agent)
        with self._core.read() as conn:
            row = conn.execute(stmt).first()
        return summary_record(row) if row is not None else None

    @lag_tolerant
    def source_ids(self, node_id: int) -> list[int]:
        """The node's sources in order: message store ids (leaf) or child node ids."""
        with self._core.read() as conn:
            rows = conn.execute(select(edges_t.c.message_id, edges_t.c.child_id).where(
                edges_t.c.summary_id == node_id).order_by(edges_t.c.ordinal)).all()
        return [m if m is not None else c for m, c in rows]

    @lag_tolerant
    def expand(self, node_id: int, *, offset: int = 0, limit: int | None = None,
               ) -> tuple[list[MessageRecord] | list[SummaryRecord], int]:
        """A page of the node's sources in order (messages or child summaries), and their total."""
        checked_int("offset", offset, low=0)
        with self._core.read() as conn:
            node = conn.execute(select(summaries_t.c.depth, summaries_t.c.source_count).where(
                summaries_t.c.id == node_id)).first()
            if node is None:
                raise NotFoundError(f"summary {node_id} not found")
            page = select(edges_t.c.message_id, edges_t.c.child_id).where(
                edges_t.c.summary_id == node_id).order_by(edges_t.c.ordinal).offset(offset)
            if limit is not None:
                page = page.limit(checked_int("limit", limit, low=1))
            edges = conn.execute(page).all()
            if node.depth == 0:
                ids = [m for m, _ in edges]
                rows = fetch_in(conn, ids, lambda chunk: message_select().where(messages_t.c.id.in_(chunk)))
                by_id = {r.store_id: r for r in records(conn, rows)}
                return [by_id[i] for i in ids], node.source_count
            ids = [c for _, c in edges]
            rows = fetch_in(conn, ids, lambda chunk: select(summaries_t).where(summaries_t.c.id.in_(chunk)))
            by_node = {r.id: summary_record(r) for r in rows}
            return [by_node[i] for i in ids], node.source_count

    def carry(self, session_pk: int, summary_ids: Sequence[int]) -> int:
        """Carry summaries of the agent's earlier sessions into ``session_pk`` (idempotent);
        how many were new to it."""
        ids = list(dict.fromkeys(summary_ids))
        if not ids:
            return 0
        with self._core.write() as conn:
            session = self._core.lock_session(conn, session_pk)
            rows = fetch_in(conn, ids, lambda chunk: select(
                summaries_t.c.id, summaries_t.c.agent_id, summaries_t.c.token_count).where(
                summaries_t.c.id.in_(chunk)))
            if len(rows) != len(ids) or any(r.agent_id != session["agent_id"] for r in rows):
                raise NotFoundError("some summaries to carry do not exist for this agent")
            already = set(conn.execute(select(carried_t.c.summary_id).where(
                carried_t.c.session_id == session_pk)).scalars())
            fresh = [r for r in sorted(rows, key=lambda r: ids.index(r.id)) if r.id not in already]
            if not fresh:
                return 0
            start = conn.execute(select(func.coalesce(func.max(carried_t.c.ordinal), -1)).where(
                carried_t.c.session_id == session_pk)).scalar_one() + 1
            conn.execute(carried_t.insert(), [
                {"session_id": session_pk, "summary_id": r.id, "ordinal": start + i}
                for i, r in enumerate(fresh)])
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                summary_count=sessions_t.c.summary_count + len(fresh),
                summary_tokens=sessions_t.c.summary_tokens + sum(r.token_count for r in fresh)))
        return len(fresh)

    def compaction_view(self, session_pk: int) -> CompactionView:
        """The session with its uncondensed and carried summaries, in one read."""
        with self._core.read() as conn:
            row = conn.execute(session_select().where(sessions_t.c.id == session_pk)).first()
            if row is None:
                raise NotFoundError(f"session {session_pk} not found")
            uncondensed = conn.execute(_uncondensed_select(session_pk)).all()
            carried = conn.execute(_carried_select(session_pk)).all()
        return CompactionView(session=session_record(row),
                              uncondensed=tuple(summary_record(r) for r in uncondensed),
                              carried=tuple(summary_record(r) for r in carried))

    def carried(self, session_pk: int) -> list[SummaryRecord]:
        """Summaries carried into the session from earlier ones, in the order carried."""
        with self._core.read() as conn:
            return [summary_record(r) for r in conn.execute(_carried_select(session_pk)).all()]

    def uncondensed(self, session_pk: int) -> list[SummaryRecord]:
        """The session's summaries not condensed into a parent, highest depth first, then oldest."""
        with self._core.read() as conn:
            return [summary_record(r) for r in conn.execute(_uncondensed_select(session_pk)).all()]

    @lag_tolerant
    def of_session(self, session_pk: int, *, depth: int | None = None, limit: int = 100,
             after_first_seq: int | None = None) -> list[SummaryRecord]:
        """The session's summaries (of one depth when given) in conversation order, paged."""
        checked_int("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        stmt = select(summaries_t).where(summaries_t.c.session_id == session_pk)
        if depth is not None:
            stmt = stmt.where(summaries_t.c.depth == depth)
        if after_first_seq is not None:
            stmt = stmt.where(summaries_t.c.first_seq > after_first_seq)
        with self._core.read() as conn:
            rows = conn.execute(stmt.order_by(summaries_t.c.depth, summaries_t.c.first_seq).limit(limit)).all()
        return [summary_record(r) for r in rows]

    @lag_tolerant
    def depth_stats(self, session_pk: int) -> list[DepthStats]:
        """Per depth: node count, uncondensed count and summary tokens."""
        uncondensed = func.sum(case((summaries_t.c.parent_id.is_(None), 1), else_=0))
        with self._core.read() as conn:
            rows = conn.execute(select(
                summaries_t.c.depth, func.count(), uncondensed, func.sum(summaries_t.c.token_count)
            ).where(summaries_t.c.session_id == session_pk).group_by(summaries_t.c.depth).order_by(
                summaries_t.c.depth)).all()
        return [DepthStats(depth=d, count=c, uncondensed=int(u or 0), tokens=int(t or 0))
                for d, c, u, t in rows]
