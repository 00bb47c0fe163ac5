"""``lcm_status`` and ``lcm_doctor``: the engine's state, and every health check in one place
(the tool and ``lcm doctor`` aggregate the same checks the same way)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lcm.context.session import ContextSession
from lcm.errors import LcmError
from lcm.records import CheckResult
from lcm.tools.args import Parsed
from lcm.tools.retrieval import similarity_floor

#: The doctor's verdict from its worst check.
VERDICTS = {"ok": "healthy", "warn": "warnings", "fail": "unhealthy"}


def status(context: ContextSession, args: Parsed) -> dict[str, Any]:
    store = context.store
    if context.rule != "store" and context.current is None and context.filters is not None:
        # A filtered session has no row: say so, and what the filters are.
        return {"agent_id": context.agent_id, "session_id": None, "stored": False,
                "session_filters": context.filters.describe(context.rule),
                "backend": store.backend_name, "database": store.location,
                "embeddings": embeddings_report(context), "last_error": context.last_error}
    session = store.sessions.get(context.session.id)
    nodes = {f"d{d.depth}": d.count for d in store.summaries.depth_stats(session.id)}
    summarizer = context.summarizer.describe()
    last = context.last_outcome or session.last_compaction or {}
    prompts = store.sessions.system_prompts(session.id)
    return {
        "agent_id": context.agent_id, "session_id": session.session_key,
        "session_ids": store.sessions.keys(session.id),
        "compression_count": context.compactions, "stored_messages": session.message_count,
        "skipped_messages": session.skipped_count,
        "fork_of": ({"session_id": store.sessions.get(session.parent_id).session_key,
                     "after_seq": session.fork_seq} if session.parent_id is not None else None),
        "forks": [f.session_key for f in store.sessions.forks(session.id)],
        "raw_messages": session.last_seq - session.covered_seq, "raw_tokens": session.raw_tokens,
        "nodes_by_depth": nodes,
        "carried_summaries": len(store.summaries.carried(session.id)),
        "system_prompt": ({"digest": prompts[-1].digest, "token_count": prompts[-1].token_count,
                           "first_seq": prompts[-1].first_seq, "versions": len(prompts)} if prompts else None),
        "context_length": context.window.context_length, "threshold_tokens": context.window.threshold_tokens,
        "target_tokens": context.window.target_tokens,
        "last_prompt_tokens": max(context.usage.prompt_tokens, 0),
        "cache": {**context.usage.cache_report(), "ttl_seconds": context.config.cache_ttl_seconds,
                  "cold": context.cache_cold()},
        "max_assembly_tokens": context.window.assembly_cap,
        "backend": store.backend_name, "database": store.location,
        "summarizer": {"route": summarizer["route"], "mode": summarizer["mode"],
                       "fallbacks": summarizer["fallbacks"], "breaker": summarizer["breaker"]},
        "last_compaction": {"status": last.get("status", "none"),
                            "reason": last.get("reason", "no compaction has run in this session yet"),
                            **{k: last[k] for k in ("cause", "passes", "leaves", "condensed", "tokens_before",
                                                     "tokens_after", "assembled_tokens", "over_budget")
                               if k in last}},
        "embeddings": embeddings_report(context),
        "recall": recall_report(context),
        "session_filters": (context.filters.describe(context.rule) if context.filters is not None
                            else {"applied": False}),
        "redaction": context.redactor.describe() if context.redactor is not None else {"enabled": False},
        "last_error": context.last_error,
    }


def embeddings_report(context: ContextSession) -> dict[str, Any]:
    """The embedder, its model, how much of the agent's history has vectors of it, and the
    background indexer's state."""
    embedder = context.embedder
    if embedder is None:
        return {"mode": "off", "model": None}
    coverage = context.store.vectors.coverage(embedder.model, agent=context.agent_id)
    out: dict[str, Any] = {"mode": context.config.embeddings_mode, **coverage.as_dict()}
    indexer = context.indexer
    if indexer is not None:
        busy = indexer.busy_for()
        out["indexer"] = {"embedded": indexer.embedded, "last_error": indexer.last_error,
                          "busy_seconds": None if busy is None else round(busy, 1)}
    return out


def recall_report(context: ContextSession) -> dict[str, Any]:
    """How recall is set up: auto-recall on or off and its budget, the search mode it uses, the
    embedding model and its similarity floor, and what auto-recall last added."""
    embedder = context.embedder
    return {"auto_recall": context.config.auto_recall, "max_tokens": context.config.auto_recall_max_tokens,
            "mode": "hybrid" if embedder is not None else "full_text",
            "model": embedder.model if embedder is not None else None,
            "similarity_floor": similarity_floor(context) if embedder is not None else None,
            "last": context.last_recall}


def doctor(context: ContextSession, args: Parsed) -> dict[str, Any]:
    return health_report(context, context.store.health.checks(deep=False))


