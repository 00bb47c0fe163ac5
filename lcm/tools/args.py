"""Argument checking for the agent tools: strict, and every error says what is accepted.

Models call tools with imperfect JSON. lcm never guesses: an integer argument takes a JSON
integer only (not ``"5"``, ``5.0`` or ``true``), an enum lists its values, an unknown argument
is named, and a timestamp must carry its time zone. A limit above its cap is clamped (and the
response says so); below its minimum it is an error.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lcm import codec

#: Integers above this cannot reach a database column (both backends are signed 64-bit). An id
#: beyond it is simply not found; any other integer argument beyond it is an error.
MAX_INT = 2**63 - 1
#: Longest string argument (a query or a question is far shorter; a role or a session id more so).
MAX_STRING_CHARS = 20_000
#: Arguments whose values are short names (matched against short indexed columns).
SHORT_STRING_CHARS = {"role": 64, "source": 64, "session_id": 255, "field": 64}

_show_repr = reprlib.Repr()
_show_repr.maxlevel, _show_repr.maxstring, _show_repr.maxother, _show_repr.maxlist = 3, 80, 80, 8


def _show(value: Any) -> str:
    """A short rendering of a caller's value for an error message (never recursion-deep)."""
    return _show_repr.repr(value)


class ArgumentError(ValueError):
    """A tool argument is missing or not acceptable; the message is shown to the model."""


@dataclass(frozen=True)
class Arg:
    name: str
    kind: str  # "string", "integer", "number", "boolean", "timestamp", "string_list", "integer_list"
    required: bool = False
    default: Any = None
    minimum: int | None = None
    cap: int | None = None  # values above are clamped to this (reported as limit_clamped_from)
    choices: tuple[str, ...] | None = None
    description: str = ""

    def json_schema(self) -> dict[str, Any]:
        kinds: dict[str, dict[str, Any]] = {"string": {"type": "string"}, "integer": {"type": "integer"},
                 "number": {"type": "number"}, "boolean": {"type": "boolean"},
                 "timestamp": {"type": ["number", "string"]},
                 "string_list": {"type": "array", "items": {"type": "string"}},
                 "integer_list": {"type": "array", "items": {"type": "integer"}}}
        schema = dict(kinds[self.kind])
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        description = self.description
        if self.default is not None:
            description += f" Default {self.default}."
        if self.cap is not None:
            description += f" At most {self.cap} (larger values are clamped)."
        schema["description"] = description.strip()
        return schema


@dataclass
class Parsed:
    values: dict[str, Any]
    clamped: dict[str, int]  # argument -> the value the caller asked for

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_timestamp_arg(name: str, value: Any) -> float:
    """Unix seconds, or an ISO-8601 string with a time zone (a naive one is an error)."""
    if _is_int(value) or (isinstance(value, float) and value == value):
        return float(value)
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise ArgumentError(f"{name} must be Unix seconds or an ISO-8601 time with a time zone "
                                f"(e.g. 2026-01-31T09:00:00Z), got {value!r}") from None
        if parsed.tzinfo is None:
            raise ArgumentError(f"{name} has no time zone: {value!r} is ambiguous; add one "
                                "(e.g. Z or +02:00) or pass Unix seconds")
        return parsed.timestamp()
    raise ArgumentError(f"{name} must be Unix seconds or an ISO-8601 time with a time zone")


#: Free text arguments: NUL and unpaired surrogates in them become spaces, as they do in what
#: the search index holds, so any text is a search (never an error). In a name they are refused.
FREE_TEXT = frozenset({"query", "prompt"})


def _check_text(name: str, value: str) -> str:
    """Text a database can take and of a sensible length, refused here (not deep inside a
    query) when it is not."""
    limit = SHORT_STRING_CHARS.get(name, MAX_STRING_CHARS)
    if len(value) > limit:
        raise ArgumentError(f"{name} must be at most {limit} characters, got {len(value)}")
    if codec.is_clean(value.replace("\x01", "")):
        return value
    if name in FREE_TEXT:
        return codec.strip_unstorable(value)
    raise ArgumentError(f"{name} contains a NUL character or an unpaired surrogate "
                        "(not text): send plain text")


def parse_args(tool: str, spec: Sequence[Arg], args: Any) -> Parsed:
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise ArgumentError(f"{tool} takes a JSON object of arguments, got {type(args).__name__}")
    known = {a.name: a for a in spec}
    unknown = sorted((k for k in args if not isinstance(k, str) or k not in known), key=repr)
    if unknown:
        raise ArgumentError(f"{tool} has no argument {', '.join(_show(k) for k in unknown)}; it "
                            f"accepts: {', '.join(a.name for a in spec) or 'no arguments'}")
    values: dict[str, Any] = {}
    clamped: dict[str, int] = {}
    for arg in spec:
        raw = args.get(arg.name)
        if raw is None:
            if arg.required:
                raise ArgumentError(f"{tool} needs the argument {arg.name!r} ({arg.description.strip()})")
            values[arg.name] = arg.default
            continue
        values[arg.name] = _convert(tool, arg, raw, clamped)
    return Parsed(values, clamped)


def _convert(tool: str, arg: Arg, raw: Any, clamped: dict[str, int]) -> Any:
    name = arg.name
    if arg.kind == "string":
        if not isinstance(raw, str):
            raise ArgumentError(f"{name} must be a string, got {type(raw).__name__}")
        if arg.choices and raw not in arg.choices:
            raise ArgumentError(f"{name} must be one of {', '.join(arg.choices)}; got {_show(raw)}")
        return _check_text(name, raw)
    if arg.kind == "integer":
        if not _is_int(raw):
            raise ArgumentError(f"{name} must be a JSON integer (not a string, float or boolean), "
                                f"got {_show(raw)}")
        if raw > MAX_INT and arg.cap is None and not name.endswith("_id"):
            raise ArgumentError(f"{name} must be below 2^63, got {_show(raw)}")
        if arg.minimum is not None and raw < arg.minimum:
            raise ArgumentError(f"{name} must be at least {arg.minimum}, got {raw}")
        if arg.cap is not None and raw > arg.cap:
            clamped[name] = raw
            return arg.cap
        return raw
    if arg.kind == "number":
        if not (_is_int(raw) or isinstance(raw, float)):
            raise ArgumentError(f"{name} must be a number, got {_show(raw)}")
        return raw
    if arg.kind == "boolean":
        if not isinstance(raw, bool):
            raise ArgumentError(f"{name} must be true or false, got {_show(raw)}")
        return raw
    if arg.kind == "timestamp":
        return parse_timestamp_arg(name, raw)
    if arg.kind in ("string_list", "integer_list"):
        want_int = arg.kind == "integer_list"
        if not isinstance(raw, list) or not all(_is_int(v) if want_int else isinstance(v, str) for v in raw):
            kind = "integers" if want_int else "strings"
            raise ArgumentError(f"{name} must be a list of {kind}, got {_show(raw)}")
        for v in raw:
            if isinstance(v, str):
                _check_text(name, v)
        if arg.choices:
            bad = [v for v in raw if v not in arg.choices]
            if bad:
                raise ArgumentError(f"{name} may only contain {', '.join(arg.choices)}; got {_show(bad)}")
        if arg.cap is not None and len(raw) > arg.cap:
            clamped[name] = len(raw)
            return raw[: arg.cap]
        return raw
    raise AssertionError(f"unknown argument kind {arg.kind}")
