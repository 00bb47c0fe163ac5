"""The agent tools for people: ``lcm sessions``, ``grep``, ``describe``, ``expand``, ``load``.

Each command runs the same tool code the agent calls (``lcm.tools``), on an context bound to
the chosen agent and session, so what a person sees is exactly what the agent would get; the
command pages through the tool's bounded responses itself. ``--json`` prints the tool's
response (with every page joined).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import click
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from lcm.cli.common import (
    agent_option,
    emit_json,
    emit_tsv,
    json_option,
    marked,
    progress_bar,
    say,
    show_table,
    stdout,
    tsv_option,
    url_option,
    when,
)
from lcm.cli.stores import latest_session_key, open_context, open_store
from lcm.cli.times import TIME, TIME_HELP
from lcm.context.session import ContextSession
from lcm.errors import NotFoundError
from lcm.tools import ToolError
from lcm.tools import call_tool as tool_call
from lcm.tools.autorecall import recall_block

REF = re.compile(r"^(msg|node):(\d+)$")
#: The agent tools' "not found" answers, in command-line words (no tool names, no "store_id").
_NOT_FOUND = (
    (re.compile(r"^store_id (\d+) not found"),
     "msg:{0} is not a message of agent {agent!r} (lcm grep shows message ids)"),
    (re.compile(r"^node (\d+) not found"),
     "node:{0} is not a summary of agent {agent!r} (lcm describe shows node ids)"),
    (re.compile(r"^session '?(.+?)'? not found"),
     "no session {0!r} for agent {agent!r} (lcm sessions lists them)"),
)


def call_tool(context: ContextSession, name: str, **args: Any) -> dict[str, Any]:
    """The agent tool's answer; its "not found" said in command-line words, naming the agent
    searched and the store's other agents (``--agent`` picks one)."""
    try:
        return tool_call(context, name, **args)
    except ToolError as exc:
        for pattern, words in _NOT_FOUND:
            found = pattern.match(str(exc))
            if found:
                raise NotFoundError(words.format(*found.groups(), agent=context.agent_id)
                                    + other_agents(context.store, context.agent_id)) from None
        raise


def other_agents(store: Any, agent: str) -> str:
    """"; this store's other agents: a, b (--agent NAME picks one)", or "" when there are none."""
    others = [a for a in store.sessions.agents() if a != agent]
    if not others:
        return ""
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return f"; this store's other agents: {shown} (--agent NAME picks one, lcm sessions --all-agents lists all)"
#: Messages ``lcm load`` asks lcm_load_session for at a time.
LOAD_PAGE = 200


def whole_field(context: ContextSession, store_id: int, field: str = "content") -> tuple[str, dict[str, Any]]:
    """A message field's complete text, paged through lcm_expand (first page returned too)."""
    pages: list[str] = []
    first: dict[str, Any] | None = None
    offset: int | None = 0
    while offset is not None:
        res = call_tool(context, "lcm_expand", store_id=store_id, content_offset=offset, max_tokens=5_000,
                        field=None if field == "content" else field)
        first = first or res
        pages.append(res["item"]["message"].get(field) or "")
        offset = res["next_content_offset"]
    assert first is not None
    return "".join(pages), first


def full_message(context: ContextSession, store_id: int) -> dict[str, Any]:
    """The stored message exactly as ingested: every cut field paged back in full."""
    text, first = whole_field(context, store_id)
    message = dict(first["item"]["message"])
    if first["item"].get("content_format") == "json":
        message["content"] = json.loads(text)
    elif isinstance(message.get("content"), str):
        message["content"] = text
    for field in first["item"].get("fields_truncated", []):
        value, page = whole_field(context, store_id, field)
        message[field] = json.loads(value) if page["item"].get("content_format") == "json" else value
    return {**first["item"], "message": message}


@click.command("sessions")
@url_option
@agent_option
@json_option
@tsv_option
@click.option("--all-agents", is_flag=True, help="Every agent's sessions.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1_000, show_default=True,
              help="Sessions to list per agent at most.")
