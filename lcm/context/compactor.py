"""Compaction: turn the oldest raw messages into leaf summaries, and runs of same-depth
summaries into deeper ones, in bounded passes that each make progress or stop with a reason.

A pass is either a leaf (the oldest compactable run up to ``LCM_LEAF_CHUNK_TOKENS``, ending
right before an assistant message, becomes a depth-0 summary) or a condensation (exactly
``LCM_CONDENSATION_FANIN`` of the oldest uncondensed summaries of one depth become one summary
of the next depth, up to ``LCM_INCREMENTAL_MAX_DEPTH``). The summarizer runs outside any
database transaction; the summary and its edges are written in one.

Bursts (hysteresis). A call starts only when the estimated context reaches ``start`` (the
caller's trigger: the threshold, or the target itself when the cache is cold or the window
shrank) and then runs passes until it is under ``target``, nothing is compactable, or
``LCM_MAX_PASSES`` / ``LCM_MAX_COMPACTION_SECONDS`` is reached — and says which. Between bursts
the prompt only grows at its end, so the provider's prompt cache stays warm.

Condensation is lazy and batched: it rewrites summaries the host already holds (a cache miss
from the first one rewritten), so it runs only inside a burst, only when the summaries take
more than ``CONDENSE_SHARE`` of the target (or when no leaf can be made and the context is
still over the target), and then condenses every full group at once, so it is rare.

Call shape. A call reads the compaction view once and plans the fresh tail once (reading the
raw messages near the tail, which then serve as leaf sources and as the assembled context's
verbatim part); each write returns the session as it left it, so the view is brought up to date
in memory. Only a write that another writer beat (``IntegrityViolation``) makes it read again.
The result hands the view and the plan on, so assembly reads nothing twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from lcm.config import LcmConfig
from lcm.context.budget import added_framing, summary_message_cost
from lcm.context.framing import frame_messages, frame_summaries
from lcm.context.planning import (
    Outcome,
    Stopped,
    TailPlan,
    condensable,
    leaf_end_index,
    tail_start_index,
    view_after_write,
)
from lcm.context.ports import MessagePort, StorePorts
from lcm.context.summarize import Summarizer, SummaryDraft, SummaryRequest
from lcm.errors import IntegrityViolation
from lcm.records import CompactionView, MessageRecord, NewSummary, SessionRecord, SummaryRecord, WrittenSummary
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE
from lcm.transcript import is_real_user

log = logging.getLogger(__name__)

#: A summarizer call's source is kept under this many characters per source token (times the
#: slack): a single 50 MB tool result must not become a 50 MB prompt.
SOURCE_SLACK = 1.25
#: The smallest summary worth asking for: room for a marked truncation (marker, expand line, text).
MIN_SUMMARY_TOKENS = 80
#: Message metas read per page while looking for the end of a leaf far before the tail.
META_PAGE = 500
#: Raw messages read before the count-based tail start (and before the newest user message).
TAIL_WINDOW_EXTRA = 256
#: User messages searched for the newest real one (host scaffolding rides in user messages).
USER_LOOKBACK = 64
#: Summaries may take this share of the compaction target before a burst condenses them.
CONDENSE_SHARE = 0.25


class Planned(Protocol):
    """A raw message as planning sees it (a stored record, or a meta without its body)."""

    @property
    def store_id(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def token_count(self) -> int: ...


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction call did, and what it read that assembly can use as it is: the view
    (None when nothing needed reading) and the tail plan (None when no leaf was planned)."""

    outcome: Outcome
    view: CompactionView | None
    plan: TailPlan | None


def _newest_real_user(messages: MessagePort, session: SessionRecord, window: Sequence[MessageRecord],
                      first_raw: int, lo: int) -> int | None:
    """The seq of the newest user message a person wrote (else the newest user message) among
    the raw region's newest ``USER_LOOKBACK`` user messages; ``window`` is ``lo..last``."""
    users = [r for r in reversed(window) if r.role == "user"][:USER_LOOKBACK]
    for r in users:
        if is_real_user(r.message):
            return r.seq
    if len(users) < USER_LOOKBACK and lo > first_raw:
        older = messages.latest(session.id, roles=("user",), limit=USER_LOOKBACK - len(users),
                                min_seq=first_raw, max_seq=lo - 1)
        for r in older:
            if is_real_user(r.message):
                return r.seq
        users.extend(older)
    return users[0].seq if users else None


