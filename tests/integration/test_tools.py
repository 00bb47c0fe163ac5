"""The agent tools on both backends, driven through ``handle_tool_call`` like a host does.

A real session is compacted by the engine first; then the tools must find and give back, byte
for byte, what compaction moved out of the prompt, page through everything exactly, stay in
their scope, and answer every bad call with an ``{"error"}`` that says what to do instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.textindex import tokenize
from lcm.tools.render import text_content
from lcm.tools.specs import EXPAND_SOURCES_CAP, GREP_LIMIT_CAP, LOAD_LIMIT_CAP, PAGE_CHARS_CAP, PAGE_CHARS_DEFAULT
from lcm.transcript import SUMMARY_MARKER
from tests.support.conversation import SYSTEM, host_step, turn
from tests.support.faults import drop_from_index
from tests.support.llm_server import completion, error

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z: the host's timestamps of the first turns
SECRET = "The deploy key fingerprint is QX7-ALPHA-90210; keep it out of the logs."
#: A long tool result: accents, CJK, astral emoji, combining marks and a lone surrogate, so that
#: code-point offsets, not bytes or UTF-16 units, are what paging must get right.
LONG = "".join(f"line {i}: café 日本語 🙂 e\u0301 {'x' * (i % 17)}\n" for i in range(900)) + "\udcff end"
BIG_ARGS = json.dumps({"patch": "y" * 9_000})
BIG_TOOL_CALLS = json.dumps([{"id": "call_patch", "type": "function",
                              "function": {"name": "apply_patch", "arguments": BIG_ARGS}}])
PARTS = [{"type": "text", "text": "Compare with this screenshot"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo" + "A" * 500}}]
AGENT_TOOLS = {"lcm_grep", "lcm_describe", "lcm_expand", "lcm_expand_query", "lcm_load_session",
               "lcm_status", "lcm_doctor"}


def call(engine: LcmEngine, name: str, messages: list[dict] | None = None, **args: Any) -> dict[str, Any]:
    raw = engine.handle_tool_call(name, args, messages=messages)
    assert isinstance(raw, str)
    return json.loads(raw)


def early_turns() -> list[list[dict[str, Any]]]:
    """The first turns of the session: a secret, a long tool result, list content, big args."""
    return [
        [{"role": "user", "content": SECRET, "timestamp": T0},
         {"role": "assistant", "content": "Noted; I will not print it.", "timestamp": T0 + 5}],
        [{"role": "user", "content": "Read the changelog", "timestamp": T0 + 60},
         {"role": "assistant", "content": None, "timestamp": T0 + 61, "tool_calls": [
             {"id": "call_long", "type": "function",
              "function": {"name": "read_file", "arguments": '{"path": "CHANGELOG"}'}}]},
         {"role": "tool", "tool_call_id": "call_long", "content": LONG, "timestamp": T0 + 62},
         {"role": "assistant", "content": "The changelog has 900 lines.", "timestamp": T0 + 63}],
        [{"role": "user", "content": PARTS, "timestamp": T0 + 120},
         {"role": "assistant", "content": None, "timestamp": T0 + 121,
          "tool_calls": json.loads(BIG_TOOL_CALLS)},
         {"role": "tool", "tool_call_id": "call_patch", "content": "patched", "timestamp": T0 + 122},
         {"role": "assistant", "content": "Patched to match the screenshot.", "timestamp": T0 + 123}],
    ]


@dataclass
class Chat:
    engine: LcmEngine
    transcript: list[dict[str, Any]]
    sent: list[dict[str, Any]]

    @property
    def store(self) -> Store:
        return self.engine.store

    def stored(self, session_key: str = "s1") -> list[Any]:
        session = self.store.sessions.find(self.engine.agent_id, session_key)
        return self.store.messages.get_range(session.id)

    def store_id_of(self, predicate) -> int:
        return next(r.store_id for r in self.stored() if predicate(r.message))


def build_chat(make_engine, turns: int = 30, **engine_kw: Any) -> Chat:
    """A session ``s1`` on platform ``cli``, compacted by the engine like Hermes would drive it."""
    engine = make_engine(context_length=6000, **engine_kw)
    engine.on_session_start("s1", platform="cli")
    transcript: list[dict[str, Any]] = [SYSTEM]
    sent: list[dict[str, Any]] = []
    for new in [*early_turns(), *(turn(i) for i in range(3, turns))]:
        sent.extend(new)
        transcript = host_step(engine, transcript, new)
    return Chat(engine, transcript, sent)


@pytest.fixture
def chat(make_engine) -> Chat:
    chat = build_chat(make_engine)
    assert chat.engine.compression_count > 0
    return chat


def message_hits(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in res["results"] if h["type"] == "message"]


def walk_sources(engine: LcmEngine, node_id: int, page: int = 3) -> list[dict[str, Any]]:
    """Every message under a node, in order, reached only through lcm_expand pages."""
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        res = call(engine, "lcm_expand", node_id=node_id, source_offset=offset, source_limit=page,
                   max_tokens=16_000)
        for item in res["expanded"]:
            if "store_id" in item:
                assert not item.get("content_truncated")
                for field in item.get("fields_truncated", []):  # a huge tool call: page it
                    whole, _ = page_content(engine, item["store_id"], field=field)
                    item["message"][field] = json.loads(whole)
                out.append(item)
            else:
                out.extend(walk_sources(engine, item["node_id"], page))
        pagination = res["pagination"]
        if not pagination["has_more"]:
            assert pagination["next_source_offset"] is None
            return out
        assert pagination["next_source_offset"] == offset + len(res["expanded"])
        offset = pagination["next_source_offset"]


def page_content(engine: LcmEngine, store_id: int, **kw: Any) -> tuple[str, list[dict[str, Any]]]:
    pages, offset = [], 0
    while offset is not None:
        res = call(engine, "lcm_expand", store_id=store_id, content_offset=offset, **kw)
        assert res["content_offset"] == offset
        pages.append(res)
        offset = res["next_content_offset"]
    field = kw.get("field", "content")
    return "".join(p["item"]["message"][field] for p in pages), pages


# --------------------------------------------------------------------------- schemas


def test_schemas_are_the_seven_contract_tools(make_engine):
    schemas = make_engine().get_tool_schemas()
    assert {s["name"] for s in schemas} == AGENT_TOOLS
    by_name = {s["name"]: s for s in schemas}
    assert by_name["lcm_grep"]["parameters"]["required"] == ["query"]
    assert by_name["lcm_expand_query"]["parameters"]["required"] == ["prompt"]
    assert by_name["lcm_load_session"]["parameters"]["required"] == ["session_id"]
    for schema in schemas:
        params = schema["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert schema["description"] and all(p.get("description") for p in params["properties"].values())
    grep_props = by_name["lcm_grep"]["parameters"]["properties"]
    assert grep_props["sort"]["enum"] == ["recency", "relevance", "hybrid"]
    assert str(GREP_LIMIT_CAP) in grep_props["limit"]["description"]


# --------------------------------------------------------------------------- find and expand


def test_an_early_detail_is_found_and_expanded_byte_exactly_after_compaction(chat):
    engine = chat.engine
    assert not any(SECRET in json.dumps(m) for m in chat.transcript), "the secret is still in the prompt"
    found = call(engine, "lcm_grep", query="QX7-ALPHA-90210")
    messages = [h for h in found["results"] if h["type"] == "message"]
    assert len(messages) == 1 and found["total_results"] == len(found["results"])
    hit = messages[0]
    assert hit["session_id"] == "s1" and hit["role"] == "user" and hit["timestamp"] == T0
    assert "QX7" in hit["snippet"]
    opened = call(engine, "lcm_expand", store_id=hit["store_id"])
    assert opened["item"]["message"] == chat.sent[0]  # verbatim, the host's extra keys included
    assert opened["item"]["store_id"] == hit["store_id"] and opened["item"]["seq"] == 1
    assert opened["from_current_session"] is True and opened["has_more"] is False
    assert opened["next_content_offset"] is None and opened["content_truncated"] is False


def test_the_summary_dag_leads_back_to_every_message_exactly_once(chat):
    engine = chat.engine
    overview = call(engine, "lcm_describe")
    assert overview["session_id"] == "s1"
    tops = [n for depth in overview["depths"].values() for n in depth["nodes"] if n["condensed_into"] is None]
    assert tops and {k: d["count"] for k, d in overview["depths"].items()} == {
        f"d{d.depth}": d.count for d in engine.store.summaries.depth_stats(engine.session.id)}
    reached = [item for node in tops for item in walk_sources(engine, node["node_id"])]
    reached.sort(key=lambda item: item["seq"])
    covered = [r for r in chat.stored() if r.seq <= engine.session.covered_seq]
    assert [i["store_id"] for i in reached] == [r.store_id for r in covered]  # each exactly once
    assert [i["message"] for i in reached] == [r.message for r in covered]


def test_describe_shows_a_node_its_sources_and_its_parent(chat):
    engine = chat.engine
    overview = call(engine, "lcm_describe")
    leaf = overview["depths"]["d0"]["nodes"][0]
    assert set(leaf) >= {"node_id", "token_count", "condensed_into", "expand_hint"}
    detail = call(engine, "lcm_describe", node_id=leaf["node_id"])
    assert detail["depth"] == 0 and detail["source_type"] == "messages"
    assert detail["content"] and detail["token_count"] < detail["source_token_count"]
    assert detail["earliest_at"] <= detail["latest_at"] and detail["session_id"] == "s1"
    expanded = call(engine, "lcm_expand", node_id=leaf["node_id"], source_limit=EXPAND_SOURCES_CAP)
    assert [i["store_id"] for i in expanded["expanded"]] == detail["source_ids"]
    if "d1" in overview["depths"]:
        upper = overview["depths"]["d1"]["nodes"][0]
        up = call(engine, "lcm_describe", node_id=upper["node_id"])
        assert up["source_type"] == "nodes" and up["depth"] == 1
        for child in up["source_ids"]:
            assert call(engine, "lcm_describe", node_id=child)["parent_id"] == upper["node_id"]
        items = call(engine, "lcm_expand", node_id=upper["node_id"])["expanded"]
        assert all(set(i) >= {"node_id", "depth", "content", "token_count"} for i in items)


def test_grep_finds_summaries_that_lead_to_the_matching_message(chat):
    engine = chat.engine
    found = call(engine, "lcm_grep", query="fingerprint", limit=50)
    summaries = [h for h in found["results"] if h["type"] == "summary"]
    assert summaries, "the leaf over the first turn names what it is about"
    target = chat.store_id_of(lambda m: m.get("content") == SECRET)
    assert any(target in {i["store_id"] for i in walk_sources(engine, h["node_id"])} for h in summaries)
    assert all(isinstance(h["depth"], int) and h["snippet"] for h in summaries)


# --------------------------------------------------------------------------- paging


def test_a_long_tool_result_pages_back_exactly(chat):
    engine = chat.engine
    store_id = chat.store_id_of(lambda m: m.get("tool_call_id") == "call_long")
    text, pages = page_content(engine, store_id)
    assert text == LONG
    assert len(pages) == -(-len(LONG) // PAGE_CHARS_DEFAULT)
    assert all(p["content_chars"] == len(LONG) for p in pages)
    assert all(p["content_truncated"] and p["has_more"] for p in pages[:-1])
    assert pages[-1]["has_more"] is False and pages[-1]["content_truncated"] is True
    assert pages[0]["item"]["message"]["tool_call_id"] == "call_long"
    small, small_pages = page_content(engine, store_id, max_tokens=50)
    assert small == LONG and all(len(p["item"]["message"]["content"]) <= 200 for p in small_pages)
    big = call(engine, "lcm_expand", store_id=store_id, max_tokens=10**9)
    assert big["max_tokens_clamped_from"] == 10**9
    assert len(big["item"]["message"]["content"]) == PAGE_CHARS_CAP
    end = call(engine, "lcm_expand", store_id=store_id, content_offset=len(LONG))
    assert end["item"]["message"]["content"] == "" and end["has_more"] is False
    past = call(engine, "lcm_expand", store_id=store_id, content_offset=len(LONG) + 1)
    assert "past the end" in past["error"]


def test_list_content_pages_as_its_json(chat):
    store_id = chat.store_id_of(lambda m: isinstance(m.get("content"), list))
    text, pages = page_content(chat.engine, store_id, max_tokens=50)
    assert json.loads(text) == PARTS and len(pages) > 1
    assert all(p["item"]["content_format"] == "json" for p in pages)


def test_load_session_pages_reproduce_the_whole_session(chat):
    engine = chat.engine
    stored = chat.stored()
    items, cursor, pages = [], None, 0
    while True:
        args = {"session_id": "s1", "limit": 7, "max_content_chars": 20_000}
        if cursor is not None:
            args["after_store_id"] = cursor
        page = call(engine, "lcm_load_session", **args)
        pages += 1
        items.extend(page["messages"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert len(page["messages"]) == 7
    assert pages == -(-len(stored) // 7)
    assert [i["store_id"] for i in items] == [r.store_id for r in stored]
    for item, rec in zip(items, stored, strict=True):
        if item.get("content_truncated"):  # only LONG is over 20,000 characters
            assert item["message"]["content"] == LONG[:20_000] and item["content_chars"] == len(LONG)
            item["message"]["content"] = page_content(engine, item["store_id"])[0]
        if item.get("fields_truncated"):  # only the 9,000-character patch arguments
            assert item["fields_truncated"] == ["tool_calls"]
            whole, _ = page_content(engine, item["store_id"], field="tool_calls")
            assert whole.startswith(item["message"]["tool_calls"])
            item["message"]["tool_calls"] = json.loads(whole)
        assert item["message"] == rec.message and item["seq"] == rec.seq
    exact = call(engine, "lcm_load_session", session_id="s1", limit=len(stored) if len(stored) <= 200 else 200)
    if len(stored) <= LOAD_LIMIT_CAP:
        assert exact["next_cursor"] is None  # null exactly at the end, no empty extra page


def test_load_session_filters_roles_and_cuts_text_and_fields(chat):
    engine = chat.engine
    users = call(engine, "lcm_load_session", session_id="s1", roles=["user"], limit=200)
    assert users["messages"] and {i["message"]["role"] for i in users["messages"]} == {"user"}
    assert len(users["messages"]) == sum(1 for r in chat.stored() if r.role == "user")
    cut = call(engine, "lcm_load_session", session_id="s1", max_content_chars=100, limit=12)
    long_item = next(i for i in cut["messages"] if i["message"].get("tool_call_id") == "call_long")
    assert long_item["content_truncated"] is True and long_item["message"]["content"] == LONG[:100]
    patch = next(i for i in cut["messages"] if i["message"].get("tool_calls") and
                 "call_patch" in json.dumps(i["message"]["tool_calls"]))
    assert patch["fields_truncated"] == ["tool_calls"] and len(patch["message"]["tool_calls"]) == 8_000
    parts = next(i for i in cut["messages"] if i["message"]["role"] == "user" and "content_format" in i)
    assert parts["content_truncated"] is True and parts["content_chars"] == len(text_content({"content": PARTS}))


# --------------------------------------------------------------------------- grep filters and sorts


def test_grep_filters_by_role_time_and_source(chat):
    engine = chat.engine
    tools = call(engine, "lcm_grep", query="output", role="tool", limit=50)
    assert tools["results"] and {h["role"] for h in tools["results"]} == {"tool"}
    assert tools["summary_results_omitted"] is True
    early = call(engine, "lcm_grep", query="changelog", time_to="2023-11-14T22:14:20Z")
    assert [h["timestamp"] for h in early["results"]] == [T0 + 60]
    window = call(engine, "lcm_grep", query="changelog", time_from=T0 + 61, time_to="2023-11-14T23:14:23+01:00")
    assert [(h["role"], h["timestamp"]) for h in window["results"]] == [("assistant", T0 + 63), ("assistant", T0 + 61)]
    later = call(engine, "lcm_grep", query="QX7", time_from=T0 + 1)
    assert later["results"] == []
    assert call(engine, "lcm_grep", query="QX7", source="cli")["results"]
    assert call(engine, "lcm_grep", query="QX7", source="telegram")["results"] == []
    naive = call(engine, "lcm_grep", query="QX7", time_from="2023-11-14T22:13:20")
    assert "time zone" in naive["error"]


def test_grep_sorts_and_clamps(chat):
    engine = chat.engine
    recency = call(engine, "lcm_grep", query="request", limit=20, session_scope="all")
    stamps = [h["timestamp"] for h in recency["results"]]
    assert len(stamps) == 20 and stamps == sorted(stamps, reverse=True)
    for sort in ("relevance", "hybrid"):
        ranked = call(engine, "lcm_grep", query="request fact7", sort=sort, limit=5, session_scope="all")
        assert ranked["results"] and all("score" in h for h in ranked["results"])
        assert "fact7" in ranked["results"][0]["snippet"]
    huge = call(engine, "lcm_grep", query="request", limit=10**12)
    assert huge["limit_clamped_from"] == 10**12 and len(huge["results"]) <= GREP_LIMIT_CAP


#: A question asked in plain words: no stored message has all of them.
QUESTION = "which port did we move the staging database to?"
PORT_ANSWER = "Done: the staging database now listens on port 6543 after the move (it was 5432)."


def test_a_question_in_plain_words_finds_its_answer(make_engine):
    """Issue 15.1: every word first, then any of the question's content words by BM25, each
    hit saying how it matched; stop words alone search nothing; semantic degrades to words."""
    engine = make_engine(context_length=200_000)
    engine.on_session_start("q")
    noise = [[{"role": "user", "content": f"check the {w} settings for worker {i}"},
              {"role": "assistant", "content": f"The {w} for worker {i} looks fine."}]
             for i, w in enumerate(["port", "database", "cache", "queue", "port", "database"] * 5)]
    answer = [{"role": "user", "content": "please relocate our pre-production store off the default"},
              {"role": "assistant", "content": PORT_ANSWER}]
    transcript = [SYSTEM]
    for t in noise[:15] + [answer] + noise[15:]:
        transcript = host_step(engine, transcript, t)
    asked = call(engine, "lcm_grep", query=QUESTION, sort="relevance")
    assert asked["results"] and {h["match"] for h in asked["results"]} <= {"any", "neighbour"}
    top = asked["results"][0]
    assert top["type"] == "message" and "6543" in top["snippet"] and "**staging**" in top["snippet"]
    for sort in ("recency", "hybrid"):  # the words that are there rank the answer first whatever the sort
        assert "6543" in call(engine, "lcm_grep", query=QUESTION, sort=sort)["results"][0]["snippet"]
    # Filters hold in the any-word part too (the role is in both indexes' scope).
    said = call(engine, "lcm_grep", query=QUESTION, role="assistant", session_scope="all")["results"]
    assert said and "6543" in said[0]["snippet"] and {h["role"] for h in said} == {"assistant"}
    asked_by_user = call(engine, "lcm_grep", query=QUESTION, role="user", session_scope="all")["results"]
    assert asked_by_user and all("6543" not in h["snippet"] and h["role"] == "user" for h in asked_by_user)
    # Other forms of the words (the stemmed index): "relocated" and "stores" find "relocate", "store".
    forms = call(engine, "lcm_grep", query="who relocated the stores", sort="relevance")["results"]
    assert forms[0]["match"] == "any" and "**relocate**" in forms[0]["snippet"]
    exact = call(engine, "lcm_grep", query="staging database port", limit=5)
    assert exact["results"][0]["match"] == "all" and "6543" in exact["results"][0]["snippet"]
    assert all(h["match"] in ("any", "neighbour") for h in exact["results"][1:])
    assert call(engine, "lcm_grep", query="what is it that we did")["results"] == []  # only stop words
    assert [h["match"] for h in call(engine, "lcm_grep", query='"staging database"')["results"]] == ["all"]
    semantic = call(engine, "lcm_grep", query=QUESTION, mode="semantic", sort="relevance")
    assert semantic["degraded"] is True and "full_text" in semantic["degraded_reason"]
    assert semantic["results"] == asked["results"]
    assert "error" in call(engine, "lcm_grep", query=QUESTION, mode="vector")


SYNTAX = ['"unbalanced', "NEAR(a b)", "*", "-", ":", "OR", "AND NOT", "col:QX7", "QX7*", "^QX7",
          "'; DROP TABLE lcm_messages; --", "a & | ! b", "(((", "\x00", "🙂", "", "   "]


def test_any_query_text_is_a_search_never_a_syntax_error(chat):
    for query in SYNTAX:
        for sort in ("recency", "relevance", "hybrid"):
            res = call(chat.engine, "lcm_grep", query=query, sort=sort)
            assert "results" in res, (query, sort, res)
    assert call(chat.engine, "lcm_grep", query="QX7*")["results"]  # a prefix query still works
    assert call(chat.engine, "lcm_status")["stored_messages"] == len(chat.sent)


# --------------------------------------------------------------------------- scopes and sessions


def test_scopes_cover_other_sessions_only_when_asked(chat):
    engine = chat.engine
    engine.on_session_start("s2", platform="telegram")  # a new session, nothing carried
    call(engine, "lcm_status", messages=[SYSTEM, {"role": "user", "content": "hello from s2 zircon"}])
    assert [h["session_id"] for h in call(engine, "lcm_grep", query="zircon")["results"]] == ["s2"]
    assert call(engine, "lcm_grep", query="QX7")["results"] == []
    everywhere = call(engine, "lcm_grep", query="QX7", session_scope="all")
    assert [(h["type"], h["session_id"]) for h in everywhere["results"]] == [("message", "s1")]
    one = call(engine, "lcm_grep", query="QX7 OR zircon", session_scope="session", session_id="s1")
    assert {h["session_id"] for h in one["results"]} == {"s1"}
    assert call(engine, "lcm_grep", query="QX7", session_scope="all", source="telegram")["results"] == []
    opened = call(engine, "lcm_expand", store_id=everywhere["results"][0]["store_id"])
    assert opened["from_current_session"] is False and opened["item"]["message"]["content"] == SECRET
    assert "not found" in call(engine, "lcm_grep", query="x", session_scope="session", session_id="s9")["error"]
    assert "session_scope='session'" in call(engine, "lcm_grep", query="x", session_id="s1")["error"]
    assert "needs session_id" in call(engine, "lcm_grep", query="x", session_scope="session")["error"]
    assert "not found" in call(engine, "lcm_load_session", session_id="s9")["error"]


def test_carried_summaries_show_in_the_new_session(make_engine):
    chat = build_chat(make_engine, new_session_retain_depth=1)
    engine = chat.engine
    engine.on_session_reset()
    engine.on_session_start("s3", platform="cli")
    overview = call(engine, "lcm_describe")
    carried = [n for d in overview["depths"].values() for n in d["nodes"] if n.get("carried")]
    assert overview["session_id"] == "s3" and carried
    # Their message numbers are another session's, and say so (issue 33.9).
    assert all(re.fullmatch(r"messages \d+-\d+ of session s[12]", n["covers"]) for n in carried), carried
    word = max(tokenize(call(engine, "lcm_describe", node_id=carried[0]["node_id"])["content"]), key=len)
    hits = call(engine, "lcm_grep", query=word, limit=50)["results"]
    assert hits and {h["type"] for h in hits} == {"summary"}  # raw messages stayed in s1
    assert {h["node_id"] for h in hits} <= {n["node_id"] for n in carried}
    assert call(engine, "lcm_status")["carried_summaries"] == len(carried)


def test_handle_tool_call_stores_the_live_transcript_first(chat):
    engine = chat.engine
    live = [*chat.transcript, {"role": "user", "content": "remember the codeword periwinkle"}]
    before = call(engine, "lcm_status")["stored_messages"]
    found = call(engine, "lcm_grep", messages=live, query="periwinkle")
    assert [h["role"] for h in found["results"]] == ["user"]
    again = call(engine, "lcm_grep", messages=live, query="periwinkle")
    assert len(again["results"]) == 1
    assert call(engine, "lcm_status")["stored_messages"] == before + 1
    summary_markers = [m for m in live if SUMMARY_MARKER in str(m.get("content"))]
    assert summary_markers, "the live transcript holds lcm's own summary messages"
    assert call(engine, "lcm_grep", query="REFERENCE ONLY", role="user")["results"] == []


# --------------------------------------------------------------------------- status and doctor


def test_status_reports_counts_pressure_and_the_last_outcome(make_engine, chat):
    fresh = make_engine()
    fresh.on_session_start("other")
    empty = call(fresh, "lcm_status")
    assert empty["stored_messages"] == 0 and empty["last_compaction"]["status"] == "none"
    assert empty["last_compaction"]["reason"]
    engine = chat.engine
    status = call(engine, "lcm_status")
    for key in ("agent_id", "session_id", "compression_count", "stored_messages", "nodes_by_depth",
                "context_length", "threshold_tokens", "last_prompt_tokens", "backend", "database",
                "summarizer", "last_compaction"):
        assert key in status, key
    assert status["stored_messages"] == len(chat.sent) and status["session_id"] == "s1"
    assert status["nodes_by_depth"]["d0"] >= 1 and status["compression_count"] == engine.compression_count
    assert status["backend"] == engine.store.backend_name and status["context_length"] == 6000
    assert set(status["summarizer"]) >= {"route", "breaker"}
    assert status["last_compaction"]["status"] and status["last_compaction"]["reason"]
    engine.compress([SYSTEM, {"role": "user", "content": "short"}], current_tokens=10)
    idle = call(engine, "lcm_status")["last_compaction"]
    assert idle["status"] == "not_needed" and idle["reason"]


def test_doctor_is_healthy_on_a_fresh_and_on_a_compacted_database(make_engine, chat):
    fresh = make_engine()
    report = call(fresh, "lcm_doctor")
    assert report["overall"] == "healthy", report
    report = call(chat.engine, "lcm_doctor")
    assert report["overall"] == "healthy", report
    names = {c["name"] for c in report["checks"]}
    assert {"schema_version", "session_counters", "config_summarizer"} <= names
    assert any(n.startswith("search_index") for n in names)
    assert all(set(c) == {"name", "status", "detail"} for c in report["checks"])


def test_doctor_finds_a_broken_index_and_the_cli_repairs_it(chat, db_url, tmp_path):
    engine = chat.engine
    secret_id = message_hits(call(engine, "lcm_grep", query="QX7"))[0]["store_id"]
    newest = chat.stored()[-1].store_id
    drop_from_index(engine.store, secret_id)
    drop_from_index(engine.store, newest)
    assert [h for h in call(engine, "lcm_grep", query="QX7")["results"] if h["type"] == "message"] == []
    report = call(engine, "lcm_doctor")
    assert report["overall"] == "unhealthy"
    assert {c["name"]: c["status"] for c in report["checks"]}["search_index_messages"] == "fail"
    done = subprocess.run([sys.executable, "-m", "lcm", "doctor", "--repair", "--json", "--url", db_url],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["overall"] == "healthy" and result["repair"]["reindexed"]["messages"] == len(chat.sent)
    if engine.store.backend_name == "sqlite":
        backup = Path(result["repair"]["backup"])
        copy = Store.open(f"sqlite:///{backup}")
        assert copy.health.stats()["messages"] == len(chat.sent)
    else:
        assert result["repair"]["backup"] is None
    assert call(engine, "lcm_doctor")["overall"] == "healthy"
    assert message_hits(call(engine, "lcm_grep", query="QX7"))[0]["store_id"] == secret_id


# --------------------------------------------------------------------------- lcm_expand_query


def test_expand_query_without_an_llm_returns_the_evidence_degraded(chat):
    res = call(chat.engine, "lcm_expand_query", prompt="What is the deploy key fingerprint?")
    assert res["degraded"] is True and res["answer"] == "" and "no LLM" in res["degraded_reason"]
    secret = next(e for e in res["evidence"] if e["type"] == "message" and SECRET in e["text"])
    assert secret["store_id"] in res["cited"]["store_ids"]
    nothing = call(chat.engine, "lcm_expand_query", prompt="anything", query="nonexistentword")
    assert nothing["degraded"] is False and nothing["cited"] == {"node_ids": [], "store_ids": []}


def test_expand_query_answers_with_checked_citations(chat, make_engine, llm):
    secret_id = message_hits(call(chat.engine, "lcm_grep", query="QX7"))[0]["store_id"]
    llm.handler = lambda body: completion(
        f"The fingerprint is QX7-ALPHA-90210 [msg:{secret_id}], see also [msg:999999] [node:424242].")
    engine = make_engine(context_length=6000, summary_base_url=llm.url, summary_model="answerer")
    engine.on_session_start("s1")
    res = call(engine, "lcm_expand_query", prompt="What is the deploy key fingerprint?",
               max_tokens=120, context_max_tokens=256)
    assert res["degraded"] is False and "QX7-ALPHA-90210" in res["answer"]
    assert res["cited"] == {"node_ids": [], "store_ids": [secret_id]}  # invented ids are dropped
    request = llm.requests[-1]
    assert request["model"] == "answerer" and request["max_tokens"] == 120
    evidence = request["messages"][-1]["content"]
    assert SECRET in evidence and len(evidence) < 256 * 4 + 600  # the budget bounds the evidence


def test_expand_query_degrades_when_the_llm_fails(chat, make_engine, llm):
    llm.handler = lambda body: error(503, "overloaded")
    engine = make_engine(context_length=6000, summary_base_url=llm.url, summary_model="m",
                         summary_timeout_ms=5000)
    engine.on_session_start("s1")
    res = call(engine, "lcm_expand_query", prompt="deploy key fingerprint")
    assert res["degraded"] is True and "503" in res["degraded_reason"]
    assert any(SECRET in e["text"] for e in res["evidence"])


def test_expand_query_over_given_nodes(chat):
    engine = chat.engine
    leaf = call(engine, "lcm_describe")["depths"]["d0"]["nodes"][0]["node_id"]
    res = call(engine, "lcm_expand_query", prompt="what happened first?", node_ids=[leaf])
    assert res["degraded"] is True and res["evidence"][0] == {
        "type": "summary", "node_id": leaf, "depth": 0,
        "text": engine.store.summaries.get(leaf).content}
    sources = call(engine, "lcm_describe", node_id=leaf)["source_ids"]
    assert [e["store_id"] for e in res["evidence"][1:]] == sources
    missing = call(engine, "lcm_expand_query", prompt="x", node_ids=[leaf, 10**9])
    assert "not found" in missing["error"]


# --------------------------------------------------------------------------- bad calls


BAD_CALLS = [
    ("lcm_nope", {}, "unknown tool"),
    ("lcm_grep", {}, "needs the argument 'query'"),
    ("lcm_grep", {"query": 5}, "query must be a string"),
    ("lcm_grep", {"query": "x", "limit": "5"}, "JSON integer"),
    ("lcm_grep", {"query": "x", "limit": 5.0}, "JSON integer"),
    ("lcm_grep", {"query": "x", "limit": True}, "JSON integer"),
    ("lcm_grep", {"query": "x", "limit": 0}, "at least 1"),
    ("lcm_grep", {"query": "x", "sort": "best"}, "recency, relevance, hybrid"),
    ("lcm_grep", {"query": "x", "session_scope": "everything"}, "current, all, session"),
    ("lcm_grep", {"query": "x", "time_from": "yesterday"}, "ISO-8601"),
    ("lcm_grep", {"query": "x", "regex": True}, "no argument 'regex'"),
    ("lcm_describe", {"node_id": -1}, "at least 1"),
    ("lcm_expand", {}, "exactly one of node_id"),
    ("lcm_expand", {"node_id": 1, "store_id": 1}, "exactly one of node_id"),
    ("lcm_expand", {"store_id": 1, "content_offset": -5}, "at least 0"),
    ("lcm_expand", {"node_id": 1, "source_offset": -1}, "at least 0"),
    ("lcm_expand", {"node_id": 1, "content_offset": 3}, "use it with store_id"),
    ("lcm_expand", {"store_id": 1, "source_limit": 3}, "use them with node_id"),
    ("lcm_expand", {"store_id": 10**9}, "not found"),
    ("lcm_expand", {"node_id": 10**9}, "not found"),
    ("lcm_expand", {"store_id": 2**70}, "not found"),
    ("lcm_describe", {"node_id": 2**64}, "not found"),
    ("lcm_expand_query", {"prompt": "x", "node_ids": ["1"]}, "list of integers"),
    ("lcm_load_session", {}, "needs the argument 'session_id'"),
    ("lcm_load_session", {"session_id": "s1", "roles": "user"}, "list of strings"),
    ("lcm_load_session", {"session_id": "s1", "after_store_id": 10**9}, "not a message of session"),
    ("lcm_status", {"verbose": True}, "no arguments"),
]


def test_bad_calls_get_an_error_that_says_what_to_do(chat):
    wrong = []
    for name, args, fragment in BAD_CALLS:  # one session for all: each call is read-only
        res = call(chat.engine, name, **args)
        if set(res) != {"error"} or fragment not in res["error"]:
            wrong.append((name, args, fragment, res))
    assert not wrong, wrong
    assert call(chat.engine, "lcm_status")["stored_messages"] == len(chat.sent)


def test_arguments_that_are_not_an_object_are_an_error(make_engine):
    engine = make_engine()
    res = json.loads(engine.handle_tool_call("lcm_grep", ["query", "x"]))  # type: ignore[arg-type]
    assert "JSON object" in res["error"]
    assert "results" in json.loads(engine.handle_tool_call("lcm_grep", {"query": "x"}))
    assert "depths" in json.loads(engine.handle_tool_call("lcm_describe", None))  # type: ignore[arg-type]


def test_a_database_that_is_down_is_an_error_never_an_exception(tmp_path):
    config = LcmConfig.from_env({}, database_url="postgresql+psycopg://postgres@127.0.0.1:1/none")
    engine = LcmEngine(config)
    engine.update_model("m", 8000)
    for name in sorted(AGENT_TOOLS):
        args = {"query": "x"} if name == "lcm_grep" else {"prompt": "x"} if name == "lcm_expand_query" \
            else {"session_id": "s"} if name == "lcm_load_session" else {}
        res = json.loads(engine.handle_tool_call(name, args, messages=[{"role": "user", "content": "hi"}]))
        assert set(res) == {"error"} and name in res["error"], (name, res)


# --------------------------------------------------------------------------- adversarial scope


@pytest.fixture
def two_agents(db_url) -> tuple[LcmEngine, LcmEngine, Chat]:
    """alice's compacted session and bob's small one, under the same host session id."""
    def engine_for(agent: str) -> LcmEngine:
        from tests.conftest import SMALL_ENGINE

        engine = LcmEngine(LcmConfig.from_env({}, database_url=db_url, agent_id=agent, **SMALL_ENGINE))
        engine.update_model("m", 6000)
        return engine

    Store.open(db_url, upgrade=True)  # PostgreSQL schemas are upgraded by an operator, not the engine
    alice = build_chat(lambda **kw: engine_for("alice"))
    alice.engine.on_session_start("s1")
    bob = engine_for("bob")
    bob.on_session_start("s1", platform="cli")
    bob.compress([SYSTEM, {"role": "user", "content": "bob's own note: marigold"},
                  {"role": "assistant", "content": "ok"}])
    return alice.engine, bob, alice


def test_another_agents_ids_are_not_found_like_ids_that_do_not_exist(two_agents):
    alice, bob, chat = two_agents
    store = alice.store
    alice_ids = [r.store_id for r in chat.stored()]
    alice_nodes = [n.id for d in range(3) for n in store.summaries.of_session(alice.session.id, depth=d, limit=500)]
    assert alice_nodes
    bob_ids = {r.store_id for r in store.messages.get_range(bob.session.id)}
    for store_id in alice_ids:
        assert store_id not in bob_ids
        res = call(bob, "lcm_expand", store_id=store_id)
        assert res == {"error": res["error"]} and res["error"].startswith(f"store_id {store_id} not found")
        assert "not a message of session" in call(bob, "lcm_load_session", session_id="s1",
                                                  after_store_id=store_id)["error"]
    for node_id in alice_nodes:
        for name, args in (("lcm_expand", {"node_id": node_id}), ("lcm_describe", {"node_id": node_id}),
                           ("lcm_expand_query", {"prompt": "x", "node_ids": [node_id]})):
            res = call(bob, name, **args)
            assert res == {"error": f"node {node_id} not found in this agent's summaries; "
                                    "lcm_describe lists the node ids"}
    assert call(bob, "lcm_describe")["depths"] == {}
    own = call(bob, "lcm_load_session", session_id="s1", limit=10**6)
    assert own["limit_clamped_from"] == 10**6
    assert [i["message"]["content"] for i in own["messages"]] == ["bob's own note: marigold", "ok"]
    assert call(alice, "lcm_grep", query="marigold", session_scope="all")["results"] == []


ESCAPES = ["QX7", "QX7 OR marigold", "scope:aalice", "scope:*", "a1", "§a1", "s1 OR a1 OR a2",
           'body:"QX7"', "QX7' OR '1'='1", "QX7\") OR 1=1 --", "* OR QX7", "NEAR(QX7 ALPHA)",
           "fingerprint deploy key", "{scope body}: QX7"]


def test_no_crafted_query_reaches_another_agents_rows(two_agents):
    alice, bob, _ = two_agents
    for query in ESCAPES:
        _bob_sees_only_his_own(bob, query)


def _bob_sees_only_his_own(bob: LcmEngine, query: str) -> None:
    bob_sessions = {"s1"}
    for scope in ("current", "all"):
        for sort in ("recency", "relevance", "hybrid"):
            res = call(bob, "lcm_grep", query=query, session_scope=scope, sort=sort, limit=10**6)
            assert "results" in res, res
            for hit in res["results"]:
                assert hit["type"] == "message" and hit["session_id"] in bob_sessions
                assert "QX7" not in hit["snippet"] and "fingerprint" not in hit["snippet"]
    answer = call(bob, "lcm_expand_query", prompt=query, query=query, max_results=10**6)
    assert all(SECRET not in e["text"] for e in answer.get("evidence", []))
    assert all("QX7" not in json.dumps(e) for e in answer.get("evidence", []))


def test_any_field_of_a_message_pages_back_exactly(chat):
    engine = chat.engine
    store_id = chat.store_id_of(lambda m: "call_patch" in json.dumps(m.get("tool_calls")))
    whole, pages = page_content(engine, store_id, field="tool_calls", max_tokens=1_000)
    assert json.loads(whole) == json.loads(BIG_TOOL_CALLS) and len(pages) == 3
    assert all(p["field"] == "tool_calls" and p["item"]["content_format"] == "json" for p in pages)
    assert "has no field 'nope'" in call(engine, "lcm_expand", store_id=store_id, field="nope")["error"]
    assert "tool_calls" in call(engine, "lcm_expand", store_id=store_id, field="role")["error"]


def test_lcm_own_calls_and_results_are_stored_but_not_searchable(chat):
    """Else every lcm_grep finds the call that asked for it, and every result echoes old text."""
    engine = chat.engine
    ask = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "g1", "type": "function", "function": {"name": "lcm_grep", "arguments": '{"query": "quokka"}'}},
        {"id": "s1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "locate quokka"}'}}]}
    live = [*chat.transcript, {"role": "user", "content": "where is the quokka file?"}, ask]
    first = call(engine, "lcm_grep", messages=live, query="quokka")
    assert [(h["role"], "locate" in h["snippet"]) for h in message_hits(first)] == [
        ("assistant", True), ("user", False)]  # the shell call is found by its command, lcm_grep's is not
    live += [{"role": "tool", "tool_call_id": "g1", "content": json.dumps(first)},
             {"role": "tool", "tool_call_id": "s1", "content": "/srv/quokka.txt"},
             {"role": "assistant", "content": "It is /srv/quokka.txt."}]
    again = call(engine, "lcm_grep", messages=live, query="quokka", limit=50)
    assert [h["role"] for h in message_hits(again)] == ["assistant", "tool", "assistant", "user"]
    stored_now = [r.message for r in chat.stored()]
    assert ask in stored_now and live[-3] in stored_now  # stored verbatim all the same


# --------------------------------------------------------------------------- issue 13.10, 13.11


def test_node_ids_of_another_session_of_the_agent_are_not_found(make_engine):
    """Issue 13.10: lcm_describe and lcm_expand by node_id answered for another session's node."""
    first = build_chat(make_engine)
    node = call(first.engine, "lcm_describe")["depths"]["d0"]["nodes"][0]["node_id"]
    assert call(first.engine, "lcm_describe", node_id=node)["node_id"] == node
    other = make_engine()
    other.on_session_start("another-session")
    other.on_turn_complete([SYSTEM, *turn(0)])
    for tool, args in (("lcm_describe", {"node_id": node}), ("lcm_expand", {"node_id": node}),
                       ("lcm_expand_query", {"prompt": "?", "node_ids": [node]})):
        res = json.loads(other.handle_tool_call(tool, args))
        assert "not found" in json.dumps(res).lower() or res.get("evidence_count", 0) == 0, (tool, res)


