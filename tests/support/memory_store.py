"""An in-memory implementation of the storage ports (``lcm.context.ports``), like
advanced-alchemy's memory repository: the engine core (ingest alignment, the compaction loop,
assembly) and the tools run over it without a database.

It keeps the store's contract, not its SQL: messages are rebuilt from their prepared columns
exactly as the real store rebuilds them (so a message reads back equal to what was sent),
identities are unique per session, ``seq`` is gapless, a leaf must cover the oldest raw
messages without gaps, a condensation takes consecutive uncondensed summaries one depth lower,
counters move with every write, and a write whose view is stale raises the same errors. Search
is deliberately plain (every query word as a substring of the indexed text), enough for the
tools to work; ranking quality is tested on the real backends.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from lcm import codec, textindex
from lcm.errors import ConcurrentUpdateError, IntegrityViolation, NotFoundError, StaleViewError
from lcm.messages import decode_message
from lcm.prepare import (
    PreparedMessage,
    PreparedSystemPrompt,
    chain_identities,
    decompress_payload,
    first_of_each,
    row_time,
)
from lcm.records import (
    AppendResult,
    CheckResult,
    CompactionView,
    DepthStats,
    EmbedItem,
    GeneratedMessage,
    MessageMeta,
    MessageRecord,
    NewSummary,
    SearchHit,
    SearchResult,
    SessionRecord,
    SettledTokens,
    SummaryRecord,
    SystemPromptRecord,
    VectorCoverage,
    WrittenSummary,
)
from lcm.textindex import Query, Term, make_snippet, parse_query, tokenize


@dataclass
class _Row:
    """A stored message."""

    store_id: int
    session_pk: int
    agent_pk: int
    seq: int
    identity: str
    content_hash: str
    role: str
    token_count: int
    ts: float
    tool_call_id: str | None
    message: dict[str, Any]
    index_text: str
    problem: tuple[str, ...]


@dataclass
class _Data:
    """Everything the memory store holds, behind one lock (a write is atomic, like a transaction)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    agents: dict[str, int] = field(default_factory=dict)
    sessions: dict[int, SessionRecord] = field(default_factory=dict)
    keys: dict[tuple[int, str], int] = field(default_factory=dict)  # own keys
    aliases: dict[tuple[int, str], int] = field(default_factory=dict)
    alias_order: dict[int, list[str]] = field(default_factory=dict)
    rows: dict[int, _Row] = field(default_factory=dict)
    by_seq: dict[int, list[int]] = field(default_factory=dict)  # session -> store ids in seq order
    identities: dict[int, dict[str, int]] = field(default_factory=dict)
    summaries: dict[int, SummaryRecord] = field(default_factory=dict)
    edges: dict[int, list[int]] = field(default_factory=dict)
    covered_by: dict[int, int] = field(default_factory=dict)  # message store id -> leaf id
    carried: dict[int, list[int]] = field(default_factory=dict)
    generated: dict[tuple[int, str], GeneratedMessage] = field(default_factory=dict)
    system_prompts: dict[int, list[SystemPromptRecord]] = field(default_factory=dict)
    #: (kind, item id, model) -> (agent pk, unit vector)
    vectors: dict[tuple[str, int, str], tuple[int, Any]] = field(default_factory=dict)

    def agent(self, name: str, *, create: bool) -> int | None:
        if name not in self.agents and create:
            self.agents[name] = next(self.ids)
        return self.agents.get(name)

    def agent_name(self, pk: int) -> str:
        return next(name for name, agent_pk in self.agents.items() if agent_pk == pk)

    def session(self, pk: int) -> SessionRecord:
        found = self.sessions.get(pk)
        if found is None:
            raise NotFoundError(f"session {pk} not found")
        return found

    def update(self, pk: int, **changes: Any) -> SessionRecord:
        self.sessions[pk] = record = replace(self.session(pk), **changes)
        return record

    def record(self, row: _Row) -> MessageRecord:
        return MessageRecord(store_id=row.store_id, session_pk=row.session_pk,
                             session_key=self.sessions[row.session_pk].session_key, seq=row.seq,
                             role=row.role, ts=row.ts, token_count=row.token_count,
                             message=_copy(row.message), problem=row.problem, identity=row.identity)

    def meta(self, row: _Row) -> MessageMeta:
        return MessageMeta(store_id=row.store_id, seq=row.seq, identity=row.identity,
                           content_hash=row.content_hash, role=row.role, token_count=row.token_count,
                           ts=row.ts, tool_call_id=row.tool_call_id)

    def in_range(self, session_pk: int, first: int, last: int) -> list[_Row]:
        ids = self.by_seq.get(session_pk, [])
        return [self.rows[i] for i in ids[max(0, first - 1): max(0, last)]]


