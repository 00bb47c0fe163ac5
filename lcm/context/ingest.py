"""Ingest: store each message of a host transcript exactly once, whoever else writes.

The host hands lcm its live transcript again and again: the whole conversation before any
compaction, lcm's own summary plus the verbatim messages after it once lcm has compacted, the
whole persisted history after a restart, the same conversation from a second host (a gateway
and a CLI resuming one session, a host and ``lcm ingest``). :class:`Ingestor` works out which
of those messages are already stored and stores only the rest, in one transaction.

What is not stored as a message: the leading system prompt (the host rebuilds it every turn;
``ContextSession`` keeps each distinct version apart, ``store.sessions.keep_system_prompt``), the messages
lcm generated itself (recognised by digest, ``lcm.transcript.OwnMessages``), the host's
ephemeral retry scaffolding, and a message that cannot be stored at all (not a JSON object, no
usable role): that one is skipped, counted on the session (``skipped_count``) and logged once,
and the rest of the transcript is stored as usual. A value JSON cannot hold never stops a
message: it is stored as well as it can be, with the change recorded on the row.

Alignment, decided under the lock of the session's family (``store.sessions.family``: a row
lock on PostgreSQL, the write lock on SQLite), against what is stored, never against this
process's memory alone. What the host's transcript proves comes first, checked against the
store (issue 30): a host that holds the context lcm handed it (plus new messages) has its held
messages where they were stored, and only what follows is matched, from the stored message
after its last one (``Held``); lcm's summary message at the head of a transcript names the
session and message it stands in for, so the conversation after it continues there
(``Covered``: a restarted host reloading the list it kept, in a fork, say). Otherwise the
transcript is matched against the stored history (the session's newest messages, reaching back
to where the host's view starts, ``host_view_seq``, and for a fork into its parent's messages
up to the fork point):

* its first matching message is the start of the longest run of consecutive matches (a host
  resumed with the tail of a long session starts anywhere); earlier messages the store does
  not know (a host inserted them) are new;
* from there messages must match the stored history one for one. The first one that does not
  is where the transcript goes its own way. If the stored history ends there, the rest is new
  and is appended. If the stored history goes on (another writer stored something else after
  the last message both share), the transcript has **diverged**: the rest continues an
  existing fork of that session at that point when one starts with the same message, else it
  becomes a new fork (a session ``<key>/fork-N`` whose ``parent_id`` / ``fork_seq`` name the
  parent and the last shared message). Nothing is interleaved, dropped or stored twice;
* a transcript that stops before the end of the stored history (a host that is behind
  another) adds nothing.

Cost. A turn costs O(new messages): the ingestor remembers, per session, the exact message
objects it matched last time (the host keeps appending to the same list) and, when the
transcript's last message is the session's last stored one, appends the new messages with a
compare-and-set on the session's ``last_seq``. Anything else (another writer appended in
between, the host changed its list) goes to full alignment under the lock, bounded by the
length of the host's transcript, never the history.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lcm.context.ports import StorePorts
from lcm.errors import ConcurrentUpdateError, NotFoundError
from lcm.messages import content_hash, message_uid, uid_identity, unstorable_reason
from lcm.prepare import PreparedMessage, message_identity, prepare_messages
from lcm.records import MessageMeta, MessageRecord, SessionRecord
from lcm.tokens import EstimatedTokens, TokenCounter
from lcm.transcript import conversation_of, recall_call_ids, split_transcript

log = logging.getLogger(__name__)

#: Counts a turn's messages where the store counts them exactly later.
ESTIMATED = EstimatedTokens()

#: Where the transcript first meets the store is searched among this many of its first
#: messages that have a stored match, each at this many (newest) stored positions.
#: (Messages that repeat, such as "ok", have many stored positions: the newest are tried.)
START_PROBES = 8
START_CANDIDATES = 256
#: Stored messages read for alignment beyond the transcript's own length.
WINDOW_SLACK = 256
#: How many forks deep one alignment follows (a fork of a fork of ...).
MAX_FOLLOW = 32


def with_exact_counts(store_ids: Sequence[int], token_counts: Sequence[int], exact: Mapping[int, int]) -> list[int]:
    """Per message (by store id), its exact count where ``exact`` has one, else as it was."""
    return [exact.get(sid, tokens) for sid, tokens in zip(store_ids, token_counts, strict=True)]


@dataclass
class IngestResult:
    """What one ingest call saw and did."""

    session: SessionRecord  # where the transcript lives now (a fork when it diverged)
    system: Mapping[str, Any] | None
    conversation: list[Mapping[str, Any]]  # the stored (storable) conversation messages
    store_ids: list[int]  # one per conversation message
    token_counts: list[int]  # lcm's token count per conversation message
    added: int  # messages this call stored
    skipped: int = 0  # messages that cannot be stored at all, in this transcript
    forked: bool = False  # this call started a new fork
    #: The transcript ends at the session's last stored message. False: the host is behind
    #: what is stored (another writer, or a restarted host re-sending its history), and a
    #: context assembled from the whole session would hand it messages it never had.
    at_end: bool = True
    #: The seq in ``session`` of the transcript's last message: where the host's conversation
    #: ends, so where a context handed back to it must end too. None when that message is not
    #: in ``session`` (a host behind a fork point) or the transcript holds no conversation.
    host_end: int | None = None


@dataclass
class HostView:
    """The transcript a host held at its last ingest (per session), for the fast path: the
    host's next transcript normally is this one plus new messages."""

    objects: list[Any]  # the host's storable conversation messages (kept alive: `is` is sound)
    store_ids: list[int]
    token_counts: list[int]
    session: SessionRecord
    #: The seq of the transcript's last message when that is the session's last stored
    #: message (the fast path may append after it), else None.
    end_seq: int | None
    end_identity: str
    added: int = 0
    host: list[Any] = field(default_factory=list)  # the host's whole list, system and lcm's too
    system: Any = None
    recall: frozenset[str] = frozenset()
    skipped: int = 0
    forked: bool = False
    #: False when the transcript's place in the stored history was a guess among equally good
    #: ones (a transcript of repeated messages): its next turn is aligned again, never appended
    #: after the guessed end.
    sure: bool = True
    #: (session pk, seq) where the transcript's last message is stored, None when unknown.
    last_at: tuple[int, int] | None = None

    def proves(self, conversation: Sequence[Any]) -> Held | None:
        """Where the messages of ``conversation`` this view held are stored, when it starts
        with exactly them (the same objects) and their places were not a guess."""
        n = len(self.objects)
        if not (n and self.sure and self.last_at is not None and len(conversation) >= n
                and _common_prefix(self.objects, conversation[:n]) == n):
            return None
        return Held(self.store_ids, self.token_counts, self.last_at)


