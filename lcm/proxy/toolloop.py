"""The lcm tools beside the client's: offered with every request, answered by the proxy.

The model sees the client's tools and, after them (always in the same order, so the prompt
prefix stays cacheable), lcm's, except any whose name a client tool already uses. When the
model calls lcm tools only, the proxy runs them and asks the upstream again with their
results, up to ``MAX_ROUNDS`` times; the client sees one answer.

**A response that mixes lcm and client tool calls** goes to the client with its own calls
only: the client can run nothing else, and the proxy cannot answer the client's calls. The lcm
calls in it are dropped, not run (the model sees, on the next request, that it did not make
them, and may make them again). Neither they nor the lcm rounds are stored: the stored
conversation is what the client holds.

Not offered when the request asks for several choices (``n`` > 1: which one would continue?),
allows no tool (``tool_choice`` "none"), or must call one of its own (``tool_choice``
"required" or naming a function: the client counts on a call it can run, and a model that
kept calling lcm's would run out of rounds and have to answer without any), and never with
``--no-tools``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lcm.context.session import ContextSession
from lcm.tools import TOOL_SCHEMAS, run_tool

#: lcm tool rounds answered for one request before the model must answer without them.
MAX_ROUNDS = 6
LCM_TOOLS = frozenset(s["name"] for s in TOOL_SCHEMAS)


@dataclass(frozen=True)
class Offer:
    """What the upstream is offered: ``tools`` (None: the request's own, untouched) and the
    names of the lcm tools among them (the calls the proxy answers)."""
    tools: list[dict[str, Any]] | None
    lcm_names: frozenset[str]


NOT_OFFERED = Offer(None, frozenset())
#: lcm's tool definitions as offered: the same objects in every request (nothing changes
#: them), so what they cost in tokens is known by identity (``is_lcm_offer``).
LCM_OFFERS: tuple[dict[str, Any], ...] = tuple({"type": "function", "function": dict(s)} for s in TOOL_SCHEMAS)
_LCM_OFFER_NAMES = tuple(str(s["name"]) for s in TOOL_SCHEMAS)
_LCM_OFFER_IDS = frozenset(id(o) for o in LCM_OFFERS)


def is_lcm_offer(tool: Any) -> bool:
    """Whether ``tool`` is one of :data:`LCM_OFFERS` (the object itself)."""
    return id(tool) in _LCM_OFFER_IDS


def offer(body: Mapping[str, Any]) -> Offer:
    """The request's tools with lcm's after them (:data:`NOT_OFFERED` when lcm's are not offered)."""
    if int(body.get("n") or 1) > 1:
        return NOT_OFFERED
    choice = body.get("tool_choice")
    if choice in ("none", "required") or (isinstance(choice, Mapping) and choice.get("type") == "function"):
        return NOT_OFFERED
    own = list(body.get("tools") or [])
    taken = {((t.get("function") or {}).get("name")) for t in own if isinstance(t, Mapping)}
    added = [o for o, name in zip(LCM_OFFERS, _LCM_OFFER_NAMES, strict=True) if name not in taken]
    return Offer(own + added, frozenset(LCM_TOOLS - taken))


def split_calls(calls: Sequence[Mapping[str, Any]] | None, lcm_names: frozenset[str],
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the calls of lcm tools, the client's calls)."""
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for call in calls or ():
        name = (call.get("function") or {}).get("name")
        (mine if name in lcm_names else theirs).append(dict(call))
    return mine, theirs


def answer(context: ContextSession, calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tool messages answering lcm calls (a tool's error is its answer, as in any host)."""
    out = []
    for call in calls:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError as exc:
            result = json.dumps({"error": f"{fn.get('name')}: the arguments are not valid JSON ({exc})"})
        else:
            result = (run_tool(context, str(fn.get("name")), args) if isinstance(args, dict)
                      else json.dumps({"error": f"{fn.get('name')}: the arguments must be a JSON object"}))
        out.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
    return out


def client_message(message: Mapping[str, Any], client_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message as the client gets it: its own tool calls only."""
    out = dict(message)
    if client_calls:
        out["tool_calls"] = client_calls
    else:
        out.pop("tool_calls", None)
    return out
