"""The agent tools: get back, exactly, what compaction moved out of the prompt.

``lcm_grep`` searches, ``lcm_describe`` shows the summary DAG, ``lcm_expand`` opens a summary
(its sources, paged) or a stored message (its text, paged), ``lcm_expand_query`` answers a
question from expanded evidence, ``lcm_load_session`` pages a whole session, ``lcm_status`` and
``lcm_doctor`` report on the engine and the store.

Rules every tool follows (``../shared/CONTRACT.md``):
  * the answer is always a JSON string; a bad argument, an unknown tool or an id that does not
    exist *for this agent* gives ``{"error": "..."}`` saying what to do instead — an id of
    another agent and an id that does not exist give the same "not found";
  * the default scope is the current session of the current agent; other sessions of the same
    agent only when asked (``session_scope``/``session_id``); never another agent's rows;
  * every response is bounded: rows (``limit_clamped_from`` when a limit was clamped) and text
    (``content_truncated``), with offsets/cursors that page through everything exactly.
    Text offsets count Unicode code points. A message's paged "text content" is its
    ``content`` string, or the compact JSON of a non-string ``content``.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Callable

from lcm.messages import message_text
from lcm.records import SORT_MODES, MessageRecord, SearchHit, SessionRecord, SummaryRecord
from lcm.tool_args import Arg, ArgumentError, Parsed, parse_args

if TYPE_CHECKING:  # pragma: no cover
    from lcm.engine import LcmEngine

GREP_LIMIT_CAP = 200
DESCRIBE_NODES_CAP = 50
DESCRIBE_SOURCE_IDS_CAP = 500
NODE_CONTENT_CAP = 20_000
EXPAND_SOURCES_CAP = 50
EXPAND_MAX_TOKENS_CAP = 16_000
PAGE_CHARS_DEFAULT = 8_000
PAGE_CHARS_CAP = 20_000
LOAD_LIMIT_CAP = 200
LOAD_CHARS_CAP = 20_000
QUERY_RESULTS_CAP = 50
QUERY_ANSWER_TOKENS_CAP = 4_000
QUERY_CONTEXT_TOKENS_CAP = 128_000
EVIDENCE_ITEM_CHARS = 6_000
FIELD_CHARS_CAP = 8_000  # any non-content field of a message item (tool calls, extras)
CHARS_PER_TOKEN = 4
_QUESTION_WORDS = frozenset("""a an and are as at be but by can could did do does for from had has
have how i if in is it its me my of on or our should so than that the their them then there these
they this to us was we were what when where which who whom why will with would you your about
any did does find tell show give""".split())

NOT_FOUND_NODE = "node {id} not found in this agent's summaries; lcm_describe lists the node ids"
NOT_FOUND_STORE = "store_id {id} not found in this agent's messages; lcm_grep returns store ids"
NOT_FOUND_SESSION = ("session {id!r} not found for this agent; session ids come from lcm_grep "
                     "results (session_scope='all') or lcm_status")

SPECS: dict[str, tuple[str, list[Arg]]] = {
    "lcm_grep": (
        "Search this conversation's full history, including everything compacted out of the "
        "prompt: raw messages and summaries. Words must all match; \"quoted phrases\", prefix*, "
        "OR and -exclusion work. Each hit has the store_id or node_id to open with lcm_expand.",
        [Arg("query", "string", required=True, description="Words to find."),
         Arg("limit", "integer", default=10, minimum=1, cap=GREP_LIMIT_CAP, description="Hits to return."),
         Arg("sort", "string", default="recency", choices=SORT_MODES,
             description="recency (newest first), relevance (best match among the newest matches), or hybrid."),
         Arg("session_scope", "string", default="current", choices=("current", "all", "session"),
             description="current session (messages and summaries), all of this agent's sessions, or the session given by session_id (raw messages only for all/session)."),
         Arg("session_id", "string", description="The session to search when session_scope is 'session'."),
         Arg("role", "string", description="Only messages of this role (user, assistant, tool, system)."),
         Arg("time_from", "timestamp", description="Only messages at or after this time: Unix seconds or ISO-8601 with a time zone."),
         Arg("time_to", "timestamp", description="Only messages at or before this time: Unix seconds or ISO-8601 with a time zone."),
         Arg("source", "string", description="Only sessions from this platform (cli, telegram, ...).")]),
    "lcm_describe": (
        "Show the summary DAG of the current session (no argument: node ids per depth with what "
        "they are about) or one summary node in full (node_id: its text, sources and parent).",
        [Arg("node_id", "integer", minimum=1, description="A summary node id.")]),
    "lcm_expand": (
        "Recover exact original text. node_id: a page of the summary's sources (messages for a "
        "depth-0 summary, child summaries above). store_id: one stored message, its text paged "
        "with content_offset. Give exactly one of node_id and store_id.",
        [Arg("node_id", "integer", minimum=1, description="A summary node id."),
         Arg("store_id", "integer", minimum=1, description="A stored message id (any session of this agent)."),
         Arg("max_tokens", "integer", minimum=50, cap=EXPAND_MAX_TOKENS_CAP,
             description="Budget for the returned text (node sources, or one page of a message)."),
         Arg("source_offset", "integer", minimum=0, description="First source to return (node_id). Default 0."),
         Arg("source_limit", "integer", minimum=1, cap=EXPAND_SOURCES_CAP, description="Sources per page (node_id). Default 10."),
         Arg("content_offset", "integer", minimum=0,
             description="Character offset into the message's text (store_id). Default 0."),
         Arg("field", "string",
             description="Which part of the message to page with content_offset (store_id): "
                         "content (default), or a field reported in fields_truncated, e.g. tool_calls.")]),
    "lcm_expand_query": (
        "Answer a question about earlier parts of the conversation from the exact stored text: "
        "finds matching summaries and messages (query) or opens given nodes (node_ids), then "
        "answers with citations [node:ID] / [msg:ID].",
        [Arg("prompt", "string", required=True, description="The question to answer."),
         Arg("query", "string", description="Search words for finding evidence (default: the prompt)."),
         Arg("node_ids", "integer_list", cap=QUERY_RESULTS_CAP, description="Summary nodes to use as evidence."),
         Arg("max_results", "integer", default=8, minimum=1, cap=QUERY_RESULTS_CAP, description="Search hits to use."),
         Arg("max_tokens", "integer", default=800, minimum=50, cap=QUERY_ANSWER_TOKENS_CAP, description="Length of the answer."),
         Arg("context_max_tokens", "integer", minimum=256, cap=QUERY_CONTEXT_TOKENS_CAP,
             description="Budget for the evidence (default LCM_EXPANSION_CONTEXT_TOKENS).")]),
    "lcm_load_session": (
        "Read a whole session in order, page by page (not a search): raw messages in store order, "
        "each cut to max_content_chars (lcm_expand(store_id) has the rest).",
        [Arg("session_id", "string", required=True, description="A session of this agent."),
         Arg("limit", "integer", default=100, minimum=1, cap=LOAD_LIMIT_CAP, description="Messages per page."),
         Arg("after_store_id", "integer", minimum=1, description="The next_cursor of the previous page."),
         Arg("max_content_chars", "integer", default=4_000, minimum=1, cap=LOAD_CHARS_CAP,
             description="Characters of each message's text."),
         Arg("roles", "string_list", description="Only these roles, e.g. [\"user\", \"assistant\"].")]),
    "lcm_status": ("Context engine state: stored messages, summaries per depth, context pressure, "
                   "last compaction and why, database and summarizer.", []),
    "lcm_doctor": ("Health checks of the lcm store and configuration: integrity, schema, search "
                   "index, summary DAG coverage, settings.", []),
}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"name": name, "description": desc,
     "parameters": {"type": "object", "properties": {a.name: a.json_schema() for a in spec},
                    "required": [a.name for a in spec if a.required], "additionalProperties": False}}
    for name, (desc, spec) in SPECS.items()
]


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, default=str)


def run_tool(engine: "LcmEngine", name: str, args: Any) -> str:
    """Dispatch one tool call; always a JSON string, errors included."""
    handler = HANDLERS.get(name)
    if handler is None:
        return dumps({"error": f"unknown tool {name!r}; lcm provides {', '.join(SPECS)}"})
    try:
        parsed = parse_args(name, SPECS[name][1], args)
        payload = handler(engine, parsed)
    except ArgumentError as exc:
        return dumps({"error": str(exc)})
    for arg, asked in parsed.clamped.items():
        row_limit = arg in ("limit", "source_limit", "max_results", "node_ids")
        payload.setdefault("limit_clamped_from" if row_limit else f"{arg}_clamped_from", asked)
    return dumps(payload)


# --------------------------------------------------------------------------- helpers


def field_text(value: Any) -> str:
    """What paging pages over: a string as it is, anything else as its compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def text_content(message: dict[str, Any]) -> str:
    """A message's paged "text content": its content string, or the JSON of other content."""
    return field_text(message.get("content"))


