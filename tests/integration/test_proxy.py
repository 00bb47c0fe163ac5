"""``lcm proxy`` with real clients (the ``openai`` package and raw httpx) against a scripted
OpenAI-compatible upstream on 127.0.0.1: storage exactly once, streaming, the lcm tool loop,
errors and timeouts, and isolation between agents."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from lcm.messages import RECALL_OPEN
from lcm.store import Store
from tests.support.llm_server import Reply, ScriptedLLM, completion, error, tool_call
from tests.support.pg_cluster import free_port
from tests.support.proxy_server import ProxyThread
from tests.support.storing import append_messages

SUMMARY_PROMPTS = ("You write the memory", "You maintain the long-term memory")


def is_summary_call(body: dict[str, Any]) -> bool:
    return ScriptedLLM.system_prompt(body).startswith(SUMMARY_PROMPTS)


def echo(body: dict[str, Any]) -> Reply:
    """The scripted model: summaries when lcm asks for one, else 'echo: <last user text>'."""
    if is_summary_call(body):
        return completion("Summary: the user and the assistant talked.")
    asked = ScriptedLLM.last_user(body).split("\n\n" + RECALL_OPEN)[0]  # without lcm's recall block
    return completion(f"echo: {asked[:80]}", prompt_tokens=100, completion_tokens=5,
                      prompt_tokens_details={"cached_tokens": 64})


@pytest.fixture
def upstream() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM(handler=echo)
    yield server
    server.close()


@pytest.fixture
def proxy(store: Store, upstream: ScriptedLLM) -> Iterator[ProxyThread]:
    running = ProxyThread(store, upstream.url)
    yield running
    running.close()


def client_of(proxy: ProxyThread, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url, api_key="sk-client-secret-123", default_headers=headers or None,
                         max_retries=0, timeout=30)


def stored(store: Store, agent: str, key: str) -> list[dict[str, Any]]:
    session = store.sessions.find(agent, key)
    assert session is not None, f"no session {key!r} of {agent!r}"
    return [r.message for r in store.messages.get_range(session.id, limit=100_000)]


def chat_requests(upstream: ScriptedLLM) -> list[dict[str, Any]]:
    return [b for b in upstream.requests if not is_summary_call(b)]


def test_a_conversation_is_stored_once_and_the_key_goes_upstream_untouched(store, upstream, proxy, db_url):
    client = client_of(proxy, **{"X-LCM-Session": "chat-1"})
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for question in ("where is the parcel?", "and the invoice?", "thanks"):
        history.append({"role": "user", "content": question})
        answer = client.chat.completions.create(model="gpt-4o", messages=history)
        assert answer.choices[0].message.content == f"echo: {question}"
        assert answer.usage.prompt_tokens_details.cached_tokens == 64
        history.append(answer.choices[0].message.model_dump(exclude_none=True))
    rows = stored(store, "default", "chat-1")
    assert [(m["role"], m.get("content")) for m in rows] == [
        (m["role"], m.get("content")) for m in history if m["role"] != "system"]
    assert all(h.get("authorization") == "Bearer sk-client-secret-123" for h in upstream.headers)
    assert all("x-lcm-session" not in h for h in upstream.headers)
    if db_url.startswith("sqlite"):  # the key is nowhere in the database file
        path = Path(db_url.removeprefix("sqlite:///"))
        for file in path.parent.glob(path.name + "*"):
            assert b"sk-client-secret-123" not in file.read_bytes()
    # every upstream call got the client's messages (nothing to compact) and lcm's tools after its own
    sent = chat_requests(upstream)[-1]
    assert [m["content"].split("\n\n<lcm_recall")[0] for m in sent["messages"] if m["role"] == "user"] == [
        "where is the parcel?", "and the invoice?", "thanks"]
    assert {t["function"]["name"] for t in sent["tools"]} >= {"lcm_grep", "lcm_expand", "lcm_describe"}


def test_conversations_without_a_session_header_are_known_by_their_opening(store, upstream, proxy):
    client = client_of(proxy)
    first = [{"role": "user", "content": "plan the trip to Lisbon"}]
    reply = client.chat.completions.create(model="gpt-4o", messages=first)
    second = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
              {"role": "user", "content": "book the train"}]
    client.chat.completions.create(model="gpt-4o", messages=second)
    other = [{"role": "user", "content": "review my essay"}]
    client.chat.completions.create(model="gpt-4o", messages=other)
    keys = sorted(s.session_key for s in store.sessions.each("default"))
    assert len(keys) == 2 and all(k.startswith("proxy-") for k in keys)
    sizes = sorted(len(stored(store, "default", k)) for k in keys)
    assert sizes == [2, 4]


def test_streamed_answers_arrive_in_order_with_usage_and_are_stored(store, upstream, proxy):
    long_text = "word " * 300  # several content chunks
    upstream.handler = lambda body: echo(body) if is_summary_call(body) else completion(
        long_text, prompt_tokens=50, completion_tokens=300, prompt_tokens_details={"cached_tokens": 32})
    client = client_of(proxy, **{"X-LCM-Session": "s"})
    history = [{"role": "user", "content": "tell me a long story"}]
    stream = client.chat.completions.create(model="gpt-4o", messages=history, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == long_text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 300
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert stored(store, "default", "s")[-1] == {"role": "assistant", "content": long_text}
    history.append({"role": "assistant", "content": long_text})
    history.append({"role": "user", "content": "shorter please"})
    list(client.chat.completions.create(model="gpt-4o", messages=history, stream=True))
    assert [m["role"] for m in stored(store, "default", "s")] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_the_proxy_answers_lcm_tool_calls_and_the_client_sees_one_answer(store, upstream, proxy, streamed):
    """The model calls lcm_grep; the proxy runs it, asks again with the result; the client gets
    the final text only, and the stored conversation holds no lcm round."""
    client = client_of(proxy, **{"X-LCM-Session": "tools"})
    history: list[dict[str, Any]] = [{"role": "user", "content": "the ferry code is QX-7781"}]
    history.append(client.chat.completions.create(model="gpt-4o", messages=history).choices[0]
                   .message.model_dump(exclude_none=True))

    def model(body: dict[str, Any]) -> Reply:
        if is_summary_call(body):
            return echo(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            found = json.loads(last["content"])
            return completion("found: " + " | ".join(r["snippet"] for r in found["results"]))
        return completion(None, tool_calls=[tool_call("lcm_grep", {"query": "ferry code"}, "call_1")])

    upstream.handler = model
    history.append({"role": "user", "content": "what was the ferry code?"})
    own_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    if streamed:
        chunks = list(client.chat.completions.create(model="gpt-4o", messages=history, tools=[own_tool],
                                                     stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert len({c.id for c in chunks}) == 1
    else:
        answer = client.chat.completions.create(model="gpt-4o", messages=history, tools=[own_tool])
        assert answer.choices[0].message.tool_calls is None
        assert answer.choices[0].finish_reason == "stop"
        text = answer.choices[0].message.content
    assert "QX-7781" in text
    calls = chat_requests(upstream)[-2:]
    assert [t["function"]["name"] for t in calls[0]["tools"]][0] == "get_weather"
    assert calls[1]["messages"][-1]["role"] == "tool" and calls[1]["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    rows = stored(store, "default", "tools")
    assert [m["role"] for m in rows] == ["user", "assistant", "user", "assistant"]
    assert "QX-7781" in rows[-1]["content"] and "tool_calls" not in rows[-1]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_a_response_mixing_lcm_and_client_calls_reaches_the_client_with_its_own_calls(store, upstream, proxy,
                                                                                       streamed):
    upstream.handler = lambda body: echo(body) if is_summary_call(body) else completion(None, tool_calls=[
        tool_call("lcm_grep", {"query": "x"}, "call_lcm"), tool_call("get_weather", {"city": "Oslo"}, "call_own")])
    client = client_of(proxy, **{"X-LCM-Session": "mixed"})
    own_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "weather in Oslo?"}]
    if streamed:
        chunks = list(client.chat.completions.create(model="gpt-4o", messages=messages, tools=[own_tool],
                                                     stream=True))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("call_own", "get_weather", {"city": "Oslo"})]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    else:
        answer = client.chat.completions.create(model="gpt-4o", messages=messages, tools=[own_tool])
        assert [c.id for c in answer.choices[0].message.tool_calls] == ["call_own"]
        assert answer.choices[0].finish_reason == "tool_calls"
    assert len(chat_requests(upstream)) == 1  # the lcm call was not run
    assert [c["id"] for c in stored(store, "default", "mixed")[-1]["tool_calls"]] == ["call_own"]


def test_provider_errors_come_back_with_their_status_and_body(store, upstream, proxy):
    upstream.handler = lambda body: error(429, "slow down: rate limit reached")
    with pytest.raises(openai.RateLimitError) as caught:
        client_of(proxy).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 429 and "slow down" in str(caught.value)
    raw = httpx.post(proxy.url + "/chat/completions", json={
        "model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert raw.status_code == 429 and raw.json()["error"]["message"] == "slow down: rate limit reached"



PROVIDER_HEADERS = [("retry-after-ms", "1500"), ("x-request-id", "req_7f3a"),
                    ("x-ratelimit-remaining-requests", "42"), ("set-cookie", "a=1; Path=/"),
                    ("set-cookie", "b=2; Path=/")]


def _provider_headers_arrived(headers: httpx.Headers) -> None:
    """What a client reads off the provider's answer reached it: each header once, both cookies,
    and none of the upstream's framing (its server, date, length or encoding)."""
    for name, value in PROVIDER_HEADERS:
        if name != "set-cookie":
            assert headers.get_list(name) == [value], name
    assert headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert "content-encoding" not in headers
    assert all("BaseHTTP" not in server for server in headers.get_list("server"))
    assert len(headers.get_list("date")) <= 1 and len(headers.get_list("content-type")) == 1


