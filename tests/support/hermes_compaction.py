"""A ``state.db`` written by hermes-agent 0.19.0 itself while its **own compressor** compacts a
long conversation: the real host (``hermes chat -q ... --resume``, one process per turn, no lcm
installed) against a scripted model on 127.0.0.1, which logs what was exchanged so a test knows
the exact conversation the file must give back.

Each turn pastes ~9,500 tokens of log; every fourth turn asks for a command, which the model runs
through Hermes' ``terminal`` tool (``echo``) before answering. With Hermes' 64k window (its
compression threshold is floored at 75%, 48k tokens), the compressor first fires after ~5 turns
and again ~4 turns later: 11 turns compact at least twice (six times, some in the middle of a
turn). ``in_place=True`` is Hermes' in-place compaction (``archive_and_compact``: old rows
flagged ``active = 0, compacted = 1`` and copies re-inserted), ``False`` its default rotation
(the session ends with ``end_reason = 'compression'`` and a child continues it).
Finally the last turn is taken back with Hermes' own ``SessionDB.rewind_to_message`` (what
``/undo`` does), so the file also holds rewound rows.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.hermes_host import HermesHome
from tests.support.hermes_model import prompt_tokens
from tests.support.llm_server import Reply, ScriptedLLM, completion, tool_call

TURNS = 11
SUMMARY_TEXT = "compressor summary {n}: the user pasted build logs {first}..{last} and the agent noted each."


def prompt(turn: int) -> str:
    words = " ".join(f"l{turn}-{j} build step passed in {j % 97} ms" for j in range(1_000))
    command = f" RUN: zqword{turn}" if turn % 4 == 1 else ""
    return f"Turn {turn}: zqturn{turn}{command}\n{words}"


@dataclass
class CompressingModel:
    """Answers Hermes' turns and its compressor's summary requests, and keeps the conversation
    as it went: what Hermes sent (user turns, tool results) and what the model said."""

    server: ScriptedLLM = field(default_factory=ScriptedLLM)
    exchanged: list[dict[str, Any]] = field(default_factory=list)
    summaries: int = 0
    calls: int = 0

    def __post_init__(self) -> None:
        self.server.handler = self.answer

    def answer(self, body: dict[str, Any]) -> Reply:
        usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": 12}
        if not body.get("tools"):  # the compressor's summary call (and Hermes' title chores)
            text = json.dumps(body.get("messages"))
            turns = [t for t in range(TURNS) if f"zqturn{t} " in text or f"zqturn{t}\\n" in text]
            if "summar" not in text.lower():
                return completion("Build log review", **usage)
            self.summaries += 1
            return completion(SUMMARY_TEXT.format(n=self.summaries, first=min(turns, default=0),
                                                  last=max(turns, default=0)), **usage)
        self.calls += 1
        last = body["messages"][-1]
        if last.get("role") == "tool":
            self.exchanged.append({"role": "tool", "tool_call_id": last.get("tool_call_id"),
                                   "content": last.get("content")})
            reply: dict[str, Any] = {"role": "assistant", "content": f"The command said: {last.get('content')}"}
            self.exchanged.append(reply)
            return completion(reply["content"], **usage)
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        self.exchanged.append({"role": "user", "content": text})
        if " RUN: " in text.split("\n", 1)[0]:
            word = text.split("\n", 1)[0].split(" RUN: ")[1]
            call = tool_call("terminal", {"command": f"echo {word}"}, f"call_run_{self.calls}")
            self.exchanged.append({"role": "assistant", "content": None, "tool_calls": [call]})
            return completion(None, tool_calls=[call], **usage)
        reply = {"role": "assistant", "content": f"Noted part {self.calls}."}
        self.exchanged.append(reply)
        return completion(reply["content"], **usage)


@dataclass
class CompactedStateDb:
    path: Path
    session_ids: list[str]  # every session the run went through, in order
    exchanged: list[dict[str, Any]]  # the conversation, as the model saw it, without the rewound turn
    rewound: int  # rows taken back by the final rewind
    summaries: int  # compressor summaries the model wrote
    rows: dict[str, int]  # the file's shape: rows by (active, compacted)


def write_compacted_state_db(venv: Path, home: Path, *, in_place: bool) -> CompactedStateDb:
    model = CompressingModel()
    try:
        hermes = HermesHome(venv, home, model.server.url)
        hermes.configure()
        with open(home / "config.yaml", "a", encoding="utf-8") as config:
            config.write(f"compression:\n  enabled: true\n  in_place: {'true' if in_place else 'false'}\n")
        session: str | None = None
        seen: list[str] = []
        for turn in range(TURNS):
            done = hermes.chat(prompt(turn), resume=session)
            if done.returncode != 0:
                raise AssertionError(f"hermes chat failed at turn {turn}: {done.stderr[-2000:]}")
            session = done.session_id
            if session not in seen:
                seen.append(session)
    finally:
        model.server.close()
    path = home / "state.db"
    # Take the last turn back as /undo does, with Hermes' own code.
    with sqlite3.connect(path) as conn:
        last_user = conn.execute("SELECT id FROM messages WHERE session_id = ? AND role = 'user' AND active = 1 "
                                 "ORDER BY id DESC LIMIT 1", (seen[-1],)).fetchone()[0]
        before = conn.execute("SELECT count(*) FROM messages WHERE active = 0 AND compacted = 0").fetchone()[0]
    undo = hermes.python("import sys; from pathlib import Path; from hermes_state import SessionDB; "
                         f"db = SessionDB(Path({str(path)!r})); "
                         f"print(db.rewind_to_message({seen[-1]!r}, {last_user})); db.close()")
    if undo.returncode != 0:
        raise AssertionError(f"rewind failed: {undo.stderr[-2000:]}")
    with sqlite3.connect(path) as conn:
        after = conn.execute("SELECT count(*) FROM messages WHERE active = 0 AND compacted = 0").fetchone()[0]
        shape = {f"active={a},compacted={c}": n for a, c, n in conn.execute(
            "SELECT active, compacted, count(*) FROM messages GROUP BY 1, 2")}
    last_turn = max(i for i, m in enumerate(model.exchanged) if m["role"] == "user")
    return CompactedStateDb(path, seen, model.exchanged[:last_turn], after - before, model.summaries, shape)
