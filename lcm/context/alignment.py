"""Alignment: where each message of a host's transcript is stored, and where the new ones go,
decided from reads of the stored history (``AlignmentReads``: plain reads for a first guess,
``FamilyPort`` under the conversation's lock for the plan that counts). Pure decisions over
those reads; ``lcm.context.ingest`` writes what they decide.

What the transcript proves comes first, checked against the store: a host that holds the
context lcm handed it has its held messages where they were stored (``Held``); lcm's summary
at the head of a transcript names the session and message it stands in for (``Covered``).
Otherwise the transcript is matched by content (see :func:`plan` and ``lcm.context.ingest``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lcm.errors import NotFoundError
from lcm.messages import message_uid, uid_identity
from lcm.prepare import message_identity
from lcm.records import MessageMeta, SessionRecord

log = logging.getLogger("lcm.context.ingest")

#: Where the transcript first meets the store is searched among this many of its first
#: messages that have a stored match, each at this many (newest) stored positions.
#: (Messages that repeat, such as "ok", have many stored positions: the newest are tried.)
START_PROBES = 8
START_CANDIDATES = 256
#: Stored messages read for alignment beyond the transcript's own length.
WINDOW_SLACK = 256
#: How many forks deep one alignment follows (a fork of a fork of ...).
MAX_FOLLOW = 32



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
class Plan:
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


def plan(reader: AlignmentReads, session_pk: int, keys: Sequence[str], proof: Held | Covered | None = None, *,
         whole: bool = False) -> Plan:
    """Where each of the transcript's messages (by ``keys``) is stored, and where the new ones go.

    ``proof``: what the host's transcript proves about where it is stored (the view it held, or
    lcm's summary at its head), followed when the store confirms it; else the transcript is
    aligned by content. ``whole``: the transcript is the host's whole conversation from its
    first message (a chat client behind lcm proxy), so one of which nothing is stored is not
    the stored history's continuation but a conversation that opens differently (its first
    message edited): see :func:`_plan_from_the_start`. Without it, such a transcript follows
    the stored history (a host may hand over only what is new)."""
    session = reader.session(session_pk)
    n = len(keys)
    plan = Plan([None] * n, [None] * n, [], session, "", None, None)
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
    if start is None and whole and keys:
        root = _root_of(reader, session)
        if root.id != session.id:  # a whole conversation is found from its family's root
            return _plan_whole_from(reader, root, keys)
        _plan_from_the_start(reader, session, keys, plan)
        return plan
    if start is None:  # nothing in the transcript is stored: it all follows the stored history
        plan.new_idx = list(range(n))
        return plan
    first, at, plan.sure = start
    _follow(reader, keys, lineage, first, at, plan)
    _map_before_start(reader, session, keys, lineage, positions, first, plan)
    plan.new_idx = [i for i in range(n) if plan.mapped[i] is None]
    return plan


def _plan_whole_from(reader: AlignmentReads, root: SessionRecord, keys: Sequence[str]) -> Plan:
    """:func:`plan` of a whole conversation against its family's root: it may go on another
    branch of the family than the session the host was last in (the original conversation
    after an edit of its first message, or another edit)."""
    return plan(reader, root.id, keys, None, whole=True)


def _root_of(reader: AlignmentReads, session: SessionRecord) -> SessionRecord:
    """The session ``session`` is a fork of, at any depth (itself when it is none)."""
    current = session
    for _ in range(MAX_FOLLOW):
        if current.parent_id is None:
            break
        current = reader.session(current.parent_id)
    return current


def _plan_from_the_start(reader: AlignmentReads, session: SessionRecord, keys: Sequence[str], plan: Plan) -> None:
    """A whole conversation of which nothing is stored in ``session``: it continues the fork of
    ``session`` that opens with the same message (made by an earlier request), else it starts
    one that shares nothing with it (``fork_seq`` 0)."""
    found = _fork_opening_with(reader, session, 0, keys[0], len(keys) + 1)
    if found is None:
        plan.target, plan.fork_seq, plan.anchor, plan.end_store_id = session, 0, "", None
        plan.new_idx = list(range(len(keys)))
        return
    lineage = _Lineage()
    lineage.extend_front(*found)
    _follow(reader, keys, lineage, 0, 0, plan)
    plan.new_idx = [i for i in range(len(keys)) if plan.mapped[i] is None]


def _fork_opening_with(reader: AlignmentReads, owner: SessionRecord, seq: int, key: str,
                       count: int) -> tuple[SessionRecord, list[MessageMeta]] | None:
    """The fork of ``owner`` after its message ``seq`` whose first message has ``key``, with
    its first ``count`` messages (None: no such fork)."""
    for fork in reader.forks(owner.id, seq):
        head = reader.metas(fork.id, 1, min(fork.last_seq, count))
        if head and meta_key(head[0]) == key:
            return fork, head
    return None


def _plan_after_held(reader: AlignmentReads, session: SessionRecord, keys: Sequence[str], held: Held,
                     plan: Plan) -> bool:
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
                        plan: Plan) -> bool:
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
            plan: Plan) -> None:
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
        # Diverged after stored position p - 1: continue the line that goes on the same way
        # (the owner's own, where the lineage had gone into a fork of it here; or a fork that
        # starts the same way), or start a fork.
        owner, shared = owners[p - 1], metas[p - 1]
        follow = None
        if owners[p].id != owner.id:  # a host back on the line it forked from (a branch switch)
            own = reader.metas(owner.id, shared.seq + 1, min(owner.last_seq, shared.seq + n - i + 1))
            if own and meta_key(own[0]) == keys[i]:
                follow = (owner, own)
        if follow is None:
            follow = _fork_opening_with(reader, owner, shared.seq, keys[i], n - i + 1)
        if follow is None:
            plan.target, plan.fork_seq, plan.anchor, plan.end_store_id = owner, shared.seq, shared.identity, None
            return
        fork, head = follow
        metas, owners, stored, p = head, [fork] * len(head), [meta_key(m) for m in head], 0


def _map_before_start(reader: AlignmentReads, session: SessionRecord, keys: Sequence[str], lineage: _Lineage,
                      positions: Mapping[str, list[int]], first: int, plan: Plan) -> None:
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


def message_key(message: Any, digest: str) -> str:
    """What identifies a message when matching a transcript against the store: its host
    uid when it has one, else its content hash (compare with :func:`meta_key`)."""
    uid = message_uid(message) if isinstance(message, Mapping) else None
    return uid_identity(uid) if uid else digest


def meta_key(meta: MessageMeta) -> str:
    """The stored side of :func:`message_key`."""
    return meta.identity if meta.identity.startswith("u") else meta.content_hash
