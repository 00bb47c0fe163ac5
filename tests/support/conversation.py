"""Building agent conversations for tests, and checking what the contract says about outputs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega").split()


def filler(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words))


def turn(i: int, *, tools: int = 1, size: int = 30, user: str | None = None) -> list[dict[str, Any]]:
    """One agent turn: a user message, ``tools`` tool rounds, a final answer."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": user or f"Request {i}: {filler(i, size)} fact{i}"}]
    for t in range(tools):
        call = f"call_{i}_{t}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function",
             "function": {"name": "shell", "arguments": json.dumps({"cmd": f"run step{i}-{t}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": call, "content": f"output {i}.{t} {filler(i + t, size)}"})
    msgs.append({"role": "assistant", "content": f"Done with request {i}: {filler(i + 3, size // 2)}"})
    return msgs


def conversation(turns: int, **kw: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.extend(turn(i, **kw))
    return out


def sequence_problems(out: Sequence[dict[str, Any]], system: dict[str, Any] | None = None) -> list[str]:
    """Contract rules for a context handed to the host (empty list: valid)."""
    problems = []
    msgs = list(out)
    if system is not None:
        if not msgs or msgs[0] != system:
            problems.append("the system message is not first and unchanged")
        msgs = msgs[1:]
    if msgs and msgs[0].get("role") != "user":
        problems.append(f"first non-system message is {msgs[0].get('role')}, not user")
    pending: set[str] = set()
    for i, m in enumerate(msgs):
        role = m.get("role")
        if "_db_persisted" in m:
            problems.append(f"message {i} carries _db_persisted")
        if i and role in ("user", "assistant") and msgs[i - 1].get("role") == role:
            problems.append(f"two {role} messages in a row at {i}")
        if role == "assistant":
            if pending:
                problems.append(f"tool calls {sorted(pending)} unanswered before message {i}")
            pending = {c["id"] for c in m.get("tool_calls") or []}
        elif role == "tool":
            if m.get("tool_call_id") not in pending:
                problems.append(f"orphan tool result {m.get('tool_call_id')} at {i}")
            pending.discard(m.get("tool_call_id"))
        elif role == "user" and pending:
            problems.append(f"tool calls {sorted(pending)} unanswered before user message {i}")
    return problems


def newest_user_index(msgs: Sequence[dict[str, Any]]) -> int:
    return max(i for i, m in enumerate(msgs) if m.get("role") == "user" and not m.get("_compressed_summary"))


SYSTEM = {"role": "system", "content": "You are a careful agent."}


def host_tokens(transcript) -> int:
    """The host's rough estimate of a request (what Hermes passes as current_tokens)."""
    return sum(len(json.dumps(m)) // 4 for m in transcript)


def host_step(engine: Any, transcript: list[dict[str, Any]], new: Sequence[dict[str, Any]], *,
              notify: bool = True) -> list[dict[str, Any]]:
    """One host turn: append ``new``, compress under pressure and keep the result, and (when
    ``notify``) report the finished turn as hosts newer than Hermes 0.19 do."""
    transcript = [*transcript, *new]
    tokens = host_tokens(transcript)
    if engine.should_compress(tokens):
        transcript = engine.compress(transcript, current_tokens=tokens)
    if notify:
        engine.on_turn_complete(transcript)
    return transcript


def run_host(engine: Any, turns: int, *, start: int = 0, transcript=None, notify: bool = True,
             **turn_kw):
    """Drive the engine like Hermes for ``turns`` generated turns; (transcript, sent)."""
    transcript = list(transcript) if transcript is not None else [SYSTEM]
    sent = []
    for i in range(start, start + turns):
        new = turn(i, **turn_kw)
        sent.extend(new)
        transcript = host_step(engine, transcript, new, notify=notify)
    return transcript, sent