def _copy(message: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(message))


def _rebuild(p: PreparedMessage) -> dict[str, Any]:
    """The message as the real store reads it back (from the same columns)."""
    e = p.encoded
    payload = decompress_payload(p.payload.data) if p.payload is not None else None
    return decode_message(role=e.role, content_kind=e.content_kind, content=e.content,
                          tool_calls=e.tool_calls, tool_call_id=e.tool_call_id, name=e.name, extra=e.extra,
                          key_order=e.key_order, payload=payload)


class _Part:
    def __init__(self, data: _Data):
        self._data = data


def _append(data: _Data, session_pk: int, prepared: Sequence[PreparedMessage], *, after_identity: str | None,
            expect_last_seq: int | None = None, timestamps: Sequence[float | None] | None = None,
            now: float | None = None) -> AppendResult:
    session = data.session(session_pk)
    identities = chain_identities(prepared, after_identity)
    ts_now = time.time() if now is None else now
    times = [row_time(timestamps[i] if timestamps is not None else None, p.encoded.host_timestamp, ts_now)
             for i, p in enumerate(prepared)]
    known = data.identities.setdefault(session_pk, {})
    if expect_last_seq is not None:
        if session.last_seq != expect_last_seq:
            raise StaleViewError(f"session {session_pk} moved on since seq {expect_last_seq}")
        fresh = first_of_each(identities)
        if any(identities[i] in known for i in fresh):
            raise ConcurrentUpdateError("another writer stored some of these messages concurrently")
    else:
        fresh = [i for i in first_of_each(identities) if identities[i] not in known]
    seq = session.last_seq
    for i in fresh:
        p, seq = prepared[i], seq + 1
        store_id = next(data.ids)
        row = _Row(store_id, session_pk, session.agent_pk, seq, identities[i], p.encoded.content_hash,
                   p.encoded.role, p.token_count, times[i], p.encoded.tool_call_id, _rebuild(p), p.body,
                   tuple(codec.decode_json(p.encoded.problem)) if p.encoded.problem else ())
        data.rows[store_id] = row
        data.by_seq.setdefault(session_pk, []).append(store_id)
        known[identities[i]] = store_id
    if fresh:
        session = data.update(session_pk, last_seq=seq, message_count=session.message_count + len(fresh),
                              token_count=session.token_count + sum(prepared[i].token_count for i in fresh),
                              updated_at=ts_now)
    fresh_set = set(fresh)
    return AppendResult(session=session, store_ids=tuple(known[i] for i in identities),
                        new_flags=tuple(i in fresh_set for i in range(len(identities))),
                        last_identity=identities[-1] if identities else (after_identity or ""),
                        token_counts=tuple(p.token_count for p in prepared))


def _new_session(data: _Data, agent_pk: int, key: str, **values: Any) -> SessionRecord:
    pk = next(data.ids)
    now = time.time()
    record = SessionRecord(id=pk, agent=data.agent_name(agent_pk), agent_pk=agent_pk, session_key=key,
                           platform=values.get("platform"), conversation_id=values.get("conversation_id"),
                           created_at=now, updated_at=now, last_seq=0, message_count=0, token_count=0,
                           covered_seq=0, covered_tokens=0, parent_id=values.get("parent_id"),
                           fork_seq=values.get("fork_seq"))
    data.sessions[pk] = record
    data.keys[(agent_pk, key)] = pk
    return record


class MemoryFamily(_Part):
    """``FamilyPort`` (the conversation's lock is the store's lock, held by ``family()``)."""

    def session(self, session_pk: int) -> SessionRecord:
        return self._data.session(session_pk)

    def metas(self, session_pk: int, first_seq: int, last_seq: int) -> list[MessageMeta]:
        return [self._data.meta(r) for r in self._data.in_range(session_pk, first_seq, last_seq)]

    def seq_of_identity(self, session_pk: int, identity: str) -> int | None:
        store_id = self._data.identities.get(session_pk, {}).get(identity)
        return self._data.rows[store_id].seq if store_id is not None else None

    def forks(self, parent_pk: int, fork_seq: int) -> list[SessionRecord]:
        return [s for s in self._data.sessions.values() if s.parent_id == parent_pk and s.fork_seq == fork_seq]

    def append(self, session_pk: int, prepared: Sequence[PreparedMessage], *,
               after_identity: str | None) -> AppendResult:
        return _append(self._data, session_pk, prepared, after_identity=after_identity)

    def create_fork(self, parent: SessionRecord, fork_seq: int) -> SessionRecord:
        n = 1 + sum(1 for s in self._data.sessions.values() if s.parent_id == parent.id)
        while (parent.agent_pk, f"{parent.session_key}/fork-{n}") in self._data.keys:
            n += 1
        return _new_session(self._data, parent.agent_pk, f"{parent.session_key}/fork-{n}",
                            platform=parent.platform, conversation_id=parent.conversation_id,
                            parent_id=parent.id, fork_seq=fork_seq)

    def add_skipped(self, session_pk: int, count: int) -> None:
        if count > 0:
            self._data.update(session_pk, skipped_count=self._data.session(session_pk).skipped_count + count)


