"""Messages: appended exactly once, read back exactly as they were sent.

Idempotent ingest. A message's identity is the host's ``message_uid`` when present, else its
content hash chained to the identity of the message before it (``lcm.prepare``), and
``UNIQUE(session_id, identity)`` is the backstop: re-sending a transcript stores nothing twice,
while the same text sent twice in a row is two messages. ``seq`` numbers a session's messages
1..last_seq without gaps (the session row's counters say where it ends).

Also here: the digests of messages lcm generated for a context (``remember_generated``), by
which a host transcript's copies of them are recognised (``lcm.transcript.OwnMessages``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection, Select, bindparam, func, select, update
from sqlalchemy.exc import IntegrityError

from lcm import codec
from lcm.backends import IdsIn, IndexRow
from lcm.errors import ConcurrentUpdateError, StaleViewError
from lcm.messages import decode_message, message_text
from lcm.prepare import (
    PAYLOAD_CODEC,
    Payload,
    PreparedMessage,
    chain_identities,
    decompress_payload,
    first_of_each,
    row_time,
)
from lcm.records import AppendResult, GeneratedMessage, MessageMeta, MessageRecord, SessionRecord, SettledTokens
from lcm.store._core import (
    MAX_PAGE_LIMIT,
    StoreCore,
    checked_int,
    fetch_in,
    generated_t,
    messages_t,
    payloads_t,
    session_record,
    sessions_t,
    storable_id,
)
from lcm.store.replica import lag_tolerant

#: Claim the next seq numbers of a session whose last seq is as expected, and add the counts;
#: the row comes back (and stays locked until commit), or nothing when the session moved on.
_BUMP_SESSION = (
    update(sessions_t)
    .where(sessions_t.c.id == bindparam("sid"), sessions_t.c.last_seq == bindparam("expected"))
    .values(last_seq=bindparam("new_last"), message_count=sessions_t.c.message_count + bindparam("n"),
            token_count=sessions_t.c.token_count + bindparam("tok"), updated_at=bindparam("now"),
            estimated_from=func.coalesce(sessions_t.c.estimated_from, bindparam("est_from")))
    .returning(*sessions_t.c)
)

#: Messages counted per read while settling a session's estimated token counts.
SETTLE_PAGE = 1000

MESSAGE_COLUMNS = (
    messages_t.c.id, messages_t.c.session_id, messages_t.c.seq, messages_t.c.role,
    messages_t.c.ts, messages_t.c.token_count, messages_t.c.content_kind,
    messages_t.c.content, messages_t.c.tool_calls, messages_t.c.tool_call_id,
    messages_t.c.name, messages_t.c.extra, messages_t.c.key_order, messages_t.c.payload_id,
    messages_t.c.problem, messages_t.c.identity, sessions_t.c.session_key,
)
META_COLUMNS = (messages_t.c.id, messages_t.c.seq, messages_t.c.identity,
                messages_t.c.content_hash, messages_t.c.role, messages_t.c.token_count,
                messages_t.c.ts, messages_t.c.tool_call_id)


def message_select() -> Select[Any]:
    """Messages with their session's host key (what :func:`records` reads)."""
    return select(*MESSAGE_COLUMNS).join(sessions_t, sessions_t.c.id == messages_t.c.session_id)


def _by_id(ids_in: IdsIn) -> Select[Any]:
    """Whole messages of one agent by id (``get_many``)."""
    return message_select().where(ids_in(messages_t.c.id), messages_t.c.agent_id == bindparam("agent"))


def metas_select(session_pk: int, first_seq: int, last_seq: int) -> Select[Any]:
    return select(*META_COLUMNS).where(
        messages_t.c.session_id == session_pk, messages_t.c.seq >= first_seq,
        messages_t.c.seq <= last_seq).order_by(messages_t.c.seq)


def seq_of_identity_select(session_pk: int, identity: str) -> Select[Any]:
    return select(messages_t.c.seq).where(messages_t.c.session_id == session_pk,
                                           messages_t.c.identity == identity)


def meta_records(rows: Sequence[Any]) -> list[MessageMeta]:
    return [MessageMeta(store_id=r.id, seq=r.seq, identity=r.identity,
                        content_hash=r.content_hash, role=r.role, token_count=r.token_count,
                        ts=r.ts, tool_call_id=r.tool_call_id) for r in rows]


