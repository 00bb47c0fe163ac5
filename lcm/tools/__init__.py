"""The agent tools: get back, exactly, what compaction moved out of the prompt.

``lcm_grep`` searches, ``lcm_describe`` shows the summary DAG, ``lcm_expand`` opens a summary
(its sources, paged) or a stored message (its text, paged), ``lcm_expand_query`` answers a
question from expanded evidence, ``lcm_load_session`` pages a whole session, ``lcm_status`` and
``lcm_doctor`` report on the engine and the store. Each runs over a
``lcm.context.ContextSession`` (the bound session and its store), whichever host drives it.

Rules every tool follows (docs/contract.md):
  * the answer is always a JSON string; a bad argument, an unknown tool or an id that does not
    exist *for this agent* gives ``{"error": "..."}`` saying what to do instead — an id of
    another agent and an id that does not exist give the same "not found";
  * the default scope is the current session of the current agent; other sessions of the same
    agent only when asked (``session_scope``/``session_id``); never another agent's rows;
  * every response is bounded: rows (``limit_clamped_from`` when a limit was clamped) and text
    (``content_truncated``), with offsets/cursors that page through everything exactly.
    Text offsets count Unicode code points.

Modules: ``specs`` (names, arguments, caps), ``args`` (strict argument checking), ``render``
(bounded items and hits), ``recall`` (grep, describe, expand, load), ``answer``
(expand_query), ``health`` (status, doctor).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from lcm.context.session import ContextSession
from lcm.errors import LcmError
from lcm.tools.answer import expand_query
from lcm.tools.args import ArgumentError, Parsed, parse_args
from lcm.tools.health import doctor, status
from lcm.tools.recall import describe, expand, grep, load_session
from lcm.tools.specs import SPECS, TOOL_SCHEMAS

__all__ = ["HANDLERS", "SPECS", "TOOL_SCHEMAS", "run_tool"]

HANDLERS: dict[str, Callable[[ContextSession, Parsed], dict[str, Any]]] = {
    "lcm_grep": grep, "lcm_describe": describe, "lcm_expand": expand,
    "lcm_expand_query": expand_query, "lcm_load_session": load_session,
    "lcm_status": status, "lcm_doctor": doctor,
}


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, default=str)


def run_tool(context: ContextSession, name: str, args: Any) -> str:
    """Dispatch one tool call; always a JSON string, errors included."""
    handler = HANDLERS.get(name)
    if handler is None:
        return dumps({"error": f"unknown tool {name!r}; lcm provides {', '.join(SPECS)}"})
    try:
        parsed = parse_args(name, SPECS[name][1], args)
        payload = handler(context, parsed)
    except ArgumentError as exc:
        return dumps({"error": str(exc)})
    for arg, asked in parsed.clamped.items():
        row_limit = arg in ("limit", "source_limit", "max_results", "node_ids")
        payload.setdefault("limit_clamped_from" if row_limit else f"{arg}_clamped_from", asked)
    return dumps(payload)


class ToolError(LcmError):
    """A tool answered with an error (bad argument, not found): shown to a person as one line."""


def call_tool(context: ContextSession, name: str, **args: Any) -> dict[str, Any]:
    """``run_tool`` for the adapters that show answers to people (the command line, the
    explorer): the response as a dict, None arguments left out, an error raised as ToolError."""
    payload: dict[str, Any] = json.loads(run_tool(context, name, {k: v for k, v in args.items() if v is not None}))
    if "error" in payload:
        raise ToolError(payload["error"])
    return payload
