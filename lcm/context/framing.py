"""What the summarizer reads: a leaf's messages or a condensation's summaries, framed as data.

Pure. A chunk's framed text is bounded: a single 50 MB tool result must not become a 50 MB
prompt, so bodies over their share of the budget keep their head and tail around a marker.
"""

from __future__ import annotations

from collections.abc import Sequence

from lcm.messages import content_text, tool_calls_text
from lcm.records import MessageRecord, SummaryRecord

#: A clipped message body keeps at least this many characters.
MIN_MESSAGE_CHARS = 400
#: The share of a clipped body kept from its head (the rest from its tail).
HEAD_SHARE = 0.75


def clip_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: its head and tail around a marker saying how
    much is left out."""
    if len(text) <= limit:
        return text
    head = int(limit * HEAD_SHARE)
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
        # Every body over an equal share of the budget is clipped to that share (its head and
        # tail kept); shorter bodies stay whole.
        share = max(MIN_MESSAGE_CHARS, budget_chars // max(1, len(bodies)))
        bodies = [clip_middle(b, share) if len(b) > share else b for b in bodies]
    lines = ["<conversation>"]
    for r, body in zip(records, bodies, strict=True):
        name = r.message.get("name") if r.role == "tool" else None
        label = f"[#{r.seq} {r.role}{' ' + name if isinstance(name, str) else ''}]"
        lines.append(f"{label} {body}")
    lines.append("</conversation>")
    return "\n".join(lines)


def frame_summaries(nodes: Sequence[SummaryRecord]) -> str:
    """Child summaries as a condensation reads them, oldest first, each with what it covers."""
    lines = ["<summaries>"]
    for n in nodes:
        lines.append(f"<summary node=\"{n.id}\" depth=\"{n.depth}\" covers=\"messages "
                     f"{n.first_seq}-{n.last_seq}\">\n{n.content.strip()}\n</summary>")
    lines.append("</summaries>")
    return "\n".join(lines)
