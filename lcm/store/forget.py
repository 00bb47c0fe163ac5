"""Forgetting: erasing messages for good (``lcm forget``), and everything derived from them.

What goes, per session, in one locked write transaction:

* the chosen messages (by session, time range, or text / regular-expression match), their
  search-index rows (FTS5 triggers; PostgreSQL's columns go with the row), their vectors
  (``ON DELETE CASCADE``) and a large payload no other message uses;
* every summary of the session from the first forgotten message on (any depth: a summary is
  derived text, and a condensed node over a forgotten leaf is too), with their edges and
  vectors, and where such a summary was carried into a later session; a summary whose own text
  matches is dropped the same way; matching system prompt versions go too;
* the session's remaining messages are renumbered so ``seq`` stays gapless, and its counters,
  coverage and fork points follow.

What remains is consistent with every invariant the doctor checks: leaves still cover the
oldest messages without gaps (the dropped tail of the DAG is simply raw again), so the engine
core can summarize the now-raw messages again (``lcm forget`` does it at once: see
``lcm.cli.forget``). Nothing here ever calls a summarizer.

SQLite keeps deleted bytes in free pages and FTS5 segments until they are overwritten: the
forgetting transaction runs with ``secure_delete`` on (freed pages are zeroed), and the
full-text tables are merged afterwards (``Backend.after_forget``); ``vacuum`` rewrites the file
(or, on PostgreSQL, the tables) so not even a free page keeps a copy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, select, update

from lcm.errors import ConfigError
from lcm.messages import message_text
from lcm.store._core import (
    IN_CHUNK,
    StoreCore,
    aliases_t,
    carried_t,
    edges_t,
    messages_t,
    payloads_t,
    sessions_t,
    summaries_t,
    system_prompts_t,
)
from lcm.store.messages import message_select, records

#: Messages read (and matched) per query while choosing what to forget.
SCAN_BATCH = 1000


@dataclass(frozen=True)
class ForgetSelector:
    """What to forget, within one agent: every condition given must hold (none: refused)."""

    agent: str
    session_keys: tuple[str, ...] = ()
    time_from: float | None = None
    time_to: float | None = None
    match: str | None = None  # a substring, case-insensitive
    regex: str | None = None  # a Python regular expression
    everything: bool = False  # the whole agent

    def matcher(self) -> re.Pattern[str] | None:
        if self.match is not None and self.regex is not None:
            raise ConfigError("give --match or --regex, not both")
        if self.regex is not None:
            try:
                return re.compile(self.regex)
            except re.error as exc:
                raise ConfigError(f"--regex is not a valid regular expression: {exc}") from None
        if self.match is not None:
            if not self.match:
                raise ConfigError("--match needs some text")
            return re.compile(re.escape(self.match), re.IGNORECASE)
        return None

    def check(self) -> None:
        chosen = self.session_keys or self.time_from is not None or self.time_to is not None or (
            self.match is not None or self.regex is not None)
        if not chosen and not self.everything:
            raise ConfigError("say what to forget: --session, --since/--until, --match or --regex "
                              "(or --all-of-agent for everything the agent stored)")
        if self.time_from is not None and self.time_to is not None and self.time_from > self.time_to:
            raise ConfigError("--since is after --until: nothing would be forgotten")
        self.matcher()


@dataclass
class SessionForget:
    """What forgetting does to one session."""

    session_pk: int
    session_key: str
    message_ids: list[int]
    message_seqs: list[int]
    first_seq: int  # the first seq affected (forgotten message or matching summary)
    summaries: int = 0  # summaries dropped (to be rebuilt from what remains)
    system_prompts: list[int] = field(default_factory=list)
    covered_before: int = 0  # messages under summaries before

    def as_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_key, "messages": len(self.message_ids),
                "summaries": self.summaries, "system_prompts": len(self.system_prompts),
                "from_seq": self.first_seq}


@dataclass
class ForgetPlan:
    sessions: list[SessionForget]

    @property
    def messages(self) -> int:
        return sum(len(s.message_ids) for s in self.sessions)

    @property
    def summaries(self) -> int:
        return sum(s.summaries for s in self.sessions)

    def as_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "summaries": self.summaries,
                "system_prompts": sum(len(s.system_prompts) for s in self.sessions),
                "sessions": [s.as_dict() for s in self.sessions]}


def _searchable(message: dict[str, Any]) -> str:
    """The text a match looks in: the message's text and tool calls, and every other string
    field (a name, an id), so nothing that holds the pattern is missed."""
    parts = [message_text(message)]
    for key, value in message.items():
        if key not in ("content", "tool_calls", "role") and value is not None:
            parts.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return "\n".join(parts)


class ForgetRepository:
    """Erasing messages and what was derived from them (``store.forget``)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def plan(self, selector: ForgetSelector) -> ForgetPlan:
        """What :meth:`apply` would erase (nothing is changed)."""
        selector.check()
        pattern = selector.matcher()
        plans: list[SessionForget] = []
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, selector.agent, create=False)
            if agent_pk is None:
                return ForgetPlan([])
            for session in self._sessions(conn, agent_pk, selector.session_keys):
                found = self._session_plan(conn, session, selector, pattern)
                if found is not None:
                    plans.append(found)
        return ForgetPlan(plans)

    def _sessions(self, conn: Connection, agent_pk: int, keys: Sequence[str]) -> list[Any]:
        """The agent's sessions (those ``keys`` name, own key or alias, when given), oldest first;
        a key that names none is an error, not silently nothing."""
        rows = list(conn.execute(select(sessions_t).where(sessions_t.c.agent_id == agent_pk).order_by(sessions_t.c.id)))
        if not keys:
            return rows
        wanted = set(keys)
        by_key = {r.session_key: r.id for r in rows if r.session_key in wanted}
        for key, session_pk in conn.execute(select(aliases_t.c.session_key, aliases_t.c.session_id).where(
                aliases_t.c.agent_id == agent_pk, aliases_t.c.session_key.in_(sorted(wanted)))):
            by_key.setdefault(key, session_pk)  # a key that names a session of its own keeps naming it
        missing = wanted - set(by_key)
        if missing:
            raise ConfigError(f"no session {', '.join(sorted(missing))} for agent; lcm sessions lists them")
        chosen = set(by_key.values())
        return [r for r in rows if r.id in chosen]

    def _session_plan(self, conn: Connection, session: Any, selector: ForgetSelector,
                      pattern: re.Pattern[str] | None) -> SessionForget | None:
        m = messages_t
        stmt = message_select().where(m.c.session_id == session.id)
        if selector.time_from is not None:
            stmt = stmt.where(m.c.ts >= selector.time_from)
        if selector.time_to is not None:
            stmt = stmt.where(m.c.ts <= selector.time_to)
        doomed: list[tuple[int, int]] = []
        after = 0
        while True:
            rows = conn.execute(stmt.where(m.c.seq > after).order_by(m.c.seq).limit(SCAN_BATCH)).all()
            if not rows:
                break
            after = rows[-1].seq
            if pattern is None:
                doomed += [(r.id, r.seq) for r in rows]
            else:
                doomed += [(rec.store_id, rec.seq) for rec in records(conn, rows)
                           if pattern.search(_searchable(rec.message))]
        first = min((seq for _, seq in doomed), default=None)
        prompts: list[int] = []
        if pattern is not None:
            nodes = conn.execute(select(summaries_t.c.first_seq, summaries_t.c.content).where(
                summaries_t.c.session_id == session.id)).all()
            matched = [n.first_seq for n in nodes if pattern.search(n.content)]
            if matched:
                first = min([*matched, *([first] if first is not None else [])])
            prompts = [p.id for p in conn.execute(select(system_prompts_t.c.id, system_prompts_t.c.message).where(
                system_prompts_t.c.session_id == session.id)) if pattern.search(p.message)]
        elif selector.everything or (selector.session_keys and selector.time_from is None
                                     and selector.time_to is None):
            prompts = list(conn.execute(select(system_prompts_t.c.id).where(
                system_prompts_t.c.session_id == session.id)).scalars())
        if first is None and not prompts:
            return None
        plan = SessionForget(session.id, session.session_key, [i for i, _ in doomed], [q for _, q in doomed],
                             first if first is not None else session.last_seq + 1, system_prompts=prompts,
                             covered_before=session.covered_seq)
        plan.summaries = int(conn.execute(select(func.count()).select_from(summaries_t).where(
            summaries_t.c.session_id == session.id, summaries_t.c.last_seq >= plan.first_seq)).scalar() or 0)
        return plan

    # ------------------------------------------------------------------ erasing

    def apply(self, plan: ForgetPlan, *, vacuum: bool = False) -> list[int]:
        """Erase what ``plan`` lists (made by :meth:`plan` just before); returns the sessions
        whose summaries were dropped (to summarize again). ``vacuum``: then rewrite the
        database (SQLite) or its tables (PostgreSQL) so no free page keeps a copy."""
        touched: list[int] = []
        for item in plan.sessions:
            with self._core.write() as conn:
                self._core.backend.before_forget(conn)
                if self._erase(conn, item):
                    touched.append(item.session_pk)
        self._core.backend.after_forget(self._core.engine, vacuum=vacuum)
        return touched

    def _erase(self, conn: Connection, item: SessionForget) -> bool:
        session = self._core.lock_session(conn, item.session_pk)
        s, m = summaries_t, messages_t
        first = item.first_seq
        dropped = list(conn.execute(select(s.c.id).where(s.c.session_id == item.session_pk,
                                                         s.c.last_seq >= first)).scalars())
        for chunk in _chunks(dropped):
            carriers = set(conn.execute(select(carried_t.c.session_id).where(
                carried_t.c.summary_id.in_(chunk))).scalars())
            conn.execute(delete(carried_t).where(carried_t.c.summary_id.in_(chunk)))
            for carrier in carriers - {item.session_pk}:
                self._recount_summaries(conn, carrier)
            # The DAG references itself both ways (edges to children, parent ids): cut the
            # references first, then the nodes. Kept children of a dropped node are uncondensed.
            conn.execute(delete(edges_t).where(edges_t.c.summary_id.in_(chunk)))
            conn.execute(update(s).where(s.c.parent_id.in_(chunk)).values(parent_id=None))
        for chunk in _chunks(dropped):
            conn.execute(delete(s).where(s.c.id.in_(chunk)))
        payload_ids: set[int] = set()
        for chunk in _chunks(item.message_ids):
            payload_ids |= {p for p in conn.execute(select(m.c.payload_id).where(
                m.c.id.in_(chunk), m.c.payload_id.is_not(None))).scalars()}
            conn.execute(delete(m).where(m.c.id.in_(chunk)))
        for chunk in _chunks(sorted(payload_ids)):
            used = set(conn.execute(select(m.c.payload_id).where(m.c.payload_id.in_(chunk))).scalars())
            gone = [p for p in chunk if p not in used]
            if gone:
                conn.execute(delete(payloads_t).where(payloads_t.c.id.in_(gone)))
        for chunk in _chunks(item.system_prompts):
            conn.execute(delete(system_prompts_t).where(system_prompts_t.c.id.in_(chunk)))
        self._renumber(conn, item.session_pk, first)
        for fork in conn.execute(select(sessions_t.c.id, sessions_t.c.fork_seq).where(
                sessions_t.c.parent_id == item.session_pk)).all():
            if fork.fork_seq:  # the fork keeps pointing at the same shared message
                shared_gone = sum(1 for q in item.message_seqs if q <= fork.fork_seq)
                conn.execute(update(sessions_t).where(sessions_t.c.id == fork.id).values(
                    fork_seq=fork.fork_seq - shared_gone))
        covered = conn.execute(select(func.max(s.c.last_seq)).where(
            s.c.session_id == item.session_pk, s.c.depth == 0)).scalar() or 0
        count, tokens = conn.execute(select(func.count(), func.coalesce(func.sum(m.c.token_count), 0)).where(
            m.c.session_id == item.session_pk)).one()
        covered_tokens = conn.execute(select(func.coalesce(func.sum(m.c.token_count), 0)).where(
            m.c.session_id == item.session_pk, m.c.seq <= covered)).scalar() or 0
        # Estimated token counts (a store that counts later) move down with their messages:
        # from ``first`` on is a safe bound (counting an exact row again changes nothing).
        estimated = session["estimated_from"]
        conn.execute(update(sessions_t).where(sessions_t.c.id == item.session_pk).values(
            last_seq=count, message_count=count, token_count=tokens, covered_seq=covered,
            covered_tokens=covered_tokens, host_view_seq=0,
            estimated_from=None if estimated is None or count == 0 else max(1, min(estimated, first))))
        self._recount_summaries(conn, item.session_pk)
        return bool(dropped)

    @staticmethod
    def _renumber(conn: Connection, session_pk: int, first: int) -> None:
        """Close the gaps the forgotten messages left: seq stays 1..n (and system prompt
        versions keep pointing at the first message they preceded)."""
        m = messages_t
        rows = conn.execute(select(m.c.id, m.c.seq).where(m.c.session_id == session_pk, m.c.seq >= first)
                            .order_by(m.c.seq)).all()
        kept_before = int(conn.execute(select(func.count()).select_from(m).where(
            m.c.session_id == session_pk, m.c.seq < first)).scalar() or 0)
        # Every row from ``first`` on is set again (the first step negates them all).
        moved = [{"rid": r.id, "nseq": kept_before + i} for i, r in enumerate(rows, start=1)]
        old_to_new = {r.seq: kept_before + i for i, r in enumerate(rows, start=1)}
        if any(r.seq != kept_before + i for i, r in enumerate(rows, start=1)):
            # Two steps, so no (session, seq) pair is ever taken twice mid-way.
            conn.execute(update(m).where(m.c.session_id == session_pk, m.c.seq >= first).values(seq=-m.c.seq))
            conn.execute(update(m).where(m.c.id == bindparam("rid")).values(seq=bindparam("nseq")), moved)
        for prompt in conn.execute(select(system_prompts_t.c.id, system_prompts_t.c.first_seq).where(
                system_prompts_t.c.session_id == session_pk, system_prompts_t.c.first_seq >= first)).all():
            later = [new for old, new in old_to_new.items() if old >= prompt.first_seq]
            conn.execute(update(system_prompts_t).where(system_prompts_t.c.id == prompt.id).values(
                first_seq=min(later) if later else kept_before + len(rows) + 1))

    @staticmethod
    def _recount_summaries(conn: Connection, session_pk: int) -> None:
        """The summaries a session's context shows (its uncondensed ones and those carried in)."""
        s = summaries_t
        own = conn.execute(select(func.count(), func.coalesce(func.sum(s.c.token_count), 0)).where(
            s.c.session_id == session_pk, s.c.parent_id.is_(None))).one()
        carried = conn.execute(select(func.count(), func.coalesce(func.sum(s.c.token_count), 0)).select_from(
            carried_t.join(s, s.c.id == carried_t.c.summary_id)).where(carried_t.c.session_id == session_pk)).one()
        conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
            summary_count=int(own[0]) + int(carried[0]), summary_tokens=int(own[1]) + int(carried[1])))


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    items = list(ids)
    for i in range(0, len(items), IN_CHUNK):
        yield items[i:i + IN_CHUNK]
