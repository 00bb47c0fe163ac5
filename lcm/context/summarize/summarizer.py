"""Summaries: prompts, routes to an LLM, escalation, and a deterministic extractive fallback.

One entry point, :meth:`Summarizer.summarize`, takes a :class:`SummaryRequest` (the framed source
text of a leaf chunk or of the child summaries being condensed) and returns a
:class:`SummaryDraft` that is guaranteed non-empty and shorter than its source — or ``None``
when the source is too small to be summarized at all. It never loops and never raises for a
failing LLM:

1. each route (an OpenAI-compatible endpoint, or the host's own LLM client such as Hermes'
   auxiliary client, and the ``LCM_SUMMARY_FALLBACK_MODELS`` behind either) is tried with the
   normal prompt, then with a terser bullet prompt, skipping routes whose circuit breaker is open;
2. if no route produced a usable summary, the extractive summary below stands in (marked "the
   LLM summarizer failed"), and if even that is not shorter, a marked truncation of the source;
3. with no LLM configured at all, an extractive summarizer picks the lines that matter
   (requests, decisions, paths, commands, values, errors), marked as extractive.

Modules: ``prompts`` (the prompts and markers), ``routes`` (HTTP, breakers, wall-clock bounds),
``text`` (pure text work), ``request`` (what goes in and out), and this one, which decides.

A result is usable when, after removing reasoning blocks (``<think>…</think>`` and friends; an
unclosed block is a failure), it is non-empty and has fewer tokens than the source. An
authentication failure opens the route's breaker for a long time and is logged at ERROR: it
is a configuration problem a person has to fix, not something to paper over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lcm.config import LcmConfig
from lcm.context.summarize.prompts import (
    ANSWER_PROMPT,
    BULLET_PROMPT,
    CONDENSED_PROMPT,
    FALLBACK_MARKER,
    LEAF_PROMPT,
    focus_clause,
)
from lcm.context.summarize.request import SummaryDraft, SummaryRequest
from lcm.context.summarize.routes import Breakers, OpenAICompatibleRoute, Route, as_route_error, sendable
from lcm.context.summarize.text import ensure_expand_line, extractive_summary, strip_reasoning, truncation
from lcm.tokens import TokenCounter

log = logging.getLogger(__name__)

#: A host's own LLM route for a model (None: the host's default), e.g. Hermes' auxiliary client.
HostRoute = Callable[[str | None], Route]


@dataclass(frozen=True)
class Accepted:
    """A model's answer that is usable as a summary."""

    content: str
    hint: str  # what its "Expand for details about:" line names
    tokens: int


@dataclass(frozen=True)
class Unusable:
    """A model's answer that is not usable as a summary, and why."""

    reason: str


