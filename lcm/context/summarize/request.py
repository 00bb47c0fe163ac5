"""What is asked of the summarizer, and what it gives back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SummaryRequest:
    depth: int
    source: str  # framed source text (<conversation>…</conversation> or <summaries>…</summaries>)
    source_tokens: int
    target_tokens: int
    focus_topic: str | None = None
    #: ``time.monotonic()`` by which the summary must be ready (the compaction's own bound):
    #: LLM calls get what is left of it, and past it the deterministic fallback answers.
    deadline: float | None = None


@dataclass(frozen=True)
class SummaryDraft:
    content: str
    kind: str  # "llm", "llm-bullets", "extractive", "truncated"
    token_count: int
    route: str
    model: str | None = None
    expand_hint: str = ""
    notes: tuple[str, ...] = ()