def sessions_command(url: str | None, agent: str, as_json: bool, as_tsv: bool, all_agents: bool,
                     limit: int) -> None:
    """List sessions: messages, tokens, summaries and how much is compacted."""
    store = open_store(url)
    agents = store.sessions.agents() if all_agents else [agent]
    rows: list[dict[str, Any]] = []
    for name in agents:
        listed = list(itertools.islice(store.sessions.each(name), limit))
        # Last activity: the last message's own time (an imported session's is when it was said).
        last = store.sessions.last_message_times([s.id for s in listed])
        for s in listed:
            rows.append({"agent": name, "session_id": s.session_key, "aliases": store.sessions.keys(s.id)[1:],
                         "platform": s.platform, "messages": s.message_count, "tokens": s.token_count,
                         "compacted_messages": s.covered_seq, "summaries_in_context": s.summary_count,
                         "created_at": s.created_at, "updated_at": s.updated_at,
                         "last_activity": last.get(s.id, s.updated_at), "origin": s.origin})
    if as_json:
        emit_json({"sessions": rows})
        return
    if as_tsv:
        emit_tsv(["agent", "session_id", "aliases", "platform", "messages", "tokens", "compacted_messages",
                  "summaries_in_context", "created_at", "updated_at", "last_activity"],
                 [[r["agent"], r["session_id"], ",".join(r["aliases"]), r["platform"], r["messages"], r["tokens"],
                   r["compacted_messages"], r["summaries_in_context"], r["created_at"], r["updated_at"],
                   r["last_activity"]] for r in rows])
        return
    if not rows:
        say(f"no sessions for {'any agent' if all_agents else 'agent ' + repr(agent)}"
            + ("" if all_agents else other_agents(store, agent)))
        return
    table = Table(title=f"lcm sessions of {'all agents' if all_agents else repr(agent)}")
    columns = (["agent"] if all_agents else []) + ["session", "platform", "messages", "tokens", "compacted",
                                                   "last activity"]
    for col in columns:
        table.add_column(col, justify="right" if col in ("messages", "tokens", "compacted") else "left",
                         no_wrap=col in ("agent", "session"))
    for r in rows:
        name = r["session_id"] + (f" (+{len(r['aliases'])} alias)" if r["aliases"] else "")
        share = f"{r['compacted_messages'] / r['messages']:.0%}" if r["messages"] else "-"
        cells: list[Text | str] = [Text(r["agent"])] if all_agents else []
        cells += [Text(name), Text(r["platform"] or "-"), f"{r['messages']:,}", f"{r['tokens']:,}", share,
                  when(r["last_activity"])]
        table.add_row(*cells)
    show_table(table)


@click.command("recall")
@click.argument("message")
@url_option
@agent_option
@json_option
@click.option("--session", "session_key", metavar="ID",
              help="The session the message is asked in (its messages not yet summarized are in the "
                   "context, so not recalled); default: the agent's most recent session.")
@click.option("--max-tokens", type=click.IntRange(50, 20_000), default=None,
              help="Size of the block at most (default: LCM_AUTO_RECALL_MAX_TOKENS).")
def recall_command(message: str, url: str | None, agent: str, as_json: bool, session_key: str | None,
                   max_tokens: int | None) -> None:
    """The auto-recall block lcm would add before the model answers MESSAGE: the stored turns
    of any of the agent's sessions that best match it, verbatim, with their store ids."""
    context = open_context(url, agent)
    context.attach(session_key or latest_session_key(context.store, agent))
    block = recall_block(context, message, max_tokens=max_tokens or context.config.auto_recall_max_tokens)
    if as_json:
        emit_json(block.as_dict())
        return
    if not block.text:
        say(f"nothing to recall for {message!r}: {block.reason}")
        return
    say(f"{len(block.store_ids)} stored message(s), {block.tokens} tokens ({block.mode}); "
        "the model would get:")
    stdout.print(Text(block.text))


@click.command("grep")
@click.argument("query")
@url_option
@agent_option
@json_option
@tsv_option
@click.option("--session", "session_key", metavar="ID",
              help="Search this session (messages and its summaries); default: all the agent's sessions.")
