"""Recall tools: ``lcm_grep`` (search), ``lcm_describe`` (the summary DAG), ``lcm_expand``
(a summary's sources, or a stored message paged exactly) and ``lcm_load_session`` (a session in
order).

Scope (the contract's default): the current session of the current agent; other sessions of the
same agent only when asked (``session_scope``/``session_id``); never another agent's rows. A
node of another session of the agent is "not found", like one of another agent.
"""

from __future__ import annotations

from typing import Any

from lcm.context.session import ContextSession
from lcm.records import MessageRecord, SessionRecord, SummaryRecord
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE
from lcm.tools.args import ArgumentError, Parsed
from lcm.tools.render import (
    bounded_message,
    clip_prefix,
    field_text,
    message_item,
    search_hit,
    system_prompt_item,
    text_content,
)
from lcm.tools.retrieval import find
from lcm.tools.specs import (
    DESCRIBE_NODES_CAP,
    DESCRIBE_SOURCE_IDS_CAP,
    NODE_CONTENT_CAP,
    NOT_FOUND_NODE,
    NOT_FOUND_SESSION,
    NOT_FOUND_STORE,
    PAGE_CHARS_CAP,
    PAGE_CHARS_DEFAULT,
)


def session_for(context: ContextSession, key: str) -> SessionRecord:
    session = context.store.sessions.find(context.agent_id, key)
    if session is None:
        raise ArgumentError(NOT_FOUND_SESSION.format(id=key))
    return session


def node_in_scope(context: ContextSession, node_id: int) -> SummaryRecord:
    """A summary node in the current session's scope: its own DAG, the summaries carried into
    it (and their sources), and its parents' if it is a fork. A node of another session of the
    agent is "not found", like one of another agent (the contract's default scope)."""
    node = context.store.summaries.get(node_id, agent=context.agent_id)
    if node is None or node.session_pk not in _scope_sessions(context):
        raise ArgumentError(NOT_FOUND_NODE.format(id=node_id))
    return node


def _scope_sessions(context: ContextSession) -> set[int]:
    store, session = context.store, context.session
    allowed = {session.id}
    current = session
    while current.parent_id is not None and current.parent_id not in allowed:
        allowed.add(current.parent_id)
        current = store.sessions.get(current.parent_id)
    for pk in list(allowed):
        allowed.update(n.session_pk for n in store.summaries.carried(pk))
    return allowed


def grep(context: ContextSession, args: Parsed) -> dict[str, Any]:
    scope, sort, limit = args["session_scope"], args["sort"], args["limit"]
    if args.get("session_id") is not None and scope != "session":
        raise ArgumentError("session_id is only used with session_scope='session'")
    if scope == "session":
        if not args.get("session_id"):
            raise ArgumentError("session_scope='session' needs session_id")
        session_pk: int | None = session_for(context, args["session_id"]).id
    elif scope == "all":
        session_pk = None
    else:
        session_pk = context.session.id
    found = find(context, args["query"], mode=args.get("mode"), scope=scope, session_pk=session_pk, sort=sort,
                 limit=limit, roles=(args["role"],) if args.get("role") else (), platform=args.get("source"),
                 time_from=args.get("time_from"), time_to=args.get("time_to"))
    payload: dict[str, Any] = {"scope": scope, "mode": found.mode}
    if found.degraded_reason:
        payload.update(degraded=True, degraded_reason=found.degraded_reason)
    if found.summaries_omitted:
        payload["summary_results_omitted"] = True
    payload["results"] = [search_hit(h) for h in found.hits]
    payload["total_results"] = len(payload["results"])
    if found.clamped:
        payload["candidates_clamped"] = True
    if found.notes:
        payload["notes"] = found.notes
    return payload


def _node_brief(node: SummaryRecord, carried_from: str | None = None) -> dict[str, Any]:
    """A node in ``lcm_describe``'s list; a carried one says whose messages its numbers count
    (another session's: "messages 1-175 of session s0" in a session of 160)."""
    covers = f"messages {node.first_seq}-{node.last_seq}" + (f" of session {carried_from}" if carried_from else "")
    brief = {"node_id": node.id, "token_count": node.token_count, "condensed_into": node.parent_id,
             "expand_hint": node.expand_hint, "covers": covers, "kind": node.kind}
    if carried_from is not None:
        brief["carried"] = True
    return brief


