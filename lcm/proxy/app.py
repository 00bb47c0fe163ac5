"""The proxy's HTTP side: ``POST /v1/chat/completions`` (streamed or not), every other route
of the API passed through unstored (``/v1/models``, embeddings, files...), both also under
``/t/<token>/v1`` (the token-in-base-URL form, see ``lcm.proxy.callers``), and ``GET /health``.

A completion, in order (store work runs in worker threads, the upstream calls on the event
loop):

1. the request is checked (a 400 shaped like the API's names what is wrong) and resolved to
   its agent and conversation;
2. its messages are stored and the upstream's messages assembled (``Conversations.prepare``);
   if the store cannot take them, the answer is a 503 and nothing is sent upstream, so a
   client's retry loses nothing and stores nothing twice;
3. the upstream is called with the client's own headers (``Authorization`` untouched) and the
   lcm tools added (``lcm.proxy.toolloop``); lcm tool rounds are answered here;
4. the answer goes back as the upstream gave it: the same bytes when no lcm round or call was
   involved; otherwise the same object with the client's calls only and the usage of every
   upstream call added up; either way with the upstream's response headers, less the ones
   that frame bytes (``upstream.NOT_PASSED_BACK``). Streams are relayed chunk by chunk as
   they arrive; a tool call's chunks are held until its round ends (the client could not run
   it before then anyway);
5. only an answer that was complete is stored (a stream cut by either side stores nothing
   of it: the client's retry gets, and stores, a new answer; a stream is whole when it brought
   ``[DONE]`` or a finish reason); a stream's answer is stored before its end (``[DONE]``) is
   sent.

An upstream error (status ≥ 400) comes back with its status and body unchanged. An upstream
that does not answer within ``--timeout`` seconds (between two bytes of a stream) gives a 504,
or an ``error`` event inside a stream already begun.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from lcm.errors import DatabaseUnavailableError, LcmError
from lcm.proxy import toolloop
from lcm.proxy.callers import AGENT_HEADER, SESSION_HEADER, TOKEN_HEADER, Callers
from lcm.proxy.conversations import Conversation, Conversations, api_key_of
from lcm.proxy.upstream import Answer, Headers, Streamed, Upstream, UpstreamTimeout, UpstreamUnreachable
from lcm.proxy.wire import (
    RequestError,
    StreamedAnswer,
    add_usage,
    error_body,
    json_bytes,
    parse_request,
    requested_output,
    sse,
    sse_events,
)

log = logging.getLogger("lcm.proxy")

#: Request headers never sent upstream: the proxy's own, and the hop-by-hop ones the client sets.
_NOT_FORWARDED = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                            "accept-encoding", "te", "upgrade", "proxy-authorization",
                            SESSION_HEADER, AGENT_HEADER, TOKEN_HEADER})


#: Methods of the API's other routes, which go to the upstream as they came (nothing stored).
PASSED_THROUGH = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@dataclass
class ProxySettings:
    upstream: str  # the provider's base URL, e.g. https://api.openai.com/v1
    timeout: float = 600.0  # seconds without a byte from the upstream
    tools: bool = True


def create_app(settings: ProxySettings, conversations: Conversations, callers: Callers) -> Starlette:
    proxy = _Proxy(settings, conversations, callers)
    routes = [Route("/health", proxy.health, methods=["GET"])]
    for prefix in ("/v1", "/t/{token}/v1"):
        routes += [Route(f"{prefix}/chat/completions", proxy.completions, methods=["POST"]),
                   # The rest of the API (models, embeddings, the Responses API, audio, files...):
                   Route(prefix + "/{rest:path}", proxy.passthrough, methods=PASSED_THROUGH)]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await proxy.close()

    return Starlette(routes=routes, lifespan=lifespan)


class _Json(JSONResponse):
    """A JSON response that a lone surrogate in what it carries (from the client's messages or
    the upstream's answer) cannot turn into a 500 (see ``wire.json_bytes``)."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def _error(exc: RequestError) -> _Json:
    return _Json(exc.body(), status_code=exc.status)


def _upstream_error(status: int, message: str, code: str) -> _Json:
    return _Json(error_body(message, kind="upstream_error", code=code), status_code=status)


def _unreachable(exc: UpstreamUnreachable) -> _Json:
    return _upstream_error(502, f"the upstream cannot be reached: {exc}", "upstream_unreachable")


def _as_received(answer: Answer) -> Response:
    """The upstream's answer as it came: status, content type, bytes and headers."""
    return _with_upstream_headers(Response(answer.content, status_code=answer.status),
                                  _typed(answer.content_type, answer.headers))


def _typed(content_type: str | None, headers: Headers) -> Headers:
    """``headers`` with the upstream's content type as it wrote it (Starlette's ``media_type``
    would add a charset to a ``text/`` type)."""
    return headers if content_type is None else [(b"content-type", content_type.encode("latin-1")), *headers]


def _with_upstream_headers(response: Response, headers: Headers) -> Response:
    """``response`` with the upstream's headers that the client gets (``upstream.NOT_PASSED_BACK``
    says which not), except those the response already sets (a stream's ``Cache-Control``)."""
    own = {name for name, _ in response.raw_headers}
    response.raw_headers.extend((name.lower(), value) for name, value in headers if name.lower() not in own)
    return response


class _Proxy:
    def __init__(self, settings: ProxySettings, conversations: Conversations, callers: Callers):
        self.settings = settings
        self.conversations = conversations
        self.callers = callers
        self.upstream = Upstream(settings.upstream, settings.timeout)
        self.base = self.upstream.base

    def _timed_out(self) -> _Json:
        return _upstream_error(504, f"the upstream did not answer within {self.settings.timeout:g} s", "timeout")

    async def close(self) -> None:
        await self.upstream.close()

    async def health(self, request: Request) -> Response:
        return _Json({"status": "ok", "upstream": self.base})

    def _forwarded(self, request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}

    async def passthrough(self, request: Request) -> Response:
        """Any other route of the API (``/v1/models``, ``/v1/embeddings``, ``/v1/responses``, files...):
        sent upstream as the client sent it, with the same checks of who is asking as a chat
        completion, and answered as the upstream answers, relayed as it arrives. Nothing of it
        is stored: lcm keeps chat-completions conversations."""
        try:
            self.callers.resolve(request.headers, request.path_params.get("token"), [])
        except RequestError as exc:
            return _error(exc)
        tail = request.url.path.split("/v1", 1)[1]
        try:
            answer = await self.upstream.forward(request.method, tail, self._forwarded(request), await request.body(),
                                                 request.query_params.multi_items())
        except UpstreamTimeout:
            return self._timed_out()
        except UpstreamUnreachable as exc:
            return _unreachable(exc)
        return _with_upstream_headers(StreamingResponse(_relayed(answer), status_code=answer.status),
                                      _typed(answer.content_type, answer.headers))

    # ------------------------------------------------------------------ completions

    async def completions(self, request: Request) -> Response:
        try:
            body = parse_request(await request.body())
            caller = self.callers.resolve(request.headers, request.path_params.get("token"), body["messages"])
        except RequestError as exc:
            return _error(exc)
        client_messages: list[dict[str, Any]] = body["messages"]
        offered = toolloop.offer(body) if self.settings.tools else toolloop.NOT_OFFERED
        tools = offered.tools if offered.tools is not None else body.get("tools")
        try:
            conversation, sendable = await run_in_threadpool(
                self.conversations.prepare, caller, client_messages, body["model"],
                api_key_of(request.headers.get("authorization")), tools, max_output=requested_output(body))
        except DatabaseUnavailableError as exc:
            return _Json(error_body(f"lcm cannot store this conversation right now ({exc}); nothing "
                                    "was sent to the model: retry shortly", kind="server_error",
                                    code="lcm_store_unavailable"), status_code=503)
        except LcmError as exc:
            return _Json(error_body(f"lcm could not store this conversation: {exc}", kind="server_error",
                                    code="lcm_error"), status_code=500)
        upstream = {**body, "messages": sendable}
        if tools is not None:
            upstream["tools"] = tools
        turn = _Turn(conversation, client_messages, upstream, offered.lcm_names, self._forwarded(request))
        if body.get("stream"):
            return await self._stream(turn)
        return await self._complete(turn)

    async def _keep(self, turn: _Turn, answer: dict[str, Any] | None, usage: Mapping[str, Any] | None) -> None:
        try:
            await run_in_threadpool(self.conversations.keep, turn.conversation, turn.client_messages, answer, usage)
        except LcmError as exc:  # the client has its answer; its next request stores it
            log.warning("lcm proxy: the answer could not be stored now (%s); the next request stores it", exc)

    async def _lcm_round(self, turn: _Turn, message: dict[str, Any], calls: list[dict[str, Any]]) -> None:
        results = await run_in_threadpool(self.conversations.run_locked, turn.conversation,
                                          lambda context: toolloop.answer(context, calls))
        turn.upstream["messages"] = [*turn.upstream["messages"], {**message, "tool_calls": calls}, *results]
        turn.rounds += 1
        if turn.rounds >= toolloop.MAX_ROUNDS:  # the model answers without them now
            turn.upstream["tool_choice"] = "none"

    async def _complete(self, turn: _Turn) -> Response:
        usage: dict[str, Any] | None = None
        while True:
            try:
                answer = await self.upstream.call("POST", "/chat/completions", turn.headers, turn.upstream)
            except UpstreamTimeout:
                return self._timed_out()
            except UpstreamUnreachable as exc:
                return _unreachable(exc)
            if answer.status >= 400:
                return _as_received(answer)
            try:
                data = json.loads(answer.content)
                message = dict(data["choices"][0]["message"])
            except (ValueError, KeyError, IndexError, TypeError):
                return _as_received(answer)
            usage = add_usage(usage, data.get("usage"))
            mine, theirs = toolloop.split_calls(message.get("tool_calls"), turn.lcm_tools)
            if mine and not theirs and turn.rounds < toolloop.MAX_ROUNDS:
                await self._lcm_round(turn, message, mine)
                continue
            break
        if not mine and turn.rounds == 0:  # untouched: the upstream's own bytes
            await self._keep(turn, message, usage)
            return _as_received(answer)
        shown = toolloop.client_message(message, theirs)
        data["choices"][0]["message"] = shown
        if mine and not theirs and data["choices"][0].get("finish_reason") == "tool_calls":
            data["choices"][0]["finish_reason"] = "stop"
        if usage is not None:
            data["usage"] = usage
        await self._keep(turn, shown, usage)
        return _with_upstream_headers(_Json(data), answer.headers)  # the last call's

    # ------------------------------------------------------------------ streams

    async def _open(self, turn: _Turn) -> Streamed | Response:
        """The upstream's streamed answer, or the response to give the client instead."""
        try:
            answer = await self.upstream.open("/chat/completions", turn.headers, turn.upstream)
        except UpstreamTimeout:
            return self._timed_out()
        except UpstreamUnreachable as exc:
            return _unreachable(exc)
        if answer.status >= 400:
            try:
                body = await answer.read()
            except (UpstreamTimeout, UpstreamUnreachable) as exc:
                return _unreachable(UpstreamUnreachable(f"its error answer broke off: {exc}"))
            return _as_received(Answer(answer.status, answer.content_type, body, answer.headers))
        return answer

    async def _stream(self, turn: _Turn) -> Response:
        first = await self._open(turn)
        if not isinstance(first, Streamed):
            return first
        return _with_upstream_headers(
            StreamingResponse(self._relay(turn, first), media_type="text/event-stream",
                              headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}), first.headers)

    async def _relay(self, turn: _Turn, answer: Streamed) -> AsyncIterator[bytes]:
        wants_usage = bool((turn.upstream.get("stream_options") or {}).get("include_usage"))
        usage: dict[str, Any] | None = None
        head: dict[str, Any] | None = None
        while True:
            streamed = StreamedAnswer()
            held: list[dict[str, Any]] = []  # the finish and usage chunks, until the round is decided
            done = False
            try:
                async for event in self._events(answer):
                    if event == "[DONE]":
                        done = True
                        continue
                    try:
                        chunk = json.loads(event)
                    except ValueError:
                        continue
                    if "error" in chunk:  # the upstream failed mid-stream: relayed, nothing stored
                        yield sse(chunk)
                        return
                    streamed.add(chunk)
                    head = head or {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
                    if not turn.lcm_tools:
                        yield sse(event)
                        continue
                    shown = _without_calls_and_finish(chunk, head)
                    if shown is not None:
                        yield sse(shown)
                    if _has_finish(chunk) or chunk.get("usage"):
                        held.append(chunk)
            except UpstreamTimeout:
                yield sse(error_body(f"the upstream stopped sending for {self.settings.timeout:g} s",
                                     kind="upstream_error", code="timeout"))
                return
            except UpstreamUnreachable as exc:
                yield sse(error_body(f"the upstream stream broke: {exc}", kind="upstream_error",
                                     code="upstream_unreachable"))
                return
            finally:
                answer.close()
            if not done and streamed.finish_reason is None:
                # A connection closed mid-answer ends a body sent without a length like a whole
                # one: only the stream's own end ([DONE], or a finish reason) says it is whole.
                yield sse(error_body("the upstream's stream ended before its answer did", kind="upstream_error",
                                     code="upstream_incomplete"))
                return
            usage = add_usage(usage, streamed.usage)
            message = streamed.message()
            mine, theirs = toolloop.split_calls(message.get("tool_calls"), turn.lcm_tools)
            if mine and not theirs and turn.rounds < toolloop.MAX_ROUNDS:
                await self._lcm_round(turn, message, mine)
                nxt = await self._open(turn)
                if not isinstance(nxt, Streamed):
                    yield sse(json.loads(bytes(nxt.body)) if nxt.body else error_body(
                        "the upstream failed", kind="upstream_error"))
                    return
                answer = nxt
                continue
            break
        # Stored before the stream's end reaches the client: a client that has read [DONE]
        # can count on its answer being kept when it sends its next request.
        await self._keep(turn, toolloop.client_message(message, theirs), usage)
        if turn.lcm_tools:
            for chunk in _closing_chunks(head or {}, theirs, held, streamed.finish_reason, usage, wants_usage):
                yield sse(chunk)
        yield sse("[DONE]")

    async def _events(self, answer: Streamed) -> AsyncIterator[str]:
        buffer = bytearray()
        async for piece in answer.chunks():
            buffer += piece
            for event in sse_events(buffer):
                yield event
        for event in sse_events(buffer + b"\n\n"):
            yield event


async def _relayed(answer: Streamed) -> AsyncIterator[bytes]:
    """A passed-through answer's bytes as they arrive. One that breaks off is broken off for
    the client too: the error propagates, so the server drops the connection before the
    chunked body's end (ending it normally would pass a cut answer off as whole)."""
    try:
        async for piece in answer.chunks():
            yield piece
    except (UpstreamTimeout, UpstreamUnreachable) as exc:
        log.warning("lcm proxy: a passed-through answer broke off: %s", exc)
        raise
    finally:
        answer.close()


@dataclass
class _Turn:
    conversation: Conversation
    client_messages: list[dict[str, Any]]
    upstream: dict[str, Any]
    lcm_tools: frozenset[str]
    headers: dict[str, str]
    rounds: int = 0


def _has_finish(chunk: Mapping[str, Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("finish_reason") for c in chunk.get("choices") or ())


def _without_calls_and_finish(chunk: Mapping[str, Any], head: Mapping[str, Any]) -> dict[str, Any] | None:
    """What of a chunk the client gets while its round is undecided: text deltas, under the
    first round's id; tool-call deltas, finish reasons and usage are held (None: nothing left)."""
    choices = []
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        delta = {k: v for k, v in (choice.get("delta") or {}).items() if k != "tool_calls"}
        if not delta:
            continue
        choices.append({**choice, "delta": delta, "finish_reason": None})
    if not choices:
        return None
    return {**chunk, **head, "choices": choices, **({"usage": None} if "usage" in chunk else {})}


def _closing_chunks(head: Mapping[str, Any], calls: list[dict[str, Any]], held: list[dict[str, Any]],
                    finish: str | None, usage: dict[str, Any] | None, wants_usage: bool) -> list[dict[str, Any]]:
    """The end of a relayed stream whose round was held: the client's tool calls (whole, one
    chunk), the finish reason, and the usage of every upstream call when the client asked for it."""
    base = {"object": "chat.completion.chunk", **head}
    out: list[dict[str, Any]] = []
    if calls:
        out.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, **call} for i, call in enumerate(calls)]}, "finish_reason": None}]})
    reason = finish if (finish != "tool_calls" or calls) else "stop"
    last = next((c for c in reversed(held) if _has_finish(c)), None)
    choice = dict(last["choices"][0]) if last is not None else {"index": 0}
    out.append({**base, "choices": [{**choice, "delta": {}, "finish_reason": reason or "stop"}]})
    if wants_usage:
        out.append({**base, "choices": [], "usage": usage})
    return out