class MemorySessions(_Part):
    def get_or_create(self, agent: str, session_key: str, *, platform: str | None = None,
                      conversation_id: str | None = None, origin: Mapping[str, Any] | None = None) -> SessionRecord:
        with self._data.lock:
            agent_pk = self._data.agent(agent, create=True)
            assert agent_pk is not None
            pk = self._data.keys.get((agent_pk, session_key))
            if pk is None:
                made = _new_session(self._data, agent_pk, session_key, platform=platform,
                                    conversation_id=conversation_id)
                return self._data.update(made.id, origin=dict(origin)) if origin is not None else made
            found = self._data.session(pk)
            return self._data.update(pk, platform=found.platform or platform,
                                     conversation_id=found.conversation_id or conversation_id,
                                     origin=found.origin or (dict(origin) if origin is not None else None))

    def find(self, agent: str, session_key: str) -> SessionRecord | None:
        agent_pk = self._data.agent(agent, create=False)
        if agent_pk is None:
            return None
        pk = self._data.keys.get((agent_pk, session_key)) or self._data.aliases.get((agent_pk, session_key))
        return self._data.sessions.get(pk) if pk is not None else None

    def alias(self, agent: str, session_key: str, session_pk: int) -> SessionRecord:
        with self._data.lock:
            existing = self.find(agent, session_key)
            if existing is not None:
                return existing
            target = self.get(session_pk, agent=agent)
            self._data.aliases[(target.agent_pk, session_key)] = session_pk
            self._data.alias_order.setdefault(session_pk, []).append(session_key)
            return target

    def keys(self, session_pk: int) -> list[str]:
        found = self._data.sessions.get(session_pk)
        return [found.session_key, *self._data.alias_order.get(session_pk, [])] if found else []

    def get(self, session_pk: int, *, agent: str | None = None) -> SessionRecord:
        found = self._data.session(session_pk)
        if agent is not None and found.agent != agent:
            raise NotFoundError(f"session {session_pk} not found")
        return found

    def of_agent(self, agent: str, *, limit: int = 100, after_id: int | None = None) -> list[SessionRecord]:
        mine = sorted((s for s in self._data.sessions.values() if s.agent == agent), key=lambda s: s.id)
        return [s for s in mine if after_id is None or s.id > after_id][:limit]

    def each(self, agent: str) -> Iterator[SessionRecord]:
        return iter(sorted((s for s in self._data.sessions.values() if s.agent == agent), key=lambda s: s.id))

    def agents(self) -> list[str]:
        return sorted(self._data.agents, key=self._data.agents.__getitem__)

    def forks(self, parent_pk: int, fork_seq: int | None = None) -> list[SessionRecord]:
        return [s for s in self._data.sessions.values()
                if s.parent_id == parent_pk and (fork_seq is None or s.fork_seq == fork_seq)]

    def add_skipped(self, session_pk: int, count: int) -> None:
        with self._data.lock:
            if count > 0:
                self._data.update(session_pk, skipped_count=self._data.session(session_pk).skipped_count + count)

    def keep_system_prompt(self, session_pk: int, prompt: PreparedSystemPrompt, *, first_seq: int,
                           at: float | None = None) -> bool:
        with self._data.lock:
            self._data.session(session_pk)
            versions = self._data.system_prompts.setdefault(session_pk, [])
            if any(v.digest == prompt.digest for v in versions):
                return False
            versions.append(SystemPromptRecord(
                id=next(self._data.ids), session_pk=session_pk, digest=prompt.digest,
                message=codec.decode_json(prompt.text), token_count=prompt.token_count,
                first_seq=first_seq, created_at=time.time() if at is None else float(at)))
            return True

    def system_prompts(self, session_pk: int) -> list[SystemPromptRecord]:
        with self._data.lock:
            return sorted(self._data.system_prompts.get(session_pk, []), key=lambda v: (v.first_seq, v.id))

    def set_host_view(self, session_pk: int, first_seq: int, *,
                      outcome: Mapping[str, Any] | None = None) -> SessionRecord:
        with self._data.lock:
            changes: dict[str, Any] = {"host_view_seq": first_seq}
            if outcome is not None:
                changes["last_compaction"] = dict(outcome)
            return self._data.update(session_pk, **changes)

    def record_compaction(self, session_pk: int, outcome: Mapping[str, Any]) -> None:
        with self._data.lock:
            self._data.update(session_pk, last_compaction=dict(outcome))

    @contextmanager
    def family(self, session_pk: int) -> Iterator[MemoryFamily]:
        with self._data.lock:
            self._data.session(session_pk)
            yield MemoryFamily(self._data)