@pytest.mark.parametrize("case", ["rate_limited", "answered", "answered_gzip", "streamed", "after_an_lcm_round"])
def test_the_providers_headers_reach_the_client_and_its_framing_does_not(store, upstream, proxy, case):
    """``retry-after(-ms)`` drives the openai client's back-off and ``x-request-id`` its request
    ids: they come back as the provider sent them, on errors, answers (compressed ones included:
    the body arrives decompressed, so its encoding must not), streams and rewritten answers."""
    client = client_of(proxy, **{"X-LCM-Session": f"headers-{case}"})
    messages = [{"role": "user", "content": "hi"}]
    if case == "rate_limited":
        upstream.handler = lambda body: Reply(**{**vars(error(429, "slow down")), "headers": PROVIDER_HEADERS})
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gpt-4o", messages=messages)
        _provider_headers_arrived(caught.value.response.headers)
        assert caught.value.request_id == "req_7f3a"
        return
    if case == "after_an_lcm_round":
        calls = iter([completion(None, tool_calls=[tool_call("lcm_status", {}, "call_1")]),
                      completion("all well")])
        upstream.handler = lambda body: echo(body) if is_summary_call(body) else Reply(
            **{**vars(next(calls)), "headers": PROVIDER_HEADERS})
    else:
        upstream.handler = lambda body: echo(body) if is_summary_call(body) else Reply(
            **{**vars(completion("all well")), "headers": PROVIDER_HEADERS, "gzip": case == "answered_gzip"})
    if case == "streamed":
        with client.chat.completions.with_streaming_response.create(model="gpt-4o", messages=messages,
                                                                     stream=True) as answer:
            text = "".join(c.choices[0].delta.content or "" for c in answer.parse() if c.choices)
            _provider_headers_arrived(answer.headers)
            assert answer.headers.get_list("cache-control") == ["no-cache"]
    else:
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        _provider_headers_arrived(raw.headers)
        assert raw.request_id == "req_7f3a"
        text = raw.parse().choices[0].message.content
    assert text == "all well"
    assert stored(store, "default", f"headers-{case}")[-1]["content"] == "all well"


