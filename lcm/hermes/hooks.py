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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lcm.hermes.engine import LcmEngine

_LIVE: weakref.WeakSet[LcmEngine] = weakref.WeakSet()


def track(engine: LcmEngine) -> None:
    """An engine that bound a host session: it hears that session's requests."""
    _LIVE.add(engine)


def pre_api_request(**kwargs: Any) -> None:
    """Hermes' hook (keyword arguments only; ``session_id`` and ``request_messages`` used)."""
    session_id = str(kwargs.get("session_id") or "")
    messages = kwargs.get("request_messages")
    if not session_id or not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return
    for engine in list(_LIVE):
        engine.observe_request(session_id, messages)


def register(ctx: Any) -> None:
    """Register the hooks with a Hermes plugin context (one without hooks is left alone)."""
    register_hook = getattr(ctx, "register_hook", None)
    if callable(register_hook):
        register_hook("pre_api_request", pre_api_request)