class MemoryMessages(_Part):
    def append(self, session_pk: int, prepared: Sequence[PreparedMessage], *,
               after_identity: str | None = None, expect_last_seq: int | None = None,
               timestamps: Sequence[float | None] | None = None, now: float | None = None) -> AppendResult:
        if timestamps is not None and len(timestamps) != len(prepared):
            raise ValueError(f"{len(timestamps)} timestamps for {len(prepared)} messages")
        with self._data.lock:
            return _append(self._data, session_pk, prepared, after_identity=after_identity,
                           expect_last_seq=expect_last_seq, timestamps=timestamps, now=now)

    def get_range(self, session_pk: int, *, first_seq: int | None = None, last_seq: int | None = None,
                  limit: int | None = None) -> list[MessageRecord]:
        rows = self._data.in_range(session_pk, first_seq or 1, last_seq or 2**62)
        return [self._data.record(r) for r in rows[:limit]]

    def page(self, session_pk: int, *, after_store_id: int | None = None, limit: int = 100,
             roles: Sequence[str] | None = None) -> tuple[list[MessageRecord], int | None]:
        rows = [self._data.rows[i] for i in self._data.by_seq.get(session_pk, [])
                if (after_store_id is None or i > after_store_id)]
        rows = [r for r in rows if not roles or r.role in roles]
        page = [self._data.record(r) for r in rows[:limit]]
        return page, (page[-1].store_id if len(rows) > limit else None)

    def latest(self, session_pk: int, *, roles: Sequence[str], limit: int, min_seq: int = 1,
               max_seq: int | None = None) -> list[MessageRecord]:
        rows = self._data.in_range(session_pk, min_seq, max_seq or 2**62)
        return [self._data.record(r) for r in reversed(rows) if r.role in roles][:limit]

    def get(self, store_id: int, *, agent: str) -> MessageRecord | None:
        found = self.get_many([store_id], agent=agent)
        return found[0] if found else None

    def get_many(self, store_ids: Sequence[int], *, agent: str) -> list[MessageRecord]:
        agent_pk = self._data.agent(agent, create=False)
        return [self._data.record(self._data.rows[i]) for i in store_ids
                if i in self._data.rows and self._data.rows[i].agent_pk == agent_pk]

    def tail(self, session_pk: int, count: int) -> list[MessageMeta]:
        ids = self._data.by_seq.get(session_pk, [])
        return [self._data.meta(self._data.rows[i]) for i in ids[len(ids) - count:]] if count else []

    def metas(self, session_pk: int, *, first_seq: int, last_seq: int) -> list[MessageMeta]:
        return [self._data.meta(r) for r in self._data.in_range(session_pk, first_seq, last_seq)]

    def seq_of_identity(self, session_pk: int, identity: str) -> int | None:
        store_id = self._data.identities.get(session_pk, {}).get(identity)
        return self._data.rows[store_id].seq if store_id is not None else None

    def remember_generated(self, agent: str, generated: Mapping[str, GeneratedMessage]) -> None:
        with self._data.lock:
            agent_pk = self._data.agent(agent, create=True)
            assert agent_pk is not None
            for digest, record in generated.items():
                self._data.generated.setdefault((agent_pk, digest), record)

    def generated(self, agent: str, digests: Collection[str]) -> dict[str, GeneratedMessage]:
        agent_pk = self._data.agent(agent, create=False)
        return {d: self._data.generated[(agent_pk, d)] for d in digests
                if agent_pk is not None and (agent_pk, d) in self._data.generated}

    #: Every turn is counted exactly here (like PostgreSQL), so nothing is ever settled later.
    counts_later = False

    def settle_tokens(self, session_pk: int, count: Any) -> SettledTokens:
        return SettledTokens()


