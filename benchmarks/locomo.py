"""Recall on real conversations: LoCoMo's development split (issue 36's yardstick).

LoCoMo (Maharana et al., ACL 2024) holds long multi-session conversations between two people
and questions whose answers are known dialog turns. Each conversation is stored the way the
held-back measurement stores it: one agent per conversation, one lcm session per LoCoMo
session, speaker A as ``user`` and speaker B as ``assistant``, each message's content
``"<speaker>: <text>"`` plus ``" [shares a photo: <caption>]"`` when the turn has one. Every
question with evidence (categories 1-4) is sent as asked through ``lcm_grep``
(``session_scope="all"``, ``sort="relevance"``); a hit is an evidence turn among the top k
messages (recall@5, recall@10). Baseline in the same run: a plain BM25 index (``bm25s``, English
stop words) over the same turns, each turn a document, the question as the query.

The data is not part of lcm: ``LCM_LOCOMO_DIR`` (or the phase's ``data`` parameter) names the
folder of ``<id>.json`` files; the phase says so and stops when it is not set.

    LCM_LOCOMO_DIR=/path/to/locomo-dev python -m benchmarks --only locomo
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from benchmarks.common import append_messages, summary_ms
from lcm.config import LcmConfig, local_model_installed
from lcm.context.embed import backfill
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.tools import run_tool

K = (5, 10)
SESSION_KEY = re.compile(r"session_\d+")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def data_dir(data: str | None) -> Path:
    folder = data or os.environ.get("LCM_LOCOMO_DIR", "")
    if not folder or not Path(folder).is_dir():
        raise SystemExit("the locomo phase needs the LoCoMo conversations: set LCM_LOCOMO_DIR to the folder of "
                         "<id>.json files (or pass data=...)")
    return Path(folder)


def turns_of(conversation: dict[str, Any]) -> list[tuple[int, list[tuple[str, dict[str, Any]]]]]:
    """(session number, [(dia_id, message)]) in order, as the held-back measurement stores them."""
    speaker_a = conversation["speaker_a"]
    # Only ``session_<n>`` holds turns (``session_<n>_date_time``, ``_summary`` and
    # ``_observation`` are LoCoMo's annotations: storing them as sessions would repeat every turn).
    sessions = sorted(int(k.split("_")[1]) for k in conversation if SESSION_KEY.fullmatch(k) and conversation[k])
    out = []
    for n in sessions:
        messages = []
        for t in conversation[f"session_{n}"]:
            text = f"{t['speaker']}: {t['text']}"
            if t.get("blip_caption"):
                text += f" [shares a photo: {t['blip_caption']}]"
            role = "user" if t["speaker"] == speaker_a else "assistant"
            messages.append((t["dia_id"], {"role": role, "content": text}))
        out.append((n, messages))
    return out


def run(backend: str, url: str, *, data: str | None = None, conversations: int | None = None,
        semantic: bool | None = None) -> dict[str, Any]:
    """``conversations``: the first N only; ``semantic``: run the semantic and hybrid modes
    (default: when the local model is installed)."""
    import bm25s

    folder = data_dir(data)
    store = Store.open(url, upgrade=True)
    semantic = local_model_installed() if semantic is None else semantic
    modes = ("full_text", "semantic", "hybrid") if semantic else ("full_text",)
    ranks: dict[str, dict[str, list[int]]] = {m: {} for m in (*modes, "bm25s")}
    latency: dict[str, list[float]] = {m: [] for m in (*modes, "bm25s")}
    stored = questions = 0
    load_s = embed_s = 0.0
    paths = sorted(folder.glob("*.json"))[:conversations]
    for path in paths:
        conversation = json.loads(path.read_text(encoding="utf-8"))
        agent = f"locomo-{path.stem}"
        started = time.perf_counter()
        by_dia: dict[str, int] = {}
        texts: list[str] = []
        ids: list[int] = []
        for n, messages in turns_of(conversation["conversation"] if "conversation" in conversation else conversation):
            session = store.sessions.get_or_create(agent, f"session-{n}", platform="locomo")
            result = append_messages(store, session.id, [m for _, m in messages])
            for (dia, m), sid in zip(messages, result.store_ids, strict=True):
                by_dia[dia] = sid
                texts.append(m["content"])
                ids.append(sid)
        store.health.optimize()
        load_s += time.perf_counter() - started
        stored += len(ids)
        engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id=agent,
                                              embeddings="local" if semantic else "off"))
        engine.on_session_start("session-1")
        if semantic:
            embedder = engine.context.embedder
            assert embedder is not None
            started = time.perf_counter()
            backfill(store.vectors, embedder, agent=agent)
            embed_s += time.perf_counter() - started
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        for qa in conversation["qa"]:
            category = CATEGORIES.get(int(qa.get("category", 0)))
            evidence = {by_dia[d] for d in qa.get("evidence", []) if d in by_dia}
            if category is None or not evidence:
                continue
            questions += 1
            for mode in (*modes, "bm25s"):
                t0 = time.perf_counter()
                if mode == "bm25s":
                    docs, _ = retriever.retrieve(bm25s.tokenize([qa["question"]], stopwords="en", show_progress=False),
                                                 k=max(K), show_progress=False)
                    ranked = [ids[int(d)] for d in docs[0]]
                else:
                    res = json.loads(run_tool(engine.context, "lcm_grep", {
                        "query": qa["question"], "session_scope": "all", "sort": "relevance",
                        "limit": max(K), "mode": mode}))
                    ranked = [h["store_id"] for h in res.get("results", []) if h["type"] == "message"]
                latency[mode].append((time.perf_counter() - t0) * 1000)
                first = next((i for i, sid in enumerate(ranked) if sid in evidence), -1)
                for key in ("all", category, path.stem):
                    ranks[mode].setdefault(key, []).append(first)
    rows = [{"mode": mode, "latency_ms": summary_ms(latency[mode]), "classes": {
        key: {"questions": len(r), **{f"recall@{k}": sum(0 <= x < k for x in r) / len(r) for k in K}}
        for key, r in found.items()}} for mode, found in ranks.items()]
    return {"messages": stored, "questions": questions, "load_s": load_s, "embed_s": embed_s or None,
            "conversations": [p.stem for p in paths], "rows": rows}
