"""How stored things are shown to an agent: bounded message items, search hits, clipped text.

A message's paged "text content" is its ``content`` string, or the compact JSON of a non-string
``content``; any other field over ``FIELD_CHARS_CAP`` is cut and named in ``fields_truncated``.
"""

from __future__ import annotations

import json
from typing import Any

from lcm.records import MessageRecord, SearchHit, SystemPromptRecord
from lcm.tools.specs import FIELD_CHARS_CAP


def field_text(value: Any) -> str:
    """What paging pages over: a string as it is, anything else as its compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def text_content(message: dict[str, Any]) -> str:
    """A message's paged "text content": its content string, or the JSON of other content."""
    return field_text(message.get("content"))


def bounded_message(message: dict[str, Any], max_chars: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(message with its text cut to ``max_chars`` and any other field to FIELD_CHARS_CAP,
    flags describing what was cut)."""
    msg = dict(message)
    flags: dict[str, Any] = {}
    text = text_content(msg)
    if len(text) > max_chars:
        msg["content"] = text[:max_chars]
        flags.update({"content_truncated": True, "content_chars": len(text)})
        if not isinstance(message.get("content"), str):
            flags["content_format"] = "json"
    cut_fields = []
    for key, value in list(msg.items()):
        if key in ("content", "role"):
            continue
        encoded = field_text(value)
        if len(encoded) > FIELD_CHARS_CAP:
            msg[key] = encoded[:FIELD_CHARS_CAP]
            cut_fields.append(key)
    if cut_fields:  # each such field now holds the start of its compact JSON (or string)
        flags["fields_truncated"] = cut_fields
    return msg, flags


def message_item(rec: MessageRecord, max_chars: int) -> dict[str, Any]:
    msg, flags = bounded_message(rec.message, max_chars)
    item = rec.to_item()
    item["message"] = msg
    item.update(flags)
    return item


def system_prompt_item(prompt: SystemPromptRecord, max_chars: int) -> dict[str, Any]:
    """A version of a session's system prompt: its digest, size, the first message it came
    with, and the message (text cut to ``max_chars``, flagged like a message item)."""
    msg, flags = bounded_message(prompt.message, max_chars)
    return {"digest": prompt.digest, "token_count": prompt.token_count, "first_seq": prompt.first_seq,
            "timestamp": prompt.created_at, "message": msg, **flags}


def clip_prefix(text: str, chars: int) -> tuple[str, bool]:
    """(the first ``chars`` characters of ``text``, whether anything was cut)."""
    return (text, False) if len(text) <= chars else (text[:chars], True)


def search_hit(hit: SearchHit) -> dict[str, Any]:
    """A search hit as ``lcm_grep`` shows it: a raw message (``store_id``, ``role``) or a summary
    (``node_id``, ``depth``), with ``score`` under ranked sorts."""
    if hit.kind == "message":
        out: dict[str, Any] = {"type": "message", "store_id": hit.id, "session_id": hit.session_key,
                               "role": hit.role}
    else:
        out = {"type": "summary", "node_id": hit.id, "depth": hit.depth, "session_id": hit.session_key}
    out.update({"timestamp": hit.ts, "snippet": hit.snippet, "match": hit.match})
    if hit.score is not None:
        out["score"] = round(hit.score, 6)
    return out