class MemorySummaries(_Part):
    def write(self, session_pk: int, new: NewSummary, *, now: float | None = None) -> WrittenSummary:
        if not new.content.strip():
            raise ValueError("a summary needs non-empty text")
        ids = list(new.source_ids)
        if not ids or len(set(ids)) != len(ids):
            raise ValueError("a summary needs at least one source, each listed once")
        with self._data.lock:
            data, session = self._data, self._data.session(session_pk)
            if new.depth == 0:
                rows = [data.rows.get(i) for i in ids]
                if any(r is None or r.session_pk != session_pk for r in rows):
                    raise IntegrityViolation("some source messages do not exist in this session")
                seqs = [r.seq for r in rows if r is not None]
                if seqs[0] <= session.covered_seq:
                    raise IntegrityViolation(f"message seq {seqs[0]} is already summarized")
                if seqs != list(range(session.covered_seq + 1, session.covered_seq + 1 + len(ids))):
                    raise IntegrityViolation("a leaf must cover the oldest raw messages without gaps")
                span = [(r.seq, r.ts, r.token_count) for r in rows if r is not None]
                first, last = seqs[0], seqs[-1]
                source_tokens = sum(t for _, _, t in span)
                earliest, latest = min(ts for _, ts, _ in span), max(ts for _, ts, _ in span)
            else:
                children = [data.summaries.get(i) for i in ids]
                if any(c is None or c.session_pk != session_pk for c in children):
                    raise IntegrityViolation("some source summaries do not exist in this session")
                nodes = [c for c in children if c is not None]
                if any(c.depth != new.depth - 1 for c in nodes):
                    raise IntegrityViolation("a condensed summary takes summaries one depth lower")
                if any(c.parent_id is not None for c in nodes):
                    raise ConcurrentUpdateError("some source summaries are already condensed")
                same_depth = sorted((s for s in data.summaries.values() if s.session_pk == session_pk
                                     and s.depth == new.depth - 1), key=lambda s: s.first_seq)
                positions = [same_depth.index(c) for c in nodes]
                if positions != list(range(positions[0], positions[0] + len(nodes))):
                    raise IntegrityViolation("condensed sources must be consecutive summaries of their depth")
                first, last = nodes[0].first_seq, max(c.last_seq for c in nodes)
                source_tokens = sum(c.token_count for c in nodes)
                earliest, latest = min(c.earliest_at for c in nodes), max(c.latest_at for c in nodes)
            node = SummaryRecord(
                id=next(data.ids), session_pk=session_pk, depth=new.depth, content=new.content,
                token_count=new.token_count, source_token_count=source_tokens, source_count=len(ids),
                first_seq=first, last_seq=last, earliest_at=earliest, latest_at=latest,
                expand_hint=new.expand_hint, kind=new.kind, model=new.model, parent_id=None,
                meta=new.meta, created_at=time.time() if now is None else now)
            data.summaries[node.id] = node
            data.edges[node.id] = ids
            if new.depth == 0:
                for i in ids:
                    data.covered_by[i] = node.id
                after = data.update(session_pk, covered_seq=last, covered_tokens=session.covered_tokens + source_tokens,
                                    summary_count=session.summary_count + 1,
                                    summary_tokens=session.summary_tokens + node.token_count)
            else:
                for i in ids:
                    data.summaries[i] = replace(data.summaries[i], parent_id=node.id)
                after = data.update(session_pk, summary_count=session.summary_count + 1 - len(ids),
                                    summary_tokens=session.summary_tokens + node.token_count - source_tokens)
            return WrittenSummary(node, after)

    def get(self, node_id: int, *, agent: str | None = None) -> SummaryRecord | None:
        node = self._data.summaries.get(node_id)
        if node is None or (agent is not None and self._data.sessions[node.session_pk].agent != agent):
            return None
        return node

    def source_ids(self, node_id: int) -> list[int]:
        return list(self._data.edges.get(node_id, []))

    def expand(self, node_id: int, *, offset: int = 0, limit: int | None = None,
               ) -> tuple[list[MessageRecord] | list[SummaryRecord], int]:
        node = self._data.summaries.get(node_id)
        if node is None:
            raise NotFoundError(f"summary {node_id} not found")
        ids = self._data.edges[node_id]
        page = ids[offset: offset + limit if limit is not None else None]
        if node.depth == 0:
            return [self._data.record(self._data.rows[i]) for i in page], len(ids)
        return [self._data.summaries[i] for i in page], len(ids)

    def carry(self, session_pk: int, summary_ids: Sequence[int]) -> int:
        with self._data.lock:
            session = self._data.session(session_pk)
            ids = list(dict.fromkeys(summary_ids))
            nodes = [self._data.summaries.get(i) for i in ids]
            if any(n is None or self._data.sessions[n.session_pk].agent_pk != session.agent_pk for n in nodes):
                raise NotFoundError("some summaries to carry do not exist for this agent")
            carried = self._data.carried.setdefault(session_pk, [])
            fresh = [n for n in nodes if n is not None and n.id not in carried]
            carried.extend(n.id for n in fresh)
            if fresh:
                self._data.update(session_pk, summary_count=session.summary_count + len(fresh),
                                  summary_tokens=session.summary_tokens + sum(n.token_count for n in fresh))
            return len(fresh)

    def compaction_view(self, session_pk: int) -> CompactionView:
        return CompactionView(session=self._data.session(session_pk),
                              uncondensed=tuple(self._uncondensed(session_pk)),
                              carried=tuple(self._carried(session_pk)))

    def _uncondensed(self, session_pk: int) -> list[SummaryRecord]:
        return sorted((s for s in self._data.summaries.values() if s.session_pk == session_pk and s.parent_id is None),
                      key=lambda s: (-s.depth, s.first_seq))

    def _carried(self, session_pk: int) -> list[SummaryRecord]:
        return [self._data.summaries[i] for i in self._data.carried.get(session_pk, [])]

    def carried(self, session_pk: int) -> list[SummaryRecord]:
        return self._carried(session_pk)

    def uncondensed(self, session_pk: int) -> list[SummaryRecord]:
        return self._uncondensed(session_pk)

    def of_session(self, session_pk: int, *, depth: int | None = None, limit: int = 100,
                   after_first_seq: int | None = None) -> list[SummaryRecord]:
        nodes = [s for s in self._data.summaries.values() if s.session_pk == session_pk
                 and (depth is None or s.depth == depth)
                 and (after_first_seq is None or s.first_seq > after_first_seq)]
        return sorted(nodes, key=lambda s: (s.depth, s.first_seq))[:limit]

    def depth_stats(self, session_pk: int) -> list[DepthStats]:
        by_depth: dict[int, list[SummaryRecord]] = {}
        for s in self._data.summaries.values():
            if s.session_pk == session_pk:
                by_depth.setdefault(s.depth, []).append(s)
        return [DepthStats(depth=d, count=len(nodes), uncondensed=sum(n.parent_id is None for n in nodes),
                           tokens=sum(n.token_count for n in nodes)) for d, nodes in sorted(by_depth.items())]


