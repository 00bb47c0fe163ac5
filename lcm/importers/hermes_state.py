"""Hermes' own session store (``state.db`` in the Hermes home, hermes-agent 0.19.0's
``hermes_state.SessionDB``, schema version 22): every session and its messages.

Read-only (``mode=ro``): the file may be in use by a running Hermes. Mapping:

* a Hermes session becomes an lcm session of the same id, its ``source`` the platform, its
  ``chat_id`` the conversation id, and its stored ``system_prompt`` a system prompt version;
  the agent is the session's ``profile_name`` (or the one the command line names);
* its **active** messages, in insertion order (``ORDER BY id``, as Hermes replays them), become
  messages in the shape Hermes itself loads (``get_messages_as_conversation``): role, content
  (decoded from Hermes' JSON-content marker), tool calls (parsed), tool call id, tool name, and
  every other field Hermes kept (reasoning, finish reason, platform message id, ``api_content``,
  timestamp), without Hermes' display clean-up, so nothing is lost;
* rewound messages (``active = 0``, which the user undid) are not imported; they are counted;
* provenance: ``origin`` = {"format": "hermes-state", "path", "id", "parent" (the session it
  continues after a compression or a branch), "title"}.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from lcm.errors import LcmError
from lcm.importers.source import check_format, open_readonly
from lcm.transfer import Entry, SessionPlan

FORMAT = "hermes-state"
#: Hermes marks JSON-encoded (non-string) content with this prefix (``SessionDB._CONTENT_JSON_PREFIX``).
_JSON_PREFIX = "\x00json:"
_JSON_FIELDS = ("tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items")
_TEXT_FIELDS = ("tool_call_id", "tool_name", "effect_disposition", "finish_reason", "reasoning",
                "reasoning_content", "api_content")


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_JSON_PREFIX):
        try:
            return json.loads(value[len(_JSON_PREFIX):])
        except ValueError:
            return value
    return value


def _message(row: sqlite3.Row, columns: set[str]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": row["role"], "content": _decode(row["content"])}
    for name in _TEXT_FIELDS:
        if name in columns and row[name] is not None and row[name] != "":
            msg[name] = row[name]
    for name in _JSON_FIELDS:
        if name in columns and row[name]:
            try:
                msg[name] = json.loads(row[name])
            except ValueError:
                msg[name] = row[name]  # kept as Hermes wrote it
    if "platform_message_id" in columns and row["platform_message_id"]:
        msg["message_id"] = row["platform_message_id"]
    if "observed" in columns and row["observed"]:
        msg["observed"] = True
    if row["timestamp"]:
        msg["timestamp"] = row["timestamp"]
    return msg


def read_hermes_state(path: str | Path, *, sessions: tuple[str, ...] = ()) -> tuple[list[tuple[str, SessionPlan]], int]:
    """(agent, plan) for every Hermes session in ``path`` (or only ``sessions``), and how many
    rewound messages were left out. Raises NotThisFormat for any other file."""
    source = Path(path).expanduser()
    with open_readonly(source) as conn:
        tables = check_format(conn, source, "hermes")
        columns, session_cols = tables["messages"], tables["sessions"]
        rows = list(conn.execute("SELECT * FROM sessions ORDER BY started_at, id"))
        wanted = set(sessions)
        missing = wanted - {r["id"] for r in rows}
        if missing:
            raise LcmError(f"{source} has no session {', '.join(sorted(missing))}")
        active = " AND active = 1" if "active" in columns else ""
        rewound = 0
        plans: list[tuple[str, SessionPlan]] = []
        for s in rows:
            if wanted and s["id"] not in wanted:
                continue
            if active:
                rewound += conn.execute("SELECT count(*) FROM messages WHERE session_id = ? AND active = 0",
                                        (s["id"],)).fetchone()[0]
            entries = [Entry(where=m["id"], message=_message(m, columns), session_key=s["id"], platform=s["source"],
                             timestamp=m["timestamp"])
                       for m in conn.execute(f"SELECT * FROM messages WHERE session_id = ?{active} ORDER BY id",
                                             (s["id"],))]
            chat = s["chat_id"] if "chat_id" in session_cols else None
            plan = SessionPlan(session_key=s["id"], entries=entries, platform=s["source"] or None,
                               conversation_id=str(chat) if chat else None)
            prompt = s["system_prompt"] if "system_prompt" in session_cols else None
            if prompt:
                plan.system_prompts.append((Entry(where=0, message={"role": "system", "content": prompt},
                                                  session_key=s["id"], timestamp=s["started_at"],
                                                  system_prompt=True), 1))
            plan.origin = {"format": FORMAT, "path": str(source.resolve()), "id": s["id"],
                           **({"parent": s["parent_session_id"]} if "parent_session_id" in session_cols
                              and s["parent_session_id"] else {}),
                           **({"title": s["title"]} if "title" in session_cols and s["title"] else {})}
            profile = s["profile_name"] if "profile_name" in session_cols else None
            plans.append((profile or "default", plan))
    return plans, rewound
