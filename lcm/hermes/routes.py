"""Hermes' own LLM client as a summarizer route: inside Hermes, lcm summarizes with the host's
auxiliary model (``call_llm(task="compression")``) unless an endpoint is configured."""

from __future__ import annotations

import re
from typing import Any

from lcm.context.summarize.routes import RouteError, bounded_call


class HermesAuxiliaryRoute:
    """Hermes' auxiliary client (``call_llm(task="compression")``): the host's own routing."""

    def __init__(self, model: str | None = None):
        self.model = model
        self.name = f"hermes-aux:{model or 'compression'}"

    def complete(self, messages: list[dict[str, str]], *, max_tokens: int, timeout: float) -> str:
        try:
            from agent.auxiliary_client import call_llm  # type: ignore[import-not-found]
        except ImportError as exc:
            raise RouteError("config", "Hermes' auxiliary client is not importable") from exc
        kwargs: dict[str, Any] = {"task": "compression", "messages": messages,
                                  "max_tokens": max_tokens, "temperature": 0.2, "timeout": timeout}
        if self.model:
            kwargs["model"] = self.model
        try:
            response = bounded_call(lambda: call_llm(**kwargs), timeout, self.name)
        except RouteError:
            raise
        except Exception as exc:
            text = str(exc)
            kind = "auth" if re.search(r"\b(401|403)\b|unauthori|forbidden|api key", text, re.I) else (
                "timeout" if "timeout" in text.lower() or "timed out" in text.lower() else "http")
            raise RouteError(kind, f"{type(exc).__name__}: {text[:300]}") from exc
        try:
            content = response.choices[0].message.content
        except (AttributeError, IndexError, TypeError):
            content = None
        if not isinstance(content, str) or not content.strip():
            raise RouteError("empty", "the auxiliary model returned no text")
        return content
