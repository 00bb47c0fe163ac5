"""Opening another program's SQLite store read-only, and telling which program wrote it.

Every importer opens its file with ``mode=ro`` (the program may be running, and an import must
never change what it reads) and checks the tables it needs before anything is written; a file of
another format fails with :class:`NotThisFormat`, which names the format the file does look like
when lcm knows it, so the user learns the right command instead of a stack trace.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from lcm.errors import LcmError


class NotThisFormat(LcmError):
    """The file is not the store an importer reads (nothing was imported)."""


#: The tables (and columns) that identify each format lcm imports from SQLite.
SIGNATURES: dict[str, dict[str, set[str]]] = {
    "hermes": {"sessions": {"id", "source", "started_at"},
               "messages": {"id", "session_id", "role", "content", "timestamp"}},
    "hermes-lcm": {"messages": {"store_id", "session_id", "role", "content", "tool_calls", "timestamp"},
                   "summary_nodes": {"node_id", "session_id", "depth", "summary", "source_ids"}},
    "lossless-claw": {"conversations": {"conversation_id", "session_id", "session_key"},
                      "messages": {"message_id", "conversation_id", "seq", "role", "content"},
                      "message_parts": {"message_id", "part_type", "ordinal", "tool_call_id", "tool_input"},
                      "summaries": {"summary_id", "conversation_id", "kind", "depth", "content"}},
}
WHAT = {"hermes": "a Hermes session store (state.db)", "hermes-lcm": "a hermes-lcm store (lcm.db)",
        "lossless-claw": "a lossless-claw store (lcm.db)"}


@contextmanager
def open_readonly(path: Path) -> Iterator[sqlite3.Connection]:
    """The file as a read-only SQLite connection with row access by name."""
    if not path.is_file():
        raise NotThisFormat(f"{path} does not exist or is not a file; nothing was imported")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise NotThisFormat(f"{path} cannot be opened as SQLite: {exc}; nothing was imported") from None
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def columns_of(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Every table of the file and its columns (empty for a file that is not SQLite)."""
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.DatabaseError:
        return {}
    return {t: {r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')} for t in tables}


def _matches(found: Mapping[str, set[str]], needed: Mapping[str, set[str]]) -> bool:
    return all(table in found and columns <= found[table] for table, columns in needed.items())


def check_format(conn: sqlite3.Connection, path: Path, fmt: str) -> dict[str, set[str]]:
    """The file's tables and columns, once it is known to be ``fmt``; else NotThisFormat saying
    what the file looks like instead."""
    found = columns_of(conn)
    if _matches(found, SIGNATURES[fmt]):
        return found
    other = next((f for f, needed in SIGNATURES.items() if f != fmt and _matches(found, needed)), None)
    if other is not None:
        hint = f"it looks like {WHAT[other]}: lcm import {other} {path}"
    elif not found:
        hint = "it is not an SQLite database"
    else:
        missing = sorted(t for t, cols in SIGNATURES[fmt].items() if not (t in found and cols <= found[t]))
        hint = f"it has no {', '.join(missing)} table with the columns {fmt} writes"
    raise NotThisFormat(f"{path} is not {WHAT[fmt]}: {hint}; nothing was imported")


def utc_seconds(text: str | None) -> float | None:
    """Unix seconds of an SQLite ``datetime('now')`` or ISO-8601 text; naive means UTC."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
