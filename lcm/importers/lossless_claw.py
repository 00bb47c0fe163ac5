"""lossless-claw's store (the OpenClaw plugin ``@martian-engineering/lossless-claw``,
github.com/Martian-Engineering/lossless-claw, 0.15): every conversation, its messages with their
parts, and its summaries.

Mapping (docs/import-lossless-claw.md):

* a conversation becomes an lcm session keyed by its OpenClaw ``session_id`` (a second
  conversation with the same one gets ``#<conversation_id>`` appended); its ``session_key``
  (``agent:<agent>:<channel>:...``) is provenance, names the agent (``agent:main:...`` imports
  into agent ``main``) unless ``--agent`` says otherwise, and gives the platform (its channel, or
  ``main``);
* messages in ``seq`` order, in the OpenAI chat shape, ``content`` exactly as the program stored
  it (its flattened text; '' for an assistant turn that only called tools):
  - an assistant's ``tool`` parts become ``tool_calls`` ({id, type "function", function {name,
    arguments = the part's ``tool_input`` text}}), in part order; its ``reasoning`` parts, joined,
    become ``reasoning``;
  - a ``tool`` row gets ``tool_call_id`` and ``name`` from its part; a result the program flagged
    as an error (``metadata.isError``) is listed in the session's origin (``tool_errors``): the
    chat shape has no field for it;
  - ``created_at`` (UTC) becomes the message time;
* ``summaries`` (leaves over ``summary_messages``, condensed over ``summary_parents``) go into
  lcm's DAG where they map cleanly (``lcm.importers.dag``), else become imported notes;
* provenance: ``origin`` = {"format": "lossless-claw", "path", "conversation_id", "session_id",
  "session_key", "title", "message_ids": [first, last], "notes", "tool_errors"}.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

from lcm.errors import LcmError
from lcm.importers.dag import plan_dag
from lcm.importers.source import check_format, open_readonly, utc_seconds
from lcm.transfer import Entry, ImportedSummary, SessionPlan

FORMAT = "lossless-claw"


def agent_of(session_key: str | None) -> str | None:
    """The OpenClaw agent id of a session key ``agent:<id>:...``."""
    parts = (session_key or "").split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "agent" and parts[1] else None


def platform_of(session_key: str | None) -> str | None:
    """The channel of a session key (``agent:main:telegram:direct:42`` -> telegram; the agent's
    main session -> main)."""
    parts = (session_key or "").split(":")
    return parts[2] if len(parts) > 2 and parts[0] == "agent" and parts[2] else None


def _meta(part: sqlite3.Row) -> dict[str, Any]:
    try:
        value = json.loads(part["metadata"] or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message(row: sqlite3.Row, parts: list[sqlite3.Row]) -> tuple[dict[str, Any], bool]:
    """The message in chat shape, and whether it is a tool result flagged as an error."""
    role = row["role"]
    msg: dict[str, Any] = {"role": role, "content": row["content"]}
    if role == "assistant":
        calls = [{"id": p["tool_call_id"], "type": "function",
                  "function": {"name": p["tool_name"], "arguments": p["tool_input"] if p["tool_input"] is not None
                               else "{}"}}
                 for p in parts if p["part_type"] == "tool" and p["tool_call_id"]]
        if calls:
            msg["tool_calls"] = calls
        reasoning = [p["text_content"] for p in parts if p["part_type"] == "reasoning" and p["text_content"]]
        if reasoning:
            msg["reasoning"] = "\n".join(reasoning)
    error = False
    if role == "tool":
        part = next((p for p in parts if p["tool_call_id"]), None)
        if part is not None:
            msg["tool_call_id"] = part["tool_call_id"]
            if part["tool_name"]:
                msg["name"] = part["tool_name"]
            error = _meta(part).get("isError") is True
    return msg, error


def read_lossless_claw(path: str | Path, *, sessions: tuple[str, ...] = ()) -> list[tuple[str, SessionPlan]]:
    """(agent, plan) for every conversation in the lossless-claw store at ``path`` (or only those
    whose session id or session key is in ``sessions``). Raises NotThisFormat for any other
    file, before anything is written."""
    source = Path(path).expanduser()
    with open_readonly(source) as conn:
        check_format(conn, source, FORMAT)
        conversations = list(conn.execute("SELECT * FROM conversations ORDER BY conversation_id"))
        known = {c["session_id"] for c in conversations} | {c["session_key"] for c in conversations}
        missing = set(sessions) - known
        if missing:
            raise LcmError(f"{source} has no conversation {', '.join(sorted(missing))} (it holds "
                           f"{', '.join(c['session_id'] for c in conversations) or 'none'})")
        taken: set[str] = set()
        plans: list[tuple[str, SessionPlan]] = []
        for conv in conversations:
            key = conv["session_id"]
            if key in taken:
                key = f"{key}#{conv['conversation_id']}"
            taken.add(key)
            if sessions and conv["session_id"] not in sessions and conv["session_key"] not in sessions:
                continue
            plans.append((agent_of(conv["session_key"]) or "default", _plan(conn, source, conv, key)))
    return plans


def _plan(conn: sqlite3.Connection, source: Path, conv: sqlite3.Row, key: str) -> SessionPlan:
    cid = conv["conversation_id"]
    rows = list(conn.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", (cid,)))
    parts_of: dict[int, list[sqlite3.Row]] = defaultdict(list)
    for part in conn.execute("SELECT p.* FROM message_parts p JOIN messages m ON m.message_id = p.message_id "
                             "WHERE m.conversation_id = ? ORDER BY p.message_id, p.ordinal", (cid,)):
        parts_of[part["message_id"]].append(part)
    platform = platform_of(conv["session_key"])
    plan = SessionPlan(session_key=key, entries=[], platform=platform)
    index_of: dict[int, int] = {}
    errors: list[str] = []
    for row in rows:
        message, error = _message(row, parts_of[row["message_id"]])
        if row["role"] == "system":
            plan.add_system_prompt(row["content"], where=row["message_id"], timestamp=utc_seconds(row["created_at"]))
            continue
        if error:
            errors.append(message["tool_call_id"])
        index_of[row["message_id"]] = len(plan.entries)
        plan.entries.append(Entry(where=row["message_id"], message=message, session_key=key, platform=platform,
                                  timestamp=utc_seconds(row["created_at"])))
    summaries = list(conn.execute("SELECT * FROM summaries WHERE conversation_id = ? ORDER BY created_at, rowid",
                                  (cid,)))
    sources_of: dict[str, list[int]] = defaultdict(list)
    for sid, mid in conn.execute("SELECT sm.summary_id, sm.message_id FROM summary_messages sm JOIN summaries s "
                                 "ON s.summary_id = sm.summary_id WHERE s.conversation_id = ? "
                                 "ORDER BY sm.summary_id, sm.ordinal", (cid,)):
        sources_of[sid].append(mid)
    children_of: dict[str, list[str]] = defaultdict(list)
    for sid, child in conn.execute("SELECT sp.summary_id, sp.parent_summary_id FROM summary_parents sp JOIN "
                                   "summaries s ON s.summary_id = sp.summary_id WHERE s.conversation_id = ? "
                                   "ORDER BY sp.summary_id, sp.ordinal", (cid,)):
        children_of[sid].append(child)  # lossless-claw names the condensed sources "parents"
    for order, s in enumerate(summaries):
        sources: tuple[Any, ...]
        if s["kind"] == "leaf":
            peer: tuple[Any, ...] = tuple(sources_of[s["summary_id"]])
            sources = tuple(index_of.get(m, -1) for m in peer)
        else:
            peer = sources = tuple(children_of[s["summary_id"]])
        plan.summaries.append(ImportedSummary(
            peer_id=s["summary_id"], depth=int(s["depth"]), content=s["content"], sources=sources, peer_sources=peer,
            order=order, model=s["model"] if s["model"] and s["model"] != "unknown" else None,
            created_at=utc_seconds(s["created_at"])))
    dag = plan_dag([e.message for e in plan.entries], plan.summaries)
    plan.origin = {"format": FORMAT, "path": str(source.resolve()), "conversation_id": cid,
                   "session_id": conv["session_id"], "session_key": conv["session_key"],
                   **({"title": conv["title"]} if conv["title"] else {}),
                   **({"message_ids": [rows[0]["message_id"], rows[-1]["message_id"]]} if rows else {}),
                   "summaries": len(summaries), **({"notes": dag.notes} if dag.notes else {}),
                   **({"tool_errors": errors} if errors else {})}
    return plan
