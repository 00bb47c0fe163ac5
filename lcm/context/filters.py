"""Session and message filters: keeping bot, cron and other noise out of the store.

* ``LCM_IGNORE_SESSION_PATTERNS`` (comma-separated globs): a session whose id, platform or
  ``platform:id`` matches is not stored at all: no row, no messages, no compaction; the host's
  context passes through unchanged, and the recall tools answer only across other sessions.
* ``LCM_STATELESS_SESSION_PATTERNS`` (globs, same keys): read-only; nothing is written for the
  session (not even a session row), the host's context passes through, and the recall tools
  work over the agent's stored sessions. Ignore wins when both match.
* ``LCM_IGNORE_MESSAGE_PATTERNS`` (comma-separated regular expressions): a conversation message
  whose text matches is not stored, like host scaffolding. Messages of a tool exchange (a
  tool result, an assistant message with tool calls) are never filtered: dropping one would
  leave its partner unanswered in every context lcm assembles. Each match is bounded in time
  (``regex`` with a timeout, ``MATCH_TIMEOUT``): a pattern that backtracks without end cannot
  hold a turn; such a message is kept (counted in ``timeouts``).

Adapters apply the filters to the host's sessions; the command line does not (what a person
names on it is what they mean).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from lcm.config import LcmConfig
from lcm.errors import ConfigError
from lcm.messages import content_text

Rule = Literal["store", "ignore", "stateless"]
#: Seconds one message pattern may spend on one message.
MATCH_TIMEOUT = 0.05
#: Distinct ignored messages remembered for the counter (a host resends its transcript).
COUNTED_CAP = 10_000


def _compile(patterns: Sequence[str]) -> list[Any]:
    if not patterns:  # the usual case: nothing to import at engine construction
        return []
    import regex  # tiktoken's dependency: matches with a timeout, unlike re

    compiled = []
    for pattern in patterns:
        try:
            compiled.append(regex.compile(pattern))
        except regex.error as exc:
            raise ConfigError(f"LCM_IGNORE_MESSAGE_PATTERNS: {pattern!r} is not a valid regular expression "
                              f"({exc}); write a literal comma as \\x2c") from None
    return compiled


class Filters:
    """The filters of one engine's settings, and what they did in this process."""

    def __init__(self, config: LcmConfig):
        self.ignore_sessions = config.ignore_session_patterns
        self.stateless_sessions = config.stateless_session_patterns
        self.message_patterns = config.ignore_message_patterns
        self._compiled = _compile(self.message_patterns)
        self._counted: set[str] = set()
        self.ignored_messages = 0
        self.timeouts = 0

    def session_rule(self, session_key: str, platform: str | None) -> Rule:
        keys = [session_key] + ([platform, f"{platform}:{session_key}"] if platform else [])

        def hit(globs: Sequence[str]) -> bool:
            return any(fnmatch.fnmatchcase(k, g) for g in globs for k in keys)

        if hit(self.ignore_sessions):
            return "ignore"
        return "stateless" if hit(self.stateless_sessions) else "store"

    def ignored_message(self, message: Any) -> bool:
        """Whether a conversation message is to be left out (see the module docstring)."""
        if not self._compiled or not isinstance(message, dict):
            return False
        if message.get("role") == "tool" or message.get("tool_calls"):
            return False
        text = content_text(message.get("content"))
        if not text and message.get("content") is not None:
            text = json.dumps(message.get("content"), ensure_ascii=False, sort_keys=True, default=str)
        for pattern in self._compiled:
            try:
                found = pattern.search(text, timeout=MATCH_TIMEOUT)
            except TimeoutError:
                self.timeouts += 1
                continue
            if found:
                digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
                if digest not in self._counted and len(self._counted) < COUNTED_CAP:
                    self._counted.add(digest)
                    self.ignored_messages += 1
                return True
        return False

    def describe(self, rule: Rule) -> dict[str, Any]:
        return {"ignore_session_patterns": list(self.ignore_sessions),
                "stateless_session_patterns": list(self.stateless_sessions),
                "ignore_message_patterns": list(self.message_patterns),
                "session_ignored": rule == "ignore", "session_stateless": rule == "stateless",
                "ignored_messages": self.ignored_messages, "match_timeouts": self.timeouts}