def plan_tail(messages: MessagePort, session: SessionRecord, config: LcmConfig) -> TailPlan:
    """Where the session's fresh tail starts (``lcm.context.planning.tail_start_index``), from
    one read of the newest raw messages (widened only when that window has no place to start)."""
    first_raw, last = session.covered_seq + 1, session.last_seq
    if last < first_raw:
        return TailPlan(first_raw, first_raw, None, last, (), last + 1)
    lo = max(first_raw, last - config.fresh_tail_count - TAIL_WINDOW_EXTRA)
    window = messages.get_range(session.id, first_seq=lo, last_seq=last)
    newest_user = _newest_real_user(messages, session, window, first_raw, lo)
    if newest_user is not None and lo > first_raw and newest_user - TAIL_WINDOW_EXTRA < lo:
        wider = max(first_raw, newest_user - TAIL_WINDOW_EXTRA)
        window = messages.get_range(session.id, first_seq=wider, last_seq=lo - 1) + window
        lo = wider
    while True:
        idx = tail_start_index(
            [r.role for r in window], [r.token_count for r in window],
            newest_user=None if newest_user is None else newest_user - lo,
            count=config.fresh_tail_count, max_tokens=config.fresh_tail_max_tokens)
        if idx > 0 or lo == first_raw:
            return TailPlan(first_raw, lo + idx, newest_user, last, tuple(window), lo)
        wider = max(first_raw, lo - 4 * TAIL_WINDOW_EXTRA)  # no assistant message: widen
        window = messages.get_range(session.id, first_seq=wider, last_seq=lo - 1) + window
        lo = wider


@dataclass
class _Run:
    """A compaction call in progress: what it knows (kept up to date in memory) and was asked."""

    view: CompactionView
    plan: TailPlan | None
    force: bool  # a pass is owed even under the target (cleared by the first leaf)
    estimate: Callable[[SessionRecord], int]
    target: float
    focus: str | None
    condensing: bool = False  # this burst condenses every full group (see ``_condensation``)
    no_leaf: str | None = None  # why no leaf can be made (once known, no more leaves are tried)