def describe(context: ContextSession, args: Parsed) -> dict[str, Any]:
    store = context.store
    if args.get("node_id") is None:
        session = context.session
        stats = {d.depth: d for d in store.summaries.depth_stats(session.id)}
        carried = store.summaries.carried(session.id)
        depths: dict[str, Any] = {}
        payload: dict[str, Any] = {"session_id": session.session_key, "depths": depths}
        all_depths = sorted(set(stats) | {n.depth for n in carried})
        for depth in all_depths:
            own = store.summaries.of_session(session.id, depth=depth, limit=DESCRIBE_NODES_CAP)
            mine = [n for n in carried if n.depth == depth]
            st = stats.get(depth)
            count = (st.count if st else 0) + len(mine)
            entry: dict[str, Any] = {"count": count,
                     "uncondensed": (st.uncondensed if st else 0) + sum(1 for n in mine if n.parent_id is None),
                     "nodes": [_node_brief(n, store.sessions.get(n.session_pk).session_key) for n in mine]
                     + [_node_brief(n) for n in own]}
            if count > DESCRIBE_NODES_CAP:
                entry["nodes"] = entry["nodes"][:DESCRIBE_NODES_CAP]
                entry["limit_clamped_from"] = count
            depths[f"d{depth}"] = entry
        return payload
    node = node_in_scope(context, args["node_id"])
    source_ids = store.summaries.source_ids(node.id)
    content, cut = clip_prefix(node.content, NODE_CONTENT_CAP)
    payload = {"node_id": node.id, "depth": node.depth, "content": content,
               "token_count": node.token_count, "source_token_count": node.source_token_count,
               "source_type": node.source_type, "source_ids": source_ids[:DESCRIBE_SOURCE_IDS_CAP],
               "parent_id": node.parent_id, "earliest_at": node.earliest_at,
               "latest_at": node.latest_at, "expand_hint": node.expand_hint, "kind": node.kind,
               "model": node.model, "covers": f"messages {node.first_seq}-{node.last_seq}",
               "session_id": next(iter(store.sessions.keys(node.session_pk)), None)}
    if cut:
        payload["content_truncated"] = True
    if len(source_ids) > DESCRIBE_SOURCE_IDS_CAP:
        payload["limit_clamped_from"] = len(source_ids)
    return payload


def expand(context: ContextSession, args: Parsed) -> dict[str, Any]:
    if (args.get("node_id") is None) == (args.get("store_id") is None):
        raise ArgumentError("lcm_expand needs exactly one of node_id (a summary) and store_id (a message)")
    if args.get("node_id") is not None:
        if args.get("content_offset") is not None:
            raise ArgumentError("content_offset pages one message: use it with store_id")
        return _expand_node(context, args)
    if args.get("source_offset") is not None or args.get("source_limit") is not None:
        raise ArgumentError("source_offset and source_limit page a node's sources: use them with node_id")
    return _expand_message(context, args)


def _expand_node(context: ContextSession, args: Parsed) -> dict[str, Any]:
    node = node_in_scope(context, args["node_id"])
    offset, limit = args.get("source_offset", 0), args.get("source_limit", 10)
    budget_chars = (args.get("max_tokens") or 4_000) * CHARS_PER_TOKEN_ESTIMATE
    sources, total = context.store.summaries.expand(node.id, offset=offset, limit=limit)
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
            content, cut = clip_prefix(src.content, room)
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


def _expand_message(context: ContextSession, args: Parsed) -> dict[str, Any]:
    """One page of a stored message's text: its content by default, or (``field``) any other
    field, so that a 1 MB tool-call argument is as recoverable as a 1 MB tool result."""
    rec = context.store.messages.get(args["store_id"], agent=context.agent_id)
    if rec is None:
        raise ArgumentError(NOT_FOUND_STORE.format(id=args["store_id"]))
    field = args.get("field") or "content"
    if field == "role" or (field != "content" and field not in rec.message):
        others = sorted(k for k in rec.message if k != "role")
        raise ArgumentError(f"message {rec.store_id} has no field {field!r} to page; it has: "
                            f"{', '.join(others) or 'no fields'}")
    text = field_text(rec.message.get(field))
    offset = args.get("content_offset", 0)
    if offset > len(text):
        raise ArgumentError(f"content_offset {offset} is past the end of the {field} "
                            f"({len(text)} characters)")
    page_chars = PAGE_CHARS_DEFAULT
    if args.get("max_tokens"):
        page_chars = min(PAGE_CHARS_CAP, args["max_tokens"] * CHARS_PER_TOKEN_ESTIMATE)
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
               "from_current_session": context.current is not None and rec.session_pk == context.current.id,
               "content_offset": offset, "next_content_offset": end if end < len(text) else None,
               "content_chars": len(text), "content_truncated": offset > 0 or end < len(text),
               "has_more": end < len(text)}
    if field != "content":
        payload["field"] = field
    return payload


def load_session(context: ContextSession, args: Parsed) -> dict[str, Any]:
    session = session_for(context, args["session_id"])
    after = args.get("after_store_id")
    if after is not None:
        anchor = context.store.messages.get(after, agent=context.agent_id)
        if anchor is None or anchor.session_pk != session.id:
            raise ArgumentError(f"after_store_id {after} is not a message of session {args['session_id']!r}; "
                                "pass the next_cursor of the previous page")
    records, cursor = context.store.messages.page(session.id, after_store_id=after, limit=args["limit"],
                                                 roles=args.get("roles") or None)
    out: dict[str, Any] = {"session_id": session.session_key,
                           "messages": [message_item(r, args["max_content_chars"]) for r in records],
                           "next_cursor": cursor}
    if args.get("include_system_prompt"):
        out["system_prompts"] = [system_prompt_item(p, args["max_content_chars"])
                                 for p in context.store.sessions.system_prompts(session.id)]
    return out