def test_a_request_sent_four_times_at_once_stores_its_message_once_and_every_answer_once(store, upstream, proxy):
    """A double (quadruple) submit: the question is stored once; each of the four different
    answers the clients got is kept once (the first in the session, the others in forks from
    the question); the client that goes on with the third answer continues in its fork."""
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    numbers, lock = itertools.count(1), threading.Lock()

    def answer(body: dict[str, Any]) -> Reply:
        if is_summary_call(body):
            return echo(body)
        with lock:
            return completion(f"answer {next(numbers)}")

    upstream.handler = answer
    history: list[dict[str, Any]] = [{"role": "user", "content": "a question sent four times"}]

    def ask(messages: list[dict[str, Any]]) -> str:
        got = httpx.post(proxy.url + "/chat/completions", json={"model": "m", "messages": messages},
                         headers={"X-LCM-Session": "quadruple"}, timeout=60)
        assert got.status_code == 200, got.text
        return str(got.json()["choices"][0]["message"]["content"])

    with ThreadPoolExecutor(4) as pool:
        answers = sorted(pool.map(ask, [history] * 4))
    assert answers == ["answer 1", "answer 2", "answer 3", "answer 4"]
    kept = {s.session_key: [m["content"] for m in stored(store, "default", s.session_key)]
            for s in store.sessions.each("default")}
    assert sum(rows.count("a question sent four times") for rows in kept.values()) == 1
    assert sorted(c for rows in kept.values() for c in rows if c.startswith("answer")) == answers
    ask([*history, {"role": "assistant", "content": "answer 3"}, {"role": "user", "content": "go on"}])
    third = next(key for key, rows in kept.items() if "answer 3" in rows)
    assert [m["content"] for m in stored(store, "default", third)][-3:] == ["answer 3", "go on", "answer 5"]


def test_several_choices_store_the_first_and_a_client_going_on_with_another_forks_there(store, upstream, proxy):
    """``n`` > 1: lcm cannot know which choice the client keeps. The first is stored as the
    answer; a client that goes on with another has edited its history, and the conversation
    continues in a fork from there: both choices kept, nothing stored twice."""
    two = completion("choice zero").body
    two["choices"].append({"index": 1, "message": {"role": "assistant", "content": "choice one"},
                           "finish_reason": "stop"})
    upstream.handler = lambda body: echo(body) if is_summary_call(body) or body.get("n") is None else Reply(200, two)
    client = client_of(proxy, **{"X-LCM-Session": "choices"})
    history: list[dict[str, Any]] = [{"role": "user", "content": "give me two"}]
    answer = client.chat.completions.create(model="gpt-4o", messages=history, n=2)
    assert [c.message.content for c in answer.choices] == ["choice zero", "choice one"]
    assert "tools" not in chat_requests(upstream)[-1]  # no lcm tools with several choices
    history += [{"role": "assistant", "content": "choice one"}, {"role": "user", "content": "go on"}]
    assert client.chat.completions.create(model="gpt-4o", messages=history).choices[0].message.content == "echo: go on"
    assert [m["content"] for m in stored(store, "default", "choices")] == ["give me two", "choice zero"]
    fork = store.sessions.find("default", "choices/fork-1")
    assert fork is not None and fork.parent_id == store.sessions.find("default", "choices").id
    assert [m["content"] for m in stored(store, "default", "choices/fork-1")] == ["choice one", "go on", "echo: go on"]


@pytest.mark.parametrize("case", ["answered", "streamed", "after_an_lcm_round"])
def test_a_lone_surrogate_in_a_message_is_stored_sent_and_echoed_back_without_a_500(store, upstream, proxy, case):
    """JSON text may carry a lone surrogate (``"\\ud800"``), which UTF-8 cannot: the proxy
    writes its JSON with ASCII escapes then. It was a 500 after the message was stored."""
    text = "broken \ud800 half of a pair"
    if case == "after_an_lcm_round":
        calls = iter([completion(None, tool_calls=[tool_call("lcm_status", {}, "call_1")])])
        upstream.handler = lambda body: next(calls, None) or echo(body)
    raw = ('{"model": "gpt-4o", "stream": %s, "messages": [{"role": "user", "content": "broken \\ud800 half '
           'of a pair"}]}' % ("true" if case == "streamed" else "false"))
    answer = httpx.post(proxy.url + "/chat/completions", content=raw.encode(), timeout=30,
                        headers={"Content-Type": "application/json", "X-LCM-Session": f"surrogate-{case}"})
    assert answer.status_code == 200, answer.text
    if case == "streamed":
        events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
        said = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    else:
        said = answer.json()["choices"][0]["message"]["content"]
    assert said == f"echo: {text}"
    assert ScriptedLLM.last_user(chat_requests(upstream)[-1]).split("\n\n" + RECALL_OPEN)[0] == text
    assert [m["content"] for m in stored(store, "default", f"surrogate-{case}")] == [text, f"echo: {text}"]


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b"[]", None),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
    (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": ["hello"]}).encode(), "messages[0]"),
    (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages[0].role"),
    (json.dumps({"model": "m", "messages": [{"role": "tool", "content": "x"}]}).encode(),
     "messages[0].tool_call_id"),
    (json.dumps({"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}).encode(), "stream"),
    (json.dumps({"model": "m", "messages": [{"role": "user"}]}).encode(), "messages[0].content"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": None}]}).encode(), "messages[0].content"),
    (json.dumps({"model": "m", "messages": [{"role": "system", "content": 5}]}).encode(), "messages[0].content"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": ["hi"]}]}).encode(), "messages[0].content[0]"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}).encode(),
     "messages[0].content[0].text"),
])
def test_malformed_requests_get_the_apis_400_and_never_reach_the_upstream(store, upstream, proxy, body, param):
    answer = httpx.post(proxy.url + "/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    problem = answer.json()["error"]
    assert problem["type"] == "invalid_request_error" and problem["param"] == param and problem["message"]
    assert upstream.requests == []
    assert store.health.stats()["messages"] == 0  # nothing the provider would refuse is stored


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "tool_calls": [tool_call("run", {}, "c1")]},
    {"role": "assistant", "tool_calls": [tool_call("run", {}, "c1")]},
    {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "x"}},
                                 {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
])
def test_content_the_api_accepts_passes_the_checks(store, upstream, proxy, message):
    history = [{"role": "user", "content": "start"}, message]
    if message.get("tool_calls"):
        history.append({"role": "tool", "tool_call_id": "c1", "content": "done"})
    answer = httpx.post(proxy.url + "/chat/completions", json={"model": "m", "messages": history},
                        headers={"X-LCM-Session": "accepted"})
    assert answer.status_code == 200, answer.text
    assert stored(store, "default", "accepted")[:len(history)] == history


def test_openai_raises_bad_request_for_a_malformed_message(store, upstream, proxy):
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(proxy).chat.completions.create(model="gpt-4o", messages=[{"role": "wizard", "content": "x"}])
    assert "role" in str(caught.value)


def test_an_upstream_that_hangs_costs_a_504_after_the_timeout(store, upstream):
    upstream.handler = lambda body: Reply(200, {"choices": []}, delay=5.0)
    running = ProxyThread(store, upstream.url, timeout=1.0)
    try:
        answer = httpx.post(running.url + "/chat/completions", timeout=30, json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "anyone there?"}]})
        assert answer.status_code == 504 and answer.json()["error"]["code"] == "timeout"
        # what the client sent is kept: its retry stores nothing twice
        upstream.handler = echo
        again = httpx.post(running.url + "/chat/completions", timeout=30, json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "anyone there?"}]})
        assert again.status_code == 200
        (session,) = list(store.sessions.each("default"))
        assert [m["role"] for m in stored(store, "default", session.session_key)] == ["user", "assistant"]
    finally:
        running.close()


