"""Pure planning: where the fresh tail starts, how far a leaf reaches, what to condense, and the
outcome a compaction reports. No I/O: the compactor reads, these decide.

Vocabulary (see also ``lcm/transcript.py``):
  * raw region: the session's messages after its summarized prefix (``seq > covered_seq``);
  * fresh tail: the newest raw messages, kept verbatim: the last ``LCM_FRESH_TAIL_COUNT``
    (optionally capped at ``LCM_FRESH_TAIL_MAX_TOKENS``), always including the newest real user
    message, and starting at an assistant message so no tool result is cut from its call;
  * compactable: raw messages before the fresh tail.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lcm.config import LcmConfig
from lcm.records import CompactionView, MessageRecord, SummaryRecord, WrittenSummary


def tail_start_index(roles: Sequence[str | None], tokens: Sequence[int], *, newest_user: int | None,
                     count: int, max_tokens: int, floor: int = 0) -> int:
    """Index where the fresh tail starts in a run of raw messages (``floor`` = first raw).

    Returns ``floor`` when nothing before the tail can be compacted (no assistant message
    to start the tail at). Pure, so the engine can also answer "is there anything to
    compact?" from the host's own transcript without reading the database.
    """
    n = len(roles)
    if n == 0:
        return floor
    want = max(floor, n - count)
    if max_tokens > 0:
        suffix = sum(tokens[want:])
        stop = newest_user if newest_user is not None else n - 1
        while want < stop and suffix > max_tokens:
            suffix -= tokens[want]
            want += 1
    if newest_user is not None:
        want = min(want, newest_user)
    for i in range(want, floor, -1):
        if roles[i] == "assistant":
            return i
    return floor


def leaf_end_index(roles: Sequence[str | None], tokens: Sequence[int], *, limit: int,
                   chunk_tokens: int, min_tokens: int = 0) -> int | None:
    """Last index (inclusive) of the leaf chunk starting at index 0 of a compactable run.

    ``limit`` is the index of the tail start (an assistant message or the end). The chunk
    ends right before an assistant message and never reaches ``limit``. It holds at most
    ``chunk_tokens``, with two exceptions that keep compaction moving: one indivisible turn
    bigger than that is a chunk of its own, and a run too small to be worth a summary
    (under ``min_tokens``) extends to the next boundary.
    """
    total = 0
    best = None
    best_total = 0
    for i in range(min(limit, len(roles))):
        total += tokens[i]
        cut_ok = i + 1 == limit or (i + 1 < len(roles) and roles[i + 1] == "assistant")
        if total > chunk_tokens and best is not None and best_total >= min_tokens:
            return best
        if cut_ok:
            best, best_total = i, total
            if total >= chunk_tokens and total >= min_tokens:
                return best
    return best


def condensable(view: CompactionView, config: LcmConfig) -> tuple[int, list[SummaryRecord]] | None:
    """(depth to build, the summaries to condense into it): exactly ``LCM_CONDENSATION_FANIN``
    of the oldest uncondensed summaries of the lowest depth that has that many, up to
    ``LCM_INCREMENTAL_MAX_DEPTH``; None when no depth does."""
    fanin = config.condensation_fanin
    by_depth: dict[int, list[SummaryRecord]] = {}
    for node in view.uncondensed:
        by_depth.setdefault(node.depth, []).append(node)
    for depth in sorted(by_depth):
        nodes = sorted(by_depth[depth], key=lambda n: n.first_seq)
        if len(nodes) >= fanin and config.can_condense_to(depth + 1):
            return depth + 1, nodes[:fanin]
    return None


def view_after_write(view: CompactionView, written: WrittenSummary,
                     condensed: Collection[int] = ()) -> CompactionView:
    """The compaction view once ``written`` is stored (``condensed``: the ids of the summaries it
    condensed), without reading it again: uncondensed stay highest depth first, then oldest."""
    gone = set(condensed)
    uncondensed = sorted([n for n in view.uncondensed if n.id not in gone] + [written.node],
                         key=lambda n: (-n.depth, n.first_seq))
    return replace(view, session=written.session, uncondensed=tuple(uncondensed))


@dataclass(frozen=True)
class TailPlan:
    """Where a session's fresh tail starts, with the raw messages read to decide it.

    ``records`` are the session's messages ``loaded_from..last_seq``: the compactor takes leaf
    sources from them and assembly its verbatim part, so one read serves a whole turn."""

    first_raw: int  # seq of the first message not under a leaf
    tail_start: int  # seq where the verbatim fresh tail starts
    newest_user: int | None  # seq of the newest real user message
    last_seq: int  # the session's last message when planned
    records: tuple[MessageRecord, ...] = ()
    loaded_from: int = 0  # seq of records[0]; last_seq + 1 when nothing was read

    @property
    def compactable(self) -> bool:
        return self.tail_start > self.first_raw

    def holds(self, first_seq: int) -> bool:
        """Whether ``records`` hold every message from ``first_seq`` to ``last_seq``."""
        return first_seq >= self.loaded_from

    def loaded(self, first_seq: int, last_seq: int | None = None) -> list[MessageRecord]:
        """The read messages with ``first_seq <= seq <= last_seq``."""
        top = self.last_seq if last_seq is None else last_seq
        return [r for r in self.records[max(0, first_seq - self.loaded_from):] if r.seq <= top]

    def after_leaf(self, covered_seq: int) -> TailPlan:
        """The same plan once a leaf covers the raw region up to ``covered_seq``."""
        return replace(self, first_raw=covered_seq + 1)


@dataclass
class Outcome:
    """What one compaction call did, kept with the session for status readers."""

    status: str = "not_needed"  # compacted, not_needed, stopped, partial
    reason: str = ""
    #: Why a burst was asked for: threshold, cold_cache, window_shrank, forced ("" for none).
    cause: str = ""
    passes: int = 0
    leaves: int = 0
    condensed: int = 0
    messages_summarized: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    seconds: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)
    at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Stopped:
    """Why a pass could not make the context smaller (the compaction stops and says so)."""

    reason: str
