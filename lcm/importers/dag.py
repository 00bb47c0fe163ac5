"""Another program's summaries, placed into lcm's summary DAG where they map cleanly.

lcm's DAG has two rules (``lcm.store.summaries``): a leaf covers the oldest messages of the
session not yet summarized, contiguous and in order; a condensed node covers consecutive
uncondensed nodes one depth below. And one rule of its own compactor: a leaf never ends between
an assistant's tool call and the call's result (the verbatim part after the summaries would
start with a result whose call the model cannot see, which providers refuse).

A peer's summary is placed when it fits those rules, in the peer's order:

* a leaf whose sources are a contiguous run of imported messages that starts where the previous
  leaf ended becomes an lcm leaf (``kind = "imported"``, the peer's text, its id and sources in
  ``meta["imported"]``);
* a leaf that ends between a tool call and its result is **moved back** to end right before the
  assistant message that made the call (lcm's own boundary): that message and its results open
  the next leaf, or stay verbatim after the last one. A leaf left with nothing is not placed and
  its messages go to the next leaf. Both are recorded (``moved_from`` in the node's meta; a note);
* a condensed summary over placed nodes of one depth that are consecutive and not yet condensed
  becomes an lcm condensed node;
* anything else (a gap, an overlap, a source that was not imported, a child that was not placed)
  stops the placing of later leaves of that session and is kept as an **imported note** on the
  session (``origin["notes"]``: the peer's id, kind, depth, text and why), shown by
  ``lcm sessions --json`` and the explorer. lcm's own compactor summarizes what is left, as it
  would have for a live host.

Pure planning (:func:`plan_dag`) is separate from writing (:func:`write_dag`), so a dry run and
the session's notes come from the file alone, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lcm.context.ports import StorePorts
from lcm.errors import IntegrityViolation
from lcm.records import NewSummary, SessionRecord
from lcm.tokens import TokenCounter
from lcm.transfer import ImportedSummary

SUMMARY_PAGE = 1000


@dataclass(frozen=True)
class PlacedNode:
    """A peer summary as it will be written: a leaf over entry indexes [start, end), or a
    condensed node over placed children (peer ids)."""

    summary: ImportedSummary
    start: int = 0
    end: int = 0
    children: tuple[str, ...] = ()
    moved_from: tuple[int, int] | None = None  # the peer's own span, when it had to move


@dataclass
class DagPlan:
    nodes: list[PlacedNode] = field(default_factory=list)  # leaves in order, then condensed by depth
    notes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def leaves(self) -> list[PlacedNode]:
        return [n for n in self.nodes if n.summary.depth == 0]


def _note(summary: ImportedSummary, why: str) -> dict[str, Any]:
    return {"id": summary.peer_id, "kind": "leaf" if summary.depth == 0 else "condensed",
            "depth": summary.depth, "content": summary.content, "why": why}


def _caller_index(messages: Sequence[Mapping[str, Any]], result_at: int, floor: int) -> int | None:
    """Index of the assistant message (at or after ``floor``) whose tool call the tool result at
    ``result_at`` answers; the nearest assistant message when no call id matches."""
    call_id = messages[result_at].get("tool_call_id")
    nearest = None
    for i in range(result_at - 1, floor - 1, -1):
        if messages[i].get("role") != "assistant":
            continue
        nearest = i if nearest is None else nearest
        calls = messages[i].get("tool_calls") or []
        if any(isinstance(c, Mapping) and c.get("id") == call_id for c in calls):
            return i
    return nearest


def _clean_end(messages: Sequence[Mapping[str, Any]], start: int, end: int) -> int:
    """``end`` moved back so that the message at ``end`` is not a tool result whose call lies
    in [start, end)."""
    if end >= len(messages) or messages[end].get("role") != "tool":
        return end
    caller = _caller_index(messages, end, start)
    return caller if caller is not None else start


def plan_dag(messages: Sequence[Mapping[str, Any]], summaries: Sequence[ImportedSummary]) -> DagPlan:
    """Where each peer summary goes (see the module docstring). ``messages`` are the session's
    imported messages in order; a leaf's ``sources`` are indexes into them, a condensed
    summary's are peer ids of its children."""
    plan = DagPlan()
    leaves = [s for s in summaries if s.depth == 0]
    leaves.sort(key=lambda s: (min(s.sources) if s.sources else -1, s.order))
    start = nominal = 0
    stopped: str | None = None
    for leaf in leaves:
        sources = list(leaf.sources)
        why: str | None = None
        if stopped is not None:
            why = f"an earlier summary of this session could not be placed ({stopped})"
        elif not sources or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in sources):
            why = "some of its messages are not in what was imported"
        elif sources != list(range(sources[0], sources[-1] + 1)):
            why = "its messages are not one contiguous run"
        elif sources[0] != nominal:
            why = (f"it does not start where the previous summary ended (message {sources[0] + 1}, "
                   f"expected {nominal + 1})")
        elif sources[-1] >= len(messages):
            why = "some of its messages are not in what was imported"
        if why is not None:
            stopped = stopped or why
            plan.notes.append(_note(leaf, why))
            continue
        nominal = sources[-1] + 1
        end = _clean_end(messages, start, nominal)
        moved = (sources[0], nominal) if (start, end) != (sources[0], nominal) else None
        if end <= start:
            plan.notes.append(_note(leaf, "it covers only a tool call whose results the next summary "
                                          "covers; its messages were given to that summary"))
            continue
        plan.nodes.append(PlacedNode(leaf, start=start, end=end, moved_from=moved))
        start = end
    placed = {n.summary.peer_id: n for n in plan.nodes}
    uncondensed_order = {0: [n.summary.peer_id for n in plan.nodes]}  # the leaves, in order
    condensed_parent: dict[str, str] = {}
    for node in sorted((s for s in summaries if s.depth > 0), key=lambda s: (s.depth, s.order)):
        children = [str(c) for c in node.sources]
        why = None
        if not children:
            why = "it condenses nothing"
        elif any(c not in placed for c in children):
            why = "some of the summaries it condenses could not be placed"
        elif any(placed[c].summary.depth != node.depth - 1 for c in children):
            why = f"it condenses summaries that are not all of depth {node.depth - 1}"
        elif any(c in condensed_parent for c in children):
            why = "some of the summaries it condenses are condensed by another summary"
        else:
            order = uncondensed_order.setdefault(node.depth - 1, [])
            at = [order.index(c) for c in children] if all(c in order for c in children) else []
            if not at or at != list(range(at[0], at[0] + len(at))):
                why = "the summaries it condenses are not consecutive"
        if why is not None:
            plan.notes.append(_note(node, why))
            continue
        for c in children:
            condensed_parent[c] = node.peer_id
        placed_node = PlacedNode(node, children=tuple(children))
        plan.nodes.append(placed_node)
        placed[node.peer_id] = placed_node
        uncondensed_order.setdefault(node.depth, []).append(node.peer_id)
    return plan


