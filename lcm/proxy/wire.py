"""The OpenAI chat-completions wire format, as the proxy needs it: request checks that answer
like the API does (a 400 with an ``error`` object naming the parameter), the usage arithmetic of
a completion that took several upstream calls, and the assembly of a streamed answer from its
``chat.completion.chunk`` events."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

orjson: Any
try:  # the [ui] extra brings it: a request's whole history is written once a request
    import orjson
except ImportError:  # pragma: no cover - the standard library does the same, slower
    orjson = None

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class RequestError(Exception):
    """A request the proxy refuses, as the API would: HTTP status, message, parameter, code."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def json_bytes(value: Any) -> bytes:
    """Compact JSON in UTF-8. JSON text can carry a lone surrogate (``"\\ud800"``): a client may
    send one and Python decodes it, but UTF-8 cannot encode it. Then every non-ASCII character
    is written as an escape instead, which any JSON reader turns back into the same text.

    orjson writes what the standard library writes here (compact, non-ASCII as UTF-8) 20 times
    faster: a 140-message history, re-sent whole on every request, took 0.5 ms. What it refuses
    (a lone surrogate, an integer past 64 bits) goes to the standard library. Reading stays with
    the standard library: orjson reads an integer past 64 bits as a float (a value changed),
    and saves only 0.08 ms there."""
    if orjson is not None:
        try:
            return bytes(orjson.dumps(value))
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The API's error object: what the ``openai`` package turns into ``BadRequestError`` and
    its siblings, with ``message`` shown to the user."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_request(raw: bytes) -> dict[str, Any]:
    """The request body as a chat-completions request, or a RequestError that says what is
    wrong with it (the upstream is never called for a request lcm could not store)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("you must provide a model parameter (a non-empty string)", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array of message objects", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got {role!r}",
                               param=f"messages[{i}].role")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise RequestError(f"messages[{i}] (role tool) must have a tool_call_id string",
                               param=f"messages[{i}].tool_call_id")
        _check_content(message, role, i)
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)):
            raise RequestError(f"messages[{i}].tool_calls must be an array of function calls",
                               param=f"messages[{i}].tool_calls")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RequestError("'stream' must be a boolean", param="stream")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be an array of tool objects", param="tools")
    return body


def requested_output(body: Mapping[str, Any]) -> int:
    """The tokens the request lets the answer take (``max_completion_tokens``, else the older
    ``max_tokens``), 0 when it sets none; the context window must hold them beside the prompt.
    A value that is not a positive integer is the upstream's to refuse: 0 here."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _check_content(message: Mapping[str, Any], role: str, i: int) -> None:
    """A message's content as the API takes it, so that lcm never stores what the provider
    refuses: a string, or an array of parts that each name their ``type`` (a text part with its
    ``text``); absent or null only on an assistant message (its tool calls, refusal or audio
    stand for it). Other part types (images, audio, files) pass as the client wrote them."""
    content = message.get("content")
    if content is None and role == "assistant":
        return
    where = f"messages[{i}].content"
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or an array of content parts (role {role})", param=where)
    for n, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise RequestError(f"{where}[{n}] must be an object with a 'type'", param=f"{where}[{n}]")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise RequestError(f"{where}[{n}] (type text) must have a 'text' string", param=f"{where}[{n}].text")


def add_usage(total: dict[str, Any] | None, more: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Usage of two upstream calls together: every number added, nested details too (the
    client pays for every call the proxy made to answer it, lcm tool rounds included)."""
    if not more:
        return total
    if total is None:
        copied: dict[str, Any] = json.loads(json.dumps(more))
        return copied
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[key] = (out.get(key) or 0) + value
        elif isinstance(value, Mapping):
            out[key] = add_usage(out.get(key) if isinstance(out.get(key), dict) else {}, value)
    return out


@dataclass
class StreamedAnswer:
    """A streamed completion put back together: the assistant message of choice 0, its finish
    reason, the usage chunk's usage, and the chunks' common fields (id, created, model)."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    refusal: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    head: dict[str, Any] = field(default_factory=dict)

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Take one ``chat.completion.chunk`` (already parsed)."""
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        if chunk.get("usage"):
            self.usage = dict(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                self.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(int(call.get("index", 0)), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        """The assistant message the stream carried, as a non-streamed answer would hold it."""
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.refusal:
            out["refusal"] = "".join(self.refusal)
        if self.calls:
            out["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return out


def sse(data: Mapping[str, Any] | str) -> bytes:
    """One server-sent event as the API writes them."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def sse_events(buffer: bytearray) -> list[str]:
    """The complete ``data:`` payloads at the front of ``buffer`` (removed from it); a partial
    event stays for the next read. Comments and other fields are skipped."""
    out: list[str] = []
    while True:
        cut = _event_end(buffer)
        if cut is None:
            return out
        end, sep = cut
        event = bytes(buffer[:end]).decode("utf-8", "replace")
        del buffer[:end + sep]
        data = [line[5:].lstrip(" ") for line in event.splitlines() if line.startswith("data:")]
        if data:
            out.append("\n".join(data))


def _event_end(buffer: bytearray) -> tuple[int, int] | None:
    found = [(i, len(sep)) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(found) if found else None