class Compactor:
    """Runs compaction passes on one session through the storage ports."""

    def __init__(self, store: StorePorts, summarizer: Summarizer, config: LcmConfig):
        self.store = store
        self.summarizer = summarizer
        self.config = config
        #: ``time.monotonic()`` bound of the running ``run()`` (LCM_MAX_COMPACTION_SECONDS):
        #: each summarizer call gets what is left of it.
        self.deadline: float | None = None

    def plan_tail(self, session: SessionRecord) -> TailPlan:
        return plan_tail(self.store.messages, session, self.config)

    def leaf_chunk(self, view: CompactionView, plan: TailPlan) -> Sequence[Planned] | None:
        """The oldest compactable run worth one leaf (see ``planning.leaf_end_index``), or None."""
        if not plan.compactable:
            return None
        worth = added_framing(bool(view.nodes)) + 2 * MIN_SUMMARY_TOKENS
        limit = plan.tail_start - plan.first_raw
        chunk_tokens = self.config.leaf_chunk_tokens
        if plan.holds(plan.first_raw):  # the tail plan read the whole compactable run already
            items: Sequence[Planned] = plan.loaded(plan.first_raw, plan.tail_start)
            end = leaf_end_index([m.role for m in items], [m.token_count for m in items], limit=limit,
                                 chunk_tokens=chunk_tokens, min_tokens=worth)
            return items[: end + 1] if end is not None else None
        session = view.session
        metas: list[Planned] = []
        lo = plan.first_raw
        fetched = 0
        while True:
            hi = min(plan.tail_start, lo + META_PAGE)  # one message of lookahead for the cut
            page = self.store.messages.metas(session.id, first_seq=lo, last_seq=hi)
            metas.extend(page)
            fetched += sum(m.token_count for m in page)
            done = hi >= plan.tail_start
            if done or fetched > max(chunk_tokens, worth):
                end = leaf_end_index([m.role for m in metas], [m.token_count for m in metas],
                                     limit=limit, chunk_tokens=chunk_tokens, min_tokens=worth)
                if end is not None and (done or sum(m.token_count for m in metas[: end + 1]) >= worth):
                    return metas[: end + 1]
                if done:
                    return None
            lo = hi + 1

    def _write(self, session: SessionRecord, depth: int, draft: SummaryDraft, sources: list[int],
               focus: str | None) -> WrittenSummary:
        meta = {"route": draft.route, "focus": focus, "notes": list(draft.notes[:3])} if (
            focus or draft.notes) else {"route": draft.route}
        return self.store.summaries.write(session.id, NewSummary(
            depth=depth, content=draft.content, token_count=draft.token_count,
            source_ids=tuple(sources), kind=draft.kind, expand_hint=draft.expand_hint,
            model=draft.model, meta=meta))

    def leaf_pass(self, view: CompactionView, plan: TailPlan, chunk: Sequence[Planned],
                  focus: str | None) -> WrittenSummary | Stopped:
        session = view.session
        source_tokens = sum(m.token_count for m in chunk)
        # The summary must beat the source *including* what it adds around itself, so every
        # leaf written shrinks the context; the summarizer's marked truncation can always do
        # that once the chunk is worth a summary at all (see ``leaf_chunk``).
        room = source_tokens - added_framing(bool(view.nodes))
        small = Stopped(f"summarizing messages {chunk[0].seq}-{chunk[-1].seq} ({source_tokens} tokens) "
                        "would not make the context smaller")
        if room <= MIN_SUMMARY_TOKENS:
            return small
        first, last = chunk[0].seq, chunk[-1].seq
        records = plan.loaded(first, last) if plan.holds(first) else self.store.messages.get_range(
            session.id, first_seq=first, last_seq=last)
        budget = int(min(source_tokens, self.config.leaf_chunk_tokens) * CHARS_PER_TOKEN_ESTIMATE * SOURCE_SLACK)
        target = min(self.config.leaf_target, max(MIN_SUMMARY_TOKENS, room // 3))
        draft = self.summarizer.summarize(SummaryRequest(
            depth=0, source=frame_messages(records, budget), source_tokens=room,
            target_tokens=target, focus_topic=focus, deadline=self.deadline))
        if draft is None:
            return small
        return self._write(session, 0, draft, [m.store_id for m in chunk], focus)

    def condense_pass(self, session: SessionRecord, depth: int, nodes: list[SummaryRecord],
                      focus: str | None) -> WrittenSummary | Stopped:
        source_tokens = sum(n.token_count for n in nodes)
        target = min(self.config.condensed_target_tokens, max(32, source_tokens // 2))
        draft = self.summarizer.summarize(SummaryRequest(
            depth=depth, source=frame_summaries(nodes), source_tokens=source_tokens,
            target_tokens=target, focus_topic=focus, deadline=self.deadline))
        if draft is None:
            return Stopped(f"summaries {[n.id for n in nodes]} cannot be condensed into anything shorter")
        return self._write(session, depth, draft, [n.id for n in nodes], focus)

    def run(self, session: SessionRecord, *, estimate: Callable[[SessionRecord], int], target: float,
            start: float | None = None, force: bool = False, focus: str | None = None,
            cause: str = "") -> CompactionResult:
        """A burst: nothing unless the context reaches ``start`` (default: ``target``), then
        passes until under ``target`` (or a bound, or nothing left); see the module docstring.

        ``session`` is the caller's latest view of the session; when no burst is due (and
        nothing forces one) the answer costs no read at all. ``cause`` says why the caller
        asked (kept in the outcome).
        """
        started = time.monotonic()
        self.deadline = started + self.config.max_compaction_seconds
        out = Outcome(tokens_before=estimate(session), at=time.time(), cause=cause)
        begin = target if start is None else max(start, target)
        if out.tokens_before < begin and not force:
            out.status, out.reason = "not_needed", (
                "the context is already under the target" if begin == target else
                f"the context ({out.tokens_before} tokens) is under the compaction trigger ({int(begin)})")
            out.tokens_after = out.tokens_before
            return CompactionResult(out, None, None)
        run = _Run(self.store.summaries.compaction_view(session.id), None, force, estimate, target, focus)
        out.tokens_before = estimate(run.view.session)
        while not self._bound_reached(out):
            try:
                if not self._pass(run, out):
                    break
            except IntegrityViolation as exc:  # another engine compacted the same session
                log.info("lcm compaction: concurrent writer on session %s (%s); re-planning",
                         run.view.session.session_key, exc)
                out.passes += 1
                run.view, run.plan, run.no_leaf = self.store.summaries.compaction_view(session.id), None, None
        out.tokens_after = estimate(run.view.session) if out.passes else out.tokens_before
        out.seconds = round(time.monotonic() - started, 3)
        return CompactionResult(out, run.view, run.plan)

    def _bound_reached(self, out: Outcome) -> bool:
        """LCM_MAX_PASSES or LCM_MAX_COMPACTION_SECONDS reached: the outcome says which."""
        if out.passes >= self.config.max_passes:
            out.status, out.reason = "partial", (
                f"stopped after {out.passes} summaries (LCM_MAX_PASSES); the rest continues "
                "on the next compaction")
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            out.status, out.reason = "partial", (
                f"stopped after {self.config.max_compaction_seconds} s "
                "(LCM_MAX_COMPACTION_SECONDS); the rest continues on the next compaction")
            return True
        return False

    def _pass(self, run: _Run, out: Outcome) -> bool:
        """One pass: a leaf while over the target, else a condensation when one is due. False
        when compaction is done (the outcome says why)."""
        session = run.view.session
        over = run.estimate(session) >= run.target or run.force
        if over and run.no_leaf is None:
            if run.plan is None:
                run.plan = self.plan_tail(session)
            chunk = self.leaf_chunk(run.view, run.plan)
            if chunk is not None:
                made = self.leaf_pass(run.view, run.plan, chunk, run.focus)
                if isinstance(made, Stopped):
                    out.status, out.reason = "stopped", made.reason
                    return False
                run.view, run.plan = view_after_write(run.view, made), run.plan.after_leaf(made.session.covered_seq)
                out.messages_summarized += len(chunk)
                self._count(out, made.node, condensed=False)
                run.force = False
                return True
            run.no_leaf = (f"nothing outside the fresh tail is left to summarize (the tail, kept "
                           f"verbatim, starts at message {run.plan.tail_start})"
                           if session.last_seq >= run.plan.first_raw else "every stored message is already summarized")
        condense = self._condensation(run, over)
        if condense is not None:
            depth, nodes = condense
            made = self.condense_pass(session, depth, nodes, run.focus)
            if isinstance(made, Stopped):
                out.status, out.reason = "stopped", made.reason
                return False
            run.view = view_after_write(run.view, made, [n.id for n in nodes])
            self._count(out, made.node, condensed=True)
            return True
        if over and run.no_leaf is not None:
            out.status = "compacted" if out.passes else "stopped"
            out.reason = run.no_leaf
            return False
        out.status = "compacted" if out.passes else "not_needed"
        out.reason = ("the context is under the target" if out.passes else
                      "the context is already under the target")
        return False

    def _condensation(self, run: _Run, over: bool) -> tuple[int, list[SummaryRecord]] | None:
        """The next condensation of this burst, or None. Due when the summaries that can still be
        condensed take more than ``CONDENSE_SHARE`` of the target, or when the context is still over the target and no
        leaf can be made; once due, every full group is condensed in the same burst."""
        if not run.condensing:
            # Summaries already at LCM_INCREMENTAL_MAX_DEPTH cannot be condensed: only the others
            # count, or a long session would condense on every burst.
            movable = [n for n in run.view.uncondensed if self.config.can_condense_to(n.depth + 1)]
            cost = summary_message_cost(len(movable), sum(n.token_count for n in movable))
            heavy = cost > CONDENSE_SHARE * run.target
            if not (heavy or (over and run.no_leaf is not None)):
                return None
        found = condensable(run.view, self.config)
        run.condensing = found is not None
        return found

    @staticmethod
    def _count(out: Outcome, made: SummaryRecord, *, condensed: bool) -> None:
        out.passes += 1
        if condensed:
            out.condensed += 1
        else:
            out.leaves += 1
        out.kinds[made.kind] = out.kinds.get(made.kind, 0) + 1
