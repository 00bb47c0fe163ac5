"""The host contract: Hermes' ``ContextEngine`` ABC when Hermes is importable, else a stand-in.

lcm's engine subclasses whichever this module provides, so inside Hermes it *is* a Hermes
context engine (``isinstance`` checks pass, defaults come from the host), and outside Hermes
(tests, other hosts, the CLI) it has the same method set and attribute defaults.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from lcm.config import hermes_home_from_env


def _hermes_base() -> type | None:
    try:
        from agent.context_engine import ContextEngine  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not installed, or an unrelated package named "agent"
        return None
    required = ("compress", "should_compress", "update_from_response", "name")
    return ContextEngine if all(hasattr(ContextEngine, a) for a in required) else None


class StandInContextEngine(ABC):
    """The Hermes ``ContextEngine`` method set, for when Hermes is not installed."""

    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0
    last_total_tokens: int = 0
    threshold_tokens: int = 0
    context_length: int = 0
    compression_count: int = 0
    threshold_percent: float = 0.75
    protect_first_n: int = 3
    protect_last_n: int = 6

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def update_from_response(self, usage: dict[str, Any]) -> None: ...

    @abstractmethod
    def should_compress(self, prompt_tokens: int | None = None) -> bool: ...

    @abstractmethod
    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False,
                 memory_context: str = "") -> list[dict[str, Any]]: ...

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        return False

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        return True

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:  # noqa: B027
        pass

    def on_session_end(self, session_id: str, messages: list[dict[str, Any]]) -> None:  # noqa: B027
        pass

    def on_session_reset(self) -> None:
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def handle_tool_call(self, name: str, args: dict[str, Any], **kwargs: Any) -> str:
        return json.dumps({"error": f"Unknown context engine tool: {name}"})

    def get_status(self) -> dict[str, Any]:
        last = self.last_prompt_tokens if self.last_prompt_tokens > 0 else 0
        return {"last_prompt_tokens": last, "threshold_tokens": self.threshold_tokens,
                "context_length": self.context_length,
                "usage_percent": min(100, last / self.context_length * 100) if self.context_length else 0,
                "compression_count": self.compression_count}

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "") -> None:
        self.context_length = context_length
        self.threshold_tokens = int(context_length * self.threshold_percent)


HermesContextEngine = _hermes_base()
ContextEngineBase: type = HermesContextEngine or StandInContextEngine
HERMES_AVAILABLE = HermesContextEngine is not None


def hermes_home_from(kwargs: dict[str, Any]) -> Path | None:
    """The Hermes home of this process: the ``hermes_home`` the host passed, else $HERMES_HOME."""
    home = kwargs.get("hermes_home")
    return Path(home).expanduser() if home else hermes_home_from_env()


def profile_name(hermes_home: Path | None) -> str:
    """Hermes profile of a home (``…/profiles/<name>``), else ``default``."""
    if hermes_home is not None and hermes_home.parent.name == "profiles" and hermes_home.name:
        return hermes_home.name
    return "default"