@pytest.mark.parametrize("how", ["refused", "closed"])
def test_an_upstream_that_cannot_answer_costs_a_502_and_the_retry_stores_nothing_twice(store, upstream, how):
    """Nothing listening, or a connection closed without an answer: a 502 naming it."""
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello?"}]}
    if how == "refused":
        running = ProxyThread(store, f"http://127.0.0.1:{free_port()}/v1")
    else:
        upstream.handler = lambda body: Reply(close=True)
        running = ProxyThread(store, upstream.url)
    try:
        answer = httpx.post(running.url + "/chat/completions", json=body, timeout=30)
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "upstream_unreachable"
    finally:
        running.close()
    upstream.handler = echo
    running = ProxyThread(store, upstream.url)
    try:
        again = httpx.post(running.url + "/chat/completions", json=body, timeout=30)
        assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == "echo: hello?"
    finally:
        running.close()
    (session,) = list(store.sessions.each("default"))
    assert [m["role"] for m in stored(store, "default", session.session_key)] == ["user", "assistant"]


@pytest.mark.parametrize("how", ["cut", "stalled"])
def test_a_stream_the_upstream_breaks_off_ends_in_an_error_event_and_stores_no_answer(store, upstream, how):
    """The first chunks reach the client; then the upstream closes the connection (cut: an
    HTTP/1.0 body, which only the missing [DONE] and finish reason tell from a whole one) or
    sends nothing for longer than --timeout (stalled). The client's stream ends with an error
    event, no [DONE]; nothing of that answer is stored, and the retry's answer is, once."""
    text = "x" * 600  # four events: the role, three of content
    if how == "cut":
        upstream.handler = lambda body: Reply(200, completion(text).body, cut_after=2)
    else:
        upstream.handler = lambda body: Reply(200, completion(text).body, drip=3.0)
    running = ProxyThread(store, upstream.url, timeout=1.0)
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "tell me"}]}
    try:
        with httpx.stream("POST", running.url + "/chat/completions", json=body, timeout=30) as answer:
            assert answer.status_code == 200
            events = [line[len("data: "):] for line in answer.iter_lines() if line.startswith("data: ")]
        assert "[DONE]" not in events
        last = json.loads(events[-1])
        assert last["error"]["code"] == ("upstream_incomplete" if how == "cut" else "timeout"), last
        assert any(json.loads(e).get("choices") for e in events[:-1])  # what came first was relayed
        (session,) = list(store.sessions.each("default"))
        assert [m["role"] for m in stored(store, "default", session.session_key)] == ["user"]
        upstream.handler = echo
        with httpx.stream("POST", running.url + "/chat/completions", json=body, timeout=30) as again:
            assert [line for line in again.iter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"
        rows = stored(store, "default", session.session_key)
        assert [(m["role"], m.get("content")) for m in rows] == [("user", "tell me"), ("assistant", "echo: tell me")]
    finally:
        running.close()


class _ForwardProxy:
    """A plain-HTTP forward proxy on 127.0.0.1 that relays each request and keeps its target."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _relay(self) -> None:
                outer.targets.append(self.path)  # absolute-form: the upstream's own URL
                length = int(self.headers.get("Content-Length") or 0)
                sent = {k: v for k, v in self.headers.items()
                        if k.lower() not in ("host", "proxy-connection", "connection", "content-length")}
                with httpx.Client(trust_env=False, timeout=30) as relay:  # not through itself
                    answer = relay.request(self.command, self.path, headers=sent,
                                           content=self.rfile.read(length) if length else None)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize("bypassed", [False, True])
def test_the_upstream_is_reached_through_the_environments_http_proxy(store, upstream, monkeypatch, bypassed):
    """HTTP_PROXY is honoured, and NO_PROXY's hosts go direct (read when the proxy starts)."""
    forward = _ForwardProxy()
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, forward.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1" if bypassed else "")
    running = ProxyThread(store, upstream.url)
    try:  # the test's own client goes straight to lcm proxy
        with httpx.Client(trust_env=False, timeout=30) as client:
            answer = client.post(running.url + "/chat/completions", json={
                "model": "gpt-4o", "messages": [{"role": "user", "content": "via whom?"}]})
        assert answer.json()["choices"][0]["message"]["content"] == "echo: via whom?"
        assert forward.targets == ([] if bypassed else [upstream.url + "/chat/completions"])
    finally:
        running.close()
        forward.close()


def test_models_are_passed_through(store, upstream, proxy):
    listed = client_of(proxy).models.list()
    assert [m.id for m in listed.data] == ["scripted"]


def test_the_rest_of_the_api_passes_through_untouched_and_nothing_of_it_is_stored(store, upstream, proxy):
    """A client pointed at the proxy for everything keeps working: embeddings through the
    ``openai`` package, a streamed answer on another route relayed as it came, a query string,
    another method, the upstream's error status."""
    from tests.support.llm_server import embeddings

    upstream.handler = lambda body: embeddings(body) if body.get("model") == "text-embedding-test" else (
        completion("relayed as it came"))
    client = client_of(proxy)
    vectors = client.embeddings.create(model="text-embedding-test", input=["zebra crossing", "the depot"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 64
    assert upstream.paths[-1] == "/v1/embeddings"
    assert upstream.headers[-1]["authorization"] == "Bearer sk-client-secret-123"
    with httpx.stream("POST", proxy.url + "/responses", json={"model": "m", "input": "hi", "stream": True},
                      headers={"Authorization": "Bearer sk-x"}) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                   if json.loads(e[6:])["choices"]) == "relayed as it came"
    assert upstream.paths[-1] == "/v1/responses"
    listed = httpx.get(proxy.url + "/files", params=[("purpose", "assistants"), ("include", "a"), ("include", "b")])
    assert listed.status_code == 200 and upstream.paths[-1] == "/v1/files?purpose=assistants&include=a&include=b"
    client.files.create(file=("notes.jsonl", b'{"a": "multipart bytes as sent"}\n'), purpose="batch")
    assert upstream.paths[-1] == "/v1/files" and "multipart bytes as sent" in upstream.requests[-1]["_unparsed"]
    assert upstream.headers[-1]["content-type"].startswith("multipart/form-data")
    gone = httpx.delete(proxy.url + "/files/file-123")
    assert gone.status_code == 404 and "file-123" in gone.json()["error"]["message"]
    assert store.health.stats()["messages"] == 0  # only chat completions are conversations


def _chunked_upstream_that_breaks_off() -> tuple[str, threading.Thread]:
    """An HTTP/1.1 upstream (raw sockets) that answers one request with a chunked body and
    closes the connection after its first chunk, before the chunked body's end."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"d\r\ndata: first\n\n\r\n")
            time.sleep(0.2)
            conn.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/v1", thread


def test_a_passed_through_body_the_upstream_breaks_off_is_broken_off_for_the_client(store):
    """Ending the relayed body normally would pass a cut answer off as whole: the client gets
    what arrived, then a broken connection, as from the upstream itself."""
    url, served = _chunked_upstream_that_breaks_off()
    running = ProxyThread(store, url)
    try:
        with httpx.stream("POST", running.url + "/responses", json={"model": "m", "input": "hi", "stream": True},
                          timeout=30) as answer:
            assert answer.status_code == 200
            got = b""
            with pytest.raises(httpx.RemoteProtocolError):
                for piece in answer.iter_raw():
                    got += piece
        assert got == b"data: first\n\n"
    finally:
        running.close()
        served.join(timeout=5)


def test_two_agents_never_see_each_others_history(store, upstream, proxy):
    """Adversarial: agent B opens its conversation exactly like agent A's, uses the same session
    key, and asks lcm_grep for A's secret; nothing of A reaches B's model or B's answers."""
    secret = "the vault combination is 44-19-3"
    a = client_of(proxy, **{"X-LCM-Agent": "alice", "X-LCM-Session": "shared-key"})
    b = client_of(proxy, **{"X-LCM-Agent": "bob", "X-LCM-Session": "shared-key"})
    opening = [{"role": "system", "content": "You are a helpful assistant."}]
    a.chat.completions.create(model="gpt-4o", messages=[*opening, {"role": "user", "content": secret}])

    def model(body: dict[str, Any]) -> Reply:
        if is_summary_call(body):
            return echo(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("tool said: " + last["content"])
        return completion(None, tool_calls=[tool_call("lcm_grep", {"query": "vault combination",
                                                                    "session_scope": "all"}, "c1")])

    upstream.handler = model
    before = len(upstream.requests)
    answer = b.chat.completions.create(model="gpt-4o", messages=[
        *opening, {"role": "user", "content": "what is the vault combination?"}])
    assert "44-19-3" not in (answer.choices[0].message.content or "")
    assert all("44-19-3" not in json.dumps(body) for body in upstream.requests[before:])
    assert all("44-19-3" not in json.dumps(m) for m in stored(store, "bob", "shared-key"))
    assert any("44-19-3" in json.dumps(m) for m in stored(store, "alice", "shared-key"))


def test_with_a_token_map_the_token_decides_the_agent(store, upstream):
    tokens = {"alice-token-0123456789": "alice", "bob-token-0123456789ab": "bob"}
    running = ProxyThread(store, upstream.url, tokens=tokens)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
    try:
        missing = httpx.post(running.url + "/chat/completions", json=body)
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        wrong = httpx.post(running.url + "/chat/completions", json=body, headers={"X-LCM-Token": "guess-guess-guess"})
        assert wrong.status_code == 401
        forged = httpx.post(running.url + "/chat/completions", json=body,
                            headers={"X-LCM-Token": "bob-token-0123456789ab", "X-LCM-Agent": "alice"})
        assert forged.status_code == 403
        by_path = openai.OpenAI(base_url=running.url.replace("/v1", "/t/alice-token-0123456789/v1"),
                                api_key="sk-x", max_retries=0)
        by_path.chat.completions.create(model="gpt-4o", messages=body["messages"])
        by_header = httpx.post(running.url + "/chat/completions", json=body,
                               headers={"X-LCM-Token": "bob-token-0123456789ab"})
        assert by_header.status_code == 200
        assert [s.agent for s in (*store.sessions.each("alice"), *store.sessions.each("bob"))] == ["alice", "bob"]
        assert upstream.requests and httpx.get(running.url + "/models").status_code == 401
        asked = len(upstream.requests)
        assert httpx.post(running.url + "/embeddings", json={"model": "e", "input": "x"}).status_code == 401
        assert len(upstream.requests) == asked  # the rest of the API needs the token too
    finally:
        running.close()


def prompt_tokens(body: dict[str, Any]) -> int:
    """What an upstream request costs in tokens: every message's text and calls (4 tokens of
    framing each) and the tools' definitions."""
    from lcm.tokens import TokenCounter

    count = TokenCounter().count_text
    total = 0
    for m in body["messages"]:
        content = m.get("content")
        total += 4 + count(content if isinstance(content, str) else json.dumps(content or ""))
        if m.get("tool_calls"):
            total += count(json.dumps(m["tool_calls"]))
    return total + (count(json.dumps(body["tools"])) if body.get("tools") else 0)


FILLER = ("We compared the {n}th batch of sensor readings against the baseline; the drift stayed "
          "within tolerance, humidity rose slightly, the pump cycled {n} times, the operator logged "
          "routine maintenance notes about gaskets, valves, filters and the cooling loop, and nothing "
          "unusual turned up in the afternoon inspection round number {n}. ") * 3


def test_two_hundred_turns_on_a_16k_window_stay_within_it_and_an_early_fact_comes_back(store, upstream):
    """A client that re-sends its whole history every turn, 200 turns, ~45k tokens of it: every
    upstream prompt fits the 16k window (lcm compacts through the upstream's own model, with the
    client's key), everything is stored once, and the fact from turn 1 reaches the model at turn 200."""
    import re

    window = 16_000

    def model(body: dict[str, Any]) -> Reply:
        if is_summary_call(body):
            return completion("Summary: routine sensor checks and maintenance notes, nothing unusual.")
        asked = ScriptedLLM.last_user(body)
        if "locker code" in asked.lower() and "?" in asked:
            seen = re.search(r"\d{4}-alpha", json.dumps(body["messages"]))
            return completion(f"Your locker code is {seen.group(0)}." if seen else "I do not know.")
        return completion("Noted.")

    upstream.handler = model
    running = ProxyThread(store, upstream.url, context_length=window)
    try:
        client = client_of(running, **{"X-LCM-Session": "long"})
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are a lab assistant."},
                                         {"role": "user", "content": "Remember this: my locker code is 7319-alpha."}]
        for turn in range(200):
            if turn:
                history.append({"role": "user", "content": FILLER.format(n=turn)})
            if turn == 199:
                history[-1] = {"role": "user", "content": "What is my locker code?"}
            answer = client.chat.completions.create(model="gpt-4o", messages=history)
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
        assert history[-1]["content"] == "Your locker code is 7319-alpha."
    finally:
        running.close()
    chats = chat_requests(upstream)
    assert len(chats) == 200
    sizes = [prompt_tokens(b) for b in chats]
    assert max(sizes) <= window, f"an upstream prompt of {max(sizes)} tokens"
    assert prompt_tokens({"messages": history}) > 2.5 * window  # the client's history is far larger
    summaries = [(b, h) for b, h in zip(upstream.requests, upstream.headers, strict=True) if is_summary_call(b)]
    assert summaries, "compaction never asked the upstream for a summary"
    assert all(b["model"] == "gpt-4o" and h["authorization"] == "Bearer sk-client-secret-123" for b, h in summaries)
    rows = stored(store, "default", "long")
    assert [(m["role"], m["content"]) for m in rows] == [(m["role"], m["content"]) for m in history[1:]]
    session = store.sessions.find("default", "long")
    assert session.covered_seq > 0  # compacted
    # The prompt cache: between two compactions, each upstream prompt starts with the previous
    # one byte for byte (the recall blocks replayed, the context held, not re-assembled).
    kept = changed = 0
    previous = None
    for body in upstream.requests:
        if is_summary_call(body):
            previous = None
            continue
        if previous is not None:
            same = body["messages"][:len(previous["messages"])] == previous["messages"]
            assert same, f"the prompt changed without a compaction at request {upstream.requests.index(body)}"
            kept += 1
        else:
            changed += 1
        previous = body
    assert kept > 150 and changed < 50, (kept, changed)


def cache_marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request as a client that uses Anthropic-style prompt caching sends it (Cline, Roo
    Code): ``cache_control`` on the system prompt and on the last two user messages, each then
    a list of one text part; every other message as plain text."""
    users = [i for i, m in enumerate(history) if m["role"] == "user"][-2:]
    mark = {"cache_control": {"type": "ephemeral"}}
    return [{**m, "content": [{"type": "text", "text": m["content"], **mark}]}
            if i in users or m["role"] == "system" else m for i, m in enumerate(history)]


def marks(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if "cache_control" in json.dumps(m.get("content"))]


def test_a_client_that_moves_its_prompt_cache_marks_is_stored_once_and_its_marks_go_up_as_sent(store, upstream):
    """Every request moves the marks: the message that had one now comes as plain text. Stored:
    each message once, in order, in one session (as first sent, mark and all). Upstream, past
    the compaction threshold too: the marks the client set now and no others (lcm's context
    comes from the store, where every user message was once marked; a provider refuses more
    than four)."""
    running = ProxyThread(store, upstream.url, context_length=4_000)
    try:
        client = httpx.Client(timeout=30)
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
        for turn in range(30):
            history.append({"role": "user", "content": f"step {turn}: " + "refactor the parser module " * 8})
            answer = client.post(running.url + "/chat/completions", headers={"X-LCM-Session": "marked"},
                                 json={"model": "claude-sonnet-4", "messages": cache_marked(history)})
            answer.raise_for_status()
            history.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})
    finally:
        running.close()
    session = store.sessions.find("default", "marked")
    assert session is not None and session.covered_seq > 0  # compacted: lcm's context went upstream
    assert store.sessions.forks(session.id) == []
    rows = stored(store, "default", "marked")
    said = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in rows]
    assert said == [m["content"] for m in history[1:]]
    chats = chat_requests(upstream)
    assert len(chats) == 30
    assembled = 0
    for body in chats:
        sent = body["messages"]
        if sent[1]["role"] == "user" and not str(sent[1]["content"]).startswith("step 0"):
            assembled += 1  # a summary heads lcm's context
        users = [i for i, m in enumerate(sent) if m["role"] == "user"]
        assert marks(sent) == [0, *users[-2:]], (marks(sent), users)
    assert assembled > 10


def test_an_edited_first_message_opens_a_fork_that_shares_nothing_and_both_branches_go_on(store, upstream):
    """A chat client re-sends its conversation from the start: one of which nothing is stored,
    under the same session name, is the conversation with its first message edited. It goes to
    a fork of the session that shares nothing with it (fork point 0), not after the stored
    history; the next requests of either branch continue their own, after a proxy restart too."""
    def ask(running: ProxyThread, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer = client_of(running, **{"X-LCM-Session": "edited"}).chat.completions.create(
            model="gpt-4o", messages=history)
        return [*history, {"role": "assistant", "content": answer.choices[0].message.content}]

    running = ProxyThread(store, upstream.url)
    try:
        first = ask(running, [{"role": "user", "content": "plan a trip to Lisbon"}])
        edited = ask(running, [{"role": "user", "content": "plan a trip to Porto"}])
        edited = ask(running, [*edited, {"role": "user", "content": "three days"}])
    finally:
        running.close()
    running = ProxyThread(store, upstream.url)  # restarted: nothing held in memory
    try:
        edited = ask(running, [*edited, {"role": "user", "content": "by train"}])
        first = ask(running, [*first, {"role": "user", "content": "in May"}])
    finally:
        running.close()
    root = store.sessions.find("default", "edited")
    [fork] = store.sessions.forks(root.id)
    assert fork.fork_seq == 0 and fork.parent_id == root.id
    assert stored(store, "default", "edited") == first
    assert stored(store, "default", fork.session_key) == edited
    sent = [b["messages"] for b in chat_requests(upstream)]
    assert sent[-2][:len(edited) - 1] == edited[:-1] and sent[-1][:len(first) - 1] == first[:-1]


def test_a_client_that_serialises_tool_calls_again_stores_each_turn_once(store, upstream, proxy):
    """A client that keeps tool calls as parsed objects (LangChain, the Vercel AI SDK) sends the
    model's calls back with its own spacing and key order: the same calls, so the conversation
    stays one session, every message stored once."""
    calls = iter(range(1_000))

    def model(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return completion("read it")
        n = next(calls)
        return completion(None, tool_calls=[{"id": f"call_{n}", "type": "function", "function": {
            "name": "read_file", "arguments": json.dumps({"path": f"src/m{n}.py", "lines": [1, 50]}, indent=1)}}])

    upstream.handler = model
    client = httpx.Client(timeout=30)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(4):
        history.append({"role": "user", "content": f"look at module {turn}"})
        for _ in range(2):  # the call, then the answer after its result
            answer = client.post(proxy.url + "/chat/completions", headers={"X-LCM-Session": "parsed"},
                                 json={"model": "gpt-4o", "messages": history, "tools": [
                                     {"type": "function", "function": {"name": "read_file", "parameters": {}}}]})
            answer.raise_for_status()
            message = answer.json()["choices"][0]["message"]
            if message.get("tool_calls"):
                call = message["tool_calls"][0]
                parsed = json.loads(call["function"]["arguments"])  # kept parsed, sent back re-serialised
                history.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": call["id"], "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps(parsed, separators=(",", ":"))}}]})
                history.append({"role": "tool", "tool_call_id": call["id"], "content": f"contents of {parsed['path']}"})
            else:
                history.append({"role": "assistant", "content": message["content"]})
    session = store.sessions.find("default", "parsed")
    assert store.sessions.forks(session.id) == []
    rows = stored(store, "default", "parsed")
    assert [(m["role"], m.get("content")) for m in rows] == [(m["role"], m.get("content")) for m in history[1:]]
    first_call = rows[1]["tool_calls"][0]["function"]["arguments"]
    assert first_call.startswith("{\n")  # stored as the model wrote it first


def test_the_recall_blocks_sent_again_count_in_the_window(store, upstream):
    """Every user message keeps the recall block it was first sent with (the prompt cache), so
    the blocks are part of each later prompt: the budget counts them, and no upstream prompt
    outgrows the window however many the context holds."""
    window = 6_000
    earlier = store.sessions.get_or_create("default", "earlier")
    append_messages(store, earlier.id, [{"role": "user" if i % 2 == 0 else "assistant",
                                         "content": FILLER.format(n=1_000 + i)} for i in range(40)])
    running = ProxyThread(store, upstream.url, context_length=window, tools=False)
    try:
        client = client_of(running, **{"X-LCM-Session": "recalling"})
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are a lab assistant."}]
        for turn in range(40):
            history.append({"role": "user", "content": FILLER.format(n=turn)})
            answer = client.chat.completions.create(model="gpt-4o", messages=history)
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
    finally:
        running.close()
    chats = chat_requests(upstream)
    with_blocks = [sum(RECALL_OPEN in json.dumps(m) for m in b["messages"]) for b in chats]
    assert max(with_blocks) >= 3  # blocks went out again with their messages
    sizes = [prompt_tokens(b) for b in chats]
    assert max(sizes) <= window, f"a prompt of {max(sizes)} tokens"
    # a block takes at most 1/16 of a small window (LCM_AUTO_RECALL_MAX_TOKENS is 1,000)
    from lcm.tokens import TokenCounter

    blocks = [m["content"].split("\n\n" + RECALL_OPEN, 1)[1] for b in chats for m in b["messages"]
              if m["role"] == "user" and RECALL_OPEN in m["content"]]
    assert max(TokenCounter().count_text(RECALL_OPEN + b) for b in blocks) <= window // 16


def test_the_window_holds_the_answer_the_client_asks_room_for(store, upstream):
    """``max_completion_tokens`` (or ``max_tokens``) is room the window must keep beside the
    prompt: on a 16k window asking for 6,000 tokens, no upstream prompt goes past 10,000."""
    window, answer_room = 16_000, 6_000
    running = ProxyThread(store, upstream.url, context_length=window)
    try:
        client = client_of(running, **{"X-LCM-Session": "roomy"})
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are a lab assistant."}]
        for turn in range(90):
            history.append({"role": "user", "content": FILLER.format(n=turn)})
            room = {"max_completion_tokens": answer_room} if turn % 2 else {"max_tokens": answer_room}
            answer = client.chat.completions.create(model="gpt-4o", messages=history, **room)
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
    finally:
        running.close()
    sizes = [prompt_tokens(b) for b in chat_requests(upstream)]
    assert prompt_tokens({"messages": history}) > window  # the history alone does not fit
    assert max(sizes) + answer_room <= window, f"a prompt of {max(sizes)} tokens left no room for the answer"


@pytest.mark.slow
def test_kill_9_mid_stream_then_the_clients_retry_loses_nothing_and_stores_nothing_twice(db_url, upstream):
    from lcm.store import Store
    from tests.support.proxy_server import ProxyProcess

    story = "chunk of a long answer " * 100  # 12 events of 200 characters
    upstream.handler = lambda body: echo(body) if is_summary_call(body) else Reply(
        200, completion(story).body, drip=0.3)
    history: list[dict[str, Any]] = [{"role": "user", "content": "tell me the long story"}]
    body = {"model": "gpt-4o", "stream": True, "messages": history}
    headers = {"X-LCM-Session": "crash", "Authorization": "Bearer sk-test"}
    Store.open(db_url, upgrade=True)  # PostgreSQL: the operator's `lcm db upgrade`
    first = ProxyProcess(db_url, upstream.url)
    try:
        with httpx.stream("POST", first.url + "/chat/completions", json=body, headers=headers, timeout=30) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()
            got = [next(lines) for _ in range(6)]  # some events of the stream arrived
            assert any("chunk of a long answer" in line for line in got)
            first.kill()
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
    finally:
        first.close()
    upstream.handler = lambda body: echo(body) if is_summary_call(body) else completion(story)
    second = ProxyProcess(db_url, upstream.url)
    try:
        retried = openai.OpenAI(base_url=second.url, api_key="sk-test", max_retries=0,
                                default_headers={"X-LCM-Session": "crash"})
        chunks = list(retried.chat.completions.create(model="gpt-4o", messages=history, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == story
    finally:
        second.close()
    store = Store.open(db_url)
    assert [(m["role"], m["content"]) for m in stored(store, "default", "crash")] == [
        ("user", "tell me the long story"), ("assistant", story)]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_database_outage_costs_a_503_sends_nothing_upstream_and_the_retry_stores_once(upstream):
    """The server stopped, then started, then restarted under a running proxy (a private
    cluster: the shared test server is never stopped)."""
    from lcm.store import connection as db
    from tests.support.pg_cluster import Cluster, cannot_run_a_cluster

    why = cannot_run_a_cluster()
    if why:
        pytest.skip(why)
    cluster = Cluster()
    try:
        store = Store.open(cluster.url, upgrade=True)
        running = ProxyThread(store, upstream.url)
        try:
            def ask(history: list[dict[str, Any]], **extra: Any) -> httpx.Response:
                return httpx.post(running.url + "/chat/completions", timeout=60, headers={"X-LCM-Session": "outage"},
                                  json={"model": "gpt-4o", "messages": history, **extra})

            history: list[dict[str, Any]] = [{"role": "user", "content": "q1"}]
            history.append(ask(history).json()["choices"][0]["message"])
            history.append({"role": "user", "content": "q2, asked while the database is down"})
            cluster.stop()
            asked_before = len(chat_requests(upstream))
            for extra in ({}, {"stream": True}):
                refused = ask(history, **extra)
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "lcm_store_unavailable"
            assert len(chat_requests(upstream)) == asked_before  # nothing went to the model
            cluster.start()
            history.append(ask(history).json()["choices"][0]["message"])  # the client's retry
            cluster.restart()  # every pooled connection is dead now
            history.append({"role": "user", "content": "q3, after a restart"})
            answered = ask(history)
            assert answered.status_code == 200, answered.text
            history.append(answered.json()["choices"][0]["message"])
        finally:
            running.close()
        assert [(m["role"], m["content"]) for m in stored(store, "default", "outage")] == [
            (m["role"], m["content"]) for m in history]
    finally:
        db.dispose(db.resolve_url(cluster.url))
        cluster.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_sixty_four_concurrent_clients_on_one_postgresql_database(pg_url, upstream):
    from concurrent.futures import ThreadPoolExecutor

    store = Store.open(pg_url, upgrade=True)
    running = ProxyThread(store, upstream.url)
    turns = 4

    def client(i: int) -> list[dict[str, Any]]:
        history: list[dict[str, Any]] = []
        with httpx.Client(timeout=120) as http:
            for t in range(turns):
                history.append({"role": "user", "content": f"client {i} asks question {t}"})
                answer = http.post(running.url + "/chat/completions", json={"model": "gpt-4o", "messages": history},
                                   headers={"X-LCM-Session": f"c{i}", "X-LCM-Agent": f"agent-{i % 8}"})
                assert answer.status_code == 200, answer.text
                history.append(answer.json()["choices"][0]["message"])
        return history

    try:
        with ThreadPoolExecutor(64) as pool:
            histories = list(pool.map(client, range(64)))
    finally:
        running.close()
    for i, history in enumerate(histories):
        assert history[-1]["content"] == f"echo: client {i} asks question {turns - 1}"
        rows = stored(store, f"agent-{i % 8}", f"c{i}")
        assert [(m["role"], m["content"]) for m in rows] == [(m["role"], m["content"]) for m in history]


def test_listening_beyond_loopback_needs_a_token_and_a_private_token_map(sqlite_url, upstream, tmp_path):
    from tests.support.proxy_server import ProxyProcess

    public = ProxyProcess(sqlite_url, upstream.url, "--host", "0.0.0.0")
    try:
        token = public.info["token"]
        assert len(token) >= 24 and public.info["agents_by_token"] == ["default"]
        local = f"http://127.0.0.1:{public.url.rsplit(':', 1)[1]}"
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(local + "/chat/completions", json=body).status_code == 401
        assert httpx.post(local.replace("/v1", f"/t/{token}/v1") + "/chat/completions", json=body).status_code == 200
    finally:
        public.close()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"a-long-enough-token-123": "alice"}))
    tokens.chmod(0o644)
    import subprocess
    import sys

    refused = subprocess.run([sys.executable, "-m", "lcm", "proxy", "--upstream", upstream.url, "--url", sqlite_url,
                              "--tokens", str(tokens), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and f"chmod 600 {tokens}" in refused.stderr


@pytest.mark.parametrize("choice,offered", [
    ("auto", True), (None, True),
    ("none", False), ("required", False), ({"type": "function", "function": {"name": "get_weather"}}, False)])
def test_lcm_tools_are_offered_unless_the_client_forbids_tools_or_needs_its_own(store, upstream, proxy, choice,
                                                                                 offered):
    """"required" or a named function: the client counts on a call it can run (a model calling
    lcm's tools instead would use up the rounds and be made to answer without any)."""
    own_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body: dict[str, Any] = {"model": "gpt-4o", "tools": [own_tool], "messages": [{"role": "user", "content": "hi"}]}
    if choice is not None:
        body["tool_choice"] = choice
    httpx.post(proxy.url + "/chat/completions", json=body, timeout=30).raise_for_status()
    [sent] = chat_requests(upstream)
    names = [t["function"]["name"] for t in sent["tools"]]
    assert names[0] == "get_weather" and ("lcm_grep" in names) == offered
    assert sent.get("tool_choice") == choice  # as the client sent it


def test_without_tools_the_upstream_gets_the_clients_tools_only(store, upstream):
    running = ProxyThread(store, upstream.url, tools=False)
    own_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    try:
        client_of(running).chat.completions.create(model="gpt-4o", tools=[own_tool],
                                                   messages=[{"role": "user", "content": "weather?"}])
        client_of(running).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    finally:
        running.close()
    first, second = chat_requests(upstream)
    assert first["tools"] == [own_tool] and "tools" not in second