def load_payloads(conn: Connection, payload_ids: Collection[int | None]) -> dict[int, str]:
    """The decompressed payloads with these ids (None entries skipped). Reads only the
    columns every schema revision has, so the upgrade migrations use it too."""
    return {pk: decompress_payload(data) for pk, data in fetch_in(
        conn, (i for i in payload_ids if i is not None),
        lambda chunk: select(payloads_t.c.id, payloads_t.c.data).where(payloads_t.c.id.in_(chunk)))}


def rebuild_message(row: Any, payloads: Mapping[int, str]) -> dict[str, Any]:
    """The host's message, exactly as it was sent, from a stored row (any revision's columns)."""
    return decode_message(
        role=row.role, content_kind=row.content_kind, content=row.content,
        tool_calls=row.tool_calls, tool_call_id=row.tool_call_id, name=row.name, extra=row.extra,
        key_order=row.key_order,
        payload=payloads.get(row.payload_id) if row.payload_id is not None else None)


def records(conn: Connection, rows: Sequence[Any]) -> list[MessageRecord]:
    """Rows of :func:`message_select` as records, payloads loaded."""
    payloads = load_payloads(conn, [r.payload_id for r in rows])
    return [MessageRecord(
        store_id=r.id, session_pk=r.session_id, session_key=r.session_key, seq=r.seq,
        role=r.role, ts=r.ts, token_count=r.token_count, message=rebuild_message(r, payloads),
        problem=tuple(codec.decode_json(r.problem)) if r.problem else (), identity=r.identity)
        for r in rows]


def store_payloads(core: StoreCore, conn: Connection, payloads: Sequence[Payload]) -> dict[str, int]:
    """Payload row ids by sha256, inserting the ones not stored yet (deduplicated by content)."""
    unique = {p.sha256: p for p in payloads}
    if not unique:
        return {}
    now = time.time()
    core.backend.claim_payloads(conn, list(unique))  # before the insert: ON CONFLICT reads the row
    core.backend.insert_ignore(conn, payloads_t, [
        {"sha256": p.sha256, "codec": PAYLOAD_CODEC, "size_chars": p.size_chars, "data": p.data,
         "created_at": now} for p in unique.values()], ["sha256"])
    rows = conn.execute(select(payloads_t.c.sha256, payloads_t.c.id).where(
        payloads_t.c.sha256.in_(list(unique)))).all()
    return {sha: pk for sha, pk in rows}


def append_rows(core: StoreCore, conn: Connection, session_pk: int, prepared: Sequence[PreparedMessage],
                *, after_identity: str | None, now: float | None = None,
                expect_last_seq: int | None = None,
                timestamps: Sequence[float | None] | None = None) -> AppendResult:
    """:meth:`MessageRepository.append` inside the caller's write transaction. Without
    ``expect_last_seq`` the caller holds the session row's lock."""
    identities, ts_now, times = _identities_and_times(prepared, after_identity, now, timestamps)
    session: Mapping[str, Any]  # the session row, as locked (or bumped) in this transaction
    if expect_last_seq is not None:
        # The caller's view is current: nothing of this can be stored yet. Claim the seq
        # numbers first (one UPDATE that also locks the row), then insert.
        fresh = first_of_each(identities)
        session = _bump(core, conn, session_pk, expect_last_seq, [prepared[i] for i in fresh], ts_now)
        known: dict[str, int] = {}
        first_seq = expect_last_seq
    else:
        session = cast(Mapping[str, Any], conn.execute(
            select(sessions_t).where(sessions_t.c.id == session_pk)).one()._mapping)
        known = dict(fetch_in(
            conn, identities, lambda chunk: select(messages_t.c.identity, messages_t.c.id).where(
                messages_t.c.session_id == session_pk, messages_t.c.identity.in_(chunk))))
        fresh = [i for i in first_of_each(identities) if identities[i] not in known]
        first_seq = session["last_seq"]
    inserted = _insert(core, conn, session, first_seq, [(identities[i], prepared[i], times[i]) for i in fresh])
    known.update(inserted)
    if fresh and expect_last_seq is None:
        session = _bump(core, conn, session_pk, first_seq, [prepared[i] for i in fresh], ts_now)
    return _appended(core, conn, session, prepared, identities, fresh, known, after_identity)


