"""The scripted model behind the end-to-end Hermes tests: an OpenAI-compatible server on
127.0.0.1 (``tests.support.llm_server``) that logs every request and answers like a small agent model.

* lcm's summary requests (its summarizer prompts) get a short summary;
* a user turn ``RECALL <words>`` makes the model call ``lcm_grep`` for the words, then
  ``lcm_expand`` on the first raw message hit, then answer with the expanded text — a real
  round trip through Hermes' tool dispatch into lcm;
* a user turn ``STATUS`` makes the model call ``lcm_status`` and answer ``STATUS OK``;
* any other turn gets a one-line acknowledgement.

Usage is reported the way a caching provider would: prompt tokens estimated from the request
(messages and tool schemas), so Hermes' own pressure checks see realistic numbers, and
``prompt_tokens_details.cached_tokens``: the tools and the part of the messages that repeat the
previous turn request's (a provider's prefix cache; no expiry).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from lcm.messages import strip_recall_blocks
from tests.support.llm_server import Reply, ScriptedLLM, completion, tool_call

SUMMARY_MARKERS = ("You write the memory of an AI agent", "You maintain the long-term memory",
                   "Summarize the material below as at most")
ANSWER_MARKER = "You answer questions about an AI agent's earlier conversation"


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def wired(body: dict[str, Any]) -> list[str]:
    """A request's messages as the provider's cache compares them: each serialized, in order."""
    return [json.dumps(m, ensure_ascii=False, sort_keys=True) for m in body.get("messages") or []]


def repeated_chars(previous: list[str], current: list[str]) -> int:
    """Characters at the start of ``current`` that repeat the start of ``previous``."""
    chars = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            return chars + next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        chars += len(a)
    return chars


def prompt_tokens(body: dict[str, Any]) -> int:
    """A provider-like count of the request (about four characters a token)."""
    size = len(json.dumps(body.get("messages") or [], ensure_ascii=False))
    size += len(json.dumps(body.get("tools") or [], ensure_ascii=False))
    return size // 4


@dataclass
class HermesModel:
    server: ScriptedLLM = field(default_factory=ScriptedLLM)
    calls: int = 0
    replies: list[dict[str, Any]] = field(default_factory=list)  # every assistant message sent to Hermes
    previous_turn: list[str] = field(default_factory=list)  # the last turn request, as the cache saw it

    def __post_init__(self) -> None:
        self.server.handler = self.answer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.server.requests

    def close(self) -> None:
        self.server.close()

    def kind(self, body: dict[str, Any]) -> str:
        system = ScriptedLLM.system_prompt(body)
        if any(m in system for m in SUMMARY_MARKERS):
            return "summary"
        if ANSWER_MARKER in system:
            return "answer"
        if "You are Hermes Agent" in system or body.get("tools"):
            return "turn"
        return "other"  # Hermes' own auxiliary chores (titles and such)

    def turn_requests(self) -> list[dict[str, Any]]:
        return [b for b in self.requests if self.kind(b) == "turn"]

    def answer(self, body: dict[str, Any]) -> Reply:
        reply = self._answer(body)
        if self.kind(body) == "turn":
            self.replies.append(reply.body["choices"][0]["message"])
        return reply

    def _answer(self, body: dict[str, Any]) -> Reply:
        kind = self.kind(body)
        usage: dict[str, Any] = {"prompt_tokens": prompt_tokens(body), "completion_tokens": 12}
        if kind == "turn":
            current = wired(body)
            repeated = repeated_chars(self.previous_turn, current)
            tools = len(json.dumps(body.get("tools") or [], ensure_ascii=False))
            usage["prompt_tokens_details"] = {"cached_tokens": (tools + repeated) // 4 if repeated else 0}
            self.previous_turn = current
        if kind == "summary":
            source = body["messages"][-1]["content"]
            ids = re.findall(r"\[#(\d+)", source)
            span = f"messages {ids[0]}-{ids[-1]}" if ids else "earlier summaries"
            return completion(f"Summary of {span}: the user pasted build logs and the agent acknowledged "
                              "each one.\nExpand for details about: build logs, fingerprints", **usage)
        if kind != "turn":
            return completion("Build log review", **usage)
        messages = body["messages"]
        last = messages[-1]
        self.calls += 1
        if last.get("role") == "tool":
            result = _json(last.get("content"))
            if "cache" in result and "threshold_tokens" in result:  # lcm_status answered
                return completion("STATUS OK", **usage)
            if "results" in result:  # lcm_grep answered: open the newest raw message hit that is
                # not the user's recall request itself (which contains the same words)
                hits = [h for h in result["results"] if h.get("type") == "message"
                        and "RECALL" not in h.get("snippet", "")]
                if not hits:
                    return completion("RECALL FAILED: lcm_grep found no message.", **usage)
                return completion(None, tool_calls=[tool_call(
                    "lcm_expand", {"store_id": hits[0]["store_id"]}, f"call_expand_{self.calls}")], **usage)
            if "item" in result:  # lcm_expand answered: page on to the end, then quote it all
                store_id = result["item"]["store_id"]
                if result.get("has_more"):
                    return completion(None, tool_calls=[tool_call(
                        "lcm_expand", {"store_id": store_id, "content_offset": result["next_content_offset"]},
                        f"call_expand_{self.calls}")], **usage)
                pages = [_json(m.get("content")) for m in messages if m.get("role") == "tool"]
                pages = [p["item"]["message"]["content"] for p in pages
                         if isinstance(p, dict) and p.get("item", {}).get("store_id") == store_id]
                return completion(f"RECALLED store_id={store_id}: {''.join(pages)}", **usage)
            return completion(f"TOOL ERROR: {result.get('error', 'unexpected tool result')}", **usage)
        # What the user typed: lcm's auto-recall block (appended to the API copy) is not a command.
        text = strip_recall_blocks(last.get("content")) if isinstance(last.get("content"), str) else ""
        if text == "STATUS":
            return completion(None, tool_calls=[tool_call("lcm_status", {}, f"call_status_{self.calls}")], **usage)
        if text.startswith("RECALL "):
            return completion(None, tool_calls=[tool_call(
                "lcm_grep", {"query": text[len("RECALL "):].strip()}, f"call_grep_{self.calls}")], **usage)
        return completion(f"Acknowledged part {self.calls}.", **usage)