class MemorySearch(_Part):
    """Every query word (parsed as lcm parses queries) must appear in the indexed text; then, as
    the store does, rows with some of its content words (``match="any"``), most words first."""

    @staticmethod
    def _found(term: Term, words: set[str]) -> bool:
        *whole, last = term.tokens
        return all(w in words for w in whole) and (
            any(w.startswith(last) for w in words) if term.prefix else last in words)

    def _score(self, text: str, query: Query) -> int | None:
        """Groups the text matches (None: not a match: a group missed, or a negative hit)."""
        words = set(tokenize(text))
        if any(self._found(t, words) for t in query.negatives):
            return None
        matched = sum(any(self._found(t, words) for t in group) for group in query.groups)
        return matched if matched == len(query.groups) else None

    def _search(self, query: str, limit: int, any_words: bool,
                rows: list[tuple[str, SearchHit]], every_word_first: bool = True) -> SearchResult:
        parsed = parse_query(query)
        if parsed.is_empty:
            return SearchResult(hits=[], notes=parsed.notes)
        hits = [replace(h, snippet=make_snippet(text, parsed)) for text, h in rows
                if self._score(text, parsed) is not None][:limit] if (
            every_word_first or not any_words or textindex.any_words(parsed) is None) else []  # one word: its own
        wider = textindex.any_words(parsed) if any_words and len(hits) < limit else None
        if wider is not None:
            seen = {h.id for h in hits}
            terms = wider.groups[0]
            scored = [(sum(self._found(t, set(tokenize(text))) for t in terms), text, h) for text, h in rows
                      if h.id not in seen and self._score(text, wider) is not None]
            scored.sort(key=lambda x: (-x[0], -x[2].id))
            hits += [replace(h, snippet=make_snippet(text, wider), match="any", score=float(n))
                     for n, text, h in scored[:limit - len(hits)]]
        return SearchResult(hits=hits, notes=parsed.notes)

    def messages(self, query: str, *, agent: str, session_pk: int | None = None, roles: Sequence[str] = (),
                 platform: str | None = None, time_from: float | None = None, time_to: float | None = None,
                 sort: str = "recency", limit: int = 10, any_words: bool = False,
                 snippets: bool = True, held_session: int | None = None,
                 every_word_first: bool = True, term_matches: int | None = None,
                 neighbours: bool = False) -> SearchResult:
        # held_session: nothing here waits for an index, so there is nothing to leave waiting;
        # neighbours: not read with the hits here (``SearchResult.adjacent`` None: asked apart);
        # term_matches bounds a database's reads of a common word: here every row is read.
        agent_pk = self._data.agent(agent, create=False)
        rows = [(r.index_text, SearchHit(kind="message", id=r.store_id, session_pk=r.session_pk,
                                         session_key=self._data.sessions[r.session_pk].session_key, ts=r.ts,
                                         role=r.role, snippet=""))
                for r in sorted(self._data.rows.values(), key=lambda r: -r.store_id)
                if r.agent_pk == agent_pk and (session_pk is None or r.session_pk == session_pk)
                and (not roles or r.role in roles) and (time_from is None or r.ts >= time_from)
                and (time_to is None or r.ts <= time_to)
                and (platform is None or self._data.sessions[r.session_pk].platform == platform)]
        return self._search(query, limit, any_words, rows, every_word_first)

    def summaries(self, query: str, *, agent: str, session_pk: int | None = None, sort: str = "recency",
                  limit: int = 10, time_from: float | None = None, time_to: float | None = None,
                  any_words: bool = False) -> SearchResult:
        rows = [(s.content, SearchHit(kind="summary", id=s.id, session_pk=s.session_pk,
                                      session_key=self._data.sessions[s.session_pk].session_key, ts=s.latest_at,
                                      depth=s.depth, snippet=""))
                for s in sorted(self._data.summaries.values(), key=lambda s: -s.id)
                if self._data.sessions[s.session_pk].agent == agent
                and (session_pk is None or s.session_pk == session_pk)]
        return self._search(query, limit, any_words, rows)
    def adjacent_messages(self, query: str, store_ids: Collection[int], *, agent: str, snippets: bool = True,
                          ) -> dict[int, tuple[SearchHit | None, SearchHit | None]]:
        agent_pk = self._data.agent(agent, create=False)
        at = {(r.session_pk, r.seq): r for r in self._data.rows.values() if r.agent_pk == agent_pk}
        parsed = parse_query(query)

        def hit(key: tuple[int, int]) -> SearchHit | None:
            r = at.get(key)
            return None if r is None else SearchHit(
                kind="message", id=r.store_id, session_pk=r.session_pk, ts=r.ts, role=r.role,
                session_key=self._data.sessions[r.session_pk].session_key, match="neighbour",
                snippet=make_snippet(r.index_text, parsed, loose=True))

        return {r.store_id: (hit((r.session_pk, r.seq - 1)), hit((r.session_pk, r.seq + 1)))
                for r in at.values() if r.store_id in store_ids}

    def similar_messages(self, query: str, vector: Any, *, model: str, agent: str, session_pk: int | None = None,
                         roles: Sequence[str] = (), platform: str | None = None, time_from: float | None = None,
                         time_to: float | None = None, limit: int = 10, snippets: bool = True) -> SearchResult:
        agent_pk = self._data.agent(agent, create=False)
        rows = {r.store_id: r for r in self._data.rows.values()
                if r.agent_pk == agent_pk and (session_pk is None or r.session_pk == session_pk)
                and (not roles or r.role in roles) and (time_from is None or r.ts >= time_from)
                and (time_to is None or r.ts <= time_to)
                and (platform is None or self._data.sessions[r.session_pk].platform == platform)}
        parsed = parse_query(query)
        return SearchResult(hits=[
            SearchHit(kind="message", id=i, session_pk=rows[i].session_pk, ts=rows[i].ts, role=rows[i].role,
                      session_key=self._data.sessions[rows[i].session_pk].session_key, score=score,
                      snippet=make_snippet(rows[i].index_text, parsed, loose=True), match="semantic")
            for i, score in self._nearest("message", set(rows), model, vector, limit)])

    def similar_summaries(self, query: str, vector: Any, *, model: str, agent: str, session_pk: int | None = None,
                          node_ids: Collection[int] = (), limit: int = 10) -> SearchResult:
        nodes = {s.id: s for s in self._data.summaries.values()
                 if self._data.sessions[s.session_pk].agent == agent
                 and (session_pk is None or s.session_pk == session_pk or s.id in node_ids)}
        parsed = parse_query(query)
        return SearchResult(hits=[
            SearchHit(kind="summary", id=i, session_pk=nodes[i].session_pk, ts=nodes[i].latest_at,
                      session_key=self._data.sessions[nodes[i].session_pk].session_key, depth=nodes[i].depth,
                      score=score, snippet=make_snippet(nodes[i].content, parsed, loose=True), match="semantic")
            for i, score in self._nearest("summary", set(nodes), model, vector, limit)])

    def _nearest(self, kind: str, allowed: set[int], model: str, vector: Any, limit: int) -> list[tuple[int, float]]:
        """Exact cosine over every allowed item with a vector of ``model`` (vectors are unit length)."""
        query = [float(x) for x in vector.reshape(-1)]
        scored = [(sum(a * b for a, b in zip(v, query, strict=False)), item)
                  for (k, item, m), (_, v) in self._data.vectors.items()
                  if k == kind and m == model and item in allowed and len(v) == len(query)]
        scored.sort(key=lambda x: (-x[0], -x[1]))
        return [(item, round(score, 6)) for score, item in scored[:limit]]


