"""Which agent and which conversation a request belongs to.

**Agent.** Without a token map (the default, loopback only) the ``X-LCM-Agent`` header names
it, else the proxy's default agent. With a token map (``lcm proxy --tokens FILE``, a JSON object
``{"token": "agent", ...}``; required to listen beyond loopback) every request must carry one
of its tokens, as the ``X-LCM-Token`` header or as the path prefix ``/t/<token>/v1/...`` (for
tools that let you set only a base URL), and the agent is the token's: an ``X-LCM-Agent``
header naming another agent is refused. The client's ``Authorization`` is the provider's
business: it goes upstream untouched and plays no part here.

**Conversation.** ``X-LCM-Session`` names it (any string up to 200 characters: the session key
within the agent). Without it, the conversation is known by how it opens: the system (or
developer) messages before the first user message and that user message, hashed. A client
that re-sends its whole history every time is matched on every request; two conversations of
one agent that open identically share a session, where lcm's alignment keeps each as its own
fork after the point they differ (nothing of one appears in the other's context).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lcm.errors import ConfigError
from lcm.messages import content_hash
from lcm.proxy.wire import RequestError

SESSION_HEADER = "x-lcm-session"
AGENT_HEADER = "x-lcm-agent"
TOKEN_HEADER = "x-lcm-token"
#: Longest session key or agent name a header may give.
MAX_KEY_CHARS = 200
#: Prefix of the session keys of conversations matched by their opening messages.
OPENING_PREFIX = "proxy-"


@dataclass(frozen=True)
class Caller:
    agent: str
    session_key: str
    #: True when the session was named by the client (X-LCM-Session), False when matched.
    named: bool


def load_tokens(path: str) -> dict[str, str]:
    """The token map of ``--tokens``: a JSON object of token → agent. It holds secrets, so it
    must not be readable by other users (like an SSH key)."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the token map {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"the token map {path} is not valid JSON ({exc})") from None
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(f"the token map {path} is readable by other users: chmod 600 {path}")
    if not isinstance(data, dict) or not data or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in data.items()):
        raise ConfigError(f"the token map {path} must be a JSON object of token → agent name, "
                          'e.g. {"s3cret-token": "research-agent"}')
    short = [k for k in data if len(k) < 16]
    if short:
        raise ConfigError(f"the token map {path} has tokens shorter than 16 characters: use long "
                          "random ones (python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return dict(data)


class Callers:
    """Resolves a request to its :class:`Caller` (see the module docstring for the rules)."""

    def __init__(self, default_agent: str, tokens: Mapping[str, str] | None = None):
        self.default_agent = default_agent
        self.tokens = dict(tokens or {})

    def resolve(self, headers: Mapping[str, str], path_token: str | None,
                messages: Sequence[Mapping[str, Any]]) -> Caller:
        agent = self._agent(headers, path_token)
        named = headers.get(SESSION_HEADER)
        if named is not None:
            key = named.strip()
            if not key or len(key) > MAX_KEY_CHARS:
                raise RequestError(f"the {SESSION_HEADER} header must be 1-{MAX_KEY_CHARS} characters",
                                   param=SESSION_HEADER)
            return Caller(agent, key, True)
        return Caller(agent, opening_key(messages), False)

    def _agent(self, headers: Mapping[str, str], path_token: str | None) -> str:
        asked = headers.get(AGENT_HEADER)
        if asked is not None and (not asked.strip() or len(asked) > MAX_KEY_CHARS):
            raise RequestError(f"the {AGENT_HEADER} header must be 1-{MAX_KEY_CHARS} characters",
                               param=AGENT_HEADER)
        if not self.tokens:
            return asked.strip() if asked is not None else self.default_agent
        given = path_token if path_token is not None else headers.get(TOKEN_HEADER)
        agent = self._known(given)
        if agent is None:
            raise RequestError("this lcm proxy needs a valid token: the X-LCM-Token header or the "
                               "base URL http://<proxy>/t/<token>/v1", status=401, kind="authentication_error",
                               code="invalid_lcm_token")
        if asked is not None and asked.strip() != agent:
            raise RequestError(f"this token belongs to another agent than {asked.strip()!r}", status=403,
                               kind="permission_error", param=AGENT_HEADER)
        return agent

    def _known(self, given: str | None) -> str | None:
        if not given:
            return None
        found = None
        for token, agent in self.tokens.items():  # every token compared in constant time
            if hmac.compare_digest(token.encode(), given.encode()):
                found = agent
        return found


def opening_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """The session key of a conversation known by how it opens: its leading system/developer
    messages and its first user message (their substance: what a client may re-encode between
    requests, like key order or an empty content, does not change it)."""
    hashes: list[str] = []
    for message in messages:
        hashes.append(content_hash(message))
        if message.get("role") == "user":
            break
    return OPENING_PREFIX + hashlib.sha256(" ".join(hashes).encode("ascii")).hexdigest()[:32]
