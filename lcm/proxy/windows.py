"""The model's context window, which the assembled context must fit.

``lcm proxy --context-length N`` sets it for every model. Otherwise a model is looked up here by
its longest matching name prefix (the provider's date suffixes, ``gpt-4o-2024-08-06``, match
``gpt-4o``), then in ``--windows FILE`` (a JSON object of model prefix → tokens, which wins over
this table), and a model found nowhere gets ``DEFAULT_WINDOW``. The table lists published
windows of common models; docs/proxy.md shows it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from lcm.errors import ConfigError

#: Window of a model neither --context-length, --windows nor this table knows.
DEFAULT_WINDOW = 128_000

MODEL_WINDOWS: dict[str, int] = {
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "llama-3.1": 128_000,
    "llama-3.3": 128_000,
    "mistral-large": 128_000,
    "qwen2.5": 32_768,
}


class Windows:
    """Model name → context window, by the rules of the module docstring."""

    def __init__(self, fixed: int | None = None, overrides: Mapping[str, int] | None = None):
        self.fixed = fixed
        self.table = {**MODEL_WINDOWS, **(overrides or {})}

    def of(self, model: str) -> int:
        if self.fixed:
            return self.fixed
        name = model.rsplit("/", 1)[-1].lower()  # "openai/gpt-4o" as routers name it
        best = max((p for p in self.table if name.startswith(p.lower())), key=len, default=None)
        return self.table[best] if best is not None else DEFAULT_WINDOW


def load_windows(path: str) -> dict[str, int]:
    """``--windows FILE``: a JSON object of model name prefix → context window in tokens."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the windows file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"the windows file {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 1024
            for k, v in data.items()):
        raise ConfigError(f"the windows file {path} must be a JSON object of model prefix → tokens "
                          '(at least 1024), e.g. {"my-model": 32768}')
    return dict(data)
