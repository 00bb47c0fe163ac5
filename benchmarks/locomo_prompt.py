"""Evidence in the prompt: does the answering turn reach the model, with and without auto-recall?

Each LoCoMo development conversation (``LCM_LOCOMO_DIR``) is played through ``LcmEngine`` as
one long conversation on a small window (16k tokens by default: most of it is compacted), the
host holding the context lcm hands back, as Hermes does; summaries are lcm's extractive ones
(offline, no LLM). Then every question (categories 1-4) is asked as the next user message, and
a question counts when one of its evidence turns appears verbatim in what the model would
receive:

- ``lcm, no recall``: the context the host holds (summaries and the verbatim fresh tail);
- ``lcm + auto-recall``: that, plus the auto-recall block for the question;
- ``tail only (Hermes' defaults)``: the first 3 and the last 20 messages, which Hermes' own
  compressor (``protect_first_n=3``, ``protect_last_n=20``) keeps verbatim; its summary is an
  LLM's prose, where a turn is not verbatim, so it is not counted (a proxy computed from its
  defaults, not a run of Hermes).

It also reports the tokens the block adds per user turn while the conversation itself is
replayed (every user turn, not only questions), and how often a turn gets a block at all.

    LCM_LOCOMO_DIR=/path/to/locomo-dev python -m benchmarks --only locomo_prompt
"""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks.common import summary_ms
from benchmarks.locomo import CATEGORIES, data_dir, turns_of
from lcm.config import LcmConfig, local_model_installed
from lcm.engine import LcmEngine
from lcm.messages import content_text
from lcm.store import Store

SYSTEM = {"role": "system", "content": "You are a helpful assistant with a long memory."}
HERMES_HEAD, HERMES_TAIL = 3, 20


def _text_of(messages: list[dict[str, Any]]) -> str:
    return "\n".join(content_text(m.get("content")) for m in messages)


def run(backend: str, url: str, *, data: str | None = None, window: int = 16_000, conversations: int | None = None,
        semantic: bool | None = None, recall_tokens: int | None = None) -> dict[str, Any]:
    """``conversations``: the first N only; ``semantic``: search with the local model (default:
    when it is installed); ``recall_tokens``: LCM_AUTO_RECALL_MAX_TOKENS (default: lcm's)."""
    folder = data_dir(data)
    Store.open(url, upgrade=True)  # a PostgreSQL schema is never upgraded implicitly
    semantic = local_model_installed() if semantic is None else semantic
    paths = sorted(folder.glob("*.json"))[:conversations]
    counts = {"questions": 0, "lcm": 0, "lcm_recall": 0, "recall_only": 0, "tail": 0}
    by_class: dict[str, dict[str, int]] = {}
    block_tokens: list[int] = []
    recall_ms: list[float] = []
    context_tokens: list[int] = []
    stored = compactions = 0
    for path in paths:
        raw = json.loads(path.read_text(encoding="utf-8"))
        conversation = raw.get("conversation", raw)
        config = LcmConfig.from_env({}, database_url=url, agent_id=f"locomo-prompt-{path.stem}",
                                    summarizer="extractive", embeddings="local" if semantic else "off",
                                    **({"auto_recall_max_tokens": recall_tokens} if recall_tokens else {}))
        engine = LcmEngine(config)
        engine.update_model("bench-model", window)
        engine.on_session_start("conversation")
        held: list[dict[str, Any]] = [SYSTEM]
        said: list[dict[str, Any]] = []
        by_dia: dict[str, str] = {}
        for _, messages in turns_of(conversation):
            for dia, message in messages:
                by_dia[dia] = message["content"]
                if message["role"] == "user" and len(said) > 1:
                    t0 = time.perf_counter()
                    block = engine.recall(message, held)
                    recall_ms.append((time.perf_counter() - t0) * 1000)
                    block_tokens.append(block.tokens)
                held = [*held, message]
                said.append(message)
                tokens = engine.context.tokens.count_text(_text_of(held))
                if engine.should_compress(tokens):
                    before = held
                    held = engine.compress(held, current_tokens=tokens)
                    compactions += held is not before and held != before
        indexer = engine.context.indexer
        if indexer is not None:
            indexer.wait_idle(600)
        stored += len(said)
        context_tokens.append(engine.context.tokens.count_text(_text_of(held)))
        in_context = _text_of(held)
        tail = _text_of(said[:HERMES_HEAD] + said[-HERMES_TAIL:])
        for qa in raw["qa"]:
            category = CATEGORIES.get(int(qa.get("category", 0)))
            evidence = [by_dia[d] for d in qa.get("evidence", []) if d in by_dia]
            if category is None or not evidence:
                continue
            block = engine.recall({"role": "user", "content": qa["question"]}, held)
            hits = {
                "lcm": any(e in in_context for e in evidence),
                "recall_only": any(e in block.text for e in evidence),
                "tail": any(e in tail for e in evidence),
            }
            hits["lcm_recall"] = hits["lcm"] or hits["recall_only"]
            for key in ("all", category):
                row = by_class.setdefault(key, {"questions": 0, "lcm": 0, "lcm_recall": 0, "recall_only": 0,
                                                "tail": 0})
                row["questions"] += 1
                for name, hit in hits.items():
                    row[name] += hit
            counts["questions"] += 1
        engine.on_session_end("conversation")
    with_block = [t for t in block_tokens if t]
    return {
        "window": window, "messages": stored, "recall_tokens": config.auto_recall_max_tokens,
        "compactions": compactions,
        "semantic": semantic, "conversations": [p.stem for p in paths],
        "classes": {k: {"questions": v["questions"], **{n: v[n] / v["questions"] for n in
                                                       ("lcm", "lcm_recall", "recall_only", "tail")}}
                    for k, v in by_class.items()},
        "block_tokens_per_turn": sum(block_tokens) / max(1, len(block_tokens)),
        "turns_with_block": len(with_block) / max(1, len(block_tokens)),
        "block_tokens_when_added": sum(with_block) / max(1, len(with_block)),
        "user_turns": len(block_tokens), "recall_latency_ms": summary_ms(recall_ms),
        "context_tokens": context_tokens,
    }
