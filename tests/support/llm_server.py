"""A scripted OpenAI-compatible chat server on 127.0.0.1 for tests (a real HTTP peer).

Every request body is logged. What it answers is decided by ``server.handler``: a function of
the request body returning a :class:`Reply` (status, JSON or raw body, optional delay). Helpers
build the common answers: a text completion, a tool call, an error status, a stall.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON; str -> raw text
    delay: float = 0.0
    drip: float = 0.0  # seconds between bytes of the body, or between a stream's events
    close: bool = False  # close the connection without answering
    cut_after: int | None = None  # a stream: close the connection after this many events
    headers: list[tuple[str, str]] = field(default_factory=list)  # extra response headers, in order
    gzip: bool = False  # a whole answer: the body gzip-compressed (Content-Encoding: gzip)


def completion(text: str | None, *, tool_calls: list[dict] | None = None, model: str = "scripted",
               prompt_tokens: int = 0, completion_tokens: int = 0,
               prompt_tokens_details: dict[str, int] | None = None) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return Reply(200, {
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  **({"prompt_tokens_details": prompt_tokens_details} if prompt_tokens_details else {})},
    })


def stream_chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A chat completion split into ``chat.completion.chunk`` events: role, content, each tool
    call (name and arguments), the finish reason, and the usage when asked for."""
    base = {"id": body.get("id", "chatcmpl-scripted"), "object": "chat.completion.chunk",
            "created": body.get("created", int(time.time())), "model": body.get("model", "scripted")}
    choice = body["choices"][0]
    message = choice["message"]
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]}]
    text = message.get("content") or ""
    for start in range(0, len(text), 200):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": text[start:start + 200]},
                                            "finish_reason": None}]})
    for i, call in enumerate(message.get("tool_calls") or []):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": call["id"], "type": "function",
             "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]},
            "finish_reason": None}]})
    finish = choice.get("finish_reason", "stop")
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body.get("usage")})
    return chunks


def tool_call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def error(status: int, message: str = "scripted failure") -> Reply:
    return Reply(status, {"error": {"message": message, "type": "scripted"}})


class _Server(ThreadingHTTPServer):
    """A connection per request (HTTP/1.0), so clients connect all the time: ``socketserver``'s
    listen backlog of 5 dropped connection attempts from 64 concurrent clients on a slow VM, and
    each drop cost a 1-7 s SYN retry (the proxy benchmark's direct baseline fell to 0.2
    requests/s)."""

    request_queue_size = 1024


@dataclass
class ScriptedLLM:
    handler: Callable[[dict[str, Any]], Reply] = field(default=lambda body: completion("ok"))
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each request's, names lower-cased

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # /v1/models, probed by some clients
                server.paths.append(self.path)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                self._send(Reply(200, {"object": "list", "data": [
                    {"id": "scripted", "object": "model", "owned_by": "tests"}]}))

            def do_DELETE(self) -> None:  # an API route the scripted model does not serve
                server.paths.append(self.path)
                self._send(error(404, f"no such object: {self.path}"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                server.requests.append(body)
                server.paths.append(self.path)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                try:
                    reply = server.handler(body)
                except Exception as exc:  # noqa: BLE001 - a handler bug becomes a 500, visibly
                    reply = error(500, f"handler raised {type(exc).__name__}: {exc}")
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.close:
                    self.close_connection = True
                    self.connection.close()
                    return
                if body.get("stream") and reply.status == 200 and isinstance(reply.body, dict):
                    usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    self._stream(reply.body, include_usage=usage, pause=reply.drip, cut_after=reply.cut_after,
                                 headers=reply.headers)
                else:
                    self._send(reply)

            def _stream(self, completion_body: dict[str, Any], include_usage: bool, pause: float = 0.0,
                        cut_after: int | None = None, headers: Sequence[tuple[str, str]] = ()) -> None:
                """The same completion as server-sent events, the way OpenAI streams it (cut
                short, the connection closed, after ``cut_after`` events)."""
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    for name, value in headers:
                        self.send_header(name, value)
                    self.end_headers()
                    for i, chunk in enumerate(stream_chunks(completion_body, include_usage)):
                        if cut_after is not None and i >= cut_after:
                            self.wfile.flush()
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        if pause:
                            self.wfile.flush()
                            time.sleep(pause)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _send(self, reply: Reply) -> None:
                payload = reply.body if isinstance(reply.body, str) else json.dumps(reply.body or {})
                data = payload.encode("utf-8")
                if reply.gzip:
                    data = gzip.compress(data)
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if reply.gzip:
                        self.send_header("Content-Encoding", "gzip")
                    for name, value in reply.headers:
                        self.send_header(name, value)
                    self.end_headers()
                    if reply.drip:
                        for i in range(len(data)):
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            time.sleep(reply.drip)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass  # the client gave up (a timeout test)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def system_prompt(body: dict[str, Any]) -> str:
        """The leading system message's text (its text parts joined, for a list of parts)."""
        msgs = body.get("messages") or []
        if not msgs or msgs[0].get("role") != "system":
            return ""
        content = msgs[0].get("content") or ""
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content

    @staticmethod
    def last_user(body: dict[str, Any]) -> str:
        for msg in reversed(body.get("messages") or []):
            if msg.get("role") == "user":
                content = msg.get("content")
                return content if isinstance(content, str) else json.dumps(content)
        return ""


def word_vector(text: str, dims: int = 64) -> list[float]:
    """A deterministic bag-of-words vector (each lower-cased word hashed to a dimension): texts
    sharing words point the same way. What the scripted embeddings endpoint answers."""
    import hashlib

    out = [0.0] * dims
    for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
        out[int(hashlib.sha256(word.encode()).hexdigest(), 16) % dims] += 1.0
    return out


def embeddings(body: dict[str, Any], dims: int = 64) -> Reply:
    """An OpenAI ``/v1/embeddings`` answer for the request ``body`` (listed out of order, as
    the API allows: clients must sort by ``index``)."""
    inputs = body.get("input")
    texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
    size = int(body.get("dimensions") or dims)
    data = [{"object": "embedding", "index": i, "embedding": word_vector(t, size)} for i, t in enumerate(texts)]
    return Reply(200, {"object": "list", "data": list(reversed(data)), "model": body.get("model"),
                       "usage": {"prompt_tokens": 0, "total_tokens": 0}})
