"""Ingest: store each message of a host transcript exactly once.

The host hands lcm its live transcript again and again: the whole conversation before any
compaction, lcm's own summary plus the verbatim messages after it once lcm has compacted, the
whole persisted history after a restart, the same list from a second engine on the same
database. :class:`Ingestor` works out which of those messages are already stored and appends
only the rest, at the end of the session, in one transaction.

Alignment. The transcript without its system prompt and without lcm's summary messages is
matched, in order, against a window of the session's newest stored messages (reaching back to
where the host's view starts, ``host_view_seq``, recorded when lcm last returned a context): by
content hash, allowing the host to have dropped stored messages (bounded look-ahead). The first
match may be anywhere in the window (a host resumed with only the tail of a long session): it
is the pairing that starts the longest run of consecutive matches. Messages after the last match are
new. A message that does not match but sits before matched ones (the host inserted or edited
something mid-transcript) is treated as new only if its content is nowhere in the view: lcm
never loses what the host holds, and never stores a copy of what it already has.

Cost. A turn costs O(new messages): the ingestor remembers, per session, the exact message
objects it matched last time (the host keeps appending to the same list), so the usual call
compares object identity for the old prefix, encodes only the new messages and reads one session
row. Another writer having appended in between (the session's ``last_seq`` moved) sends it back
to full alignment, which is bounded by the length of the host's transcript, never the history.
"""

from __future__ import annotations

import bisect
import logging
import operator
import threading
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import Any

from lcm.errors import ConcurrentUpdateError
from lcm.messages import content_hash, message_uid, uid_identity
from lcm.records import MessageMeta, MessageRecord, SessionRecord
from lcm.store import Store
from lcm.transcript import conversation_of, recall_call_ids, split_transcript

log = logging.getLogger(__name__)

#: How many stored messages the host may have dropped between two it kept.
LOOKAHEAD = 64
#: Where the transcript first meets the store is searched among this many of its first
#: messages that have a stored match, each at this many (newest) stored positions.
START_PROBES = 8
START_CANDIDATES = 16
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
    objects: list[Any]  # the host's message objects (kept alive, so `is` comparisons are sound)
    store_ids: list[int]
    token_counts: list[int]
    last_seq: int  # the session's last seq when this was recorded
    last_identity: str  # the identity of that last stored message
    session: SessionRecord
    new: int = 0  # messages stored by the call that recorded this
    host: list[Any] = field(default_factory=list)  # the host's whole list, system and summary too
    system: Any = None
    summaries: int = 0  # lcm summary messages in ``host``
    recall: frozenset[str] = frozenset()  # ids of calls to lcm's own tools seen so far


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

    def remember(self, session: SessionRecord, records: Sequence[MessageRecord], host: Sequence[Any]) -> None:
        """Record the transcript the host now holds: ``host`` is the context lcm just returned
        and ``records`` its verbatim messages (their ``message`` objects, which the host keeps
        appending after)."""
        system, conversation = split_transcript(host)
        with self._lock:
            previous = self._cache.get(session.id)
            if previous is not None and previous.last_seq == session.last_seq:
                last_identity = previous.last_identity
            else:
                tail = self.store.tail(session.id, 1)
                last_identity = tail[0].identity if tail else ""
            objects = [r.message for r in records]
            self._cache[session.id] = _Seen(
                objects=objects,
                store_ids=[r.store_id for r in records], token_counts=[r.token_count for r in records],
                last_seq=session.last_seq, last_identity=last_identity, session=session,
                host=list(host), system=system,
                summaries=len(host) - len(conversation) - (1 if system is not None else 0),
                recall=recall_call_ids(objects))

    def ingest(self, session_pk: int, messages: Sequence[Any]) -> IngestResult:
        with self._lock:
            seen = self._cache.get(session_pk)
            if seen is not None and seen.host and _common_prefix(seen.host, messages) == len(seen.host):
                # The host appended to the list lcm saw last: only the appended part is read.
                appended = list(messages[len(seen.host):])
                extra = conversation_of(appended)
                fast = self._extend(session_pk, seen, seen.objects + extra)
                if fast is not None:
                    fast.host, fast.system = list(messages), seen.system
                    fast.summaries = seen.summaries + len(appended) - len(extra)
                    return self._result(fast)
            system, conversation = split_transcript(messages)
            summaries = len(messages) - len(conversation) - (1 if system is not None else 0)
            seen = self._ingest(session_pk, conversation)
            seen.host, seen.system, seen.summaries = list(messages), system, summaries
            return self._result(seen)

    def _ingest(self, session_pk: int, conversation: list[Any]) -> _Seen:
        """Full alignment of the transcript against the stored session."""
        session = self.store.get_session(session_pk)
        hashes = [_hash(m) for m in conversation]
        recall = recall_call_ids(conversation)
        mapped, tokens, new_idx, anchor = self._align(session, conversation, hashes)
        if new_idx:
            result = self.store.append_messages(
                session_pk, [conversation[i] for i in new_idx], after_identity=anchor or None,
                recall_call_ids=recall)
            for i, sid, tok in zip(new_idx, result.store_ids, result.token_counts, strict=True):
                mapped[i], tokens[i] = sid, tok
            session, anchor = result.session, result.last_identity
            if result.inserted:
                log.debug("lcm ingest: %d new message(s) in session %s", result.inserted, session.session_key)
        seen = _Seen(list(conversation), [int(s) for s in mapped], [int(t or 0) for t in tokens],
                     session.last_seq, anchor or "", session, len(new_idx), recall=recall)
        self._cache[session_pk] = seen
        return seen

    def _extend(self, session_pk: int, seen: _Seen, conversation: list[Any]) -> _Seen | None:
        """The host appended to the transcript lcm saw last: store just the new messages,
        provided nobody else wrote to the session meanwhile (else None: align again)."""
        new = conversation[len(seen.objects):]
        if not new:  # nothing new: stored messages never change, no database work at all
            return _Seen(seen.objects, seen.store_ids, seen.token_counts,
                         seen.last_seq, seen.last_identity, seen.session, 0, recall=seen.recall)
        recall = seen.recall | recall_call_ids(new)
        try:
            result = self.store.append_messages(session_pk, new, after_identity=seen.last_identity or None,
                                                expect_last_seq=seen.last_seq, recall_call_ids=recall)
        except ConcurrentUpdateError:
            return None
        extended = _Seen(conversation, seen.store_ids + list(result.store_ids),
                         seen.token_counts + list(result.token_counts), result.session.last_seq,
                         result.last_identity, result.session, len(new), recall=recall)
        self._cache[session_pk] = extended
        if result.inserted:
            log.debug("lcm ingest: %d new message(s) in session %s", result.inserted,
                      result.session.session_key)
        return extended

    @staticmethod
    def _result(seen: _Seen) -> IngestResult:
        return IngestResult(session=seen.session, system=seen.system, conversation=seen.objects,
                            store_ids=seen.store_ids, token_counts=seen.token_counts,
                            new=seen.new, summaries_seen=seen.summaries)

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
        stored = [meta_key(meta) for meta in metas]
        positions: dict[str, list[int]] = {}
        for j, key in enumerate(stored):
            positions.setdefault(key, []).append(j)
        keys = [message_key(m, hashes[i]) for i, m in enumerate(conversation)]
        start = _alignment_start(keys, stored, positions)
        first, p = start if start is not None else (n, 0)
        last_matched = -1
        for i in range(first, n):
            key = keys[i]
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
            key = keys[i]
            if i < last_matched:
                if key not in positions and older is None and lo > 1:
                    older = {meta_key(m): m for m in self.store.message_metas(
                        session.id, first_seq=1, last_seq=lo - 1)}  # rare: a full look-up
                known = metas[positions[key][0]] if key in positions else (older or {}).get(key)
                if known is not None:  # a stored message the host moved or kept: not new
                    mapped[i], tokens[i] = known.store_id, known.token_count
                    continue
                log.info("lcm ingest: session %s: a message the host inserted mid-transcript is "
                         "stored at the end", session.session_key)
            new_idx.append(i)
        return mapped, tokens, new_idx, anchor


