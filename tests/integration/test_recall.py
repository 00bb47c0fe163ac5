"""Recall that reaches the model (issue 36), on both backends with the real local model:
neighbours in ranked search, the similarity floor against generated nonsense, auto-recall
(the engine method, what it leaves out, its budget, Hermes' hook) and the recall block never
stored, whatever a host sends back; ``lcm recall`` on the command line."""

from __future__ import annotations

import json
import random
import string
import uuid
from typing import Any

import pytest

from lcm.engine import LcmEngine
from lcm.hermes import hooks
from lcm.messages import RECALL_CLOSE, RECALL_OPEN
from tests.support.conversation import SYSTEM, host_step

pytest.importorskip("tokenizers", reason="the [semantic] extra is not installed")

#: A conversation whose answers follow the turns that hold the questions' words.
TURNS = [
    ("Which band did you end up seeing at the festival last weekend?", "Matt Patterson! His voice was amazing."),
    ("How is the garden doing after the storm?", "The tomatoes survived, the basil did not."),
    ("Did you finish reading the novel I lent you?", "Yes, the ending surprised me completely."),
    ("Where are you flying for the conference in March?", "Lisbon, and I am staying near the river."),
    ("What did the vet say about your dog's leg?", "A sprain; two weeks of rest and short walks."),
]
FACT = "For the record: the vault recovery phrase hint is 'copper lantern 42', kept in the blue binder."


def call(engine: LcmEngine, name: str, **args: Any) -> dict[str, Any]:
    return json.loads(engine.handle_tool_call(name, args))


