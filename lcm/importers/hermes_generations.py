"""The conversation inside Hermes' compaction generations: which stored rows are messages the
user and the model exchanged, which are copies a compaction re-inserted, which are Hermes'
summaries. Pure: rows in, a verdict per row out.

What hermes-agent 0.19.0 writes (``agent/context_compressor.py``, ``hermes_state.py``):

* its compressor turns the live list into head + summary + tail: **copies** of the first
  messages (``protect_first_n``) and of the newest ones, a summary message between them, each
  copy keeping the original's ``timestamp`` (Hermes stamps every message when it is made, and
  ``_insert_message_rows`` stores that stamp);
* in place (``compression.in_place``, the gateway's default), ``archive_and_compact`` flags
  every live row ``active = 0, compacted = 1`` and inserts that list as new live rows; without
  it, the session ends (``end_reason = 'compression'``) and a child session starts with that
  list. Either way the new turns follow the copies;
* the summary is its own message (text starting ``[CONTEXT COMPACTION — REFERENCE ONLY]``, or
  ``[CONTEXT SUMMARY]:`` before) or, when neither role fits between head and tail, it is
  **merged into the first tail copy**: ``[PRIOR CONTEXT — ...]`` + that message's own text +
  ``[END OF PRIOR CONTEXT — COMPACTION SUMMARY BELOW]`` + the summary;
* a copy may differ from its original: an old tool result's text pruned, old images replaced
  by a placeholder; and a call whose result was summarized away may get a stub result.

So, once a conversation has been compacted, a row is:

* a **summary** when it is one, or the summary part of a merged copy (and the copy's own part
  too when that was an earlier summary): Hermes' lossy note, kept once (a rotation may write
  the compacted list twice) as the session's imported note, never as a user or assistant
  message;
* a **copy** when an earlier kept row has its role and exact timestamp (and the same tool call
  ids; a tool result's text may differ); when, after a summary or a copy, it repeats a message
  of the turn still in progress (no final answer yet: the user's message, a call, a result),
  which a compaction writes again with its own timestamp (or a rotation's); or when it is a
  second result for a call that already has one;
* otherwise a **message**, kept in row order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Starts of a standalone compressor summary, newest first (``SUMMARY_PREFIX``, the legacy one).
SUMMARY_PREFIXES = ("[CONTEXT COMPACTION — REFERENCE ONLY]", "[CONTEXT SUMMARY]:")
MERGED_HEADER = "[PRIOR CONTEXT — for reference only; not a new message]"
MERGED_DELIMITER = "[END OF PRIOR CONTEXT — COMPACTION SUMMARY BELOW]"


@dataclass
class Verdicts:
    kept: list[int] = field(default_factory=list)  # indexes of the rows that are messages, in order
    copies: list[int] = field(default_factory=list)
    summaries: list[tuple[int, str]] = field(default_factory=list)  # (row index, Hermes' summary text)
    own_text: dict[int, str] = field(default_factory=dict)  # kept merged rows: their text without the summary


def is_summary(content: Any) -> bool:
    return isinstance(content, str) and content.lstrip().startswith(SUMMARY_PREFIXES)


def split_merged(content: Any) -> tuple[str, str] | None:
    """(the tail message's own text, the summary) of a copy the summary was merged into."""
    if not isinstance(content, str) or not content.startswith(MERGED_HEADER + "\n"):
        return None
    cut = content.find("\n\n" + MERGED_DELIMITER)
    if cut < 0:
        return None
    own = content[len(MERGED_HEADER) + 1:cut]
    summary = content[cut + len("\n\n" + MERGED_DELIMITER):].lstrip("\n")
    return own, summary


def _call_ids(message: Mapping[str, Any]) -> tuple[Any, ...]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ()
    return tuple(c.get("id") for c in calls if isinstance(c, Mapping))


def _copy_of(original: Mapping[str, Any], row: Mapping[str, Any], merged: bool) -> bool:
    if original.get("tool_call_id") != row.get("tool_call_id") or _call_ids(original) != _call_ids(row):
        return False
    if merged or row.get("role") == "tool":
        return True  # the summary was merged into it / Hermes may prune an old result's text
    same = (original.get("content") or None) == (row.get("content") or None)
    return same or isinstance(original.get("content"), list)  # old images replaced by a placeholder


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("role"), a.get("content") or None, a.get("tool_call_id"), _call_ids(a)) == (
        b.get("role"), b.get("content") or None, b.get("tool_call_id"), _call_ids(b))


def sort_generations(rows: Sequence[Mapping[str, Any]], *, compacted: bool) -> Verdicts:
    """A verdict for each row (messages in the shape the importer builds, in row order).
    ``compacted``: the conversation went through at least one compaction; before one there
    are no copies and no summaries, and every row is a message."""
    out = Verdicts()
    if not compacted:
        out.kept = list(range(len(rows)))
        return out
    by_stamp: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    answered: set[Any] = set()
    noted: set[str] = set()
    turn: list[Mapping[str, Any]] = []  # kept messages since the last kept user message
    turn_open = False  # that turn has no final answer yet: a compaction may write it again
    compacted_since = False  # a summary or a copy since the last kept message

    def note(index: int, text: str) -> None:
        if text not in noted:  # Hermes' rotation can write the compacted list twice
            out.summaries.append((index, text))
            noted.add(text)

    for i, row in enumerate(rows):
        content = row.get("content")
        merged = split_merged(content)
        if is_summary(content):
            note(i, str(content))
            compacted_since = True
            continue
        if merged is not None:
            note(i, merged[1])
            compacted_since = True
            if is_summary(merged[0]):  # the tail it was merged into was an earlier summary
                note(i, merged[0])
                continue
            row = {**row, "content": merged[0]}
        stamp = (row.get("role"), row.get("timestamp"))
        earlier = by_stamp.get(stamp, []) if row.get("timestamp") is not None else []
        if any(_copy_of(o, row, merged is not None) for o in earlier):
            out.copies.append(i)
            compacted_since = True
            continue
        again = next((k for k in turn if _same_message(k, row)), None) if compacted_since and turn_open else None
        if again is not None:
            # The turn in progress when the compaction ran, written again after it with the
            # compaction's timestamp (or a rotation's); later copies carry that stamp.
            out.copies.append(i)
            by_stamp.setdefault(stamp, []).append(again)
            continue
        call_id = row.get("tool_call_id")
        if row.get("role") == "tool" and call_id is not None and call_id in answered:
            out.copies.append(i)  # a stub result for a call that already has its result
            continue
        if merged is not None:
            # A merged copy whose original is not in the file (a rewind took it back, say): its
            # own text is the message; the summary part is a note (above).
            out.own_text[i] = merged[0]
        out.kept.append(i)
        turn = [row] if row.get("role") == "user" else [*turn, row]
        turn_open = not (row.get("role") == "assistant" and not _call_ids(row))
        compacted_since = False
        by_stamp.setdefault(stamp, []).append(row)
        if row.get("role") == "tool" and call_id is not None:
            answered.add(call_id)
    return out
