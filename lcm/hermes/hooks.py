"""Hermes plugin hooks lcm listens to, beside its context-engine contract.

``pre_llm_call``: before each model call, lcm's auto-recall block for the turn's user message
(``lcm.tools.autorecall``), returned as context Hermes appends to the API copy of that message.

``pre_api_request``: the request Hermes is about to send. Hermes builds each request's system
message itself (once per session, byte-stable) and hands ``compress()`` the conversation only,
so this is where lcm sees the system prompt it keeps once per version (issue 20). The hook is
process-wide while engines are per agent (Hermes deep-copies the registered one), so the engines
that bound a session are tracked here, weakly, and each takes only requests for its own session.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class RequestListener(Protocol):
    """What hears a request's system prompt (``lcm.hermes.engine.LcmEngine``, which imports this
    module: the hooks know the engine only by this method)."""

    def observe_request(self, session_id: str, system: Mapping[str, Any]) -> None: ...

    def recall_context(self, session_id: str, user_message: Any,
                       context_messages: Sequence[Mapping[str, Any]] | None) -> str: ...


_LIVE: weakref.WeakSet[RequestListener] = weakref.WeakSet()


def track(engine: RequestListener) -> None:
    """An engine that bound a host session: it hears that session's requests."""
    _LIVE.add(engine)


def system_message(kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The request's system prompt as a system message: the first of its messages (chat
    completions), else the request body's ``system`` (Anthropic's Messages API) or
    ``instructions`` (OpenAI's Responses API), as Hermes hands them to the hook."""
    messages = kwargs.get("request_messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], Mapping) \
            and messages[0].get("role") == "system":
        return messages[0]
    request = kwargs.get("request")
    body = request.get("body") if isinstance(request, Mapping) else None
    if isinstance(body, Mapping):
        for key in ("system", "instructions"):
            value = body.get(key)
            if isinstance(value, str | list) and value:
                return {"role": "system", "content": value}
    return None


def pre_api_request(**kwargs: Any) -> None:
    """Hermes' hook (keyword arguments only): the system prompt of a request for a session."""
    session_id = str(kwargs.get("session_id") or "")
    system = system_message(kwargs) if session_id else None
    if system is None:
        return
    for engine in list(_LIVE):
        engine.observe_request(session_id, system)


def pre_llm_call(**kwargs: Any) -> dict[str, str] | None:
    """Hermes' hook before each model call: lcm's auto-recall block for the turn's user message,
    as context Hermes appends to the API copy of that message (never to the system prompt, so
    the cached prefix stays; Hermes replays the same bytes on later turns)."""
    session_id = str(kwargs.get("session_id") or "")
    if not session_id:
        return None
    history = kwargs.get("conversation_history")
    held = [m for m in history if isinstance(m, Mapping)] if isinstance(history, list) else None
    for engine in list(_LIVE):
        text = engine.recall_context(session_id, kwargs.get("user_message"), held)
        if text:
            return {"context": text}
    return None


def register(ctx: Any) -> None:
    """Register the hooks with a Hermes plugin context (one without hooks is left alone)."""
    register_hook = getattr(ctx, "register_hook", None)
    if callable(register_hook):
        register_hook("pre_api_request", pre_api_request)
        register_hook("pre_llm_call", pre_llm_call)