@pytest.mark.parametrize("tool,args", [
    ("lcm_grep", {"query": "nul \x00 byte"}),
    ("lcm_grep", {"query": "lone \ud800 surrogate"}),
    ("lcm_grep", {"query": "x", "role": "r" * 100}),
    ("lcm_grep", {"query": "x", "session_scope": "session", "session_id": "s" * 300}),
    ("lcm_grep", {"query": "x", "limit": 2**64}),
    ("lcm_expand", {"store_id": 1, "content_offset": 2**63}),
    ("lcm_expand", {"node_id": 1, "source_offset": 2**70}),
    ("lcm_load_session", {"session_id": "s", "after_store_id": 2**64}),
    ("lcm_grep", {1: "x", "query": "y"}),
    ("lcm_grep", {"query": "x", "role": ["deep"] }),
])
def test_odd_tool_arguments_are_argument_errors_never_internal_ones(make_engine, tool, args):
    """Issue 13.11: such calls reached the database and failed "inside lcm" with a traceback."""
    engine = make_engine()
    engine.on_session_start("s")
    engine.on_turn_complete([SYSTEM, *turn(0)])
    res = json.loads(engine.handle_tool_call(tool, args))
    if "error" in res:
        assert "inside lcm" not in res["error"], res
    assert engine.get_status()["last_error"] is None, engine.get_status()["last_error"]


def test_arguments_nested_thousands_deep_are_refused_cleanly(make_engine):
    engine = make_engine()
    engine.on_session_start("s")
    deep: list = []
    node = deep
    for _ in range(3000):
        node.append([])
        node = node[0]
    for args in ({"query": deep}, {"query": "x", "roles": deep}, {"prompt": "q", "node_ids": deep}):
        for tool in ("lcm_grep", "lcm_load_session", "lcm_expand_query"):
            res = json.loads(engine.handle_tool_call(tool, args))
            assert "error" in res and "inside lcm" not in res["error"], (tool, res)