def converse(engine: LcmEngine, session: str, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    engine.on_session_start(session, platform="cli")
    transcript: list[dict[str, Any]] = [SYSTEM]
    for asked, answered in pairs:
        transcript = host_step(engine, transcript, [{"role": "user", "content": asked},
                                                    {"role": "assistant", "content": answered}])
    return transcript


def settle(engine: LcmEngine) -> None:
    indexer = engine.context.indexer
    if indexer is not None:
        assert indexer.wait_idle(60), indexer.last_error


def nonsense(seed: int, count: int) -> list[str]:
    """Queries that mean nothing: random letter strings, alone and in threes."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(6, 13)))
    return [word() if i % 2 else " ".join(word() for _ in range(3)) for i in range(count)]


def test_the_turn_after_the_question_words_is_found_as_a_neighbour(make_engine):
    engine = make_engine(context_length=100_000, embeddings="off")
    converse(engine, "s1", TURNS)
    found = call(engine, "lcm_grep", query="which band did she see at the festival", sort="relevance",
                 session_scope="all", limit=3)["results"]
    answer = next(h for h in found if "Patterson" in h["snippet"])
    assert found[0]["match"] == "any" and "festival" in found[0]["snippet"]
    assert answer["match"] == "neighbour" and found.index(answer) <= 1
    # Recency (exact, newest first) has no neighbours: only rows with the words.
    newest = call(engine, "lcm_grep", query="which band did she see at the festival", session_scope="all")
    assert all(h["match"] != "neighbour" for h in newest["results"])


def test_nonsense_gets_no_hits_by_meaning_and_says_why(make_engine):
    engine = make_engine(context_length=100_000, embeddings="local")
    converse(engine, "s1", TURNS)
    settle(engine)
    for query in nonsense(36, 12):
        for mode in ("semantic", "hybrid"):
            res = call(engine, "lcm_grep", query=query, mode=mode, session_scope="all", sort="relevance")
            assert res["results"] == [], (query, mode, res["results"][:2])
        assert any("similarity floor 0.35" in n for n in res["notes"])
    # A real paraphrase still clears the floor.
    near = call(engine, "lcm_grep", query="musician concert performance", mode="semantic", session_scope="all")
    assert near["results"] and near["results"][0]["match"] == "semantic"
    assert all(h["score"] >= 0.35 for h in near["results"])
    status = call(engine, "lcm_status")["recall"]
    assert status["similarity_floor"] == 0.35 and status["model"] == "local:all-MiniLM-L6-v2"
    # The floor is a setting: 0 lets everything through (nonsense then "matches").
    loose = make_engine(context_length=100_000, embeddings="local", semantic_floor=0.0)
    loose.on_session_start("s1")
    assert call(loose, "lcm_grep", query=nonsense(36, 1)[0], mode="semantic", session_scope="all")["results"]


def test_auto_recall_quotes_an_early_fact_the_context_lacks(make_engine):
    engine = make_engine(context_length=100_000, embeddings="local")
    converse(engine, "old", [(FACT, "Noted, the blue binder."), *TURNS])
    transcript = converse(engine, "new", TURNS[:2])
    settle(engine)
    fact_id = next(r.store_id for r in engine.store.messages.get_range(engine.store.sessions.find(
        engine.agent_id, "old").id) if r.message["content"] == FACT)

    block = engine.recall("what was the hint for the vault recovery phrase?", transcript)
    assert block.text.startswith(RECALL_OPEN) and block.text.endswith(RECALL_CLOSE)
    assert fact_id in block.store_ids and FACT in block.text and f"store_id={fact_id}" in block.text
    assert block.tokens <= engine.config.auto_recall_max_tokens
    # What the context already holds is not quoted again.
    held = engine.recall("which band did you see at the festival", transcript)
    in_context = {r.store_id for r in engine.store.messages.get_range(engine.context.session.id)}
    assert not in_context & set(held.store_ids)
    # A tight budget cuts the quote, never overflows; nothing matches nonsense.
    small = engine.recall("what was the hint for the vault recovery phrase?", transcript, max_tokens=60)
    assert 0 < small.tokens <= 60 and small.store_ids == [fact_id] and small.text.count("\n") == 2
    assert engine.recall("qzxv wkpl fjrtyh", transcript).text == ""
    assert fact_id in engine.recall("binder?", transcript).store_ids  # one word is searched too
    assert engine.recall("ok, thanks!", transcript).text == ""  # stop words only


@pytest.mark.parametrize("script", ["prose", "cjk", "digits"])
def test_a_long_turn_is_quoted_from_its_beginning_within_its_share_and_the_budget(make_engine, script):
    """A pasted log is cut before it is counted (``PRECUT_CHARS_PER_TOKEN``): text denser than
    prose (CJK, a character or so a token; digits) still ends within its share, and the block
    within its budget."""
    from lcm.tools.autorecall import MAX_SHARE_PER_HIT, MAX_TOKENS_PER_HIT

    filler = {"prose": "the nightly export wrote its rows and moved on to the next table ",
              "cjk": "数据库备份在夜间完成并写入了新的表格",
              "digits": "4711 0815 2718 3141 1618 9999 "}[script]
    engine = make_engine(context_length=100_000, embeddings="off")
    pasted = "zanzibarlog begins: " + filler * (40_000 // len(filler))
    converse(engine, "old", [(pasted, "Noted."), ("the zanzibarlog was short today", "Good.")])
    transcript = converse(engine, "new", TURNS[:1])
    count = engine.context.tokens.count_text
    for budget in (1000, 300, 120):
        block = engine.recall("what did the zanzibarlog say?", transcript, max_tokens=budget)
        lines = block.text.split("\n")[1:-1]
        share = max(20, min(MAX_TOKENS_PER_HIT, int(budget * MAX_SHARE_PER_HIT)))
        assert lines and all(count(line) <= share for line in lines)
        assert block.tokens == count(block.text) <= budget
        long = [line for line in lines if "zanzibarlog begins: " + filler[:4] in line]
        assert long or budget < 300  # a small budget may be spent before the long turn's turn
        assert all(line.endswith(" …") for line in long)


def test_a_context_message_is_recognised_with_its_recall_block_and_not_by_its_text_alone(make_engine):
    """What the context holds is left out by content hash, whatever the host added to it: an
    earlier user message sent again with its recall block is the stored one. A message with the
    same words under another role is not, so the stored one is still quoted."""
    engine = make_engine(context_length=100_000, embeddings="off")
    converse(engine, "old", [(FACT, "Noted, the blue binder."), *TURNS])
    transcript = converse(engine, "new", TURNS[:2])
    asked = "what was the hint for the vault recovery phrase?"
    first = engine.recall(asked, transcript).text
    assert FACT in first
    with_block = {"role": "user", "content": f"{FACT}\n\n{first}"}  # as the host sent it then
    held = engine.recall(asked, [*transcript, with_block])
    assert FACT not in held.text
    as_part = {"role": "user", "content": [{"type": "text", "text": FACT, "cache_control": {"type": "ephemeral"}}]}
    assert FACT not in engine.recall(asked, [*transcript, as_part]).text  # one text part: the same message
    other_role = {"role": "assistant", "content": FACT}
    assert FACT in engine.recall(asked, [*transcript, other_role]).text


def test_the_asked_message_is_not_quoted_back_to_itself_but_its_answer_is(make_engine):
    """A user message asked again word for word (stored in an earlier session) is the question
    itself, not an answer to it: left out by content hash; the turn that answered it stays."""
    engine = make_engine(context_length=100_000, embeddings="off")
    converse(engine, "old", [(FACT, "Noted: copper lantern 42, in the blue binder."), *TURNS])
    transcript = converse(engine, "new", TURNS[:2])
    block = engine.recall(FACT, transcript)
    quoted = engine.context.store.messages.get_many(block.store_ids, agent=engine.context.agent_id)
    assert [r.message["content"] for r in quoted if r.message["role"] == "user"].count(FACT) == 0
    assert "Noted: copper lantern 42" in block.text
    # Another user message with the same words and one more is not the question itself.
    other = engine.recall(FACT + " Thanks.", transcript)
    assert FACT in other.text


def test_the_block_is_never_stored_whatever_the_host_sends_back(make_engine, db_url):
    engine = make_engine(context_length=100_000, embeddings="off")
    transcript = converse(engine, "old", [(FACT, "Noted."), *TURNS])
    engine.on_session_start("s2")
    asked = "which phrase hint did I give for the vault?"
    block = engine.recall(asked, [SYSTEM])
    assert FACT in block.text
    # One host echoes the block in the content, another (Hermes) in the api_content sidecar.
    echoed = [SYSTEM, {"role": "user", "content": asked + "\n\n" + block.text},
              {"role": "assistant", "content": "copper lantern 42"},
              {"role": "user", "content": "thanks", "api_content": "thanks\n\n" + block.text},
              {"role": "assistant", "content": "You're welcome."}]
    engine.compress(echoed, current_tokens=100)
    stored = [r.message for r in engine.store.messages.get_range(engine.context.session.id)]
    assert stored == [{"role": "user", "content": asked}, {"role": "assistant", "content": "copper lantern 42"},
                      {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "You're welcome."}]
    # The same turn sent clean afterwards is the same message: stored once.
    engine.compress([SYSTEM, {"role": "user", "content": asked}, *echoed[2:],
                     {"role": "user", "content": "one more"}], current_tokens=100)
    again = [r.message["content"] for r in engine.store.messages.get_range(engine.context.session.id)]
    assert again == [asked, "copper lantern 42", "thanks", "You're welcome.", "one more"]
    assert "lcm_recall" not in json.dumps([r.message for r in engine.store.messages.get_range(
        engine.context.session.id)])
    # Text a user typed that only looks like the tags is theirs, kept as typed.
    typed = 'the log said <lcm_recall note="x">\nnot ours\n</lcm_recall> twice'
    engine.compress([SYSTEM, {"role": "user", "content": asked}, *echoed[2:], {"role": "user", "content": "one more"},
                     {"role": "assistant", "content": "ok"}, {"role": "user", "content": typed}], current_tokens=100)
    assert engine.store.messages.get_range(engine.context.session.id)[-1].message["content"] == typed
    # Search never finds the block's words in the turn that carried it.
    hits = call(engine, "lcm_grep", query="copper lantern binder", session_scope="current")["results"]
    assert all(h["store_id"] != again.index(asked) + 1 for h in hits if h["type"] == "message")
    assert transcript  # the old session is untouched by all this
    assert [r.message["content"] for r in engine.store.messages.get_range(
        engine.store.sessions.find(engine.agent_id, "old").id)][0] == FACT


def test_hermes_pre_llm_call_hook_answers_for_its_own_session_only(make_engine):
    # The hook is process-wide: session ids of this test alone (other tests' engines may live on).
    live, quiet = f"live-{uuid.uuid4().hex}", f"quiet-{uuid.uuid4().hex}"
    engine = make_engine(context_length=100_000, embeddings="off")
    converse(engine, "old", [(FACT, "Noted.")])
    engine.on_session_start(live)
    history = [SYSTEM, {"role": "user", "content": "vault recovery phrase hint?"}]
    got = hooks.pre_llm_call(session_id=live, user_message="vault recovery phrase hint?",
                             conversation_history=history, is_first_turn=False, model="m", platform="cli")
    assert got is not None and FACT in got["context"]
    assert hooks.pre_llm_call(session_id=f"someone-else-{uuid.uuid4().hex}", user_message="vault recovery phrase hint?",
                              conversation_history=history) is None
    assert call(engine, "lcm_status")["recall"]["last"]["store_ids"]
    off = make_engine(context_length=100_000, embeddings="off", auto_recall=False)
    off.on_session_start(quiet)
    assert hooks.pre_llm_call(session_id=quiet, user_message="vault recovery phrase hint?",
                              conversation_history=history) is None


def test_lcm_recall_prints_the_block(make_engine, db_url, lcm, monkeypatch):
    engine = make_engine(context_length=100_000, embeddings="off")
    converse(engine, "old", [(FACT, "Noted."), *TURNS])
    converse(engine, "new", TURNS[:1])  # the latest session: the old one's messages are not in its context
    monkeypatch.setenv("LCM_EMBEDDINGS", "off")
    code, out, err = lcm("recall", "vault recovery phrase hint", "--url", db_url, "--agent", engine.agent_id,
                         "--json")
    assert code == 0, err
    block = json.loads(out)
    assert FACT in block["text"] and block["mode"] == "full_text" and block["tokens"] <= 1000
    code, out, err = lcm("recall", "qzxv wkpl", "--url", db_url, "--agent", engine.agent_id)
    assert code == 0 and "nothing to recall" in out + err
    # Asked in the old session, whose messages are all in its context: nothing to add.
    code, out, err = lcm("recall", "vault recovery phrase hint", "--url", db_url, "--agent", engine.agent_id,
                         "--session", "old", "--json")
    assert code == 0 and json.loads(out)["reason"] == "every match is already in the context"
