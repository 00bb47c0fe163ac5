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

Alignment (its decisions are in ``lcm.context.alignment``), decided under the lock of the
session's family (``store.sessions.family``: a row lock on PostgreSQL, the write lock on
SQLite), against what is stored, never against this process's memory alone. What the host's
transcript proves comes first, checked against the store (issue 30): a host that holds the
context lcm handed it (plus new messages) has its held messages where they were stored, and
only what follows is matched, from the stored message after its last one (``Held``); lcm's
summary message at the head of a transcript names the session and message it stands in for,
so the conversation after it continues there (``Covered``: a restarted host reloading the list
it kept, in a fork, say). Otherwise the transcript is matched against the stored history (the
session's newest messages, reaching back to where the host's view starts, ``host_view_seq``,
and for a fork into its parent's messages up to the fork point):

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
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lcm.context.alignment import Covered, Held, message_key
from lcm.context.alignment import plan as plan_alignment
from lcm.context.ports import StorePorts
from lcm.errors import ConcurrentUpdateError
from lcm.messages import content_hash, unstorable_reason
from lcm.prepare import PreparedMessage, prepare_messages
from lcm.records import MessageMeta, MessageRecord, SessionRecord
from lcm.tokens import EstimatedTokens, TokenCounter
from lcm.transcript import conversation_of, recall_call_ids, same_objects_prefix, split_transcript

log = logging.getLogger(__name__)

#: Counts a turn's messages where the store counts them exactly later.
ESTIMATED = EstimatedTokens()

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
    #: The seq in ``session`` of the transcript's last message: where the host's conversation
    #: ends, so where a context handed back to it must end too (another writer may have stored
    #: more since, which the host never had). None when that message is not in ``session`` (a
    #: host behind a fork point) or the transcript holds no conversation.
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
                and same_objects_prefix(self.objects, conversation[:n]) == n):
            return None
        return Held(self.store_ids, self.token_counts, self.last_at)


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
    #: Every transcript is the host's whole conversation from its first message (``alignment.plan``).
    whole: bool = False
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
            if seen is not None and seen.host and same_objects_prefix(seen.host, messages) == len(seen.host):
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
        guess = plan_alignment(_Reader(self.store), session_pk, keys, proof, whole=self.whole)
        prepared: dict[int, PreparedMessage] = dict(zip(
            guess.new_idx, prepare_messages([good[i] for i in guess.new_idx], self._counter(), recall), strict=True))
        with self.store.sessions.family(session_pk) as writer:
            plan = plan_alignment(writer, session_pk, keys, proof, whole=self.whole)
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
        if forked and plan.fork_seq == 0:
            log.info("lcm ingest: the conversation opens differently from session %s (its first message "
                     "was edited); it continues in the fork %s", plan.target.session_key, target.session_key)
        elif forked:
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
                            forked=seen.forked,
                            host_end=at[1] if at is not None and at[0] == seen.session.id else None)


def _partition(messages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(messages that can be stored, messages that cannot be stored at all)."""
    good: list[Any] = []
    bad: list[Any] = []
    for m in messages:
        (bad if unstorable_reason(m) is not None else good).append(m)
    return good, bad