class MemoryVectors(_Part):
    """Vectors by (kind, item, model); what the real store keeps in ``lcm_vectors``."""

    def _items(self, kind: str, agent_pk: int | None) -> list[EmbedItem]:
        if kind == "message":
            return [EmbedItem(kind="message", id=r.store_id, agent_pk=r.agent_pk, session_pk=r.session_pk,
                              role=r.role, ts=r.ts, text=r.index_text or "")
                    for r in sorted(self._data.rows.values(), key=lambda r: r.store_id)
                    if agent_pk is None or r.agent_pk == agent_pk]
        out = []
        for s in sorted(self._data.summaries.values(), key=lambda s: s.id):
            pk = self._data.agents[self._data.sessions[s.session_pk].agent]
            if agent_pk is None or pk == agent_pk:
                out.append(EmbedItem(kind="summary", id=s.id, agent_pk=pk, session_pk=s.session_pk, role=None,
                                     ts=s.latest_at, text=s.content))
        return out

    def _agent_pk(self, agent: str | None) -> int | None:
        return None if agent is None else self._data.agent(agent, create=False) or -1

    def pending(self, model: str, *, kind: str, agent: str | None = None, after_id: int = 0,
                limit: int = 256) -> list[EmbedItem]:
        with self._data.lock:
            return [it for it in self._items(kind, self._agent_pk(agent))
                    if it.id > after_id and (kind, it.id, model) not in self._data.vectors][:limit]

    def put(self, model: str, items: Sequence[EmbedItem], vectors: Any) -> int:
        if len(items) != len(vectors):
            raise ValueError(f"{len(items)} items but {len(vectors)} vectors")
        written = 0
        with self._data.lock:
            for item, vector in zip(items, vectors, strict=True):
                key = (item.kind, item.id, model)
                alive = item.id in (self._data.rows if item.kind == "message" else self._data.summaries)
                if alive and key not in self._data.vectors:
                    self._data.vectors[key] = (item.agent_pk, [float(x) for x in vector])
                    written += 1
        return written

    def prune(self, model: str, *, agent: str | None = None) -> int:
        agent_pk = self._agent_pk(agent)
        with self._data.lock:
            gone = [k for k, (pk, _) in self._data.vectors.items()
                    if k[2] != model and (agent_pk is None or pk == agent_pk)]
            for k in gone:
                del self._data.vectors[k]
        return len(gone)

    def coverage(self, model: str | None, *, agent: str | None = None) -> VectorCoverage:
        agent_pk = self._agent_pk(agent)
        with self._data.lock:
            mine = [k for k, (pk, _) in self._data.vectors.items() if agent_pk is None or pk == agent_pk]
            others: dict[str, int] = {}
            for k in mine:
                if k[2] != model:
                    others[k[2]] = others.get(k[2], 0) + 1
            return VectorCoverage(
                model=model, messages=len(self._items("message", agent_pk)),
                messages_embedded=sum(k[0] == "message" and k[2] == model for k in mine),
                summaries=len(self._items("summary", agent_pk)),
                summaries_embedded=sum(k[0] == "summary" and k[2] == model for k in mine),
                other_models=dict(sorted(others.items())))