@dataclass(frozen=True)
class Held:
    """What a host's held view proves about the stored session: its first ``len(store_ids)``
    conversation messages are stored as ``store_ids``, the last of them at ``last_at``."""

    store_ids: list[int]
    token_counts: list[int]
    last_at: tuple[int, int]


@dataclass(frozen=True)
class Covered:
    """What lcm's summary message in a host's transcript proves: the conversation message after
    it (index ``index`` of the conversation) is message ``seq`` of session ``session_pk``."""

    index: int
    session_pk: int
    seq: int


@dataclass
class _Plan:
    """Where each transcript message is stored, decided from one read of the stored state."""

    mapped: list[int | None]
    tokens: list[int | None]
    new_idx: list[int]
    target: SessionRecord  # the session new messages go to (or the parent of a new fork)
    anchor: str  # identity new messages chain after
    fork_seq: int | None  # not None: start a fork of ``target`` after this seq
    end_store_id: int | None  # the store id of ``target``'s last stored message
    #: The alignment start was the only best one (see ``_alignment_start``).
    sure: bool = True
    #: (session pk, seq) of the stored message the transcript's last message is (None: new).
    last_at: tuple[int, int] | None = None


class AlignmentReads(Protocol):
    """What alignment reads: ``_Reader`` outside the lock, ``FamilyPort`` under it."""

    def session(self, pk: int) -> SessionRecord: ...
    def metas(self, pk: int, first_seq: int, last_seq: int) -> list[MessageMeta]: ...
    def forks(self, pk: int, fork_seq: int) -> list[SessionRecord]: ...
    def seq_of_identity(self, pk: int, identity: str) -> int | None: ...