def _bump(core: StoreCore, conn: Connection, session_pk: int, expected_last: int,
          added: Sequence[PreparedMessage], now: float) -> Mapping[str, Any]:
    """Claim seq numbers after ``expected_last`` for ``added`` and add their counts: the
    session row, now locked; StaleViewError when the session is no longer where expected."""
    bumped = core.backend.returning_row(conn, _BUMP_SESSION, _bump_params(session_pk, expected_last, added, now))
    if bumped is None:
        raise _stale(session_pk, expected_last)
    return bumped


def _bump_params(session_pk: int, expected_last: int, added: Sequence[PreparedMessage], now: float) -> dict[str, Any]:
    """The parameters of a session bump (``_BUMP_SESSION``, and the fused statement's UPDATE);
    ``est_from``: the seq of the first added message whose count is an estimate (or None)."""
    est_from = next((expected_last + 1 + i for i, p in enumerate(added) if not p.token_exact), None)
    return {"sid": session_pk, "expected": expected_last, "new_last": expected_last + len(added),
            "n": len(added), "tok": sum(p.token_count for p in added), "now": now, "est_from": est_from}


def _stale(session_pk: int, expected_last: int) -> StaleViewError:
    return StaleViewError(f"session {session_pk} moved on (or is gone) since seq {expected_last}")


def _identities_and_times(prepared: Sequence[PreparedMessage], after_identity: str | None, now: float | None,
                          timestamps: Sequence[float | None] | None) -> tuple[list[str], float, list[float]]:
    """Each message's identity (chained after ``after_identity``), the time of this append, and
    the time recorded for each message."""
    identities = chain_identities(prepared, after_identity)
    ts_now = time.time() if now is None else now
    times = [row_time(timestamps[i] if timestamps is not None else None, p.encoded.host_timestamp, ts_now)
             for i, p in enumerate(prepared)]
    return identities, ts_now, times


def _appended(core: StoreCore, conn: Connection, session: Any, prepared: Sequence[PreparedMessage],
              identities: Sequence[str], fresh: Sequence[int], known: Mapping[str, int],
              after_identity: str | None) -> AppendResult:
    """What an append returns: the session as it now is, every message's store id, which were new."""
    record = session_record({**session, "agent_name": core.agent_name(conn, session["agent_id"])})
    fresh_set = set(fresh)
    return AppendResult(
        session=record,
        store_ids=tuple(known[i] for i in identities),
        new_flags=tuple(i in fresh_set for i in range(len(identities))),
        last_identity=identities[-1] if identities else (after_identity or ""),
        token_counts=tuple(p.token_count for p in prepared),
    )


def _insert(core: StoreCore, conn: Connection, session: Mapping[str, Any], after_seq: int,
            new: Sequence[tuple[str, PreparedMessage, float]]) -> dict[str, int]:
    """Insert (identity, prepared, time) rows with the seq numbers after ``after_seq``, their
    payloads stored once; store ids by identity. ConcurrentUpdateError (nothing written) when
    another writer stored one of them first."""
    payload_ids = store_payloads(core, conn, [p.payload for _, p, _ in new if p.payload is not None])
    rows, index = _message_rows(session["id"], session["agent_id"], after_seq, new, payload_ids)
    inserted = core.backend.insert_rows(conn, messages_t, rows, index, ("id", "identity"))
    if len(inserted) != len(rows):
        raise ConcurrentUpdateError(CONCURRENT_INSERT)
    return {identity: row_id for row_id, identity in inserted}


CONCURRENT_INSERT = "another writer stored some of these messages concurrently; nothing was written"