@dataclass
class DagReport:
    placed: int = 0  # nodes written by this import
    already: int = 0  # nodes an earlier run of the same import wrote
    skipped: int = 0  # placeable, but the session was already summarized there (lcm's own compaction)
    notes: int = 0


def _imported_ids(store: StorePorts, session_pk: int) -> dict[str, int]:
    """peer id -> lcm node id of what earlier imports placed in the session."""
    found: dict[str, int] = {}
    depth = 0
    while True:
        after: int | None = None
        seen = False
        while True:
            page = store.summaries.of_session(session_pk, depth=depth, limit=SUMMARY_PAGE, after_first_seq=after)
            seen = seen or bool(page)
            for node in page:
                imported = (node.meta or {}).get("imported")
                if isinstance(imported, Mapping) and isinstance(imported.get("id"), str):
                    found[imported["id"]] = node.id
            if len(page) < SUMMARY_PAGE:
                break
            after = page[-1].first_seq
        if not seen:
            return found
        depth += 1


def write_dag(store: StorePorts, session: SessionRecord, plan: DagPlan, tokens: TokenCounter, *,
              fmt: str, first_seq: int = 1) -> DagReport:
    """Write the planned nodes into ``session``, whose imported messages start at ``first_seq``.
    Idempotent: nodes an earlier run placed are recognised by their peer id and not written again."""
    report = DagReport(notes=len(plan.notes))
    if not plan.nodes:
        return report
    last = max(n.end for n in plan.leaves) if plan.leaves else 0
    metas = store.messages.metas(session.id, first_seq=first_seq, last_seq=first_seq + last - 1) if last else []
    done = _imported_ids(store, session.id)
    lcm_ids: dict[str, int] = dict(done)
    for node in plan.nodes:
        summary = node.summary
        if summary.peer_id in done:
            report.already += 1
            continue
        if summary.depth == 0:
            if node.end > len(metas):
                report.skipped += 1
                continue
            sources = tuple(m.store_id for m in metas[node.start:node.end])
        else:
            if any(c not in lcm_ids for c in node.children):
                report.skipped += 1
                continue
            sources = tuple(lcm_ids[c] for c in node.children)
        meta: dict[str, Any] = {"format": fmt, "id": summary.peer_id, "sources": list(summary.peer_sources)}
        if node.moved_from is not None:
            meta["moved_from"] = {"first": node.moved_from[0] + 1, "last": node.moved_from[1],
                                  "why": "a tool call and its result stay on one side of a summary"}
        new = NewSummary(depth=summary.depth, content=summary.content, token_count=tokens.count_text(summary.content),
                         source_ids=sources, kind="imported", expand_hint=summary.expand_hint,
                         model=summary.model, meta={"imported": meta})
        try:
            written = store.summaries.write(session.id, new, now=summary.created_at)
        except IntegrityViolation:
            report.skipped += 1  # lcm's own compaction summarized these messages already
            continue
        lcm_ids[summary.peer_id] = written.node.id
        report.placed += 1
    return report
