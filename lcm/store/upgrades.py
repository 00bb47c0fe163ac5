"""Data upgrades that Alembic revisions run through lcm's own code.

A revision that changes what a stored value *means* (not just the DDL) recomputes it here with
the very functions new rows are prepared with (``lcm.prepare``) and read back with
(``lcm.store.messages``): one copy of each rule. A later change to one of these rules needs a
new revision that calls its own recomputation again.

Only the columns that exist since revision 0001 are touched, through lightweight table
definitions (not ``lcm.store.schema``, which follows the newest schema).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from lcm.messages import content_hash, message_uid
from lcm.prepare import index_text, message_identity, recall_calls
from lcm.store.messages import load_payloads, rebuild_message

PAGE = 1_000

_messages = sa.table(
    "lcm_messages", sa.column("id"), sa.column("session_id"), sa.column("seq"), sa.column("identity"),
    sa.column("content_hash"), sa.column("role"), sa.column("content_kind"), sa.column("content"),
    sa.column("tool_calls"), sa.column("tool_call_id"), sa.column("name"), sa.column("extra"),
    sa.column("key_order"), sa.column("payload_id"), sa.column("search_text"))


def _pages(conn: Connection, session_pk: int, *, after: int = 0, where: Any = None) -> Iterator[tuple[Any, Any]]:
    """A session's messages after seq ``after`` (those ``where`` selects), in seq order, a page
    of ``PAGE`` rows at a time, with the payloads they point at."""
    while True:
        query = sa.select(_messages).where(_messages.c.session_id == session_pk, _messages.c.seq > after)
        rows = conn.execute((query if where is None else query.where(where))
                            .order_by(_messages.c.seq).limit(PAGE)).all()
        if not rows:
            return
        yield rows, load_payloads(conn, [r.payload_id for r in rows])
        after = rows[-1].seq


def recompute_message_identities(conn: Connection, reindex: Any = None) -> dict[str, int]:
    """Recompute every message's substance hash and chained identity (session by session, in
    seq order), and its search text where lcm's own recall traffic is now left out of the
    index. ``reindex(conn, ids)`` refreshes index entries whose text changed (PostgreSQL).
    Returns counts of what changed."""
    changed_ids = 0
    changed_text: list[int] = []
    sessions = conn.execute(sa.select(_messages.c.session_id).distinct().order_by(
        _messages.c.session_id)).scalars().all()
    for session_pk in sessions:
        previous = ""
        recall: frozenset[str] = frozenset()
        for rows, payloads in _pages(conn, session_pk):
            messages = [rebuild_message(r, payloads) for r in rows]
            recall = recall | recall_calls(messages)
            for row, message in zip(rows, messages, strict=True):
                digest = content_hash(message)
                identity = previous = message_identity(previous, digest, message_uid(message))
                values: dict[str, Any] = {}
                if digest != row.content_hash or identity != row.identity:
                    values.update(content_hash=digest, identity=identity)
                    changed_ids += 1
                body = index_text(message, recall)
                current = row.search_text if row.search_text is not None else (row.content or "")
                if body != current:
                    values["search_text"] = body
                    changed_text.append(row.id)
                if values:
                    conn.execute(sa.update(_messages).where(_messages.c.id == row.id).values(**values))
    if changed_text and reindex is not None:
        reindex(conn, changed_text)
    return {"identities": changed_ids, "search_texts": len(changed_text)}


_sessions = sa.table("lcm_sessions", sa.column("id"), sa.column("parent_id"), sa.column("fork_seq"))


def rehash_identity_v3(conn: Connection) -> dict[str, int]:
    """Revision 0015: recompute the substance hash of every message whose content is a list of
    parts (one plain text part now hashes as its text; ``cache_control`` marks are left out) or
    that calls tools (JSON arguments now hash as their value, whatever their spacing), and
    re-chain the identities from the first message whose hash changed, in its session and in
    the forks that branch off at or after it. One scan of the messages' kinds finds the
    sessions that hold such a message; only those messages are read, and only the
    sessions that changed are re-chained. Returns counts of what changed."""
    may_change = sa.or_(_messages.c.content_kind.in_(("json", "payload")), _messages.c.tool_calls.is_not(None))
    candidates = conn.execute(sa.select(_messages.c.session_id).where(may_change).distinct()
                              .order_by(_messages.c.session_id)).scalars().all()
    first_changed: dict[int, int] = {}  # session -> the first seq whose hash changes
    for session_pk in candidates:
        for rows, payloads in _pages(conn, session_pk, where=may_change):
            changed = next((r.seq for r in rows if content_hash(rebuild_message(r, payloads)) != r.content_hash), None)
            if changed is not None:
                first_changed[session_pk] = changed
                break
    if not first_changed:
        return {"sessions": 0, "hashes": 0, "identities": 0}
    # Forks chain their first message from their parent's message at the fork point: a fork
    # of a changed session at or after the change is re-chained whole. Forks have larger ids
    # than their parents, so one pass in id order sees every parent first.
    forks = conn.execute(sa.select(_sessions.c.id, _sessions.c.parent_id, _sessions.c.fork_seq).where(
        _sessions.c.parent_id.is_not(None)).order_by(_sessions.c.id)).all()
    for fork_pk, parent_pk, fork_seq in forks:
        changed_at = first_changed.get(parent_pk)
        if changed_at is not None and (fork_seq or 0) >= changed_at:
            first_changed[fork_pk] = 1
    parents = {pk: (parent_pk, fork_seq) for pk, parent_pk, fork_seq in forks}
    hashes = identities = 0
    for session_pk in sorted(first_changed):
        start = first_changed[session_pk]
        if start > 1:
            previous = _identity_through(conn, session_pk, start - 1)
        elif session_pk in parents:
            parent_pk, fork_seq = parents[session_pk]
            previous = _identity_through(conn, parent_pk, fork_seq or 0)
        else:
            previous = ""
        for rows, payloads in _pages(conn, session_pk, after=start - 1):
            changes = []
            for row in rows:
                message = rebuild_message(row, payloads)
                digest = content_hash(message)
                identity = previous = message_identity(previous, digest, message_uid(message))
                if digest != row.content_hash or identity != row.identity:
                    changes.append({"row_id": row.id, "new_hash": digest, "new_identity": identity})
                    hashes += digest != row.content_hash
                    identities += identity != row.identity
            if changes:  # one statement per page, in seq order (every new identity is a fresh hash)
                conn.execute(_REHASH, changes)
    return {"sessions": len(first_changed), "hashes": hashes, "identities": identities}


def _identity_through(conn: Connection, session_pk: int, seq: int) -> str:
    """The identity of the session's last message at or before ``seq`` ("" for none): what the
    chain after it continues from."""
    return conn.execute(sa.select(_messages.c.identity).where(
        _messages.c.session_id == session_pk, _messages.c.seq <= seq)
        .order_by(_messages.c.seq.desc()).limit(1)).scalar() or ""


_REHASH = sa.update(_messages).where(_messages.c.id == sa.bindparam("row_id")).values(
    content_hash=sa.bindparam("new_hash"), identity=sa.bindparam("new_identity"))