def _alignment_start(keys: Sequence[str], stored: Sequence[str],
                     positions: Mapping[str, list[int]]) -> tuple[int, int] | None:
    """(transcript index, window index) where the transcript first meets the stored window.

    The host's transcript may begin anywhere in the window: at its start (a host that re-sends
    everything), at the newest stored messages (a host resumed with the tail of its history,
    or whose view lcm has not recorded), or anywhere between. The start is the pairing that
    begins the longest run of consecutive matches; ties go to the earlier transcript message,
    then to the newer stored one. None: nothing in the transcript is stored.
    """
    best: tuple[int, int, int] | None = None  # (run length, -transcript index, window index)
    probes = 0
    for i, key in enumerate(keys):
        candidates = positions.get(key)
        if not candidates:
            continue
        for j in candidates[-START_CANDIDATES:]:
            run = 1
            while i + run < len(keys) and j + run < len(stored) and keys[i + run] == stored[j + run]:
                run += 1
            if best is None or (run, -i, j) > best:
                best = (run, -i, j)
        probes += 1
        if probes >= START_PROBES:
            break
    return None if best is None else (-best[1], best[2])


def _hash(message: Any) -> str:
    return content_hash(message) if isinstance(message, Mapping) else ""


def message_key(message: Any, digest: str) -> str:
    """What identifies a message when matching a transcript against the store: its host
    uid when it has one, else its content hash (compare with :func:`meta_key`)."""
    uid = message_uid(message) if isinstance(message, Mapping) else None
    return uid_identity(uid) if uid else digest


def meta_key(meta: MessageMeta) -> str:
    """The stored side of :func:`message_key`."""
    return meta.identity if meta.identity.startswith("u") else meta.content_hash


def _common_prefix(old: Sequence[Any], new: Sequence[Any]) -> int:
    """Length of the prefix the two lists share, element by element (the same objects)."""
    n = min(len(old), len(new))
    if n and old[n - 1] is new[n - 1] and all(map(operator.is_, old[:n], new[:n])):
        return n  # the usual turn: one C-speed pass, no Python loop over a long transcript
    i = 0
    while i < n and old[i] is new[i]:
        i += 1
    return i