def bounded_message(message: dict[str, Any], max_chars: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(message with its text cut to ``max_chars`` and any other field to FIELD_CHARS_CAP,
    flags describing what was cut)."""
    msg = dict(message)
    flags: dict[str, Any] = {}
    text = text_content(msg)
    if len(text) > max_chars:
        msg["content"] = text[:max_chars]
        flags.update({"content_truncated": True, "content_chars": len(text)})
        if not isinstance(message.get("content"), str):
            flags["content_format"] = "json"
    cut_fields = []
    for key, value in list(msg.items()):
        if key in ("content", "role"):
            continue
        encoded = field_text(value)
        if len(encoded) > FIELD_CHARS_CAP:
            msg[key] = encoded[:FIELD_CHARS_CAP]
            cut_fields.append(key)
    if cut_fields:  # each such field now holds the start of its compact JSON (or string)
        flags["fields_truncated"] = cut_fields
    return msg, flags


def message_item(rec: MessageRecord, max_chars: int) -> dict[str, Any]:
    msg, flags = bounded_message(rec.message, max_chars)
    item = rec.to_item()
    item["message"] = msg
    item.update(flags)
    return item


def _session_for(engine: "LcmEngine", key: str) -> SessionRecord:
    session = engine.store.sessions.find(engine.agent_id, key)
    if session is None:
        raise ArgumentError(NOT_FOUND_SESSION.format(id=key))
    return session


def _node(engine: "LcmEngine", node_id: int) -> SummaryRecord:
    """A summary node in the current session's scope: its own DAG, the summaries carried into
    it (and their sources), and its parents' if it is a fork. A node of another session of the
    agent is "not found", like one of another agent (the contract's default scope)."""
    node = engine.store.summaries.get(node_id, agent=engine.agent_id)
    if node is None or node.session_pk not in _node_sessions(engine):
        raise ArgumentError(NOT_FOUND_NODE.format(id=node_id))
    return node


def _node_sessions(engine: "LcmEngine") -> set[int]:
    store, session = engine.store, engine.session
    allowed = {session.id}
    current = session
    while current.parent_id is not None and current.parent_id not in allowed:
        allowed.add(current.parent_id)
        current = store.sessions.get(current.parent_id)
    for pk in list(allowed):
        allowed.update(n.session_pk for n in store.summaries.carried(pk))
    return allowed


def _clip(text: str, chars: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= chars else (text[:chars], True)


# --------------------------------------------------------------------------- lcm_grep


def _hit_message(hit: SearchHit) -> dict[str, Any]:
    out = {"type": "message", "store_id": hit.id, "session_id": hit.session_key, "role": hit.role,
           "timestamp": hit.ts, "snippet": hit.snippet}
    if hit.score is not None:
        out["score"] = round(hit.score, 6)
    return out


def _hit_summary(hit: SearchHit) -> dict[str, Any]:
    out = {"type": "summary", "node_id": hit.id, "depth": hit.depth, "session_id": hit.session_key,
           "timestamp": hit.ts, "snippet": hit.snippet}
    if hit.score is not None:
        out["score"] = round(hit.score, 6)
    return out


def _merge(messages: list[SearchHit], summaries: list[SearchHit], sort: str, limit: int) -> list[SearchHit]:
    if sort == "recency":
        return sorted(messages + summaries, key=lambda h: (-h.ts, h.kind != "message", -h.id))[:limit]
    ranked = [(i, 0, h) for i, h in enumerate(messages)] + [(i, 1, h) for i, h in enumerate(summaries)]
    return [h for _, _, h in sorted(ranked, key=lambda t: (t[0], t[1]))][:limit]


def grep(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    store, agent = engine.store, engine.agent_id
    scope, sort, limit = a["session_scope"], a["sort"], a["limit"]
    if a.get("session_id") is not None and scope != "session":
        raise ArgumentError("session_id is only used with session_scope='session'")
    roles = (a["role"],) if a.get("role") else ()
    filters = dict(roles=roles, platform=a.get("source"), time_from=a.get("time_from"),
                   time_to=a.get("time_to"))
    if scope == "session":
        if not a.get("session_id"):
            raise ArgumentError("session_scope='session' needs session_id")
        session_pk: int | None = _session_for(engine, a["session_id"]).id
    elif scope == "all":
        session_pk = None
    else:
        session_pk = engine.session.id
    found = store.search.messages(a["query"], agent=agent, session_pk=session_pk, sort=sort,
                                  limit=limit, **filters)
    payload: dict[str, Any] = {"scope": scope}
    hits = list(found.hits)
    summary_hits: list[SearchHit] = []
    if scope == "current":
        if roles or a.get("time_from") is not None or a.get("time_to") is not None or a.get("source"):
            payload["summary_results_omitted"] = True  # filters apply to raw messages only
        else:
            summary_hits = _current_summary_hits(engine, a["query"], sort, limit)
    results = _merge(hits, summary_hits, sort, limit)
    payload["results"] = [_hit_message(h) if h.kind == "message" else _hit_summary(h) for h in results]
    payload["total_results"] = len(payload["results"])
    if found.candidates_clamped:
        payload["candidates_clamped"] = True
    if found.notes:
        payload["notes"] = list(found.notes)
    return payload


def _current_summary_hits(engine: "LcmEngine", query: str, sort: str, limit: int) -> list[SearchHit]:
    """Summaries of the current session, plus those carried into it from earlier sessions."""
    store, agent, session = engine.store, engine.agent_id, engine.session
    hits = list(store.search.summaries(query, agent=agent, session_pk=session.id, sort=sort, limit=limit).hits)
    carried = {n.id for n in store.summaries.carried(session.id)}
    if carried:
        wider = store.search.summaries(query, agent=agent, sort=sort, limit=GREP_LIMIT_CAP).hits
        hits.extend(h for h in wider if h.id in carried)
        if sort == "recency":
            hits.sort(key=lambda h: -h.ts)
    return hits[:limit]


# --------------------------------------------------------------------------- lcm_describe


def _node_brief(node: SummaryRecord, carried: bool = False) -> dict[str, Any]:
    brief = {"node_id": node.id, "token_count": node.token_count, "condensed_into": node.parent_id,
             "expand_hint": node.expand_hint, "covers": f"messages {node.first_seq}-{node.last_seq}",
             "kind": node.kind}
    if carried:
        brief["carried"] = True
    return brief


def describe(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    store = engine.store
    if a.get("node_id") is None:
        session = engine.session
        stats = {d.depth: d for d in store.summaries.depth_stats(session.id)}
        carried = store.summaries.carried(session.id)
        depths: dict[str, Any] = {}
        payload: dict[str, Any] = {"session_id": session.session_key, "depths": depths}
        all_depths = sorted(set(stats) | {n.depth for n in carried})
        for depth in all_depths:
            own = store.summaries.list(session.id, depth=depth, limit=DESCRIBE_NODES_CAP)
            mine = [n for n in carried if n.depth == depth]
            st = stats.get(depth)
            count = (st.count if st else 0) + len(mine)
            entry = {"count": count,
                     "uncondensed": (st.uncondensed if st else 0) + sum(1 for n in mine if n.parent_id is None),
                     "nodes": [_node_brief(n, True) for n in mine] + [_node_brief(n) for n in own]}
            if count > DESCRIBE_NODES_CAP:
                entry["nodes"] = entry["nodes"][:DESCRIBE_NODES_CAP]
                entry["limit_clamped_from"] = count
            depths[f"d{depth}"] = entry
        return payload
    node = _node(engine, a["node_id"])
    source_ids = store.summaries.source_ids(node.id)
    content, cut = _clip(node.content, NODE_CONTENT_CAP)
    payload = {"node_id": node.id, "depth": node.depth, "content": content,
               "token_count": node.token_count, "source_token_count": node.source_token_count,
               "source_type": node.source_type, "source_ids": source_ids[:DESCRIBE_SOURCE_IDS_CAP],
               "parent_id": node.parent_id, "earliest_at": node.earliest_at,
               "latest_at": node.latest_at, "expand_hint": node.expand_hint, "kind": node.kind,
               "model": node.model, "covers": f"messages {node.first_seq}-{node.last_seq}",
               "session_id": (store.sessions.keys(node.session_pk) or [None])[0]}
    if cut:
        payload["content_truncated"] = True
    if len(source_ids) > DESCRIBE_SOURCE_IDS_CAP:
        payload["limit_clamped_from"] = len(source_ids)
    return payload


# --------------------------------------------------------------------------- lcm_expand


def expand(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    if (a.get("node_id") is None) == (a.get("store_id") is None):
        raise ArgumentError("lcm_expand needs exactly one of node_id (a summary) and store_id (a message)")
    if a.get("node_id") is not None:
        if a.get("content_offset") is not None:
            raise ArgumentError("content_offset pages one message: use it with store_id")
        return _expand_node(engine, a)
    if a.get("source_offset") is not None or a.get("source_limit") is not None:
        raise ArgumentError("source_offset and source_limit page a node's sources: use them with node_id")
    return _expand_message(engine, a)


def _expand_node(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    node = _node(engine, a["node_id"])
    offset, limit = a.get("source_offset", 0), a.get("source_limit", 10)
    budget_chars = (a.get("max_tokens") or 4_000) * CHARS_PER_TOKEN
    sources, total = engine.store.summaries.expand(node.id, offset=offset, limit=limit)
    if offset > total:
        raise ArgumentError(f"source_offset {offset} is past the last source ({total} sources)")
    items: list[dict[str, Any]] = []
    used = 0
    for src in sources:
        room = max(500, budget_chars - used)
        if items and used >= budget_chars:
            break
        if isinstance(src, MessageRecord):
            item = message_item(src, room)
            used += min(len(text_content(src.message)), room)
        else:
            content, cut = _clip(src.content, room)
            item = {"node_id": src.id, "depth": src.depth, "content": content,
                    "token_count": src.token_count, "expand_hint": src.expand_hint}
            if cut:
                item["content_truncated"] = True
            used += len(content)
        items.append(item)
    next_offset = offset + len(items)
    has_more = next_offset < total
    return {"node_id": node.id, "depth": node.depth, "source_type": node.source_type,
            "expanded": items,
            "pagination": {"source_offset": offset, "source_limit": limit, "total_sources": total,
                           "next_source_offset": next_offset if has_more else None,
                           "has_more": has_more}}


def _expand_message(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    """One page of a stored message's text: its content by default, or (``field``) any other
    field, so that a 1 MB tool-call argument is as recoverable as a 1 MB tool result."""
    rec = engine.store.messages.get(a["store_id"], agent=engine.agent_id)
    if rec is None:
        raise ArgumentError(NOT_FOUND_STORE.format(id=a["store_id"]))
    field = a.get("field") or "content"
    if field == "role" or (field != "content" and field not in rec.message):
        others = sorted(k for k in rec.message if k != "role")
        raise ArgumentError(f"message {rec.store_id} has no field {field!r} to page; it has: "
                            f"{', '.join(others) or 'no fields'}")
    text = field_text(rec.message.get(field))
    offset = a.get("content_offset", 0)
    if offset > len(text):
        raise ArgumentError(f"content_offset {offset} is past the end of the {field} "
                            f"({len(text)} characters)")
    page_chars = min(PAGE_CHARS_CAP, a["max_tokens"] * CHARS_PER_TOKEN) if a.get("max_tokens") else PAGE_CHARS_DEFAULT
    page = text[offset: offset + page_chars]
    end = offset + len(page)
    if field == "content":
        msg, flags = bounded_message({**rec.message, "content": page} if text else rec.message, PAGE_CHARS_CAP)
    else:  # the paged field in full; the rest of the message bounded as in a listing
        msg, flags = bounded_message({k: v for k, v in rec.message.items() if k != field}, PAGE_CHARS_DEFAULT)
        msg[field] = page
    item = rec.to_item()
    item["message"] = msg
    item.update({k: v for k, v in flags.items() if k != "content_format"})
    if text and not isinstance(rec.message.get(field), str):
        item["content_format"] = "json"
    payload = {"item": item,
               "from_current_session": engine._session is not None and rec.session_pk == engine._session.id,
               "content_offset": offset, "next_content_offset": end if end < len(text) else None,
               "content_chars": len(text), "content_truncated": offset > 0 or end < len(text),
               "has_more": end < len(text)}
    if field != "content":
        payload["field"] = field
    return payload


# --------------------------------------------------------------------------- lcm_expand_query

_CITE = re.compile(r"\[(node|msg):(\d+)\]")


def expand_query(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    budget = (a.get("context_max_tokens") or engine.config.expansion_context_tokens) * CHARS_PER_TOKEN
    evidence: list[dict[str, Any]] = []
    used = 0

    def add(kind: str, ident: int, text: str, extra: dict[str, Any]) -> bool:
        nonlocal used
        if used >= budget:
            return False
        body, cut = _clip(text, min(EVIDENCE_ITEM_CHARS, budget - used))
        entry = {"type": kind, ("node_id" if kind == "summary" else "store_id"): ident, "text": body, **extra}
        if cut:
            entry["content_truncated"] = True
        evidence.append(entry)
        used += len(body)
        return True

    if a.get("node_ids"):
        for nid in a["node_ids"]:
            node = _node(engine, nid)
            add("summary", node.id, node.content, {"depth": node.depth})
        for nid in a["node_ids"]:  # then their sources, while the budget lasts
            sources, _ = engine.store.summaries.expand(nid, limit=EXPAND_SOURCES_CAP)
            for src in sources:
                ok = add("message", src.store_id, message_text(src.message), {"role": src.role, "seq": src.seq}) \
                    if isinstance(src, MessageRecord) else add("summary", src.id, src.content, {"depth": src.depth})
                if not ok:
                    break
    else:
        query = a.get("query") or evidence_query(a["prompt"])
        hits = _merge(list(engine.store.search.messages(query, agent=engine.agent_id,
                                                         session_pk=engine.session.id, sort="relevance",
                                                         limit=a["max_results"]).hits),
                      _current_summary_hits(engine, query, "relevance", a["max_results"]),
                      "relevance", a["max_results"])
        for hit in hits:
            if hit.kind == "summary":
                node = engine.store.summaries.get(hit.id, agent=engine.agent_id)
                if node is not None:
                    add("summary", node.id, node.content, {"depth": node.depth})
            else:
                rec = engine.store.messages.get(hit.id, agent=engine.agent_id)
                if rec is not None:
                    add("message", rec.store_id, message_text(rec.message), {"role": rec.role, "seq": rec.seq})
    ids = {"node_ids": [e["node_id"] for e in evidence if e["type"] == "summary"],
           "store_ids": [e["store_id"] for e in evidence if e["type"] == "message"]}
    if not evidence:
        return {"answer": "No stored message or summary matches; nothing to answer from.",
                "cited": {"node_ids": [], "store_ids": []}, "degraded": False, "evidence_count": 0}
    answer, route, problem = engine.summarizer.answer(a["prompt"], _frame_evidence(evidence), a["max_tokens"])
    if answer is None:
        return {"answer": "", "degraded": True, "degraded_reason": problem, "evidence": evidence, "cited": ids}
    cited_nodes = sorted({int(i) for k, i in _CITE.findall(answer) if k == "node"} & set(ids["node_ids"]))
    cited_msgs = sorted({int(i) for k, i in _CITE.findall(answer) if k == "msg"} & set(ids["store_ids"]))
    return {"answer": answer, "cited": {"node_ids": cited_nodes, "store_ids": cited_msgs},
            "degraded": False, "route": route, "evidence_count": len(evidence)}


def evidence_query(prompt: str) -> str:
    """A search for a natural-language question: its content words, any of which may match
    (ranking puts rows matching more of them first)."""
    from lcm.textindex import tokenize

    words = [w for w in dict.fromkeys(tokenize(prompt)) if w not in _QUESTION_WORDS]
    return " OR ".join(words) if words else prompt


def _frame_evidence(evidence: list[dict[str, Any]]) -> str:
    parts = ["<evidence>"]
    for e in evidence:
        tag = f"node:{e['node_id']}" if e["type"] == "summary" else f"msg:{e['store_id']}"
        role = f" {e['role']}" if e.get("role") else ""
        parts.append(f"[{tag}{role}]\n{e['text']}")
    parts.append("</evidence>")
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- lcm_load_session


def load_session(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    session = _session_for(engine, a["session_id"])
    after = a.get("after_store_id")
    if after is not None:
        anchor = engine.store.messages.get(after, agent=engine.agent_id)
        if anchor is None or anchor.session_pk != session.id:
            raise ArgumentError(f"after_store_id {after} is not a message of session {a['session_id']!r}; "
                                "pass the next_cursor of the previous page")
    records, cursor = engine.store.messages.page(session.id, after_store_id=after, limit=a["limit"],
                                                 roles=a.get("roles") or None)
    return {"session_id": session.session_key,
            "messages": [message_item(r, a["max_content_chars"]) for r in records],
            "next_cursor": cursor}


# --------------------------------------------------------------------------- status, doctor


def status(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    store = engine.store
    session = store.sessions.get(engine.session.id)
    nodes = {f"d{d.depth}": d.count for d in store.summaries.depth_stats(session.id)}
    summarizer = engine.summarizer.describe()
    last = engine._last_outcome or session.last_compaction or {}
    return {
        "agent_id": engine.agent_id, "session_id": session.session_key,
        "session_ids": store.sessions.keys(session.id),
        "compression_count": engine.compression_count, "stored_messages": session.message_count,
        "skipped_messages": session.skipped_count,
        "fork_of": ({"session_id": store.sessions.get(session.parent_id).session_key,
                     "after_seq": session.fork_seq} if session.parent_id is not None else None),
        "forks": [f.session_key for f in store.sessions.forks(session.id)],
        "raw_messages": session.last_seq - session.covered_seq, "raw_tokens": session.raw_tokens,
        "nodes_by_depth": nodes,
        "carried_summaries": len(store.summaries.carried(session.id)),
        "context_length": engine.context_length, "threshold_tokens": engine.threshold_tokens,
        "last_prompt_tokens": max(engine.last_prompt_tokens, 0),
        "max_assembly_tokens": engine.assembly_cap,
        "backend": store.backend_name, "database": store.location,
        "summarizer": {"route": summarizer["route"], "mode": summarizer["mode"],
                       "fallbacks": summarizer["fallbacks"], "breaker": summarizer["breaker"]},
        "last_compaction": {"status": last.get("status", "none"),
                            "reason": last.get("reason", "no compaction has run in this session yet"),
                            **{k: last[k] for k in ("passes", "leaves", "condensed", "tokens_before",
                                                     "tokens_after", "assembled_tokens", "over_budget")
                               if k in last}},
        "last_error": engine._last_error,
    }


def doctor(engine: "LcmEngine", a: Parsed) -> dict[str, Any]:
    checks = [c.as_dict() for c in engine.store.health.checks(deep=False)]
    checks.extend(config_checks(engine))
    worst = "fail" if any(c["status"] == "fail" for c in checks) else (
        "warn" if any(c["status"] == "warn" for c in checks) else "ok")
    return {"overall": {"ok": "healthy", "warn": "warnings", "fail": "unhealthy"}[worst], "checks": checks}


def config_checks(engine: "LcmEngine") -> list[dict[str, str]]:
    cfg, out = engine.config, []
    window = engine.context_length
    if window and cfg.leaf_chunk_tokens > window // 2:
        out.append({"name": "config_leaf_chunk", "status": "warn",
                    "detail": f"LCM_LEAF_CHUNK_TOKENS={cfg.leaf_chunk_tokens} is over half the "
                              f"{window}-token window: summarizer calls may not fit the model"})
    else:
        out.append({"name": "config_leaf_chunk", "status": "ok",
                    "detail": f"leaf chunks of up to {cfg.leaf_chunk_tokens} tokens"})
    if window and cfg.fresh_tail_max_tokens and cfg.fresh_tail_max_tokens >= engine.assembly_cap:
        out.append({"name": "config_fresh_tail", "status": "warn",
                    "detail": "LCM_FRESH_TAIL_MAX_TOKENS is not below the assembly cap: the fresh "
                              "tail alone could fill the context"})
    else:
        out.append({"name": "config_fresh_tail", "status": "ok",
                    "detail": f"fresh tail: {cfg.fresh_tail_count} messages"
                              + (f", at most {cfg.fresh_tail_max_tokens} tokens" if cfg.fresh_tail_max_tokens else "")})
    summ = engine.summarizer.describe()
    broken = [n for n, st in summ["breaker"].items() if st["state"] != "closed"]
    if cfg.summarizer == "llm" and summ["mode"] != "llm":
        out.append({"name": "config_summarizer", "status": "fail",
                    "detail": "LCM_SUMMARIZER=llm but no LLM is configured (set LCM_SUMMARY_BASE_URL "
                              "and LCM_SUMMARY_MODEL, or run inside Hermes)"})
    elif broken:
        out.append({"name": "config_summarizer", "status": "warn",
                    "detail": "summarizer routes failing: " + "; ".join(
                        f"{n} ({summ['breaker'][n]['state']}: {summ['breaker'][n]['last_error']})" for n in broken)})
    else:
        out.append({"name": "config_summarizer", "status": "ok",
                    "detail": f"summaries via {summ['route']}" + (
                        " (deterministic extractive summaries: no LLM configured)" if summ["mode"] == "extractive" else "")})
    return out


HANDLERS: dict[str, Callable[["LcmEngine", Parsed], dict[str, Any]]] = {
    "lcm_grep": grep, "lcm_describe": describe, "lcm_expand": expand,
    "lcm_expand_query": expand_query, "lcm_load_session": load_session,
    "lcm_status": status, "lcm_doctor": doctor,
}