def health_report(context: ContextSession, storage: Sequence[CheckResult]) -> dict[str, Any]:
    """The doctor's report: the storage checks given (``lcm doctor`` may run deep ones) and
    the settings checks, with the verdict of the worst."""
    checks = [*storage, *config_checks(context)]
    return {"overall": verdict(checks), "checks": [c.as_dict() for c in checks]}


def verdict(checks: Sequence[CheckResult]) -> str:
    statuses = {c.status for c in checks}
    return VERDICTS["fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"]


def config_checks(context: ContextSession) -> list[CheckResult]:
    """Settings that cannot work well together with the host's window or summarizer."""
    cfg, window, cap = context.config, context.window.context_length, context.window.assembly_cap
    out: list[CheckResult] = []
    if window and cfg.leaf_chunk_tokens > window // 2:
        out.append(CheckResult("config_leaf_chunk", "warn",
                               f"LCM_LEAF_CHUNK_TOKENS={cfg.leaf_chunk_tokens} is over half the {window}-token "
                               "window: summarizer calls may not fit the model"))
    else:
        out.append(CheckResult("config_leaf_chunk", "ok", f"leaf chunks of up to {cfg.leaf_chunk_tokens} tokens"))
    if window and cfg.fresh_tail_max_tokens and cfg.fresh_tail_max_tokens >= cap:
        out.append(CheckResult("config_fresh_tail", "warn",
                               "LCM_FRESH_TAIL_MAX_TOKENS is not below the assembly cap: the fresh tail "
                               "alone could fill the context"))
    else:
        cap_text = f", at most {cfg.fresh_tail_max_tokens} tokens" if cfg.fresh_tail_max_tokens else ""
        out.append(CheckResult("config_fresh_tail", "ok", f"fresh tail: {cfg.fresh_tail_count} messages{cap_text}"))
    summarizer = context.summarizer.describe()
    breakers = summarizer["breaker"]
    broken = [name for name, state in breakers.items() if state["state"] != "closed"]
    if cfg.summarizer == "llm" and summarizer["mode"] != "llm":
        out.append(CheckResult("config_summarizer", "fail",
                               "LCM_SUMMARIZER=llm but no LLM is configured (set LCM_SUMMARY_BASE_URL and "
                               "LCM_SUMMARY_MODEL, or run inside Hermes)"))
    elif broken:
        out.append(CheckResult("config_summarizer", "warn", "summarizer routes failing: " + "; ".join(
            f"{name} ({breakers[name]['state']}: {breakers[name]['last_error']})" for name in broken)))
    else:
        extractive = " (deterministic extractive summaries: no LLM configured)" if (
            summarizer["mode"] == "extractive") else ""
        out.append(CheckResult("config_summarizer", "ok", f"summaries via {summarizer['route']}{extractive}"))
    out.append(embeddings_check(context))
    return out


#: Vectors missing while the running engine's background embedder has had work for less than
#: this long are the normal lag after a turn, not a problem (older gaps are).
PENDING_GRACE_SECONDS = 60.0


def embeddings_check(context: ContextSession) -> CheckResult:
    """Missing vectors (beyond the background embedder's normal lag), vectors of another
    model, and a failing embedder."""
    try:
        report = embeddings_report(context)
    except LcmError as exc:
        return CheckResult("embeddings", "fail", f"embeddings cannot be used: {exc}")
    if report["mode"] == "off":
        return CheckResult("embeddings", "ok", "off: search is full text (LCM_EMBEDDINGS=local with the "
                                               "[semantic] extra adds semantic and hybrid search)")
    problems = []
    indexer = report.get("indexer") or {}
    busy = indexer.get("busy_seconds")
    # A running engine embeds what a turn stored a moment after it: a normal state, not a gap.
    lagging = bool(report["pending"]) and busy is not None and busy < PENDING_GRACE_SECONDS and not (
        indexer.get("last_error"))
    if report["pending"] and not lagging:
        problems.append(f"{report['pending']} messages and summaries of agent {context.agent_id!r} have no "
                        f"vector of {report['model']} yet (run `lcm embed`; a running engine fills them in too)")
    if report["other_models"]:
        models = ", ".join(f"{m} ({n})" for m, n in report["other_models"].items())
        problems.append(f"vectors of another model are never searched: {models} (the model changed: "
                        "`lcm embed` re-embeds with the current one, `lcm embed --prune` then deletes them)")
    error = (report.get("indexer") or {}).get("last_error")
    if error:
        problems.append(f"the background embedder is failing: {error}")
    if problems:
        return CheckResult("embeddings", "warn", "; ".join(problems))
    if lagging:
        return CheckResult("embeddings", "ok", f"{report['model']}: {report['pending']} messages and summaries "
                                               "are being embedded now (the background embedder has had work "
                                               f"for {busy:.0f} s)")
    return CheckResult("embeddings", "ok", f"{report['model']}: every message and summary has its vector "
                                           f"({report['messages_embedded']} messages, "
                                           f"{report['summaries_embedded']} summaries)")
