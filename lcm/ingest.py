"""Ingest: store each message of a host transcript exactly once.

The host hands lcm its live transcript again and again: the whole conversation before any
compaction, lcm's own summary plus the verbatim messages after it once lcm has compacted, the
whole persisted history after a restart, the same list from a second engine on the same
database. :class:`Ingestor` works out which of those messages are already stored and appends
only the rest, at the end of the session, in one transaction.

Alignment. The transcript without its system prompt and without lcm's summary messages is
matched, in order, against the session's stored messages from where the host's view starts
(``host_view_seq``, recorded when lcm last returned a context): by content hash, allowing the
host to have dropped stored messages (bounded look-ahead). Messages after the last match are
new. A message that does not match but sits before matched ones (the host inserted or edited
something mid-transcript) is treated as new only if its content is nowhere in the view: lcm
never loses what the host holds, and never stores a copy of what it already has.

Cost. A turn costs O(new messages): the ingestor remembers, per session, the exact message
objects it matched last time (the host keeps appending to the same list), so the usual call
compares object identity for the old prefix, hashes only the new messages and reads one session
row. Another writer having appended in between (the session's ``last_seq`` moved) sends it back
to full alignment, which is bounded by the length of the host's transcript, never the history.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from lcm.messages import content_hash, message_uid, uid_identity
from lcm.records import MessageMeta, MessageRecord, SessionRecord
from lcm.store import Store
from lcm.transcript import split_transcript

log = logging.getLogger(__name__)

#: How many stored messages the host may have dropped between two it kept.
LOOKAHEAD = 64
#: Stored messages read for alignment beyond the transcript's own length.
WINDOW_SLACK = 256


@dataclass
class IngestResult:
    """What one ingest call saw and did."""

    session: SessionRecord
    system: Mapping[str, Any] | None
    conversation: list[Mapping[str, Any]]
    store_ids: list[int]  # one per conversation message
    token_counts: list[int]  # lcm's token count per conversation message
    new: int
    summaries_seen: int  # lcm summary messages found (and not stored)


@dataclass
class _Seen:
    objects: list[Any]
    hashes: list[str]
    store_ids: list[int]
    token_counts: list[int]
    last_seq: int
    last_identity: str


@dataclass
class Ingestor:
    store: Store
    _cache: dict[int, _Seen] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, session_pk: int | None = None) -> None:
        with self._lock:
            if session_pk is None:
                self._cache.clear()
            else:
                self._cache.pop(session_pk, None)

    def remember(self, session: SessionRecord, records: Sequence[MessageRecord]) -> None:
        """Record the transcript the host now holds: the verbatim messages of the context lcm
        just returned (their ``message`` objects, which the host keeps appending after)."""
        with self._lock:
            previous = self._cache.get(session.id)
            if previous is not None and previous.last_seq == session.last_seq:
                last_identity = previous.last_identity
            else:
                tail = self.store.tail(session.id, 1)
                last_identity = tail[0].identity if tail else ""
            objects = [r.message for r in records]
            self._cache[session.id] = _Seen(
                objects=objects, hashes=[_hash(m) for m in objects],
                store_ids=[r.store_id for r in records], token_counts=[r.token_count for r in records],
                last_seq=session.last_seq, last_identity=last_identity)

    def ingest(self, session_pk: int, messages: Sequence[Any]) -> IngestResult:
        system, conversation = split_transcript(messages)
        summaries_seen = len(messages) - len(conversation) - (1 if system is not None else 0)
        with self._lock:
            return self._ingest(session_pk, system, conversation, summaries_seen)

    def _ingest(self, session_pk, system, conversation, summaries_seen) -> IngestResult:
        session = self.store.get_session(session_pk)
        seen = self._cache.get(session_pk)
        n_old = 0
        if seen is not None and seen.last_seq == session.last_seq:
            n_old = _common_prefix(seen.objects, conversation)
        if seen is not None and n_old == len(seen.objects) and n_old > 0:
            hashes = seen.hashes + [_hash(m) for m in conversation[n_old:]]
            mapped: list[int | None] = list(seen.store_ids) + [None] * (len(conversation) - n_old)
            tokens: list[int | None] = list(seen.token_counts) + [None] * (len(conversation) - n_old)
            new_idx = list(range(n_old, len(conversation)))
            anchor = seen.last_identity
        else:
            hashes = [_hash(m) for m in conversation]
            mapped, tokens, new_idx, anchor = self._align(session, conversation, hashes)
        if new_idx:
            result = self.store.append_messages(
                session_pk, [conversation[i] for i in new_idx], after_identity=anchor or None)
            for i, sid, tok in zip(new_idx, result.store_ids, result.token_counts, strict=True):
                mapped[i], tokens[i] = sid, tok
            session, anchor = result.session, result.last_identity
            if result.inserted:
                log.debug("lcm ingest: %d new message(s) in session %s", result.inserted, session.session_key)
        store_ids = [int(s) for s in mapped]  # every message is stored now
        counts = [int(t or 0) for t in tokens]
        self._cache[session_pk] = _Seen(list(conversation), hashes, store_ids, counts,
                                        session.last_seq, anchor or "")
        return IngestResult(session=session, system=system, conversation=list(conversation),
                            store_ids=store_ids, token_counts=counts, new=len(new_idx),
                            summaries_seen=summaries_seen)

    def _align(self, session: SessionRecord, conversation: Sequence[Any], hashes: Sequence[str]):
        """Match the transcript against the stored view; returns (ids, tokens, new indexes, anchor)."""
        n = len(conversation)
        mapped: list[int | None] = [None] * n
        tokens: list[int | None] = [None] * n
        if session.last_seq == 0:
            return mapped, tokens, list(range(n)), None
        # The window holds at least as many stored messages as the transcript (plus slack), and
        # reaches back to where the host's view starts when that is further.
        view_from = max(1, session.host_view_seq or 1)
        lo = max(1, min(view_from, session.last_seq - n - WINDOW_SLACK + 1))
        metas = self.store.message_metas(session.id, first_seq=lo, last_seq=session.last_seq)
        anchor = metas[-1].identity if metas else None
        positions: dict[str, list[int]] = {}
        for j, meta in enumerate(metas):
            positions.setdefault(_meta_key(meta), []).append(j)
        p = 0
        last_matched = -1
        for i, message in enumerate(conversation):
            key = _message_key(message, hashes[i])
            candidates = positions.get(key, ())
            k = bisect.bisect_left(candidates, p)
            if k < len(candidates) and candidates[k] - p <= LOOKAHEAD:
                j = candidates[k]
                mapped[i], tokens[i] = metas[j].store_id, metas[j].token_count
                p = j + 1
                last_matched = i
        new_idx = []
        older: dict[str, MessageMeta] | None = None
        for i in range(n):
            if mapped[i] is not None:
                continue
            key = _message_key(conversation[i], hashes[i])
            if i < last_matched:
                if key not in positions and older is None and lo > 1:
                    older = {_meta_key(m): m for m in self.store.message_metas(
                        session.id, first_seq=1, last_seq=lo - 1)}  # rare: a full look-up
                known = metas[positions[key][0]] if key in positions else (older or {}).get(key)
                if known is not None:  # a stored message the host moved or kept: not new
                    mapped[i], tokens[i] = known.store_id, known.token_count
                    continue
                log.info("lcm ingest: session %s: a message the host inserted mid-transcript is "
                         "stored at the end", session.session_key)
            new_idx.append(i)
        return mapped, tokens, new_idx, anchor


def _hash(message: Any) -> str:
    return content_hash(message) if isinstance(message, Mapping) else ""


def _message_key(message: Any, digest: str) -> str:
    uid = message_uid(message) if isinstance(message, Mapping) else None
    return uid_identity(uid) if uid else digest


def _meta_key(meta: MessageMeta) -> str:
    return meta.identity if meta.identity.startswith("u") else meta.content_hash


def _common_prefix(old: Sequence[Any], new: Sequence[Any]) -> int:
    n = min(len(old), len(new))
    i = 0
    while i < n and old[i] is new[i]:
        i += 1
    return i
