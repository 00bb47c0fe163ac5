"""hermes-lcm's store (``lcm.db`` of the Hermes plugin github.com/stephenschoettler/hermes-lcm,
schema version 4, plugin 0.7.0): every session, its messages and its summary DAG.

Mapping (docs/import-hermes-lcm.md):

* a ``messages.session_id`` becomes an lcm session of that id, sessions ordered by their first
  row; ``messages.source`` is its platform; the agent is ``default`` unless named;
* rows in ``store_id`` order become messages in Hermes' shape: role, content exactly as stored
  (NULL stays null), ``tool_calls`` parsed from the column's JSON (the OpenAI list as the host
  sent it), ``tool_call_id``, ``tool_name`` when set; the row's ``timestamp`` is the message time;
* a ``role = 'system'`` row (hermes-lcm stores each session's system prompt as its first row) is
  a version of the session's system prompt, as live ingest keeps it, not a message;
* ``summary_nodes`` (depth 0 over store ids, depth > 0 over node ids) go into lcm's DAG where
  they map cleanly (``lcm.importers.dag``), else become the session's imported notes;
* ``pinned`` rows are listed in the session's origin (lcm has no pins);
* provenance: ``origin`` = {"format": "hermes-lcm", "path", "id", "store_ids": [first, last],
  "summary_nodes", "notes"}.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

from lcm.errors import LcmError
from lcm.importers.dag import plan_dag
from lcm.importers.source import check_format, open_readonly
from lcm.transfer import Entry, ImportedSummary, SessionPlan

FORMAT = "hermes-lcm"


def _message(row: sqlite3.Row) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": row["role"], "content": row["content"]}
    if row["tool_calls"]:
        try:
            msg["tool_calls"] = json.loads(row["tool_calls"])
        except ValueError:
            msg["tool_calls"] = row["tool_calls"]  # kept as the program wrote it
    if row["tool_call_id"]:
        msg["tool_call_id"] = row["tool_call_id"]
    if row["tool_name"]:
        msg["tool_name"] = row["tool_name"]
    return msg


def _ids(text: str | None) -> list[Any]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def read_hermes_lcm(path: str | Path, *, sessions: tuple[str, ...] = ()) -> list[tuple[str, SessionPlan]]:
    """(agent, plan) for every session in the hermes-lcm store at ``path`` (or only
    ``sessions``). Raises NotThisFormat for any other file, before anything is written."""
    source = Path(path).expanduser()
    with open_readonly(source) as conn:
        check_format(conn, source, FORMAT)
        rows = list(conn.execute("SELECT * FROM messages ORDER BY store_id"))
        nodes = list(conn.execute("SELECT * FROM summary_nodes ORDER BY node_id"))
    by_session: dict[str, list[sqlite3.Row]] = defaultdict(list)
    for row in rows:
        by_session[row["session_id"]].append(row)
    missing = set(sessions) - set(by_session)
    if missing:
        raise LcmError(f"{source} has no session {', '.join(sorted(missing))} "
                       f"(it holds {', '.join(by_session) or 'none'})")
    nodes_of: dict[str, list[sqlite3.Row]] = defaultdict(list)
    for node in nodes:
        nodes_of[node["session_id"]].append(node)
    plans: list[tuple[str, SessionPlan]] = []
    for key, session_rows in by_session.items():
        if sessions and key not in sessions:
            continue
        plans.append(("default", _plan(source, key, session_rows, nodes_of[key])))
    return plans


def _plan(source: Path, key: str, rows: list[sqlite3.Row], nodes: list[sqlite3.Row]) -> SessionPlan:
    platform = next((r["source"] for r in rows if r["source"]), None)
    plan = SessionPlan(session_key=key, entries=[], platform=platform)
    index_of: dict[int, int] = {}
    for row in rows:
        message = _message(row)
        if row["role"] == "system":
            plan.add_system_prompt(row["content"] or "", where=row["store_id"], timestamp=row["timestamp"])
            continue
        index_of[row["store_id"]] = len(plan.entries)
        plan.entries.append(Entry(where=row["store_id"], message=message, session_key=key, platform=platform,
                                  timestamp=row["timestamp"]))
    for order, node in enumerate(nodes):
        peer = _ids(node["source_ids"])
        leaf = node["depth"] == 0
        sources = tuple(index_of.get(i, -1) if isinstance(i, int) else -1 for i in peer) if leaf else tuple(
            f"node:{i}" for i in peer)
        plan.summaries.append(ImportedSummary(
            peer_id=f"node:{node['node_id']}", depth=int(node["depth"]), content=node["summary"],
            sources=sources, peer_sources=tuple(peer), order=order, expand_hint=node["expand_hint"] or "",
            created_at=node["created_at"]))
    dag = plan_dag([e.message for e in plan.entries], plan.summaries)
    pinned = [r["store_id"] for r in rows if r["pinned"]]
    plan.origin = {"format": FORMAT, "path": str(source.resolve()), "id": key,
                   "store_ids": [rows[0]["store_id"], rows[-1]["store_id"]],
                   "summary_nodes": len(nodes), **({"pinned_store_ids": pinned} if pinned else {}),
                   **({"notes": dag.notes} if dag.notes else {})}
    return plan