def _message_rows(session_pk: int, agent_pk: int, after_seq: int, new: Sequence[tuple[str, PreparedMessage, float]],
                  payload_ids: Mapping[str, int]) -> tuple[list[dict[str, Any]], list[IndexRow]]:
    """The rows of ``new`` (identity, prepared, time) numbered after ``after_seq``, and their
    search index entries."""
    rows: list[dict[str, Any]] = []
    index: list[IndexRow] = []
    for seq, (identity, p, ts) in enumerate(new, start=after_seq + 1):
        e = p.encoded
        rows.append({
            "session_id": session_pk, "agent_id": agent_pk, "seq": seq, "identity": identity,
            "content_hash": e.content_hash, "role": e.role, "content_kind": e.content_kind,
            "content": e.content, "tool_calls": e.tool_calls, "tool_call_id": e.tool_call_id,
            "name": e.name, "extra": e.extra, "key_order": e.key_order,
            "payload_id": payload_ids[p.payload.sha256] if p.payload is not None else None,
            "search_text": p.search_text, "token_count": p.token_count, "ts": ts, "problem": e.problem,
        })
        index.append(IndexRow(body=p.body, session_pk=session_pk, agent_pk=agent_pk, role=e.role))
    return rows, index


def _append_fused(core: StoreCore, session_pk: int, agent_pk: int, prepared: Sequence[PreparedMessage], *,
                  after_identity: str | None, expect_last_seq: int, now: float | None,
                  timestamps: Sequence[float | None] | None) -> AppendResult:
    """The known-view append as one statement outside a transaction (backends with
    ``fused_append``): a turn costs one round trip instead of four. Safe to re-run after a
    dropped connection whether or not it landed: the expected last seq makes a second run a
    StaleViewError, and the caller re-aligns."""
    identities, ts_now, times = _identities_and_times(prepared, after_identity, now, timestamps)
    fresh = first_of_each(identities)
    added = [prepared[i] for i in fresh]
    rows, index = _message_rows(session_pk, agent_pk, expect_last_seq,
                                [(identities[i], prepared[i], times[i]) for i in fresh], {})
    for row in rows:
        del row["session_id"], row["agent_id"]  # the statement takes them from the session row
    bump = _bump_params(session_pk, expect_last_seq, added, ts_now)
    with core.write_statement() as conn:
        try:
            fused = core.backend.append_fused(conn, bump, messages_t, rows, index)
        except IntegrityError as exc:
            raise ConcurrentUpdateError(CONCURRENT_INSERT) from exc
        if fused is None:
            raise _stale(session_pk, expect_last_seq)
        session = fused
        known = dict(zip(session["lcm_new_identities"], session["lcm_new_ids"], strict=True))
        return _appended(core, conn, session, prepared, identities, fresh, known, after_identity)


