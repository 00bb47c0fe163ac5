"""Hermes plugin hooks lcm listens to, beside its context-engine contract.

``pre_api_request``: the request Hermes is about to send. Hermes builds each request's system
message itself (once per session, byte-stable) and hands ``compress()`` the conversation only,
so this is where lcm sees the system prompt it keeps once per version (issue 20). The hook is
process-wide while engines are per agent (Hermes deep-copies the registered one), so the engines
that bound a session are tracked here, weakly, and each takes only requests for its own session.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Protocol


class RequestListener(Protocol):
    """What hears a request's system prompt (``lcm.hermes.engine.LcmEngine``, which imports this
    module: the hooks know the engine only by this method)."""

    def observe_request(self, session_id: str, system: Mapping[str, Any]) -> None: ...


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


def register(ctx: Any) -> None:
    """Register the hooks with a Hermes plugin context (one without hooks is left alone)."""
    register_hook = getattr(ctx, "register_hook", None)
    if callable(register_hook):
        register_hook("pre_api_request", pre_api_request)
