"""``lcm demo``: the whole story on the embedded store, without Hermes and without an LLM key.

It imports the shipped three-session transcript (``lcm/demo/transcript.jsonl``) turn by turn
through the context with a small context window, compacting after every turn with the
configured summarizer (the extractive one when no LLM is set), then shows what is stored, the
summary DAG, how small the assembled prompt is against the raw history, and a grep plus expand
that brings back a fact from the first turn byte-exactly. Everything goes under the agent
``lcm-demo``, so it never mixes with a real agent's sessions; running it again adds nothing
(ingest is idempotent) and shows the same story.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import click
from rich.table import Table

from lcm.cli.common import emit_json, json_option, say, show_table, url_option, when
from lcm.cli.recall import full_message, whole_field
from lcm.cli.stores import open_context
from lcm.cli.transfer import import_plans
from lcm.demo.generate import BRIDGE_CODE, DEMO_QUERY
from lcm.tools import call_tool
from lcm.transfer import plan_sessions, read_transcript

DEMO_AGENT = "lcm-demo"
#: Small sizes so a 90,000-token transcript builds a DAG several levels deep in seconds.
DEMO_SETTINGS = dict(fresh_tail_count=8, leaf_chunk_tokens=1_500, leaf_target_tokens=250,
                     condensed_target_tokens=400, condensation_fanin=4, incremental_max_depth=-1,
                     new_session_retain_depth=2)


@click.command("demo")
@url_option
@json_option
@click.option("--agent", default=DEMO_AGENT, show_default=True, metavar="NAME",
              help="The agent the demo stores under (kept apart from your own).")
@click.option("--context-length", type=click.IntRange(4_000), default=8_000, show_default=True,
              help="The pretend model window.")
def demo_command(url: str | None, as_json: bool, agent: str, context_length: int) -> None:
    """Watch lcm compact a long agent transcript and recall an early fact exactly."""
    with resources.as_file(resources.files("lcm.demo") / "transcript.jsonl") as path:
        transcript = read_transcript(path)
    plans = plan_sessions(transcript)
    originals = {e.where: e.message for e in transcript.entries}
    context = open_context(url, agent, create=True, context_length=context_length, **DEMO_SETTINGS)
    route = context.summarizer.describe()
    if not as_json:
        say(f"lcm demo: {len(transcript.entries)} messages in {len(plans)} sessions from the shipped transcript")
        say(f"store: {context.store.location} ({context.store.backend_name}), agent {agent}, "
            f"window {context_length:,} tokens")
        say("summarizer: " + (f"{route['route']}" if route["mode"] != "extractive" else
                              "extractive (no LLM configured; LCM_SUMMARY_BASE_URL and LCM_SUMMARY_MODEL "
                              "give LLM summaries)"))
    reports, outcomes = import_plans(context, plans, compact=True, show_progress=not as_json,
                                     label="ingesting", carry=True)

    sessions: list[dict[str, Any]] = []
    for plan in plans:
        session = context.attach(plan.session_key)
        assembled = context.assemble_context()
        depths = {f"d{d.depth}": d.count for d in context.store.summaries.depth_stats(session.id)}
        sessions.append({"session_id": plan.session_key, "platform": session.platform,
                         "messages": session.message_count, "raw_tokens": session.token_count,
                         "summaries": depths, "carried_in": len(context.store.summaries.carried(session.id)),
                         "assembled_tokens": assembled.tokens,
                         "assembled_messages": len(assembled.messages)})
    last = plans[-1].session_key
    context.attach(last)
    found = call_tool(context, "lcm_grep", query=DEMO_QUERY, session_scope="all", limit=5)
    hits = [h for h in found["results"] if h["type"] == "message"]
    recall: dict[str, Any] = {"query": DEMO_QUERY, "hits": found["results"], "byte_exact": False}
    if hits:
        item = full_message(context, hits[0]["store_id"])
        original = next((m for m in originals.values() if m.get("content") and BRIDGE_CODE in str(m["content"])), None)
        text, _ = whole_field(context, hits[0]["store_id"])
        recall.update({"store_id": item["store_id"], "session_id": item["session_id"],
                       "text": text, "byte_exact": original is not None and json.dumps(
                           item["message"], ensure_ascii=False) == json.dumps(original, ensure_ascii=False)})
    total_raw = sum(s["raw_tokens"] for s in sessions)
    result = {"agent": agent, "database": context.store.location, "backend": context.store.backend_name,
              "summarizer": route["route"], "context_length": context_length,
              "stored_messages": sum(s["messages"] for s in sessions), "raw_tokens": total_raw,
              "new_messages": sum(r.added for r in reports),
              "already_stored": sum(r.already_stored for r in reports),
              "summaries_written": sum(o.get("leaves", 0) + o.get("condensed", 0) for o in outcomes),
              "sessions": sessions, "recall": recall}
    if as_json:
        emit_json(result)
    else:
        _show(result, last, url)
    if not recall["byte_exact"]:
        raise click.ClickException("the early fact did not come back byte-exactly: run lcm doctor")


def _show(result: dict[str, Any], last: str, url: str | None) -> None:
    new, old = result["new_messages"], result["already_stored"]
    say("")
    say(f"stored: {result['stored_messages']:,} messages, {result['raw_tokens']:,} tokens, each exactly once "
        f"({new:,} new this run, {old:,} already stored)")
    table = Table(title="per session: the summary DAG, and the prompt lcm assembles against the raw history")
    for col in ("session", "messages", "tokens", "summaries", "prompt", "smaller"):
        table.add_column(col, justify="left" if col in ("session", "summaries") else "right",
                         no_wrap=col != "summaries")
    for s in result["sessions"]:
        dag = " ".join(f"{k}:{v}" for k, v in sorted(s["summaries"].items())) or "-"
        ratio = s["raw_tokens"] / s["assembled_tokens"] if s["assembled_tokens"] else 0
        table.add_row(s["session_id"], f"{s['messages']:,}", f"{s['raw_tokens']:,}", dag,
                      f"{s['assembled_tokens']:,}", f"{ratio:.1f}x")
    show_table(table)
    window = result["context_length"]
    over = [s["session_id"] for s in result["sessions"] if s["assembled_tokens"] > window]
    say(f"every assembled prompt fits the {window:,}-token window" if not over else
        f"over the {window:,}-token window: {', '.join(over)} (see lcm status --session ID)")
    carried = [s for s in result["sessions"] if s["carried_in"]]
    if carried:
        say("each later session starts with the previous one's top summaries carried over (as after /new): "
            + ", ".join(f"{s['session_id']} +{s['carried_in']}" for s in carried))
    say("nothing was dropped: every message is in the store, reachable from the DAG")
    recall = result["recall"]
    say("")
    say(f"lcm_grep {recall['query']!r} across the agent's sessions, from session {last}:")
    for hit in recall["hits"]:
        ref = f"msg:{hit['store_id']}" if hit["type"] == "message" else f"node:{hit['node_id']}"
        say(f"  {ref:<10} {hit.get('session_id') or '-':<22} {when(hit.get('timestamp'))}  {hit['snippet']}")
    if "text" in recall:
        say("")
        say(f"lcm_expand msg:{recall['store_id']} (session {recall['session_id']}, compacted long ago):")
        say(f"  {recall['text']}")
        say("")
        say("byte-exact: " + ("yes, identical to the original message in the transcript" if recall["byte_exact"]
                              else "NO: the stored message differs from the transcript"))
    say("")
    say("next, try (one command per line):")
    for command in ("lcm sessions", "lcm grep ERR_LEDGER_DRIFT", "lcm recall 'which port is staging Postgres on?'",
                    "lcm describe", "lcm expand node:<id>"):
        say(f"  {command} --agent {result['agent']}" + ("" if url is None else f" --url '{url}'"))
