"""Compaction: turn the oldest raw messages into leaf summaries, and runs of same-depth
summaries into deeper ones, in bounded passes that each make progress or stop with a reason.

Vocabulary (see also ``lcm/transcript.py``):
  * raw region: the session's messages after its summarized prefix (``seq > covered_seq``);
  * fresh tail: the newest raw messages, kept verbatim: the last ``LCM_FRESH_TAIL_COUNT``
    (optionally capped at ``LCM_FRESH_TAIL_MAX_TOKENS``), always including the newest real user
    message, and starting at an assistant message so no tool result is cut from its call;
  * compactable: raw messages before the fresh tail.

A pass is either a condensation (exactly ``LCM_CONDENSATION_FANIN`` of the oldest uncondensed
summaries of one depth become one summary of the next depth, up to
``LCM_INCREMENTAL_MAX_DEPTH``) or a leaf (the oldest compactable run up to
``LCM_LEAF_CHUNK_TOKENS``, ending right before an assistant message, becomes a depth-0
summary). The summarizer runs outside any database transaction; the summary and its edges are
written in one. A call runs passes until the estimated context is under the target, nothing is
compactable, or ``LCM_MAX_PASSES`` / ``LCM_MAX_COMPACTION_SECONDS`` is reached — and says which.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from lcm.assembly import NODE_FRAMING_TOKENS, SUMMARY_FRAMING_TOKENS
from lcm.config import LcmConfig
from lcm.errors import IntegrityViolation
from lcm.messages import content_text, tool_calls_text
from lcm.records import CompactionView, MessageMeta, MessageRecord, NewSummary, SessionRecord, SummaryRecord
from lcm.store import Store
from lcm.summarize import SummaryRequest, Summarizer
from lcm.transcript import is_real_user

log = logging.getLogger(__name__)

#: The framed source of one summarizer call is kept under this many characters per source
#: token budget: a single 50 MB tool result must not become a 50 MB prompt.
SOURCE_CHARS_PER_TOKEN = 4.0
SOURCE_SLACK = 1.25
MIN_MESSAGE_CHARS = 400
#: The smallest summary worth asking for: room for a marked truncation (marker, expand line, text).
MIN_SUMMARY_TOKENS = 80
META_PAGE = 500
TAIL_WINDOW_EXTRA = 256


# --------------------------------------------------------------------------- pure planning


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


# --------------------------------------------------------------------------- source framing


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = int(limit * 0.75)
    tail = max(0, limit - head)
    return f"{text[:head]}\n[… {len(text) - head - tail} characters left out here …]\n{text[-tail:]}"


def frame_messages(records: Sequence[MessageRecord], budget_chars: int) -> str:
    """The chunk as the summarizer reads it: one labelled block per message, long ones clipped."""
    bodies = []
    for r in records:
        msg = r.message
        text = content_text(msg.get("content"))
        calls = tool_calls_text(msg.get("tool_calls"))
        if calls:
            text = f"{text}\n→ tool call: {calls}" if text else f"→ tool call: {calls}"
        bodies.append(text.strip())
    total = sum(len(b) for b in bodies)
    if total > budget_chars:
        # Clip the longest bodies first: every message keeps at least its head and tail.
        share = max(MIN_MESSAGE_CHARS, budget_chars // max(1, len(bodies)))
        bodies = [_clip(b, share) if len(b) > share else b for b in bodies]
    lines = ["<conversation>"]
    for r, body in zip(records, bodies, strict=True):
        name = r.message.get("name") if r.role == "tool" else None
        label = f"[#{r.seq} {r.role}{' ' + name if isinstance(name, str) else ''}]"
        lines.append(f"{label} {body}")
    lines.append("</conversation>")
    return "\n".join(lines)


def frame_summaries(nodes: Sequence[SummaryRecord]) -> str:
    lines = ["<summaries>"]
    for n in nodes:
        lines.append(f"<summary node=\"{n.id}\" depth=\"{n.depth}\" covers=\"messages "
                     f"{n.first_seq}-{n.last_seq}\">\n{n.content.strip()}\n</summary>")
    lines.append("</summaries>")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the loop


@dataclass
class Outcome:
    """What one compaction call did, kept with the session for status readers."""

    status: str = "not_needed"  # compacted, not_needed, stopped, partial
    reason: str = ""
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


@dataclass
class TailPlan:
    first_raw: int  # seq
    tail_start: int  # seq
    newest_user: int | None  # seq

    @property
    def compactable(self) -> bool:
        return self.tail_start > self.first_raw


class Compactor:
    def __init__(self, store: Store, summarizer: Summarizer, config: LcmConfig):
        self.store = store
        self.summarizer = summarizer
        self.config = config
        #: ``time.monotonic()`` bound of the running ``run()`` (LCM_MAX_COMPACTION_SECONDS):
        #: each summarizer call gets what is left of it.
        self.deadline: float | None = None

    # -- planning over the store ---------------------------------------------------------

    def newest_real_user(self, session: SessionRecord) -> int | None:
        first_raw = session.covered_seq + 1
        users = self.store.messages.latest(session.id, roles=("user",), limit=64, min_seq=first_raw)
        for rec in users:
            if is_real_user(rec.message):
                return rec.seq
        return users[0].seq if users else None

    def plan_tail(self, session: SessionRecord) -> TailPlan:
        first_raw, last = session.covered_seq + 1, session.last_seq
        if last < first_raw:
            return TailPlan(first_raw, first_raw, None)
        newest_user = self.newest_real_user(session)
        lo = max(first_raw, last - self.config.fresh_tail_count - TAIL_WINDOW_EXTRA)
        if newest_user is not None:
            lo = max(first_raw, min(lo, newest_user - TAIL_WINDOW_EXTRA))
        while True:
            metas = self.store.messages.metas(session.id, first_seq=lo, last_seq=last)
            idx = tail_start_index(
                [m.role for m in metas], [m.token_count for m in metas],
                newest_user=None if newest_user is None else newest_user - lo,
                count=self.config.fresh_tail_count, max_tokens=self.config.fresh_tail_max_tokens)
            if idx > 0 or lo == first_raw:
                return TailPlan(first_raw, lo + idx, newest_user)
            lo = max(first_raw, lo - 4 * TAIL_WINDOW_EXTRA)  # no assistant in the window: widen

    def leaf_chunk(self, view: CompactionView, plan: TailPlan) -> list[MessageMeta] | None:
        if not plan.compactable:
            return None
        session = view.session
        metas: list[MessageMeta] = []
        lo = plan.first_raw
        limit = plan.tail_start - plan.first_raw
        worth = self._framing(view) + 2 * MIN_SUMMARY_TOKENS
        fetched = 0
        while True:
            hi = min(plan.tail_start, lo + META_PAGE)  # one message of lookahead for the cut
            page = self.store.messages.metas(session.id, first_seq=lo, last_seq=hi)
            metas.extend(page)
            fetched += sum(m.token_count for m in page)
            done = hi >= plan.tail_start
            if done or fetched > max(self.config.leaf_chunk_tokens, worth):
                end = leaf_end_index([m.role for m in metas], [m.token_count for m in metas],
                                     limit=limit, chunk_tokens=self.config.leaf_chunk_tokens,
                                     min_tokens=worth)
                if end is not None and (done or sum(m.token_count for m in metas[: end + 1]) >= worth):
                    return metas[: end + 1]
                if done:
                    return None
            lo = hi + 1

    def condensable(self, view: CompactionView) -> tuple[int, list[SummaryRecord]] | None:
        fanin = self.config.condensation_fanin
        by_depth: dict[int, list[SummaryRecord]] = {}
        for node in view.uncondensed:
            by_depth.setdefault(node.depth, []).append(node)
        for depth in sorted(by_depth):
            nodes = sorted(by_depth[depth], key=lambda n: n.first_seq)
            if len(nodes) >= fanin and self.config.can_condense_to(depth + 1):
                return depth + 1, nodes[:fanin]
        return None

    # -- passes ----------------------------------------------------------------------------

    def _write(self, session: SessionRecord, depth: int, draft, sources: list[int],
               focus: str | None) -> SummaryRecord:
        written = self.store.summaries.write(session.id, NewSummary(
            depth=depth, content=draft.content, token_count=draft.token_count,
            source_ids=tuple(sources), kind=draft.kind, expand_hint=draft.expand_hint,
            model=draft.model,
            meta={"route": draft.route, "focus": focus, "notes": list(draft.notes[:3])} if (
                focus or draft.notes) else {"route": draft.route}))
        return written.node

    @staticmethod
    def _framing(view: CompactionView) -> int:
        """What one more summary adds to the context besides its own text."""
        return NODE_FRAMING_TOKENS + (0 if view.nodes else SUMMARY_FRAMING_TOKENS)

    def leaf_pass(self, view: CompactionView, chunk: list[MessageMeta], focus: str | None
                  ) -> SummaryRecord | str:
        session = view.session
        source_tokens = sum(m.token_count for m in chunk)
        # The summary must beat the source *including* what it adds around itself, so every
        # leaf written shrinks the context; the summarizer's marked truncation can always do
        # that once the chunk is worth a summary at all (see ``leaf_chunk``).
        room = source_tokens - self._framing(view)
        small = (f"summarizing messages {chunk[0].seq}-{chunk[-1].seq} ({source_tokens} tokens) "
                 "would not make the context smaller")
        if room <= MIN_SUMMARY_TOKENS:
            return small
        records = self.store.messages.get_range(session.id, first_seq=chunk[0].seq, last_seq=chunk[-1].seq)
        budget = int(min(source_tokens, self.config.leaf_chunk_tokens) * SOURCE_CHARS_PER_TOKEN * SOURCE_SLACK)
        target = min(self.config.leaf_target, max(MIN_SUMMARY_TOKENS, room // 3))
        draft = self.summarizer.summarize(SummaryRequest(
            depth=0, source=frame_messages(records, budget), source_tokens=room,
            target_tokens=target, focus_topic=focus, deadline=self.deadline))
        if draft is None:
            return small
        return self._write(session, 0, draft, [m.store_id for m in chunk], focus)

    def condense_pass(self, session: SessionRecord, depth: int, nodes: list[SummaryRecord],
                      focus: str | None) -> SummaryRecord | str:
        source_tokens = sum(n.token_count for n in nodes)
        target = min(self.config.condensed_target_tokens, max(32, source_tokens // 2))
        draft = self.summarizer.summarize(SummaryRequest(
            depth=depth, source=frame_summaries(nodes), source_tokens=source_tokens,
            target_tokens=target, focus_topic=focus, deadline=self.deadline))
        if draft is None:
            return f"summaries {[n.id for n in nodes]} cannot be condensed into anything shorter"
        return self._write(session, depth, draft, [n.id for n in nodes], focus)

    def run(self, session: SessionRecord, *, estimate: Callable[[SessionRecord], int], target: float,
            force: bool = False, focus: str | None = None) -> Outcome:
        """Passes until under ``target`` (or a bound, or nothing left); see the module docstring.

        ``session`` is the caller's latest view of the session; when it is already under the
        target (and nothing forces a pass) the answer costs no query at all.
        """
        started = time.monotonic()
        deadline = self.deadline = started + self.config.max_compaction_seconds
        session_pk = session.id
        out = Outcome(tokens_before=estimate(session), at=time.time())
        if out.tokens_before < target and not force:
            out.status, out.reason = "not_needed", "the context is already under the target"
            out.tokens_after = out.tokens_before
            return out
        view = self.store.summaries.compaction_view(session_pk)
        out.tokens_before = estimate(view.session)
        pending_force = force
        while True:
            if out.passes:
                view = self.store.summaries.compaction_view(session_pk)
            if out.passes >= self.config.max_passes:
                out.status, out.reason = "partial", (
                    f"stopped after {out.passes} summaries (LCM_MAX_PASSES); the rest continues "
                    "on the next compaction")
                break
            if time.monotonic() >= deadline:
                out.status, out.reason = "partial", (
                    f"stopped after {self.config.max_compaction_seconds} s "
                    "(LCM_MAX_COMPACTION_SECONDS); the rest continues on the next compaction")
                break
            session = view.session
            try:
                condense = self.condensable(view)
                if condense is not None:
                    depth, nodes = condense
                    made = self.condense_pass(session, depth, nodes, focus)
                    if isinstance(made, str):
                        out.status, out.reason = "stopped", made
                        break
                    self._count(out, made, condensed=True)
                    continue
                if estimate(session) < target and not pending_force:
                    if out.passes:
                        out.status, out.reason = "compacted", "the context is under the target"
                    else:
                        out.status, out.reason = "not_needed", "the context is already under the target"
                    break
                plan = self.plan_tail(session)
                chunk = self.leaf_chunk(view, plan)
                if chunk is None:
                    out.status = "compacted" if out.passes else "stopped"
                    out.reason = (
                        f"nothing outside the fresh tail is left to summarize (the tail, kept "
                        f"verbatim, starts at message {plan.tail_start})"
                        if session.last_seq >= plan.first_raw else
                        "every stored message is already summarized")
                    break
                made = self.leaf_pass(view, chunk, focus)
                if isinstance(made, str):
                    out.status, out.reason = "stopped", made
                    break
                out.messages_summarized += len(chunk)
                self._count(out, made, condensed=False)
                pending_force = False
            except IntegrityViolation as exc:  # another engine compacted the same session
                log.info("lcm compaction: concurrent writer on session %s (%s); re-planning",
                         session.session_key, exc)
                out.passes += 1
                continue
        out.tokens_after = estimate(self.store.sessions.get(session_pk)) if out.passes else out.tokens_before
        out.seconds = round(time.monotonic() - started, 3)
        return out

    @staticmethod
    def _count(out: Outcome, made: SummaryRecord, *, condensed: bool) -> None:
        out.passes += 1
        if condensed:
            out.condensed += 1
        else:
            out.leaves += 1
        out.kinds[made.kind] = out.kinds.get(made.kind, 0) + 1