@click.option("--role", help="Only messages of this role.")
@click.option("--since", "time_from", type=TIME, help="Only messages at or after this time: " + TIME_HELP)
@click.option("--until", "time_to", type=TIME, help="Only messages at or before this time (same forms).")
@click.option("--source", help="Only sessions of this platform (cli, telegram, ...).")
@click.option("--sort", type=click.Choice(["recency", "relevance", "hybrid"]), default="recency", show_default=True)
@click.option("--mode", type=click.Choice(["full_text", "semantic", "hybrid"]), default=None,
              help="Words, meaning (needs embeddings), or both fused; default: hybrid when embeddings "
                   "are on (LCM_EMBEDDINGS), else full_text.")
@click.option("--limit", type=int, default=20, show_default=True, help="Hits (at most 200).")
def grep_command(query: str, url: str | None, agent: str, as_json: bool, as_tsv: bool, session_key: str | None,
                 role: str | None, time_from: float | None, time_to: float | None, source: str | None,
                 sort: str, mode: str | None, limit: int) -> None:
    """Search stored messages and summaries (the lcm_grep tool): every word first, then any of
    the content words, best first."""
    context = open_context(url, agent)
    if session_key is not None:
        context.attach(session_key)
    res = call_tool(context, "lcm_grep", query=query, limit=limit, sort=sort, mode=mode, role=role, source=source,
                    session_scope="current" if session_key is not None else "all",
                    time_from=time_from, time_to=time_to)
    if as_json:
        emit_json(res)
        return
    if as_tsv:
        emit_tsv(["ref", "session_id", "kind", "timestamp", "match", "score", "snippet"],
                 [[f"msg:{h['store_id']}" if h["type"] == "message" else f"node:{h['node_id']}",
                   h.get("session_id"), h.get("role") or f"summary d{h.get('depth')}", h.get("timestamp"),
                   h.get("match"), h.get("score"), h["snippet"]] for h in res["results"]])
        return
    if not res["results"]:
        for note in res.get("notes") or ():  # why nothing matched, when the search knows
            say(f"note: {note}")
        say(f"no match for {query!r} in the messages of agent {agent!r}" + other_agents(context.store, agent))
        return
    if res.get("degraded"):
        say(f"note: {res['degraded_reason']}")
    some = sum(h.get("match") == "any" for h in res["results"])
    near = sum(h.get("match") == "semantic" for h in res["results"])
    beside = sum(h.get("match") == "neighbour" for h in res["results"])
    say(f"{res['total_results']} hit(s) for {query!r}"
        + (f" ({some} with only some of its words)" if some else "")
        + (f" ({near} by meaning alone)" if near else "")
        + (f" ({beside} next to hits in their session)" if beside else "")
        + (" (only the newest matches were ranked)" if res.get("candidates_clamped") else ""))
    for hit in res["results"]:
        ref = f"msg:{hit['store_id']}" if hit["type"] == "message" else f"node:{hit['node_id']}"
        kind = hit.get("role") or f"summary d{hit.get('depth')}"
        head = Text(f"{ref:<11}", style="bold")
        head.append(f" {hit.get('session_id') or '-'}  {kind}  {when(hit.get('timestamp'))}")
        stdout.print(head)
        stdout.print(Text("    ").append_text(marked(hit["snippet"])))
    if res.get("limit_clamped_from"):
        say(f"(limit clamped from {res['limit_clamped_from']})")
    say("open one with: lcm expand <ref>")


def attach_to_node(context: ContextSession, node_id: int) -> None:
    """Bind to the session a node belongs to: the agent tools answer for the current session's
    nodes only, while a person at the command line names any node of the agent."""
    node = context.store.summaries.get(node_id, agent=context.agent_id)
    if node is not None:
        context.attach(context.store.sessions.get(node.session_pk).session_key)


