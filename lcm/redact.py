"""Redaction of secrets before anything is stored (opt-in: ``LCM_SENSITIVE_PATTERNS_ENABLED``).

lcm is lossless by default; a redacted value is gone for good. When enabled, each named pattern
of ``LCM_SENSITIVE_PATTERNS`` replaces what it matches in every string of a message (content,
text parts, tool-call arguments, tool results, any other field) with a placeholder:

    [REDACTED:api_key:3f9a1c2e]     a short sha256 digest, to tell two values apart
    [REDACTED:password]             no digest for passwords (it would help a dictionary attack)

It runs where a message enters lcm, before everything else (``lcm.context.ingest`` and the
importers): alignment, identities, the store, the search index, vectors, summaries and the
summarizer all only ever see the redacted message. Redaction is deterministic and idempotent (a
placeholder never matches again), so the host sending the original or lcm's redacted copy
back is the same message, stored once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lcm.errors import ConfigError

_VALUE = r"[A-Za-z0-9_\-\.~+/=]{8,}"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]


@dataclass(frozen=True)
class Pattern:
    """A named kind of secret: a regex whose group ``secret`` is the value to replace."""

    name: str
    regex: re.Pattern[str]
    digest: bool = True
    doc: str = ""

    def placeholder(self, value: str) -> str:
        return f"[REDACTED:{self.name}:{_digest(value)}]" if self.digest else f"[REDACTED:{self.name}]"


#: The catalog: names usable in LCM_SENSITIVE_PATTERNS (hermes-lcm's four, and provider tokens).
CATALOG: dict[str, Pattern] = {p.name: p for p in (
    Pattern("api_key", re.compile(
        r"(?i)(?:\b|_)(?:api[_-]?key|api[_-]?token|access[_-]?token|secret[_-]?key|client[_-]?secret)"
        r"[\"']?\s*[:=]\s*[\"']?(?P<secret>" + _VALUE + ")"),
        doc="api_key / api_token / access_token / secret_key / client_secret assignments and JSON keys"),
    Pattern("bearer_token", re.compile(
        r"(?i)\bbearer\s+(?P<secret>" + _VALUE + r")"
        r"|(?i:\b(?:auth_?)?token[\"']?\s*[:=]\s*[\"']?)(?P<json>[^\"'\s,;]{12,})"),
        doc="Authorization: Bearer values, and token assignments and JSON values"),
    Pattern("password_assignment", re.compile(
        r"(?i)\b(?:password|passwd|pwd|passphrase)[\"']?\s*[:=]\s*"
        r"(?:\"(?P<dq>[^\"]+)\"|'(?P<sq>[^']+)'|(?P<secret>[^\s,;\"']+))"), digest=False,
        doc="password / passwd / pwd / passphrase assignments and JSON keys, quoted values with spaces included"),
    Pattern("private_key", re.compile(
        r"(?P<secret>-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)"),
        doc="PEM private key blocks"),
    Pattern("provider_token", re.compile(
        r"(?P<secret>\bsk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_\-]{20,}|\bgh[pousr]_[A-Za-z0-9]{30,}"
        r"|\bgithub_pat_[A-Za-z0-9_]{30,}|\bAKIA[0-9A-Z]{16}\b|\bxox[abprs]-[A-Za-z0-9\-]{10,}"
        r"|\bAIza[0-9A-Za-z_\-]{35})"),
        doc="provider key shapes: sk-..., ghp_/gho_/github_pat_..., AKIA..., xox?-..., AIza..."),
)}
DEFAULT_PATTERNS = ("api_key", "bearer_token", "password_assignment", "private_key", "provider_token")
#: A placeholder this module wrote, captured: ``split`` keeps them as the odd parts.
_PLACEHOLDER_SPLIT = re.compile(r"(\[REDACTED:[a-z_]+(?::[0-9a-f]{8})?\])")


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if each is in the catalog, else a ConfigError listing the known ones."""
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise ConfigError(f"LCM_SENSITIVE_PATTERNS has unknown names {', '.join(unknown)}; "
                          f"known: {', '.join(CATALOG)}")
    return tuple(names)


@dataclass
class Redactor:
    """The enabled patterns, and how many values they replaced in this process (by name)."""

    patterns: tuple[Pattern, ...]
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, names: Sequence[str]) -> Redactor:
        return cls(tuple(CATALOG[n] for n in check_names(names)))

    def text(self, value: str) -> str:
        """``value`` with every match replaced (the same object when nothing matched)."""
        if not value:
            return value
        out = value
        for pattern in self.patterns:
            # Placeholders already there are never scanned again (their names look like keys).
            parts = _PLACEHOLDER_SPLIT.split(out)
            out = "".join(part if i % 2 else pattern.regex.sub(self._replacer(pattern), part)
                          for i, part in enumerate(parts))
        return value if out == value else out

    def _replacer(self, pattern: Pattern) -> Callable[[re.Match[str]], str]:
        def replace(match: re.Match[str]) -> str:
            whole = match.group(0)
            for group in ("secret", "json", "dq", "sq"):
                secret = match.groupdict().get(group)
                if secret is None:
                    continue
                if secret.startswith("[REDACTED:"):
                    return whole  # already redacted: idempotent
                self.counts[pattern.name] = self.counts.get(pattern.name, 0) + 1
                start, end = match.start(group) - match.start(0), match.end(group) - match.start(0)
                return whole[:start] + pattern.placeholder(secret) + whole[end:]
            return whole
        return replace

    def message(self, message: Any) -> Any:
        """The message with every string redacted (the same object when nothing changed)."""
        return self._value(message, top=True)

    def _value(self, value: Any, top: bool = False) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            changed = False
            out: dict[Any, Any] = {}
            for key, item in value.items():
                new = item if (top and key == "role") else self._value(item)
                changed = changed or new is not item
                out[key] = new
            return out if changed else value
        if isinstance(value, list | tuple):
            items = [self._value(v) for v in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                return type(value)(items) if isinstance(value, tuple) else items
            return value
        return value

    def messages(self, messages: Sequence[Any]) -> list[Any]:
        return [self.message(m) for m in messages]

    def describe(self) -> dict[str, Any]:
        return {"enabled": True, "patterns": [p.name for p in self.patterns],
                "placeholder": "[REDACTED:<name>:<first 8 hex of sha256>] ([REDACTED:password_assignment] "
                               "without a digest)", "redacted_values": dict(self.counts)}
