"""``lcm_expand_query``: answer a question from the exact stored text, with citations.

Evidence is gathered from the given nodes (their text, then their sources) or from a relevance
search for the question's content words, within a budget; the summarizer's LLM answers citing
``[node:ID]`` / ``[msg:ID]``. With no LLM, the evidence itself comes back (``degraded``).
"""

from __future__ import annotations

import re
from typing import Any

from lcm.context.session import ContextSession
from lcm.messages import message_text
from lcm.records import MessageRecord
from lcm.textindex import STOP_WORDS, tokenize
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE
from lcm.tools.args import Parsed
from lcm.tools.recall import node_in_scope
from lcm.tools.render import clip_prefix
from lcm.tools.retrieval import find
from lcm.tools.specs import EVIDENCE_ITEM_CHARS, EXPAND_SOURCES_CAP

_CITE = re.compile(r"\[(node|msg):(\d+)\]")


def expand_query(context: ContextSession, args: Parsed) -> dict[str, Any]:
    budget = (args.get("context_max_tokens") or context.config.expansion_context_tokens) * CHARS_PER_TOKEN_ESTIMATE
    evidence: list[dict[str, Any]] = []
    used = 0

    def add(kind: str, ident: int, text: str, extra: dict[str, Any]) -> bool:
        nonlocal used
        if used >= budget:
            return False
        body, cut = clip_prefix(text, min(EVIDENCE_ITEM_CHARS, budget - used))
        entry = {"type": kind, ("node_id" if kind == "summary" else "store_id"): ident, "text": body, **extra}
        if cut:
            entry["content_truncated"] = True
        evidence.append(entry)
        used += len(body)
        return True

    if args.get("node_ids"):
        for nid in args["node_ids"]:
            node = node_in_scope(context, nid)
            add("summary", node.id, node.content, {"depth": node.depth})
        for nid in args["node_ids"]:  # then their sources, while the budget lasts
            sources, _ = context.store.summaries.expand(nid, limit=EXPAND_SOURCES_CAP)
            for src in sources:
                ok = add("message", src.store_id, message_text(src.message), {"role": src.role, "seq": src.seq}) \
                    if isinstance(src, MessageRecord) else add("summary", src.id, src.content, {"depth": src.depth})
                if not ok:
                    break
    else:
        query = args.get("query") or evidence_query(args["prompt"])
        searched = find(context, query, mode=None, scope="current", session_pk=context.session.id,
                        sort="relevance", limit=args["max_results"])
        for hit in searched.hits:
            if hit.kind == "summary":
                found = context.store.summaries.get(hit.id, agent=context.agent_id)
                if found is not None:
                    add("summary", found.id, found.content, {"depth": found.depth})
            else:
                rec = context.store.messages.get(hit.id, agent=context.agent_id)
                if rec is not None:
                    add("message", rec.store_id, message_text(rec.message), {"role": rec.role, "seq": rec.seq})
    ids = {"node_ids": [e["node_id"] for e in evidence if e["type"] == "summary"],
           "store_ids": [e["store_id"] for e in evidence if e["type"] == "message"]}
    if not evidence:
        return {"answer": "No stored message or summary matches; nothing to answer from.",
                "cited": {"node_ids": [], "store_ids": []}, "degraded": False, "evidence_count": 0}
    answer, route, problem = context.summarizer.answer(args["prompt"], _frame_evidence(evidence), args["max_tokens"])
    if answer is None:
        return {"answer": "", "degraded": True, "degraded_reason": problem, "evidence": evidence, "cited": ids}
    cited_nodes = sorted({int(i) for k, i in _CITE.findall(answer) if k == "node"} & set(ids["node_ids"]))
    cited_msgs = sorted({int(i) for k, i in _CITE.findall(answer) if k == "msg"} & set(ids["store_ids"]))
    return {"answer": answer, "cited": {"node_ids": cited_nodes, "store_ids": cited_msgs},
            "degraded": False, "route": route, "evidence_count": len(evidence)}


def evidence_query(prompt: str) -> str:
    """A search for a natural-language question: its content words, any of which may match
    (ranking puts rows matching more of them first)."""
    words = [w for w in dict.fromkeys(tokenize(prompt)) if w not in STOP_WORDS]
    return " OR ".join(words) if words else prompt


def _frame_evidence(evidence: list[dict[str, Any]]) -> str:
    parts = ["<evidence>"]
    for e in evidence:
        tag = f"node:{e['node_id']}" if e["type"] == "summary" else f"msg:{e['store_id']}"
        role = f" {e['role']}" if e.get("role") else ""
        parts.append(f"[{tag}{role}]\n{e['text']}")
    parts.append("</evidence>")
    return "\n\n".join(parts)