@click.command("describe")
@click.argument("node", required=False)
@url_option
@agent_option
@json_option
@click.option("--session", "session_key", metavar="ID", help="Default: the agent's most recent session.")
def describe_command(node: str | None, url: str | None, agent: str, as_json: bool, session_key: str | None) -> None:
    """The summary DAG of a session, or one summary node (NODE: 7 or node:7)."""
    context = open_context(url, agent)
    if node is None:
        context.attach(session_key or latest_session_key(context.store, agent))
        res = call_tool(context, "lcm_describe")
        if as_json:
            emit_json(res)
            return
        tree = Tree(Text(f"session {res['session_id']}"))
        for depth, entry in sorted(res["depths"].items(), key=lambda kv: -int(kv[0][1:])):
            branch = tree.add(Text(f"{depth}: {entry['count']} node(s), {entry['uncondensed']} in context"))
            for n in entry["nodes"]:
                flag = " (carried from an earlier session)" if n.get("carried") else ""
                into = f" → node:{n['condensed_into']}" if n["condensed_into"] else ""
                branch.add(Text(f"node:{n['node_id']} {n['covers']}, {n['token_count']} tokens{into}{flag}",
                                style="dim" if n["condensed_into"] else ""))
            if entry.get("limit_clamped_from"):
                branch.add(Text(f"… {entry['limit_clamped_from'] - len(entry['nodes'])} more"))
        if not res["depths"]:
            tree.add(Text("no summaries yet"))
        stdout.print(tree)
        return
    node_id = _node_id(node)
    if session_key:
        context.attach(session_key)
    else:
        attach_to_node(context, node_id)
    res = call_tool(context, "lcm_describe", node_id=node_id)
    if as_json:
        emit_json(res)
        return
    say(f"node:{res['node_id']}  depth {res['depth']}  {res['covers']}  session {res['session_id']}")
    say(f"{res['token_count']} tokens over {res['source_token_count']} source tokens; kind {res['kind']}"
        + (f", model {res['model']}" if res.get("model") else "")
        + (f"; condensed into node:{res['parent_id']}" if res["parent_id"] else ""))
    say(f"{when(res['earliest_at'])} .. {when(res['latest_at'])}")
    say("")
    say(res["content"])
    say("")
    refs = [("msg" if res["source_type"] == "messages" else "node") + f":{i}" for i in res["source_ids"]]
    say(f"sources ({len(refs)}): " + " ".join(refs))


def _node_id(text: str) -> int:
    m = REF.match(text) if ":" in text else None
    if m and m.group(1) == "node":
        return int(m.group(2))
    if text.isdigit():
        return int(text)
    raise click.BadParameter(f"{text!r} is not a node id (give 7 or node:7)", param_hint="NODE")


@click.command("expand")
@click.argument("ref")
@url_option
@agent_option
@json_option
@click.option("--raw", is_flag=True, help="msg: print only the exact text content (for pipes and diffs).")
def expand_command(ref: str, url: str | None, agent: str, as_json: bool, raw: bool) -> None:
    """Exact original text: REF is msg:ID (a stored message) or node:ID (a summary's sources)."""
    m = REF.match(ref)
    if not m:
        raise click.BadParameter(f"{ref!r}: give msg:ID (a stored message) or node:ID (a summary)",
                                 param_hint="REF")
    context = open_context(url, agent)
    ident = int(m.group(2))
    if m.group(1) == "msg":
        _expand_message(context, ident, as_json=as_json, raw=raw)
    else:
        _expand_node(context, ident, as_json=as_json)


def _expand_message(context: ContextSession, store_id: int, *, as_json: bool, raw: bool) -> None:
    item = full_message(context, store_id)
    if as_json:
        emit_json(item)
        return
    text, _ = whole_field(context, store_id)
    if raw:
        click.echo(text, nl=False)
        return
    msg = item["message"]
    say(f"msg:{item['store_id']}  {msg.get('role')}  session {item['session_id']}  seq {item['seq']}  "
        f"{when(item['timestamp'])}  {item['token_count']} tokens")
    for key, value in msg.items():
        if key not in ("role", "content"):
            say(f"{key}: {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}")
    say("")
    click.echo(text)


