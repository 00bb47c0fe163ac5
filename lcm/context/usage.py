"""What the host's model reported: the last call's token counts, and the running prompt-cache
figures of every call reported so far (``lcm_status`` shows them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _count(usage: Mapping[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` the usage reports as a number (nested ``a.b`` keys allowed)."""
    for key in keys:
        value: Any = usage
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


@dataclass
class Usage:
    """What the host's model reported for its last call (``-1``: unknown since a compaction),
    and the running prompt-cache figures of every call reported so far.

    Reads the shapes providers and hosts report: OpenAI's ``prompt_tokens`` with
    ``prompt_tokens_details.cached_tokens`` (and the Responses API's ``input_tokens_details``),
    Anthropic's ``input_tokens`` beside ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (which ``input_tokens`` does not include), and Hermes'
    normalized ``cache_read_tokens`` / ``cache_write_tokens``."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    #: Running totals since the session started: requests reported, their prompt tokens, and
    #: the prompt tokens the provider said it read from (and wrote to) its cache.
    requests: int = 0
    requests_with_cache: int = 0  # requests that reported a cache counter at all
    prompt_total: int = 0
    cache_read_total: int = 0
    cache_write_total: int = 0

    def update(self, usage: Mapping[str, Any]) -> None:
        read = _count(usage, "cache_read_tokens", "cache_read_input_tokens",
                      "prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens")
        write = _count(usage, "cache_write_tokens", "cache_creation_input_tokens")
        prompt = _count(usage, "prompt_tokens")
        if prompt is None:
            prompt = _count(usage, "input_tokens") or 0
            if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
                prompt += (read or 0) + (write or 0)  # Anthropic: input_tokens excludes the cache
        completion = _count(usage, "completion_tokens", "output_tokens") or 0
        self.prompt_tokens, self.completion_tokens = prompt, completion
        self.total_tokens = _count(usage, "total_tokens") or prompt + completion
        if prompt <= 0:
            return
        self.requests += 1
        self.prompt_total += prompt
        if read is not None or write is not None:
            self.requests_with_cache += 1
            self.cache_read_total += read or 0
            self.cache_write_total += write or 0

    def cache_report(self) -> dict[str, Any]:
        """The running cache figures, as ``lcm_status`` shows them."""
        share = (round(self.cache_read_total / self.prompt_total, 4)
                 if self.requests_with_cache and self.prompt_total else None)
        return {"requests": self.requests, "requests_reporting_cache": self.requests_with_cache,
                "prompt_tokens": self.prompt_total, "cache_read_tokens": self.cache_read_total,
                "cache_write_tokens": self.cache_write_total, "cache_read_share": share}
