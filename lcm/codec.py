"""Lossless encoding of Python strings and JSON values into database text.

Why this exists: PostgreSQL ``text`` cannot hold NUL characters, neither backend can store a
string that is not valid UTF-8 (``json.loads`` happily produces lone surrogates such as
``"\\ud800"``), and JSON itself cannot tell a lone high+low surrogate pair apart from the astral
character they form. Host messages may contain all of these, and lcm promises that every stored
message reads back exactly as it was sent. So every string and JSON document goes through this
module on its way into the database.

The encoding is the identity for ordinary text (the overwhelmingly common case, so stored rows
stay readable and searchable with plain SQL). Only text containing NUL, U+0001 or a surrogate is
escaped: it is stored as ``MARK + escaped`` where ``MARK`` is U+0001 and the escapes are

    U+0000 -> MARK "0"      U+0001 -> MARK "1"      surrogate U+Dxxx -> MARK "s" + 4 hex digits

Because U+0001 itself is always escaped, an unescaped stored value never contains ``MARK``, and
decoding is unambiguous. JSON documents are written with ``ensure_ascii=False`` (JSON already
escapes NUL and U+0001 as ``\\u0000`` / ``\\u0001``); only if a surrogate would be written raw is
the document re-encoded with every string escaped as above and prefixed with ``MARK`` (which plain
JSON text never starts with).
"""

from __future__ import annotations

import json
import re
from typing import Any

MARK = "\x01"
_NEEDS_ESCAPE = re.compile("[\x00\x01\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE_SEQ = re.compile("\x01(?:([01])|s([0-9a-f]{4}))")


class CodecError(ValueError):
    """A value cannot be represented (not JSON-serialisable, or a corrupt stored value)."""


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch == "\x00":
        return MARK + "0"
    if ch == MARK:
        return MARK + "1"
    return f"{MARK}s{ord(ch):04x}"


def _unescape_seq(match: re.Match[str]) -> str:
    digit, hexcode = match.group(1), match.group(2)
    if digit is not None:
        return "\x00" if digit == "0" else MARK
    return chr(int(hexcode, 16))


def _escape(s: str) -> str:
    return _NEEDS_ESCAPE.sub(_escape_char, s)


def _unescape(s: str) -> str:
    # A valid encoding never leaves a MARK that does not start an escape sequence.
    if MARK in _ESCAPE_SEQ.sub("", s):
        raise CodecError("corrupt escaped text: stray escape marker")
    return _ESCAPE_SEQ.sub(_unescape_seq, s)


def is_clean(s: str) -> bool:
    """True if ``s`` can be stored verbatim (the encoding is the identity for it)."""
    return _NEEDS_ESCAPE.search(s) is None


def encode_text(s: str) -> str:
    """Encode a string for a text column; the identity for clean text."""
    if _NEEDS_ESCAPE.search(s) is None:
        return s
    return MARK + _escape(s)


def decode_text(stored: str) -> str:
    """Inverse of :func:`encode_text`."""
    if stored.startswith(MARK):
        return _unescape(stored[1:])
    return stored


def _escape_tree(value: Any) -> Any:
    if isinstance(value, str):
        return _escape(value)
    if isinstance(value, dict):
        return {_escape(k) if isinstance(k, str) else k: _escape_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escape_tree(v) for v in value]
    return value


def _unescape_tree(value: Any) -> Any:
    if isinstance(value, str):
        return _unescape(value)
    if isinstance(value, dict):
        return {_unescape(k): _unescape_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unescape_tree(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"value is not JSON-serialisable: {exc}") from exc


def encode_json(value: Any) -> str:
    """Encode any JSON value (key order kept) as database-safe text."""
    out = _dumps(value)
    if _SURROGATE.search(out) is None:
        return out
    return MARK + _dumps(_escape_tree(value))


def decode_json(stored: str) -> Any:
    """Inverse of :func:`encode_json`."""
    try:
        if stored.startswith(MARK):
            return _unescape_tree(json.loads(stored[1:]))
        return json.loads(stored)
    except json.JSONDecodeError as exc:
        raise CodecError(f"corrupt stored JSON: {exc}") from exc


def strip_unstorable(s: str, replacement: str = " ") -> str:
    """Replace NUL, U+0001 and surrogates; used for derived text (search bodies, summaries)."""
    if _NEEDS_ESCAPE.search(s) is None:
        return s
    return _NEEDS_ESCAPE.sub(replacement, s)