class _Reader:
    """The reads alignment needs, outside a transaction (the optimistic first plan); the same
    methods as ``FamilyPort`` offers under the lock."""

    def __init__(self, store: StorePorts):
        self.store = store

    def session(self, pk: int) -> SessionRecord:
        return self.store.sessions.get(pk)

    def metas(self, pk: int, first_seq: int, last_seq: int) -> list[MessageMeta]:
        return self.store.messages.metas(pk, first_seq=first_seq, last_seq=last_seq)

    def forks(self, pk: int, fork_seq: int) -> list[SessionRecord]:
        return self.store.sessions.forks(pk, fork_seq)

    def seq_of_identity(self, pk: int, identity: str) -> int | None:
        return self.store.messages.seq_of_identity(pk, identity)


@dataclass
class Ingestor:
    store: StorePorts
    tokens: TokenCounter = field(default_factory=TokenCounter)
    own: Callable[[Any], bool] = field(default=lambda m: False)
    #: The alignment key of the stored message a cut copy lcm handed out stands for, else None.
    stands_for: Callable[[Any], str | None] = field(default=lambda m: None)
    #: (session pk, last seq) that lcm's summary message stands in for, else None.
    covers: Callable[[Any], tuple[int, int] | None] = field(default=lambda m: None)
    #: Secrets out of messages before anything else sees them (``lcm.redact``; None: off).
    redact: Callable[[Sequence[Any]], list[Any]] | None = None
    _cache: dict[int, HostView] = field(default_factory=dict)
    _bad: dict[int, set[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _counter(self) -> TokenCounter:
        """What a turn's messages are counted with: the exact tokenizer, or an estimate where
        the store counts exactly later (``MessagePort.counts_later``: see ``recount``)."""
        return ESTIMATED if self.store.messages.counts_later else self.tokens

    def recount(self, session_pk: int, exact: Mapping[int, int]) -> None:
        """Exact counts of messages stored with estimates (``MessagePort.settle_tokens``): the
        host view remembered for the session takes them too."""
        with self._lock:
            seen = self._cache.get(session_pk)
            if seen is not None and exact:
                seen.token_counts = with_exact_counts(seen.store_ids, seen.token_counts, exact)

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
        system, _ = split_transcript(host, self.own)
        # ``session`` is as the hand-over left it: another writer's message after ours means
        # the host is not at the end (its next turn aligns again).
        end = records[-1] if records and records[-1].seq == session.last_seq else None
        objects = [r.message for r in records]
        with self._lock:
            self._cache[session.id] = HostView(
                objects=objects, store_ids=[r.store_id for r in records],
                token_counts=[r.token_count for r in records], session=session,
                end_seq=end.seq if end is not None else None,
                end_identity=end.identity if end is not None else "",
                host=list(host), system=system, recall=recall_call_ids(objects),
                last_at=(records[-1].session_pk, records[-1].seq) if records else None)

    def ingest(self, session_pk: int, messages: Sequence[Any]) -> IngestResult:
        redact = self.redact or (lambda ms: list(ms))
        with self._lock:
            seen = self._cache.get(session_pk)
            prior = None
            if seen is not None and seen.host and _common_prefix(seen.host, messages) == len(seen.host):
                fast = self._extend(seen, redact(messages[len(seen.host):]))
                if fast is not None:
                    fast.host, fast.system = list(messages), seen.system
                    return self._result(fast)
                prior = seen  # the host holds what it held before, plus new messages
            seen = self._ingest(session_pk, redact(messages), prior)
            # The fast path compares the host's own objects, redacted or not.
            seen.host = list(messages)
            return self._result(seen)

    # ------------------------------------------------------------------ the fast path

    def _extend(self, seen: HostView, appended: list[Any]) -> HostView | None:
        """The host appended to the transcript lcm saw last: store just the new messages, if
        the transcript ended at the session's last message and nobody wrote since (else None:
        align again)."""
        extra = conversation_of(appended, self.own)
        good, bad = _partition(extra)
        unnoted = self._unnoted(seen.session, bad)
        if not good:
            self._count_skipped(seen.session, unnoted)
            return HostView(seen.objects, seen.store_ids, seen.token_counts, seen.session,
                         seen.end_seq, seen.end_identity, 0,
                         recall=seen.recall, skipped=seen.skipped + len(bad), sure=seen.sure,
                         last_at=seen.last_at)
        if seen.end_seq is None or not seen.sure:
            return None
        recall = seen.recall | recall_call_ids(good)
        try:
            result = self.store.messages.append(
                seen.session.id, prepare_messages(good, self._counter(), recall),
                after_identity=seen.end_identity or None, expect_last_seq=seen.end_seq)
        except ConcurrentUpdateError:
            return None
        self._count_skipped(result.session, unnoted)
        extended = HostView(seen.objects + good, seen.store_ids + list(result.store_ids),
                         seen.token_counts + list(result.token_counts), result.session,
                         result.session.last_seq, result.last_identity, len(good),
                         recall=recall, skipped=seen.skipped + len(bad),
                         last_at=(result.session.id, result.session.last_seq))
        self._cache[result.session.id] = extended
        if result.inserted:
            log.debug("lcm ingest: %d new message(s) in session %s", result.inserted,
                      result.session.session_key)
        return extended

    # ------------------------------------------------------------------ full alignment

    def _ingest(self, session_pk: int, messages: Sequence[Any], prior: HostView | None = None) -> HostView:
        """Full alignment. ``prior``: the view this host held last, which ``messages`` extend:
        where its messages are stored is known (``Held``), so only what follows is aligned."""
        system, conversation = split_transcript(messages, self.own)
        good, bad = _partition(conversation)
        keys = [self.stands_for(m) or message_key(m, content_hash(m)) for m in good]
        recall = recall_call_ids(good)
        proof = (prior.proves(good) if prior is not None else None) or self._covered(messages, good)
        # A first plan from a plain read: its new messages are encoded outside the lock, the
        # expensive part of a write. The plan that counts is made again under the lock.
        guess = _plan(_Reader(self.store), session_pk, keys, proof)
        prepared: dict[int, PreparedMessage] = dict(zip(
            guess.new_idx, prepare_messages([good[i] for i in guess.new_idx], self._counter(), recall), strict=True))
        with self.store.sessions.family(session_pk) as writer:
            plan = _plan(writer, session_pk, keys, proof)
            missing = [i for i in plan.new_idx if i not in prepared]
            if missing:
                prepared.update(zip(missing, prepare_messages([good[i] for i in missing], self._counter(), recall),
                                    strict=True))
            target, forked = plan.target, False
            if plan.new_idx and plan.fork_seq is not None:
                target, forked = writer.create_fork(plan.target, plan.fork_seq), True
            end_id, end_identity = plan.end_store_id, plan.anchor
            if plan.new_idx:
                result = writer.append(target.id, [prepared[i] for i in plan.new_idx],
                                       after_identity=plan.anchor or None)
                for i, sid, tok in zip(plan.new_idx, result.store_ids, result.token_counts, strict=True):
                    plan.mapped[i], plan.tokens[i] = sid, tok
                target, end_id, end_identity = result.session, result.store_ids[-1], result.last_identity
                if plan.new_idx[-1] == len(good) - 1:  # the transcript's last message is new
                    plan.last_at = (target.id, target.last_seq)
            unnoted = self._unnoted(target, bad)
            if unnoted:
                writer.add_skipped(target.id, len(unnoted))
                target = writer.session(target.id)
        self._noted(target, unnoted)  # only once the count is committed
        if forked:
            self._carry_into_fork(target)
            log.warning("lcm ingest: the transcript diverged from session %s after its message %d "
                        "(another writer stored something else there); it continues in the fork %s",
                        plan.target.session_key, plan.fork_seq, target.session_key)
        if plan.new_idx:
            log.debug("lcm ingest: %d new message(s) in session %s", len(plan.new_idx), target.session_key)
        last = plan.mapped[-1] if plan.mapped else None
        extendable = last is not None and last == end_id
        seen = HostView(list(good), [int(s or 0) for s in plan.mapped], [int(t or 0) for t in plan.tokens],
                     target, target.last_seq if extendable else None,
                     end_identity if extendable else "", len(plan.new_idx),
                     host=list(messages), system=system, recall=recall,
                     skipped=len(bad), forked=forked, sure=plan.sure, last_at=plan.last_at)
        self._cache[target.id] = seen
        return seen

    def _covered(self, messages: Sequence[Any], good: Sequence[Any]) -> Covered | None:
        """Where lcm's (last) summary message in the transcript says the conversation after it
        continues (``Covered``), or None: no such summary, or nothing after it."""
        if not good:
            return None
        conversation = {id(m) for m in good}
        found, index = None, 0
        for m in messages:
            if id(m) in conversation:
                index += 1
                continue
            covers = self.covers(m)
            if covers is not None:
                found = (index, covers)
        if found is None or found[0] >= len(good):
            return None
        index, (session_pk, through) = found
        return Covered(index, session_pk, through + 1)

    def _carry_into_fork(self, fork: SessionRecord) -> None:
        """A fork's context starts with the parent's summaries of what the two share."""
        if fork.parent_id is None or fork.fork_seq is None:
            return
        nodes = self.store.summaries.carried(fork.parent_id) + [
            n for n in self.store.summaries.uncondensed(fork.parent_id) if n.last_seq <= fork.fork_seq]
        if nodes:
            self.store.summaries.carry(fork.id, [n.id for n in nodes])

    def _unnoted(self, session: SessionRecord, bad: Sequence[Any]) -> list[tuple[str, Any]]:
        """The messages that cannot be stored and this process has not counted yet (by mark)."""
        known = self._bad.get(session.id, set())
        out: dict[str, Any] = {}
        for message in bad:
            mark = hashlib.sha256(repr(message).encode("utf-8", "backslashreplace")).hexdigest()
            if mark not in known:
                out.setdefault(mark, message)
        return list(out.items())

    def _count_skipped(self, session: SessionRecord, unnoted: list[tuple[str, Any]]) -> None:
        if unnoted:
            self.store.sessions.add_skipped(session.id, len(unnoted))
            self._noted(session, unnoted)

    def _noted(self, session: SessionRecord, unnoted: list[tuple[str, Any]]) -> None:
        """Counted on the session: remember them, and log each once (per process)."""
        known = self._bad.setdefault(session.id, set())
        for mark, message in unnoted:
            known.add(mark)
            log.warning("lcm ingest: a message of session %s cannot be stored (%s); it is skipped, "
                        "the rest of the transcript is stored", session.session_key,
                        unstorable_reason(message))

    @staticmethod
    def _result(seen: HostView) -> IngestResult:
        at = seen.last_at
        return IngestResult(session=seen.session, system=seen.system, conversation=seen.objects,
                            store_ids=seen.store_ids, token_counts=seen.token_counts,
                            added=seen.added, skipped=seen.skipped,
                            forked=seen.forked, at_end=seen.end_seq is not None,
                            host_end=at[1] if at is not None and at[0] == seen.session.id else None)


# --------------------------------------------------------------------------- planning


class _Lineage:
    """The stored history a transcript is matched against: a window of the session's newest
    messages and, for a fork whose window reaches its start, its ancestors' messages up to
    the fork point; with the session each message belongs to."""

    def __init__(self) -> None:
        self.metas: list[MessageMeta] = []
        self.owners: list[SessionRecord] = []

    def extend_front(self, owner: SessionRecord, metas: list[MessageMeta]) -> None:
        self.metas[:0] = metas
        self.owners[:0] = [owner] * len(metas)

    @property
    def keys(self) -> list[str]:
        """Each stored message's alignment key (see :func:`meta_key`)."""
        return [meta_key(m) for m in self.metas]

    def positions(self) -> dict[str, list[int]]:
        """Where each key occurs in the lineage, oldest first."""
        out: dict[str, list[int]] = {}
        for j, key in enumerate(self.keys):
            out.setdefault(key, []).append(j)
        return out


def _lineage(reader: AlignmentReads, session: SessionRecord, want: int, from_seq: int | None = None) -> _Lineage:
    """``from_seq``: a window of ``want`` messages from there instead (a host far behind the
    stored end; the window still holds more than the transcript, so matching never mistakes
    its end for the session's)."""
    lineage = _Lineage()
    if from_seq is not None:
        lineage.extend_front(session, reader.metas(session.id, from_seq, min(session.last_seq,
                                                                             from_seq + want)))
        return lineage
    view_from = max(1, session.host_view_seq or 1)
    lo = max(1, min(view_from, session.last_seq - want + 1))
    lineage.extend_front(session, reader.metas(session.id, lo, session.last_seq))
    current, depth = session, 0
    while lo == 1 and current.parent_id is not None and current.fork_seq and depth < MAX_FOLLOW:
        parent = reader.session(current.parent_id)
        lo = max(1, current.fork_seq - max(0, want - len(lineage.metas)) + 1)
        lineage.extend_front(parent, reader.metas(parent.id, lo, current.fork_seq))
        current, depth = parent, depth + 1
    return lineage


def _plan(reader: AlignmentReads, session_pk: int, keys: Sequence[str], proof: Held | Covered | None = None) -> _Plan:
    """Where each of the transcript's messages (by ``keys``) is stored, and where the new ones go.

    ``proof``: what the host's transcript proves about where it is stored (the view it held, or
    lcm's summary at its head), followed when the store confirms it; else the transcript is
    aligned by content."""
    session = reader.session(session_pk)
    n = len(keys)
    plan = _Plan([None] * n, [None] * n, [], session, "", None, None)
    if isinstance(proof, Held) and _plan_after_held(reader, session, keys, proof, plan):
        return plan
    if isinstance(proof, Covered) and _plan_after_summary(reader, session, keys, proof, plan):
        return plan
    lineage = _lineage(reader, session, n + WINDOW_SLACK) if session.last_seq or session.parent_id else _Lineage()
    if not lineage.metas:
        plan.new_idx = list(range(n))
        return plan
    plan.anchor, plan.end_store_id = lineage.metas[-1].identity, lineage.metas[-1].store_id
    positions = lineage.positions()
    start = _alignment_start(keys, lineage.keys, positions)
    if (start is None or start[0] > 0) and keys and lineage.metas[0].seq > 1 and lineage.owners[0].id == session.id:
        # The window (which does not reach the session's start) explains no transcript from
        # its first message: nothing matched, or only a later message did (an "ok" matches
        # many). A host far behind (a restarted host re-sending its history turn by turn, a
        # second host resuming an old copy) may start where the session starts: its first
        # message's identity, chained from the start as ingest chains it, says so in one
        # index look-up.
        first_identity = keys[0] if keys[0].startswith("u") else message_identity("", keys[0], None)
        seq = reader.seq_of_identity(session.id, first_identity)
        if seq is not None:
            lineage = _lineage(reader, session, n + WINDOW_SLACK, from_seq=seq)
            positions = lineage.positions()
            start = _alignment_start(keys, lineage.keys, positions)
    if start is None:  # nothing in the transcript is stored: it all follows the stored history
        plan.new_idx = list(range(n))
        return plan
    first, at, plan.sure = start
    _follow(reader, keys, lineage, first, at, plan)
    _map_before_start(reader, session, keys, lineage, positions, first, plan)
    plan.new_idx = [i for i in range(n) if plan.mapped[i] is None]
    return plan


def _plan_after_held(reader: AlignmentReads, session: SessionRecord, keys: Sequence[str], held: Held,
                     plan: _Plan) -> bool:
    """Plan a transcript that extends what the host held: the held messages are where they were
    stored (checked: the last one is still there), and only the rest is matched, one for one,
    from the stored message after it. False when that cannot be used (the last held message is
    not in this session, or not where it was): align the usual way.

    Nothing is searched for: a host that holds lcm's context proves where its transcript is
    in the stored history, however far behind the session's end it is and however often its
    messages repeat (an "ok" that matches anywhere)."""
    k = len(held.store_ids)
    owner_pk, seq = held.last_at
    if owner_pk != session.id or seq > session.last_seq:
        return False
    # From the last held message on; longer than the rest of the transcript, so the transcript
    # always ends inside the window unless the stored session ends first.
    lineage = _lineage(reader, session, len(keys) - k + WINDOW_SLACK, from_seq=seq)
    if not lineage.metas or lineage.metas[0].store_id != held.store_ids[-1]:
        return False
    plan.mapped[:k], plan.tokens[:k] = list(held.store_ids), list(held.token_counts)
    plan.last_at = held.last_at
    _follow(reader, keys, lineage, k, 1, plan)
    plan.new_idx = [i for i in range(len(keys)) if plan.mapped[i] is None]
    return True


def _plan_after_summary(reader: AlignmentReads, session: SessionRecord, keys: Sequence[str], covered: Covered,
                        plan: _Plan) -> bool:
    """Plan a transcript that lcm's summary message heads: the conversation after the summary
    starts at the message it names (checked: that stored message has the same key), in
    ``session``, in a fork that descends from it (a restarted host, bound to its host key,
    that holds the context lcm handed it in a fork of its conversation) or in an ancestor (a
    fork's context opens with its parent's messages before the fork point); from there the
    transcript is followed one for one, into the forks it continues. False when that cannot be
    used: align the usual way."""
    target = _in_family(reader, session, covered.session_pk)
    if target is None or covered.seq > target.last_seq:
        return False
    i = covered.index
    lineage = _lineage(reader, target, len(keys) - i + WINDOW_SLACK, from_seq=covered.seq)
    if not lineage.metas or lineage.metas[0].seq != covered.seq or lineage.keys[0] != keys[i]:
        return False
    plan.target = target
    _follow(reader, keys, lineage, i, 0, plan)
    _map_before_start(reader, target, keys, lineage, lineage.positions(), i, plan)
    plan.new_idx = [j for j in range(len(keys)) if plan.mapped[j] is None]
    return True


def _in_family(reader: AlignmentReads, session: SessionRecord, pk: int) -> SessionRecord | None:
    """The session ``pk`` if it is ``session``, one of its forks (at any depth) or one of its
    ancestors, else None (another conversation, or forgotten since)."""
    if pk == session.id:
        return session
    try:
        current = session
        for _ in range(MAX_FOLLOW):  # an ancestor: the host holds context from before a fork
            if current.parent_id is None:
                break
            current = reader.session(current.parent_id)
            if current.id == pk:
                return current
        found = current = reader.session(pk)
        for _ in range(MAX_FOLLOW):  # a fork: a host bound to its host key continues a fork
            if current.parent_id is None:
                return None
            if current.parent_id == session.id:
                return found
            current = reader.session(current.parent_id)
    except NotFoundError:
        return None
    return None


def _follow(reader: AlignmentReads, keys: Sequence[str], lineage: _Lineage, first: int, at: int,
            plan: _Plan) -> None:
    """Map the transcript from ``first`` one for one onto the lineage from ``at``, into the forks
    it continues; where it goes its own way with history left after it, the new messages start
    a fork there (``plan.fork_seq``)."""
    n = len(keys)
    metas, owners, stored = lineage.metas, lineage.owners, lineage.keys
    i, p = first, at
    for _ in range(MAX_FOLLOW):
        while i < n and p < len(stored) and keys[i] == stored[p]:
            plan.mapped[i], plan.tokens[i] = metas[p].store_id, metas[p].token_count
            plan.last_at = (owners[p].id, metas[p].seq)
            i, p = i + 1, p + 1
        if i == n or p == len(stored):
            plan.target, plan.anchor, plan.end_store_id = owners[-1], metas[-1].identity, metas[-1].store_id
            return
        # Diverged after stored position p - 1: continue a fork that starts the same way, or
        # start one.
        owner, shared = owners[p - 1], metas[p - 1]
        follow = None
        for fork in reader.forks(owner.id, shared.seq):
            head = reader.metas(fork.id, 1, min(fork.last_seq, n - i + 1))
            if head and meta_key(head[0]) == keys[i]:
                follow = (fork, head)
                break
        if follow is None:
            plan.target, plan.fork_seq, plan.anchor, plan.end_store_id = owner, shared.seq, shared.identity, None
            return
        fork, head = follow
        metas, owners, stored, p = head, [fork] * len(head), [meta_key(m) for m in head], 0


def _map_before_start(reader: AlignmentReads, session: SessionRecord, keys: Sequence[str], lineage: _Lineage,
                      positions: Mapping[str, list[int]], first: int, plan: _Plan) -> None:
    """Messages before the alignment start that the store knows elsewhere (the host kept or
    moved them) are not new."""
    older: dict[str, MessageMeta] | None = None
    for i in range(first):
        if keys[i] in positions:
            hit: MessageMeta | None = lineage.metas[positions[keys[i]][0]]
        else:
            if older is None:  # rare: a full look-up of the session before the window
                older = {meta_key(m): m for m in reader.metas(session.id, 1, lineage.metas[0].seq - 1)
                         } if lineage.owners[0].id == session.id and lineage.metas[0].seq > 1 else {}
            hit = older.get(keys[i])
        if hit is not None:
            plan.mapped[i], plan.tokens[i] = hit.store_id, hit.token_count
        else:
            log.info("lcm ingest: session %s: a message the host holds before the stored ones it "
                     "continues is stored at the end", session.session_key)


def _alignment_start(keys: Sequence[str], stored: Sequence[str],
                     positions: Mapping[str, list[int]]) -> tuple[int, int, bool] | None:
    """(transcript index, window index, sure) where the transcript first meets the stored window.

    The host's transcript may begin anywhere in the window: at its start (a host that re-sends
    everything), at the newest stored messages (a host resumed with the tail of its history,
    or whose view lcm has not recorded), or anywhere between. The start is the pairing that
    begins the longest run of consecutive matches; ties go to the earlier transcript message,
    then to the newer stored one. ``sure`` is False when another stored position began an
    equally long run for the same transcript message (``[u]`` against a stored ``[u, u]``: the
    transcript may be either one): the guess is only good for this turn. None: nothing in the
    transcript is stored.
    """
    best: tuple[int, int, int] | None = None  # (run length, -transcript index, window index)
    tied = False
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
                tied = best is not None and best[:2] == (run, -i)
                best = (run, -i, j)
        probes += 1
        if probes >= START_PROBES:
            break
    return None if best is None else (-best[1], best[2], not tied)


def _partition(messages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(messages that can be stored, messages that cannot be stored at all)."""
    good: list[Any] = []
    bad: list[Any] = []
    for m in messages:
        (bad if unstorable_reason(m) is not None else good).append(m)
    return good, bad


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