class MessageRepository:
    """The messages of every session (``store.messages``)."""

    def __init__(self, core: StoreCore):
        self._core = core

    def append(self, session_pk: int, prepared: Sequence[PreparedMessage], *,
               after_identity: str | None = None, expect_last_seq: int | None = None,
               timestamps: Sequence[float | None] | None = None, now: float | None = None) -> AppendResult:
        """Store a contiguous run of a session's messages, each exactly once, in one transaction.

        ``prepared`` (``lcm.prepare.prepare_messages``) follows the stored message whose
        identity is ``after_identity`` (None: the start of the session). Messages already stored
        (same identity) are skipped; the rest get the next ``seq`` numbers.

        ``expect_last_seq``: the caller knows the session ended at that seq and is appending
        after it. If another writer appended since, StaleViewError is raised and nothing is
        written; if not, the per-message existence check is skipped (nothing can exist yet).

        ``timestamps``: one per message, the time to record (an import restoring an export);
        None entries fall back to the message's own ``timestamp`` key, then to now.
        """
        if timestamps is not None and len(timestamps) != len(prepared):
            raise ValueError(f"{len(timestamps)} timestamps for {len(prepared)} messages")
        core = self._core
        agent_pk = core.session_agent(session_pk)
        if (expect_last_seq is not None and agent_pk is not None and prepared and core.backend.fused_append
                and all(p.payload is None and p.token_exact for p in prepared)):
            result = _append_fused(core, session_pk, agent_pk, prepared, after_identity=after_identity,
                                   expect_last_seq=expect_last_seq, now=now, timestamps=timestamps)
        else:
            with core.write() as conn:
                if expect_last_seq is None:
                    core.lock_session(conn, session_pk)
                result = append_rows(core, conn, session_pk, prepared, after_identity=after_identity,
                                     now=now, expect_last_seq=expect_last_seq, timestamps=timestamps)
            core.remember_session_agent(session_pk, result.session.agent_pk)
        core.wrote_messages(sum(result.new_flags))
        return result

    @property
    def counts_later(self) -> bool:
        """Whether a turn should store estimated token counts (the backend's
        ``defer_token_counts``); :meth:`settle_tokens` counts them exactly when needed."""
        return self._core.backend.defer_token_counts

    def settle_tokens(self, session_pk: int, count: Callable[[str], int]) -> SettledTokens:
        """Count exactly every message of the session (and of the sessions it forks from) whose
        stored count is an estimate, before anything plans with the counts. ``count``: a
        message's text to its tokens (``TokenCounter.count_message_text``, as at ingest). The
        rows and the session's counters change in one write per session. Returns the exact
        count of each message counted, by store id, and the session as it now is."""
        exact: dict[int, int] = {}
        after: SessionRecord | None = None
        pk: int | None = session_pk
        visited: set[int] = set()
        while pk is not None and pk not in visited:
            visited.add(pk)
            with self._core.read() as conn:
                row = conn.execute(select(sessions_t.c.estimated_from, sessions_t.c.parent_id).where(
                    sessions_t.c.id == pk)).first()
            if row is None:
                break
            if row.estimated_from is not None:
                counted, settled = self._settle_session(pk, count)
                exact.update(counted)
                after = settled if pk == session_pk else after
            pk = row.parent_id
        return SettledTokens(exact, after)

    def _settle_session(self, session_pk: int, count: Callable[[str], int]) -> tuple[dict[int, int], SessionRecord]:
        exact: dict[int, int] = {}
        with self._core.write() as conn:
            session = self._core.lock_session(conn, session_pk)
            start = session["estimated_from"]
            if start is None:  # another process settled it meanwhile
                return exact, self._core.session_of(conn, session_pk)
            delta = covered_delta = 0
            while start <= session["last_seq"]:
                page = records(conn, conn.execute(message_select().where(
                    messages_t.c.session_id == session_pk, messages_t.c.seq >= start,
                    messages_t.c.seq < start + SETTLE_PAGE).order_by(messages_t.c.seq)).all())
                changed = []
                for rec in page:
                    exact[rec.store_id] = tokens = count(message_text(rec.message))
                    if tokens != rec.token_count:
                        changed.append({"mid": rec.store_id, "tok": tokens})
                        delta += tokens - rec.token_count
                        covered_delta += tokens - rec.token_count if rec.seq <= session["covered_seq"] else 0
                if changed:
                    conn.execute(update(messages_t).where(messages_t.c.id == bindparam("mid")).values(
                        token_count=bindparam("tok")), changed)
                start += SETTLE_PAGE
            conn.execute(update(sessions_t).where(sessions_t.c.id == session_pk).values(
                token_count=sessions_t.c.token_count + delta,
                covered_tokens=sessions_t.c.covered_tokens + covered_delta, estimated_from=None))
            return exact, self._core.session_of(conn, session_pk)

    def get_range(self, session_pk: int, *, first_seq: int | None = None, last_seq: int | None = None,
                  limit: int | None = None) -> list[MessageRecord]:
        """Messages of a session with ``first_seq <= seq <= last_seq``, in order."""
        stmt = message_select().where(messages_t.c.session_id == session_pk)
        if first_seq is not None:
            stmt = stmt.where(messages_t.c.seq >= first_seq)
        if last_seq is not None:
            stmt = stmt.where(messages_t.c.seq <= last_seq)
        stmt = stmt.order_by(messages_t.c.seq)
        if limit is not None:
            stmt = stmt.limit(checked_int("limit", limit, low=1))
        with self._core.read() as conn:
            return records(conn, conn.execute(stmt).all())

    @lag_tolerant
    def page(self, session_pk: int, *, after_store_id: int | None = None, limit: int = 100,
             roles: Sequence[str] | None = None) -> tuple[list[MessageRecord], int | None]:
        """One page of a session in store order, and the cursor for the next (None at the end)."""
        checked_int("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        stmt = message_select().where(messages_t.c.session_id == session_pk)
        if after_store_id is not None:
            stmt = stmt.where(messages_t.c.id > after_store_id)
        if roles:
            stmt = stmt.where(messages_t.c.role.in_(list(roles)))
        with self._core.read() as conn:
            rows = conn.execute(stmt.order_by(messages_t.c.id).limit(limit + 1)).all()
            found = records(conn, rows[:limit])
        return found, (found[-1].store_id if len(rows) > limit else None)

    def latest(self, session_pk: int, *, roles: Sequence[str], limit: int, min_seq: int = 1,
               max_seq: int | None = None) -> list[MessageRecord]:
        """The session's newest messages with one of ``roles`` in ``min_seq..max_seq``, newest first."""
        checked_int("limit", limit, low=1, high=MAX_PAGE_LIMIT)
        stmt = message_select().where(
            messages_t.c.session_id == session_pk, messages_t.c.role.in_(list(roles)),
            messages_t.c.seq >= min_seq)
        if max_seq is not None:
            stmt = stmt.where(messages_t.c.seq <= max_seq)
        with self._core.read() as conn:
            return records(conn, conn.execute(stmt.order_by(messages_t.c.seq.desc()).limit(limit)).all())

    @lag_tolerant
    def get(self, store_id: int, *, agent: str) -> MessageRecord | None:
        """The message with this store id if it belongs to ``agent`` (else None: not found)."""
        found = self.get_many([store_id], agent=agent)
        return found[0] if found else None

    @lag_tolerant
    def get_many(self, store_ids: Sequence[int], *, agent: str) -> list[MessageRecord]:
        """The agent's messages with these ids, in the order given; others are left out."""
        ids = [i for i in store_ids if storable_id(i)]
        if not ids:
            return []
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return []
            rows = self._core.backend.rows_by_ids(conn, "messages.by_id", _by_id, ids, {"agent": agent_pk})
            by_id = {r.store_id: r for r in records(conn, rows)}
        return [by_id[i] for i in ids if i in by_id]

    def tail(self, session_pk: int, count: int) -> list[MessageMeta]:
        """The newest ``count`` messages of a session (bodies not loaded), oldest first."""
        checked_int("count", count, low=0)
        if count == 0:
            return []
        with self._core.read() as conn:
            rows = conn.execute(select(*META_COLUMNS).where(
                messages_t.c.session_id == session_pk).order_by(messages_t.c.seq.desc()).limit(count)).all()
        return meta_records(list(reversed(rows)))

    def metas(self, session_pk: int, *, first_seq: int, last_seq: int) -> list[MessageMeta]:
        """Messages ``first_seq..last_seq`` without bodies (alignment and planning)."""
        with self._core.read() as conn:
            return meta_records(conn.execute(metas_select(session_pk, first_seq, last_seq)).all())

    def seq_of_identity(self, session_pk: int, identity: str) -> int | None:
        """The seq of the session's message with this identity (the unique index), or None."""
        with self._core.read() as conn:
            seq: int | None = conn.execute(seq_of_identity_select(session_pk, identity)).scalar()
            return seq

    def remember_generated(self, agent: str, generated: Mapping[str, GeneratedMessage]) -> None:
        """Record messages lcm generated for a context, by digest (``lcm.transcript.
        generated_digest``), each with what it stands for (``GeneratedMessage``). The first
        record of a digest stays."""
        if not generated:
            return
        now = time.time()
        with self._core.write() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=True)
            self._core.backend.insert_ignore(conn, generated_t, [
                {"agent_id": agent_pk, "digest": d, "stands_for": g.stands_for, "session_id": g.session_pk,
                 "through_seq": g.through_seq, "created_at": now}
                for d, g in generated.items()], ["agent_id", "digest"])

    def generated(self, agent: str, digests: Collection[str]) -> dict[str, GeneratedMessage]:
        """Which of ``digests`` name messages lcm generated for this agent, with what each
        stands for (see :meth:`remember_generated`)."""
        if not digests:
            return {}
        with self._core.read() as conn:
            agent_pk = self._core.agent_pk(conn, agent, create=False)
            if agent_pk is None:
                return {}
            g = generated_t.c
            return {d: GeneratedMessage(s, pk, seq) for d, s, pk, seq in conn.execute(
                select(g.digest, g.stands_for, g.session_id, g.through_seq).where(
                    g.agent_id == agent_pk, g.digest.in_(list(set(digests))))).all()}