class MemoryHealth(_Part):
    """The invariants the real doctor checks that a memory store can break at all."""

    def checks(self, *, deep: bool = False, everything: bool = False,
               bound: int | None = None) -> list[CheckResult]:
        data, problems = self._data, []  # a memory store is small: every session, whatever the bound
        for s in data.sessions.values():
            rows = data.in_range(s.id, 1, s.last_seq)
            if [r.seq for r in rows] != list(range(1, s.last_seq + 1)) or s.message_count != len(rows) \
                    or s.token_count != sum(r.token_count for r in rows):
                problems.append(f"session {s.id}: message counters disagree with the rows")
            covered = [r for r in rows if r.store_id in data.covered_by]
            if [r.seq for r in covered] != list(range(1, s.covered_seq + 1)) \
                    or s.covered_tokens != sum(r.token_count for r in covered):
                problems.append(f"session {s.id}: coverage disagrees with the leaves")
            shown = [n for n in data.summaries.values() if n.session_pk == s.id and n.parent_id is None] + [
                data.summaries[i] for i in data.carried.get(s.id, [])]
            if s.summary_count != len(shown) or s.summary_tokens != sum(n.token_count for n in shown):
                problems.append(f"session {s.id}: summary counters disagree with the DAG")
        return [CheckResult("memory_invariants", "fail" if problems else "ok",
                            "; ".join(problems[:5]) or "counters, coverage and summary counters hold")]


class MemoryStore:
    """``lcm.context.ports.StorePorts`` over dictionaries."""

    backend_name = "memory"
    location = ":memory:"

    def __init__(self) -> None:
        self.data = _Data()
        self.sessions = MemorySessions(self.data)
        self.messages = MemoryMessages(self.data)
        self.summaries = MemorySummaries(self.data)
        self.search = MemorySearch(self.data)
        self.vectors = MemoryVectors(self.data)
        self.health = MemoryHealth(self.data)