@dataclass
class Summarizer:
    """Produces summaries through the configured route, with escalation and breakers."""

    config: LcmConfig
    tokens: TokenCounter
    #: The host's LLM route, used when no endpoint is configured (``LCM_SUMMARIZER=auto``/``llm``).
    host_route: HostRoute | None = None
    breakers: Breakers = field(init=False)

    def __post_init__(self) -> None:
        self.breakers = Breakers(self.config.breaker_failures, float(self.config.breaker_cooldown_seconds))

    @property
    def mode(self) -> str:
        """``llm`` when some LLM route exists, else ``extractive``."""
        return "llm" if self.routes() else "extractive"

    def routes(self) -> list[Route]:
        cfg = self.config
        if cfg.summarizer == "extractive":
            return []
        models = [m for m in (cfg.summary_model, *cfg.summary_fallback_models) if m]
        if cfg.summary_base_url:
            endpoint: list[Route] = [OpenAICompatibleRoute(cfg.summary_base_url, m, cfg.summary_api_key)
                                     for m in (models or ["default"])]
            return endpoint
        if self.host_route is not None:
            chosen: list[str | None] = list(models) or [None]  # None: the host's own default model
            return [self.host_route(m) for m in chosen]
        return []

    def describe(self) -> dict[str, Any]:
        routes = self.routes()
        return {
            "route": routes[0].name if routes else "extractive",
            "mode": "llm" if routes else "extractive",
            "fallbacks": [r.name for r in routes[1:]],
            "breaker": self.breakers.snapshot(),
        }

    def answer(self, question: str, evidence: str, max_tokens: int) -> tuple[str | None, str | None, str | None]:
        """(answer, route, None), or (None, None, why not) when no LLM route can answer."""
        routes = self.routes()
        if not routes:
            return None, None, "no LLM is configured (LCM_SUMMARY_BASE_URL / Hermes auxiliary client)"
        messages = [{"role": "system", "content": ANSWER_PROMPT},
                    {"role": "user", "content": sendable(f"{evidence}\n\nQuestion: {question}")}]
        problems = []
        for route in routes:
            if not self.breakers.available(route.name):
                problems.append(f"{route.name}: breaker open")
                continue
            try:
                text = route.complete(messages, max_tokens=max_tokens,
                                      timeout=self.config.summary_timeout_ms / 1000.0)
            except Exception as failure:  # noqa: BLE001 - a failing route never escapes
                exc = as_route_error(failure)
                self.breakers.failure(route.name, exc)
                problems.append(f"{route.name}: {exc.kind}: {exc}")
                continue
            cleaned = strip_reasoning(text)
            if not cleaned:
                self.breakers.failure(route.name, "an empty or unfinished answer")
                problems.append(f"{route.name}: an empty or unfinished answer")
                continue
            self.breakers.success(route.name)
            return cleaned, route.name, None
        return None, None, "; ".join(problems) or "no route answered"

    def _prompt(self, request: SummaryRequest, level: str) -> list[dict[str, str]]:
        focus = focus_clause(request.focus_topic)
        if level == "bullets":
            system = BULLET_PROMPT.format(bullets=8 if request.depth == 0 else 10,
                                          target=max(40, request.target_tokens // 2), focus=focus)
        elif request.depth == 0:
            system = LEAF_PROMPT.format(target=request.target_tokens, focus=focus)
        else:
            system = CONDENSED_PROMPT.format(depth=request.depth, target=request.target_tokens,
                                             focus=focus)
        return [{"role": "system", "content": system},
                {"role": "user", "content": sendable(request.source)}]

    def _accept(self, text: str, request: SummaryRequest) -> Accepted | Unusable:
        """The text as a summary (its expand line ensured) if it is usable, else why not."""
        cleaned = strip_reasoning(text)
        if cleaned is None:
            return Unusable("an unclosed reasoning block")
        if not cleaned:
            return Unusable("an empty answer")
        content, hint = ensure_expand_line(cleaned, request.source)
        count = self.tokens.count_text(content)
        if count >= request.source_tokens:
            return Unusable(f"{count} tokens, not shorter than the {request.source_tokens}-token source")
        return Accepted(content, hint, count)

    def summarize(self, request: SummaryRequest) -> SummaryDraft | None:
        """A usable summary of the request's source (see the module docstring), or None."""
        routes = self.routes()
        problems: list[str] = []
        if not routes:
            text = extractive_summary(request, self.tokens)
            accepted = self._accept(text, request)
            if isinstance(accepted, Accepted):
                return SummaryDraft(accepted.content, "extractive", accepted.tokens, "extractive", None,
                                    accepted.hint)
            problems.append(f"extractive: {accepted.reason}")
        for route in routes:
            if not self.breakers.available(route.name):
                problems.append(f"{route.name}: breaker open")
                continue
            for level in ("normal", "bullets"):
                timeout = self.config.summary_timeout_ms / 1000.0
                if request.deadline is not None:
                    timeout = min(timeout, request.deadline - time.monotonic())
                if timeout <= 0.05:
                    problems.append("the compaction's time (LCM_MAX_COMPACTION_SECONDS) is up")
                    break
                target = request.target_tokens if level == "normal" else max(40, request.target_tokens // 2)
                try:
                    text = route.complete(self._prompt(request, level),
                                          max_tokens=int(target * 1.6) + 64, timeout=timeout)
                except Exception as failure:  # noqa: BLE001 - a failing route never escapes
                    exc = as_route_error(failure)
                    self.breakers.failure(route.name, exc)
                    problems.append(f"{route.name}: {exc.kind}: {exc}")
                    break  # this route is failing, not the prompt: next route
                accepted = self._accept(text, request)
                if isinstance(accepted, Unusable):
                    self.breakers.failure(route.name, f"unusable summary ({accepted.reason})")
                    problems.append(f"{route.name} ({level}): {accepted.reason}")
                    continue  # escalate to the terser prompt on the same route
                self.breakers.success(route.name)
                kind = "llm" if level == "normal" else "llm-bullets"
                return SummaryDraft(accepted.content, kind, accepted.tokens, route.name, route.model,
                                    accepted.hint, tuple(problems))
            if problems and problems[-1].startswith("the compaction's time"):
                break
        reason = "; ".join(problems[-3:]) or "no summarizer produced a usable result"
        if routes:  # the LLM failed: the deterministic extractive summary keeps compaction going
            accepted = self._accept(extractive_summary(request, self.tokens, FALLBACK_MARKER), request)
            if isinstance(accepted, Accepted):
                log.warning("lcm summarizer: no LLM route gave a usable summary (%s); using the "
                            "extractive fallback", reason)
                return SummaryDraft(accepted.content, "extractive", accepted.tokens, "extractive", None,
                                    accepted.hint, tuple(problems))
        cut = truncation(request, self.tokens, reason)
        if cut is None:
            return None
        content, hint = cut
        return SummaryDraft(content, "truncated", self.tokens.count_text(content), "truncated",
                            None, hint, tuple(problems))