def _expand_node(context: ContextSession, node_id: int, *, as_json: bool) -> None:
    attach_to_node(context, node_id)
    sources: list[dict[str, Any]] = []
    offset: int | None = 0
    head = None
    while offset is not None:
        res = call_tool(context, "lcm_expand", node_id=node_id, source_offset=offset, source_limit=50,
                        max_tokens=16_000)
        head = head or res
        sources.extend(res["expanded"])
        offset = res["pagination"]["next_source_offset"]
    assert head is not None
    if as_json:
        emit_json({**{k: v for k, v in head.items() if k not in ("expanded", "pagination")},
                   "expanded": sources, "total_sources": len(sources)})
        return
    say(f"node:{node_id}  depth {head['depth']}  {len(sources)} source(s)")
    for src in sources:
        say("")
        if "store_id" not in src:
            say(f"── node:{src['node_id']} depth {src['depth']} ({src['token_count']} tokens)")
            click.echo(src["content"])
            continue
        msg = src["message"]
        say(f"── msg:{src['store_id']} {msg.get('role')} seq {src['seq']} {when(src['timestamp'])}")
        body = msg.get("content")
        if body is None and msg.get("tool_calls"):
            body = "tool calls: " + (msg["tool_calls"] if isinstance(msg["tool_calls"], str)
                                     else json.dumps(msg["tool_calls"], ensure_ascii=False))
        click.echo(body if isinstance(body, str) else json.dumps(body, ensure_ascii=False))
        if src.get("content_truncated") or src.get("fields_truncated"):
            say(f"   (cut; the whole message: lcm expand msg:{src['store_id']})")


@click.command("load")
@click.argument("session_key", metavar="SESSION")
@url_option
@agent_option
@json_option
@click.option("--roles", help="Comma list of roles to show, e.g. user,assistant.")
@click.option("--max-chars", type=click.IntRange(1, 20_000), default=2_000, show_default=True,
              help="Characters of each message shown (lcm expand msg:ID has the rest).")
@click.option("--limit", type=click.IntRange(1), default=None, help="Messages to show at most.")
def load_command(session_key: str, url: str | None, agent: str, as_json: bool, roles: str | None,
                 max_chars: int, limit: int | None) -> None:
    """A whole session in order (the lcm_load_session tool, every page)."""
    context = open_context(url, agent)
    role_list = [r.strip() for r in roles.split(",") if r.strip()] if roles else None
    items: list[dict[str, Any]] = []
    cursor = None
    found = context.store.sessions.find(agent, session_key)  # None: the tool says so below
    total = min(found.message_count, limit or found.message_count) if found is not None else 0
    # A big session reads for seconds: progress on stderr (stdout stays the session's text).
    with progress_bar(not as_json and total > LOAD_PAGE) as bar:
        task = bar.add_task(f"load {session_key}", total=total, unit="messages") if bar is not None else None
        while True:
            page_size = LOAD_PAGE if limit is None else min(LOAD_PAGE, limit - len(items))
            res = call_tool(context, "lcm_load_session", session_id=session_key, limit=page_size,
                            after_store_id=cursor, max_content_chars=max_chars, roles=role_list)
            items.extend(res["messages"])
            if bar is not None:
                bar.advance(task, len(res["messages"]))
            cursor = res["next_cursor"]
            if cursor is None or (limit is not None and len(items) >= limit):
                break
    if as_json:
        emit_json({"session_id": session_key, "messages": items, "more_after": cursor})
        return
    for item in items:
        msg = item["message"]
        say(f"── msg:{item['store_id']} {msg.get('role')} seq {item['seq']} {when(item['timestamp'])}")
        body = msg.get("content")
        if msg.get("tool_calls"):
            calls = msg["tool_calls"]
            say("tool calls: " + (calls if isinstance(calls, str) else json.dumps(calls, ensure_ascii=False)))
        if body is not None:
            click.echo(body if isinstance(body, str) else json.dumps(body, ensure_ascii=False))
        if item.get("content_truncated"):
            say(f"   … {item['content_chars'] - max_chars:,} more characters: lcm expand msg:{item['store_id']}")
    if cursor is not None:
        say(f"(more messages after msg:{cursor}; raise --limit)")
