"""Hermes' own session store (``state.db`` in the Hermes home, hermes-agent 0.19.0's
``hermes_state.SessionDB``, schema version 22): every conversation and its messages
(docs/import-hermes.md).

Read-only (``mode=ro``): the file may be in use by a running Hermes. Mapping:

* a Hermes conversation becomes one lcm session named by its first session id: a session
  and the sessions that continue it after a compression (Hermes without ``compression.in_place``
  ends the session, ``end_reason = 'compression'``, and starts a child); the children's ids
  become aliases of the lcm session, so a host resuming one of them finds it. Its ``source``
  is the platform, its ``chat_id`` the conversation id, each session's stored
  ``system_prompt`` a system prompt version; the agent is the ``profile_name`` (or the one the
  command line names);
* its messages, in insertion order, **archived generations included** (``active = 0,
  compacted = 1``: what Hermes' compressor summarized away, still on disk), become messages in
  the shape Hermes itself loads (``get_messages_as_conversation``): role, content (decoded from
  Hermes' JSON-content marker), tool calls (parsed), tool call id, tool name, and every other
  field Hermes kept (reasoning, finish reason, platform message id, ``api_content``,
  timestamp), without Hermes' display clean-up, so nothing is lost;
* the copies each compaction re-inserted are recognised and stored once; Hermes' compressor
  summaries are not messages: they are kept as the session's imported notes
  (``origin["notes"]``) and counted (``lcm.importers.hermes_generations`` says how);
* rewound messages (``active = 0, compacted = 0``, which the user took back) are not imported;
  they are counted;
* provenance: ``origin`` = {"format": "hermes-state", "path", "id", "parent" (the session it
  branched from), "title", "continued_as", "compaction_copies", "notes"}.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lcm.errors import LcmError
from lcm.importers.hermes_generations import sort_generations
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


@dataclass
class HermesRead:
    """What ``read_hermes_state`` found: the plans, and what it left out, counted."""

    plans: list[tuple[str, SessionPlan]]
    rewound: int = 0  # rows the user took back (active = 0, compacted = 0)
    copies: int = 0  # rows a compaction re-inserted (copies of messages already kept)
    summaries: int = 0  # Hermes' compressor summaries, kept as the session's imported notes


def _col(row: sqlite3.Row, columns: set[str], name: str) -> Any:
    return row[name] if name in columns else None


def _chains(sessions: list[sqlite3.Row], columns: set[str]) -> dict[str, list[sqlite3.Row]]:
    """root session id -> the sessions of one conversation, in order: a session whose parent
    ended in a compression continues it (Hermes' rotation); any other session is its own."""
    by_id = {s["id"]: s for s in sessions}
    root_of: dict[str, str] = {}
    chains: dict[str, list[sqlite3.Row]] = {}
    for s in sessions:  # started_at order: a parent comes before its child
        parent = by_id.get(_col(s, columns, "parent_session_id"))
        if parent is not None and _col(parent, columns, "end_reason") == "compression" and parent["id"] in root_of:
            root_of[s["id"]] = root_of[parent["id"]]
        else:
            root_of[s["id"]] = s["id"]
        chains.setdefault(root_of[s["id"]], []).append(s)
    return chains


def read_hermes_state(path: str | Path, *, sessions: tuple[str, ...] = ()) -> HermesRead:
    """A plan per conversation in ``path`` (or only the ones holding ``sessions``): every
    message exchanged, once, in order, with compaction copies and Hermes' summaries taken out
    (``lcm.importers.hermes_generations``). Raises NotThisFormat for any other file."""
    source = Path(path).expanduser()
    with open_readonly(source) as conn:
        tables = check_format(conn, source, "hermes")
        columns, session_cols = tables["messages"], tables["sessions"]
        rows = list(conn.execute("SELECT * FROM sessions ORDER BY started_at, id"))
        missing = set(sessions) - {r["id"] for r in rows}
        if missing:
            raise LcmError(f"{source} has no session {', '.join(sorted(missing))}")
        chains = _chains(rows, session_cols)
        wanted = {root for root, chain in chains.items() if any(s["id"] in sessions for s in chain)}
        read = HermesRead(plans=[])
        for root, chain in chains.items():
            if sessions and root not in wanted:
                continue
            read.plans.append(_conversation(conn, source, chain, columns, session_cols, read))
    return read


def _conversation(conn: sqlite3.Connection, source: Path, chain: list[sqlite3.Row], columns: set[str],
                  session_cols: set[str], read: HermesRead) -> tuple[str, SessionPlan]:
    first = chain[0]
    # Rewound rows (the user took them back) are out; rows a compaction archived are in.
    if "active" in columns and "compacted" in columns:
        live, gone = "(active = 1 OR compacted = 1)", "active = 0 AND compacted = 0"
    elif "active" in columns:
        live, gone = "active = 1", "active = 0"
    else:
        live = gone = ""
    rows: list[sqlite3.Row] = []
    starts: list[int] = []  # where each session of the chain starts in ``rows``
    for s in chain:
        starts.append(len(rows))
        rows += conn.execute(f"SELECT * FROM messages WHERE session_id = ?{' AND ' + live if live else ''} "
                             "ORDER BY id", (s["id"],)).fetchall()
        if gone:
            read.rewound += conn.execute(f"SELECT count(*) FROM messages WHERE session_id = ? AND {gone}",
                                         (s["id"],)).fetchone()[0]
    compacted = len(chain) > 1 or ("compacted" in columns and any(r["compacted"] for r in rows))
    messages = [_message(r, columns) for r in rows]
    verdicts = sort_generations(messages, compacted=compacted)
    read.copies += len(verdicts.copies)
    read.summaries += len(verdicts.summaries)
    platform = first["source"] or None
    chat = _col(first, session_cols, "chat_id")
    plan = SessionPlan(session_key=first["id"], entries=[], platform=platform,
                       conversation_id=str(chat) if chat else None)
    kept = iter(verdicts.kept)
    next_kept = next(kept, None)
    for position, s in enumerate(chain):
        prompt = _col(s, session_cols, "system_prompt")
        if prompt:
            plan.add_system_prompt(prompt, where=0, timestamp=s["started_at"])
        end = starts[position + 1] if position + 1 < len(chain) else len(rows)
        while next_kept is not None and next_kept < end:
            message = messages[next_kept]
            if next_kept in verdicts.own_text:
                message = {**message, "content": verdicts.own_text[next_kept]}
            plan.entries.append(Entry(where=rows[next_kept]["id"], message=message, session_key=first["id"],
                                      platform=platform, timestamp=rows[next_kept]["timestamp"]))
            next_kept = next(kept, None)
    notes = [{"kind": "hermes-compressor-summary", "session": rows[i]["session_id"], "row": rows[i]["id"],
              "content": text} for i, text in verdicts.summaries]
    parent = _col(first, session_cols, "parent_session_id")
    title = next((t for t in (_col(s, session_cols, "title") for s in reversed(chain)) if t), None)
    plan.origin = {"format": FORMAT, "path": str(source.resolve()), "id": first["id"],
                   **({"parent": parent} if parent else {}), **({"title": title} if title else {}),
                   **({"continued_as": [s["id"] for s in chain[1:]]} if len(chain) > 1 else {}),
                   **({"compaction_copies": len(verdicts.copies)} if verdicts.copies else {}),
                   **({"notes": notes} if notes else {})}
    plan.aliases = [s["id"] for s in chain[1:]]
    return _col(first, session_cols, "profile_name") or "default", plan
