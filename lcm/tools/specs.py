"""The agent tools' names, arguments, caps and schemas: the contract's tool surface
(docs/contract.md), in one place."""

from __future__ import annotations

from typing import Any

from lcm.records import SEARCH_MODES, SORT_MODES
from lcm.tools.args import Arg

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
NOT_FOUND_NODE = "node {id} not found in this agent's summaries; lcm_describe lists the node ids"
NOT_FOUND_STORE = "store_id {id} not found in this agent's messages; lcm_grep returns store ids"
NOT_FOUND_SESSION = ("session {id!r} not found for this agent; session ids come from lcm_grep "
                     "results (session_scope='all') or lcm_status")

SPECS: dict[str, tuple[str, list[Arg]]] = {
    "lcm_grep": (
        "Search this conversation's full history, including everything compacted out of the "
        "prompt: raw messages and summaries. Ask in plain words or exact terms: hits with every "
        "word come first (match: all), then hits with some of the content words, best first "
        "(match: any); with embeddings on, hits close in meaning are fused in (match: semantic). "
        "\"quoted phrases\", prefix*, OR and -exclusion work. Each hit has the "
        "store_id or node_id to open with lcm_expand.",
        [Arg("query", "string", required=True, description="Words to find, or a question."),
         Arg("mode", "string", choices=SEARCH_MODES,
             description="full_text (words), semantic (meaning) or hybrid (both, fused). Default: hybrid "
                         "when embeddings are on, else full_text; without embeddings the search is "
                         "full_text and says degraded."),
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
         Arg("roles", "string_list", description="Only these roles, e.g. [\"user\", \"assistant\"]."),
         Arg("include_system_prompt", "boolean", default=False,
             description="Also return the session's system prompt: every version kept, each with "
                         "the seq of the first message it came with (cut to max_content_chars).")]),
    "lcm_status": ("Context state: stored messages, summaries per depth, context pressure, "
                   "last compaction and why, prompt-cache reads, the system prompt kept, database and summarizer.", []),
    "lcm_doctor": ("Health checks of the lcm store and configuration: integrity, schema, search "
                   "index, summary DAG coverage, settings.", []),
}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"name": name, "description": desc,
     "parameters": {"type": "object", "properties": {a.name: a.json_schema() for a in spec},
                    "required": [a.name for a in spec if a.required], "additionalProperties": False}}
    for name, (desc, spec) in SPECS.items()
]
