"""OpenAI-format messages: lossless split into storage columns, reassembly, identity, text.

A host message is a dict with ``role`` and any of ``content`` (a string, a list of parts, or
null), ``tool_calls``, ``tool_call_id``, ``name`` and arbitrary other keys. lcm promises that
what it stores reads back equal to what was sent (key order included) with one exception:
Hermes' ``_db_persisted`` bookkeeping marker, which is never stored and never part of identity.

Storage layout (see :class:`EncodedMessage`): the five core keys get their own columns when
their values are representable there; everything else goes into ``extra`` (a JSON object, in
the original key order). ``key_order`` is only written when the original order differs from
the order :func:`decode_message` rebuilds, so it is almost always NULL. Content and tool calls
whose combined size exceeds :data:`PAYLOAD_MIN_CHARS` move into a separately stored, compressed
payload (deduplicated by hash), so a 50 MB tool result is stored once.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from lcm import codec
from lcm.errors import InvalidMessageError

CORE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
#: Keys the host adds for its own bookkeeping: stripped on ingest, never part of identity.
HOST_MARKER_KEYS = frozenset({"_db_persisted"})
#: Content + tool-call text longer than this is stored as a compressed, deduplicated payload.
PAYLOAD_MIN_CHARS = 65_536
#: Longest role / tool_call_id / name kept in an indexed column (longer values go to ``extra``).
ROLE_MAX_CHARS = 64
SHORT_FIELD_MAX_CHARS = 255
#: A host ``message_uid`` longer than this is hashed to form the identity.
UID_MAX_CHARS = 120

#: Values nested deeper than this are not stored (JSON encoders and decoders recurse); the
#: message is stored with the deep part replaced by a marker, and says so in its ``problem``.
MAX_NESTING = 200
#: Hermes' ephemeral retry scaffolding: the host pops these messages itself and never persists
#: them (``run_agent._EPHEMERAL_SCAFFOLDING_FLAGS``); lcm does not store them either, or a
#: transcript that dropped one would look like a diverging one.
EPHEMERAL_FLAGS = ("_empty_recovery_synthetic", "_empty_terminal_sentinel", "_thinking_prefill",
                   "_verification_stop_synthetic", "_pre_verify_synthetic", "_kanban_stop_synthetic")

CONTENT_TEXT = "text"
CONTENT_JSON = "json"
CONTENT_ABSENT = "absent"
CONTENT_PAYLOAD = "payload"


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    """A message split into the column values the store writes."""

    role: str
    content_kind: str
    content: str | None
    tool_calls: str | None
    tool_call_id: str | None
    name: str | None
    extra: str | None
    key_order: str | None
    payload: str | None  # encoded JSON object of the fields moved out of the row
    content_hash: str
    uid: str | None
    host_timestamp: float | None
    text: str  # plain text of content and tool calls: what search and token counts see
    problem: str | None = None  # JSON list of what had to change to store the message


def is_ephemeral(message: Any) -> bool:
    """Host scaffolding that is never part of the conversation (see :data:`EPHEMERAL_FLAGS`)."""
    return isinstance(message, Mapping) and any(message.get(f) for f in EPHEMERAL_FLAGS)


def unstorable_reason(message: Any) -> str | None:
    """Why ``message`` cannot be stored at all (None: it can). Everything else about a
    message can be stored, if need be after :func:`make_storable`."""
    if not isinstance(message, Mapping):
        return f"not a JSON object but {type(message).__name__}"
    role = message.get("role")
    if not isinstance(role, str) or not role:
        return "no 'role' string"
    if len(role) > ROLE_MAX_CHARS or not codec.is_clean(role):
        return f"a 'role' of {len(role)} characters (at most {ROLE_MAX_CHARS} ordinary ones)"
    return None


def make_storable(message: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The message with every value JSON cannot hold replaced by the closest value it can
    (datetimes in ISO-8601, bytes in base64, sets as lists, other objects as their ``str``),
    and a list saying what was replaced where. Deterministic: the same message gives the same
    result, so a host re-sending it is recognised."""
    problems: list[str] = []

    def fix(value: Any, path: str, depth: int) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value
        if depth >= MAX_NESTING:
            problems.append(f"{path}: nested deeper than {MAX_NESTING} levels; the rest is not stored")
            return "[lcm: nested too deep to store]"
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                name = key if isinstance(key, str) else str(key)
                if name is not key:
                    problems.append(f"{path}: key {key!r} ({type(key).__name__}) stored as text")
                out[name] = fix(item, f"{path}.{name}", depth + 1)
            return out
        if isinstance(value, (list, tuple)):
            return [fix(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        kind = type(value).__name__
        if isinstance(value, (dt.datetime, dt.date, dt.time)):
            fixed: Any = value.isoformat()
        elif isinstance(value, (bytes, bytearray, memoryview)):
            fixed = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, (set, frozenset)):
            fixed = sorted((fix(v, f"{path}[]", depth + 1) for v in value), key=repr)
        else:
            fixed = str(value)
        problems.append(f"{path}: {kind} stored as {type(fixed).__name__}")
        return fixed

    fixed = {str(k): fix(v, str(k), 1) for k, v in message.items()}
    return fixed, problems


#: The tags around an auto-recall block (``lcm.tools.autorecall``): a host puts the block into
#: the API copy of a user message (Hermes' ``api_content``) or, a simpler host, into its content,
#: and may send it back; lcm never stores it as conversation.
RECALL_OPEN = "<lcm_recall"
RECALL_HEADER = f'{RECALL_OPEN} note="stored messages that match this one, not in the context; lcm_expand store_id=N">'
RECALL_CLOSE = "</lcm_recall>"
#: Only a block as lcm writes it: its exact header line, then quoted lines that each start with
#: a store id, then the closing tag. Text a user typed that merely mentions the tags is kept.
_RECALL_BLOCK = re.compile(r"(?:\n\n)?" + re.escape(RECALL_HEADER) + r"\n(?:\[store_id=\d+ [^\n]*\n)+"
                           + re.escape(RECALL_CLOSE))


def strip_recall_blocks(text: str) -> str:
    """``text`` without the auto-recall blocks lcm added to it (with the blank line before each)."""
    return _RECALL_BLOCK.sub("", text) if RECALL_OPEN in text else text


def without_recall_blocks(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """The message with lcm's recall blocks taken out of its text; the same object when it has
    none (the usual case: no copy). A sidecar (``api_content``) that is then the content again
    is dropped: it only carried the block."""
    content, api = message.get("content"), message.get("api_content")
    if not ((isinstance(content, str) and RECALL_OPEN in content) or (isinstance(api, str) and RECALL_OPEN in api)):
        return message
    out = dict(message)
    if isinstance(content, str):
        out["content"] = strip_recall_blocks(content)
    if isinstance(api, str):
        out["api_content"] = strip_recall_blocks(api)
        if out["api_content"] in ("", out.get("content")):
            del out["api_content"]
    return out


def clean_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message as lcm stores and returns it: host bookkeeping markers and lcm's own recall
    blocks removed."""
    if not isinstance(message, Mapping):
        raise InvalidMessageError(f"a message must be a JSON object, got {type(message).__name__}")
    message = without_recall_blocks(message)
    if HOST_MARKER_KEYS.isdisjoint(message.keys()):
        return dict(message)
    return {k: v for k, v in message.items() if k not in HOST_MARKER_KEYS}


def arguments_substance(arguments: Any) -> Any:
    """What a tool call's arguments say: a JSON text as its value (canonical: sorted keys, no
    spaces), since clients that keep calls as parsed objects (LangChain, the Vercel AI SDK)
    serialise them again with their own spacing and key order when they re-send the history,
    and a few send the object itself; a text that is not JSON is compared as written."""
    if not isinstance(arguments, str):
        return {"json": arguments}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return {"json": value}


def _call_substance(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    fn = call.get("function")
    if isinstance(fn, Mapping):
        fn = {"name": fn.get("name"), "arguments": arguments_substance(fn.get("arguments"))}
    return {"id": call.get("id"), "type": call.get("type") or "function", "function": fn}


#: Keys of a content part that instruct the provider rather than say anything: clients that use
#: Anthropic-style prompt caching (Cline, Roo Code, aider and others through OpenRouter or an
#: OpenAI-compatible gateway) mark the newest messages with ``cache_control`` on every request
#: and drop the mark from a message once newer ones take it, so one message arrives with and
#: without it.
PART_HINT_KEYS = frozenset({"cache_control"})


def _part_substance(part: Any) -> Any:
    if isinstance(part, Mapping) and not PART_HINT_KEYS.isdisjoint(part.keys()):
        return {k: v for k, v in part.items() if k not in PART_HINT_KEYS}
    return part


def has_hints(message: Mapping[str, Any]) -> bool:
    """Whether the message carries provider hints (``PART_HINT_KEYS``) on itself or on a part of
    its content (Hermes marks a message without text at its top level)."""
    if not PART_HINT_KEYS.isdisjoint(message.keys()):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, Mapping) and not PART_HINT_KEYS.isdisjoint(p.keys()) for p in content)


def without_hints(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """The message without provider hints (``PART_HINT_KEYS``), on itself or on its content's
    parts; the same object when it has none."""
    if not has_hints(message):
        return message
    out = {k: v for k, v in message.items() if k not in PART_HINT_KEYS}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [_part_substance(p) for p in content]
    return out


def content_substance(content: Any) -> Any:
    """What a message's content says, whatever form a client sends it in: lcm's recall blocks
    left out of text; a list of parts without their provider hints (``PART_HINT_KEYS``); and a
    list of one plain text part as that text, which the API treats as the same message (clients
    and SDKs switch between the two forms when they re-send their history). Several parts stay
    a list: how the API joins them is the provider's business. Null, empty and absent are one
    "nothing" (None)."""
    if isinstance(content, list):
        parts = [_part_substance(p) for p in content]
        if len(parts) == 1:
            only = parts[0]
            if (isinstance(only, Mapping) and only.get("type") == "text" and only.keys() == {"type", "text"}
                    and isinstance(only.get("text"), str)):
                content = only["text"]
            else:
                content = parts
        else:
            content = parts
    if isinstance(content, str):
        content = strip_recall_blocks(content)
    return None if content in (None, "", []) else content


def substance(message: Mapping[str, Any]) -> dict[str, Any]:
    """What makes a message *this* message: who said it (role, and the speaker ``name`` of a
    non-tool message), what was said (:func:`content_substance`: the same words in a string or
    in one text part, with or without a prompt-cache mark, are one content), which tools it
    called (id, type, function name and arguments of each call) and which call it answers.
    Everything else is an annotation a host may add or drop between sending a message and
    sending it back — Hermes adds ``timestamp`` and drops ``reasoning`` and ``finish_reason``
    when it reloads a session, adds ``tool_name``, stamps ``api_content``; a chat client moves
    ``cache_control`` marks — and must not turn one message into two."""
    out: dict[str, Any] = {"role": message.get("role"), "content": content_substance(message.get("content"))}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call_substance(c) for c in calls] if isinstance(calls, list) else calls
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message.get("tool_call_id")
    if message.get("role") != "tool" and message.get("name") is not None:
        out["name"] = message.get("name")
    return out


def content_hash(message: Mapping[str, Any]) -> str:
    """A stable hash of a message's :func:`substance` (key order never matters).

    Identity (the hash chained to the predecessor's identity, or a host ``message_uid``) is
    what makes ingest exactly-once; the stored message is still the whole message as first
    seen, annotations included.
    """
    body = substance(message)
    try:
        canonical = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        # A value JSON cannot hold: hash what lcm stores for it (see make_storable).
        canonical = json.dumps(substance(make_storable(message)[0]), sort_keys=True,
                               ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:32]


def uid_identity(uid: Any) -> str:
    """Identity for a message the host stamped with a durable ``message_uid``."""
    text = str(uid)
    if len(text) <= UID_MAX_CHARS and codec.is_clean(text):
        return "u:" + text
    return "u#" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def chain_identity(previous: str, message_hash: str) -> str:
    """Identity of a message without a host uid: its content chained to its predecessor.

    Re-sending a transcript reproduces the same chain, so nothing is stored twice, while the
    same text sent twice in a row ("ok", "ok") has two different predecessors and so two rows.
    """
    digest = hashlib.sha256(f"{previous}|{message_hash}".encode("ascii")).hexdigest()
    return "h:" + digest[:32]


def message_uid(message: Mapping[str, Any]) -> str | None:
    uid = message.get("message_uid")
    if uid is None or isinstance(uid, bool) or not isinstance(uid, (str, int)):
        return None
    text = str(uid)
    return text or None


def parse_timestamp(value: Any) -> float | None:
    """Unix seconds from a host ``timestamp`` value, or None when it is not one.

    Accepts numbers (seconds, or milliseconds when implausibly large for seconds) and ISO-8601
    strings; a naive ISO string is taken as UTC (a stored message's time must not depend on the
    machine reading it).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
        if not math.isfinite(seconds):
            return None
        if abs(seconds) > 1e11:  # milliseconds (1e11 s is the year 5138)
            seconds /= 1000.0
        return seconds
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return parse_timestamp(float(text))
        except ValueError:
            pass
        try:
            return _parse_iso(text)
        except ValueError:
            return None
    return None


def _parse_iso(text: str) -> float:
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        text = part.get("text")
        if isinstance(text, str):
            return text
        for key in ("input_text", "output_text", "content"):
            value = part.get(key)
            if isinstance(value, str):
                return value
    return None


def content_text(content: Any) -> str:
    """The readable text of a ``content`` value (string, or the text of its parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_part_text(p) for p in content) if t)
    if isinstance(content, Mapping):
        return _part_text(content) or ""
    return ""


def tool_calls_text(tool_calls: Any) -> str:
    """Function names and arguments of tool calls, so a search finds the command that ran."""
    if not isinstance(tool_calls, list):
        return ""
    lines: list[str] = []
    for call in tool_calls:
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function")
        if isinstance(fn, Mapping):
            name, args = fn.get("name"), fn.get("arguments")
            if isinstance(name, str):
                lines.append(name)
            if isinstance(args, str):
                lines.append(args)
            elif args is not None:
                lines.append(json.dumps(args, ensure_ascii=False, default=str))
    return "\n".join(lines)


def message_text(message: Mapping[str, Any]) -> str:
    """All text of a message that a reader (or a search) cares about."""
    parts = [content_text(message.get("content")), tool_calls_text(message.get("tool_calls"))]
    return "\n".join(p for p in parts if p)


def _short_column(value: Any, max_chars: int) -> str | None:
    """The value if it fits an indexed short-string column verbatim, else None."""
    if isinstance(value, str) and len(value) <= max_chars and codec.is_clean(value):
        return value
    return None


def encode_message(message: Mapping[str, Any]) -> EncodedMessage:
    """Split a host message into column values. Raises InvalidMessageError for non-messages
    (:func:`unstorable_reason`); a value JSON cannot hold is stored as well as it can be
    (:func:`make_storable`), and the result's ``problem`` says what was changed."""
    msg = clean_message(message)
    role = msg.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidMessageError("a message needs a non-empty string 'role'")
    if _short_column(role, ROLE_MAX_CHARS) is None:
        raise InvalidMessageError(
            f"'role' must be at most {ROLE_MAX_CHARS} characters of ordinary text"
        )
    try:
        return _encode(msg)
    except (InvalidMessageError, RecursionError):
        fixed, problems = make_storable(msg)
        return replace(_encode(fixed), problem=codec.encode_json(problems[:20]))


def _encode(msg: dict[str, Any]) -> EncodedMessage:
    role = msg["role"]

    extra: dict[str, Any] = {}
    tool_call_id = _short_column(msg.get("tool_call_id"), SHORT_FIELD_MAX_CHARS)
    name = _short_column(msg.get("name"), SHORT_FIELD_MAX_CHARS)
    for key, value in msg.items():
        if key not in CORE_KEYS:
            extra[key] = value
        elif key == "tool_call_id" and tool_call_id is None:
            extra[key] = value
        elif key == "name" and name is None:
            extra[key] = value

    try:
        content_kind, content = _encode_content(msg)
        tool_calls = codec.encode_json(msg["tool_calls"]) if "tool_calls" in msg else None
        extra_text = codec.encode_json(extra) if extra else None
    except codec.CodecError as exc:
        raise InvalidMessageError(str(exc)) from exc

    payload = None
    big = (len(content) if content else 0) + (len(tool_calls) if tool_calls else 0)
    if big > PAYLOAD_MIN_CHARS:
        moved = {k: msg[k] for k in ("content", "tool_calls") if k in msg}
        payload = codec.encode_json(moved)
        content_kind, content, tool_calls = CONTENT_PAYLOAD, None, None

    order = list(msg.keys())
    rebuilt = _rebuilt_order(order, extra)
    return EncodedMessage(
        role=role,
        content_kind=content_kind,
        content=content,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        name=name,
        extra=extra_text,
        key_order=None if rebuilt == order else codec.encode_json(order),
        payload=payload,
        content_hash=content_hash(msg),
        uid=message_uid(msg),
        host_timestamp=parse_timestamp(msg.get("timestamp")),
        text=message_text(msg),
    )


def _encode_content(msg: Mapping[str, Any]) -> tuple[str, str | None]:
    if "content" not in msg:
        return CONTENT_ABSENT, None
    value = msg["content"]
    if isinstance(value, str):
        return CONTENT_TEXT, codec.encode_text(value)
    return CONTENT_JSON, codec.encode_json(value)


def _rebuilt_order(order: list[str], extra: Mapping[str, Any]) -> list[str]:
    present = set(order)
    core = [k for k in CORE_KEYS if k in present and k not in extra]
    return core + list(extra.keys())


def decode_message(
    *,
    role: str,
    content_kind: str,
    content: str | None,
    tool_calls: str | None,
    tool_call_id: str | None,
    name: str | None,
    extra: str | None,
    key_order: str | None,
    payload: str | None = None,
) -> dict[str, Any]:
    """Rebuild the host message exactly as it was ingested."""
    out: dict[str, Any] = {"role": role}
    moved: dict[str, Any] = codec.decode_json(payload) if payload is not None else {}
    if content_kind == CONTENT_TEXT:
        out["content"] = codec.decode_text(content or "")
    elif content_kind == CONTENT_JSON:
        out["content"] = codec.decode_json(content or "null")
    elif content_kind == CONTENT_PAYLOAD and "content" in moved:
        out["content"] = moved["content"]
    if tool_calls is not None:
        out["tool_calls"] = codec.decode_json(tool_calls)
    elif "tool_calls" in moved:
        out["tool_calls"] = moved["tool_calls"]
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    if name is not None:
        out["name"] = name
    if extra is not None:
        out.update(codec.decode_json(extra))
    if key_order is not None:
        order = codec.decode_json(key_order)
        out = {k: out[k] for k in order if k in out}
    return out
