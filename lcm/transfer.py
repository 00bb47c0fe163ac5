"""Transcripts in and out of a store: what ``lcm ingest`` and ``lcm export`` do.

Formats read (``read_transcript``):
  * JSONL, one object per line: an OpenAI-format message (``{"role": ...}``), or an export
    line ``{"session_id", "platform", "conversation_id", "seq", "timestamp", "message": {...}}``
    (``lcm export`` writes these; only ``message`` is required);
  * JSON: a list of such objects, or a chat request body ``{"messages": [...]}``.
Blank lines are skipped. Every line is validated before anything is written; a bad line is
reported with its line number (item number in a JSON list) and, unless the caller skips bad
lines, nothing is imported.

Plain messages are a *host transcript*: a leading system prompt is kept as the session's system
prompt (once per version, never a conversation message) and lcm's own summary messages are
dropped, exactly as live ingest does. Export lines are stored messages and are imported
verbatim, with their recorded times, so that ``export → ingest → export`` reproduces the export
byte for byte; a line marked ``"system_prompt": true`` is a version of the session's system
prompt (``lcm export`` writes each version right before the first message it preceded).

Idempotence (``import_session``): the file's messages are matched, in order, against the
session's stored messages from the start. Stored messages that are a prefix of the file are
skipped and the rest appended; a file that is a prefix of the stored session adds nothing; a
file that disagrees with what is stored is refused (import it under another session id)
rather than guessed at. Importing the same file twice therefore adds nothing, and an import
interrupted halfway resumes where it stopped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from lcm.context.alignment import message_key, meta_key
from lcm.context.ports import StorePorts
from lcm.errors import InvalidMessageError, LcmError
from lcm.messages import content_hash, encode_message, parse_timestamp
from lcm.prepare import prepare_messages, prepare_system_prompt
from lcm.records import MessageRecord, SessionRecord, SystemPromptRecord
from lcm.tokens import TokenCounter
from lcm.transcript import is_lcm_summary, is_real_user, recall_call_ids, role_of

EXPORT_PAGE = 500
MAX_REPORTED_PROBLEMS = 5


class TranscriptError(LcmError, ValueError):
    """The transcript cannot be imported as it is (the message says where and why)."""


@dataclass(frozen=True)
class Entry:
    """One message of a transcript file, with where it came from."""

    where: int  # line number (JSONL) or item number (JSON list), 1-based
    message: dict[str, Any]
    session_key: str | None = None
    platform: str | None = None
    conversation_id: str | None = None
    timestamp: float | None = None
    exported: bool = False  # an export line: a stored message, imported verbatim
    system_prompt: bool = False  # a version of the session's system prompt, not a message
    seq: int | None = None  # an export line's seq (a system prompt's: the first message it preceded)


@dataclass
class Transcript:
    source: str
    entries: list[Entry]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (where, why) of bad lines skipped
    unit: str = "line"


def _open_text(source: str | Path | TextIO) -> tuple[str, str]:
    if not isinstance(source, (str, Path)):  # an open text stream
        return getattr(source, "name", "<stdin>"), source.read()
    if str(source) == "-":
        return "<stdin>", sys.stdin.read()
    path = Path(source).expanduser()
    try:
        return str(path), path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TranscriptError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TranscriptError(f"{path}: is a directory, not a transcript file") from None
    except UnicodeDecodeError as exc:
        raise TranscriptError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise TranscriptError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _items(text: str) -> tuple[list[tuple[int, Any]], list[tuple[int, str]], str]:
    """(numbered raw items, JSON errors, unit) of a JSON or JSONL document."""
    stripped = text.strip()
    if not stripped:
        return [], [], "line"
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    else:
        if isinstance(whole, list):
            return list(enumerate(whole, 1)), [], "item"
        if isinstance(whole, dict) and isinstance(whole.get("messages"), list):
            key = whole.get("session_id")
            wrapped = [{"session_id": key, "message": m} if isinstance(key, str) and isinstance(m, dict)
                       and "message" not in m else m for m in whole["messages"]]
            return list(enumerate(wrapped, 1)), [], "item"
    items: list[tuple[int, Any]] = []
    errors: list[tuple[int, str]] = []
    # JSONL lines end at "\n" (a "\r" before it is allowed) and nowhere else: str.splitlines
    # would also cut at U+2028, U+2029, U+0085 and form feeds, which JSON allows raw inside a
    # string (other writers leave them unescaped), and the message would be lost.
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            items.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            errors.append((number, f"not JSON ({exc.msg} at column {exc.colno})"))
    return items, errors, "line"


#: The roles of the chat message shape (docs/contract.md, Messages).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _check_shape(message: dict[str, Any]) -> None:
    """A transcript message must look like a chat message: a known role, and text (or a list of
    parts) unless it is an assistant turn that only calls tools."""
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise InvalidMessageError(f"role {role!r} is not a chat role ({', '.join(CHAT_ROLES)})")
    content = message.get("content")
    if content is None:
        if not message.get("tool_calls"):
            raise InvalidMessageError("a message needs content (text or a list of parts) or tool_calls")
    elif not isinstance(content, str | list):
        raise InvalidMessageError(f"content must be text or a list of parts, got {type(content).__name__}")


def _entry(where: int, raw: Any) -> Entry:
    if not isinstance(raw, dict):
        raise InvalidMessageError(f"expected a JSON object, got {type(raw).__name__}")
    exported = "message" in raw
    message = raw["message"] if exported else raw
    if not isinstance(message, dict):
        raise InvalidMessageError("'message' must be an object")
    encode_message(message)  # the store's own validation: role, content, JSON-serialisable
    if not exported:  # a transcript to import: the contract's message shape (an export line is
        _check_shape(message)  # whatever lcm once accepted, and must come back exactly)
    meta: dict[str, Any] = {}
    if exported:
        for key in ("session_id", "platform", "conversation_id"):
            value = raw.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InvalidMessageError(f"{key!r} must be a non-empty string")
            meta[key] = value
        if raw.get("timestamp") is not None:
            ts = parse_timestamp(raw["timestamp"])
            if ts is None:
                raise InvalidMessageError(f"'timestamp' must be Unix seconds or ISO-8601 with a zone, "
                                          f"got {raw['timestamp']!r}")
            meta["timestamp"] = ts
        if raw.get("system_prompt") not in (None, True, False):
            raise InvalidMessageError("'system_prompt' must be true or false")
        if raw.get("system_prompt") and message.get("role") != "system":
            raise InvalidMessageError("a line marked 'system_prompt' must hold a system message")
        seq = raw.get("seq")
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
            raise InvalidMessageError(f"'seq' must be a non-negative integer, got {seq!r}")
        meta["seq"] = seq
    return Entry(where=where, message=message, session_key=meta.get("session_id"),
                 platform=meta.get("platform"), conversation_id=meta.get("conversation_id"),
                 timestamp=meta.get("timestamp"), exported=exported,
                 system_prompt=bool(exported and raw.get("system_prompt")), seq=meta.get("seq"))


def read_transcript(source: str | Path | TextIO, *, skip_bad: bool = False) -> Transcript:
    """Parse and validate a whole transcript; TranscriptError lists the bad lines (by number)
    unless ``skip_bad``, in which case they are left out and listed in ``skipped``."""
    name, text = _open_text(source)
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark (Windows editors write one)
    items, problems, unit = _items(text)
    if not items and not problems:
        raise TranscriptError(f"{name}: no messages in it: nothing to import")
    entries: list[Entry] = []
    for where, raw in items:
        try:
            entries.append(_entry(where, raw))
        except (InvalidMessageError, ValueError) as exc:
            problems.append((where, str(exc)))
    problems.sort()
    if problems and not skip_bad:
        shown = "; ".join(f"{unit} {w}: {why}" for w, why in problems[:MAX_REPORTED_PROBLEMS])
        more = f" (and {len(problems) - MAX_REPORTED_PROBLEMS} more)" if len(problems) > MAX_REPORTED_PROBLEMS else ""
        raise TranscriptError(f"{name}: {len(problems)} bad {unit}{'s' if len(problems) > 1 else ''}, "
                              f"nothing imported: {shown}{more} (--skip-bad imports the rest)")
    return Transcript(name, entries, problems, unit)


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class ImportedSummary:
    """A summary another program wrote (``lcm import``), to place into lcm's DAG
    (``lcm.importers.dag``). ``sources``: for a leaf, indexes into the session's imported
    messages; for a condensed summary, the peer ids of its children. ``peer_sources``: the
    program's own ids of what it covered, kept as provenance."""

    peer_id: str
    depth: int
    content: str
    sources: tuple[Any, ...]
    peer_sources: tuple[Any, ...] = ()
    order: int = 0  # the program's own order of writing
    expand_hint: str = ""
    model: str | None = None
    created_at: float | None = None


@dataclass
class SessionPlan:
    """The messages of one session to import, in order."""

    session_key: str
    entries: list[Entry]
    platform: str | None = None
    conversation_id: str | None = None
    dropped: int = 0  # lcm summaries of a host transcript, not stored
    #: Versions of the session's system prompt, each with the seq of the first message it
    #: preceded: a plain transcript's leading system message, or export lines marked so.
    system_prompts: list[tuple[Entry, int]] = field(default_factory=list)
    #: Where the session came from (``lcm import``): kept on the lcm session as its origin.
    origin: dict[str, Any] | None = None
    #: Summaries another program wrote over these messages (``lcm import hermes-lcm``, ...).
    summaries: list[ImportedSummary] = field(default_factory=list)
    #: Other host ids of the same conversation (Hermes' sessions continued after a compression):
    #: made aliases of the session, so a host resuming one of them finds it.
    aliases: list[str] = field(default_factory=list)

    def add_system_prompt(self, content: Any, *, where: int, timestamp: float | None) -> None:
        """A version of the session's system prompt from another program's store, preceding the
        next message to be added."""
        self.system_prompts.append((Entry(where=where, message={"role": "system", "content": content},
                                          session_key=self.session_key, timestamp=timestamp, system_prompt=True),
                                    len(self.entries) + 1))


def plan_sessions(transcript: Transcript, *, session_key: str | None = None) -> list[SessionPlan]:
    """Group the entries by session (``session_key`` puts them all into one), in file order."""
    plans: dict[str, SessionPlan] = {}
    for entry in transcript.entries:
        key = session_key or entry.session_key
        if not key:
            raise TranscriptError(f"{transcript.source}: {transcript.unit} {entry.where} names no session: "
                                  "pass --session NAME")
        plan = plans.setdefault(key, SessionPlan(key, []))
        plan.platform = plan.platform or entry.platform
        plan.conversation_id = plan.conversation_id or entry.conversation_id
        plan.entries.append(entry)
    for plan in plans.values():
        kept: list[Entry] = []
        for i, entry in enumerate(plan.entries):
            if entry.system_prompt:
                plan.system_prompts.append((entry, entry.seq if entry.seq is not None else len(kept) + 1))
                continue
            if not entry.exported and i == 0 and role_of(entry.message) == "system":
                plan.system_prompts.append((entry, 1))
                continue
            if not entry.exported and is_lcm_summary(entry.message):
                plan.dropped += 1
                continue
            kept.append(entry)
        plan.entries = kept
    return list(plans.values())


@dataclass
class ImportReport:
    session_key: str
    in_file: int
    already_stored: int
    added: int
    dropped: int
    system_prompts: int = 0  # versions of the system prompt this import kept (new ones)
    #: Another program's summaries: placed into the DAG now, placed before, not placed, notes.
    imported_summaries: dict[str, int] | None = None


def turns(entries: Sequence[Entry]) -> list[list[Entry]]:
    """Split at each real user message: the unit a host would have sent, and the step at which
    an import compacts."""
    out: list[list[Entry]] = []
    for entry in entries:
        if not out or is_real_user(entry.message):
            out.append([])
        out[-1].append(entry)
    return out


def import_session(store: StorePorts, agent: str, plan: SessionPlan, tokens: TokenCounter, *,
                   after_turn: Callable[[SessionRecord, int], None] | None = None,
                   redact: Callable[[Any], Any] | None = None) -> ImportReport:
    """Store a session's messages exactly once (see the module docstring for the matching
    rule). ``after_turn(session, messages_added)`` runs after each stored turn (compaction,
    progress). ``redact``: secrets out of every message first (``lcm.redact``), so matching
    and storing both see the redacted message."""
    if redact is not None:
        plan = replace(plan, entries=[replace(e, message=redact(e.message)) for e in plan.entries],
                       system_prompts=[(replace(e, message=redact(e.message)), seq) for e, seq in plan.system_prompts])
    session = store.sessions.get_or_create(agent, plan.session_key, platform=plan.platform,
                                          conversation_id=plan.conversation_id, origin=plan.origin)
    stored = store.messages.metas(session.id, first_seq=1, last_seq=session.last_seq) if session.last_seq else []
    keys = [message_key(e.message, content_hash(e.message)) for e in plan.entries]
    common = 0
    while common < min(len(stored), len(keys)) and meta_key(stored[common]) == keys[common]:
        common += 1
    if common < len(stored) and common < len(keys):
        where = plan.entries[common].where
        raise TranscriptError(
            f"session {plan.session_key!r} already holds different messages: its message {common + 1} "
            f"is not the file's ({where}); import into another session (--session NAME)")
    kept_prompts = sum(store.sessions.keep_system_prompt(
        session.id, prepare_system_prompt(entry.message, tokens), first_seq=first_seq, at=entry.timestamp)
        for entry, first_seq in plan.system_prompts)
    anchor = stored[common - 1].identity if common else None
    rest = plan.entries[common:]
    recall = recall_call_ids([e.message for e in plan.entries])
    added = 0
    for turn in turns(rest):
        result = store.messages.append(
            session.id, prepare_messages([e.message for e in turn], tokens, recall), after_identity=anchor,
            timestamps=[e.timestamp for e in turn])
        anchor, session = result.last_identity, result.session
        added += result.inserted
        if after_turn is not None:
            after_turn(session, result.inserted)
    return ImportReport(plan.session_key, len(plan.entries), common, added, plan.dropped, kept_prompts)


# --------------------------------------------------------------------------- export


def _line_head(session: SessionRecord, seq: int, timestamp: float) -> dict[str, Any]:
    return {"session_id": session.session_key, "platform": session.platform,
            "conversation_id": session.conversation_id, "seq": seq, "timestamp": timestamp}


def export_line(session: SessionRecord, record: MessageRecord) -> dict[str, Any]:
    return {**_line_head(session, record.seq, record.ts), "message": record.message}


def system_prompt_line(session: SessionRecord, prompt: SystemPromptRecord) -> dict[str, Any]:
    """A version of the session's system prompt: ``seq`` is the first message it preceded."""
    return {**_line_head(session, prompt.first_seq, prompt.created_at), "system_prompt": True,
            "message": prompt.message}


def export_sessions(store: StorePorts, agent: str, session_key: str | None = None) -> Iterator[dict[str, Any]]:
    """Every stored message of the agent's session (or of all its sessions, oldest session
    first), in store order, as export lines, each version of a session's system prompt right
    before the first message it preceded; read page by page, so memory stays flat."""
    if session_key is not None:
        found = store.sessions.find(agent, session_key)
        if found is None:
            raise TranscriptError(f"agent {agent!r} has no session {session_key!r} (lcm sessions lists them)")
        sessions: Iterator[SessionRecord] = iter([found])
    else:
        sessions = store.sessions.each(agent)
    for session in sessions:
        prompts = store.sessions.system_prompts(session.id)  # in first_seq order
        cursor = None
        while True:
            records, cursor = store.messages.page(session.id, after_store_id=cursor, limit=EXPORT_PAGE)
            for record in records:
                while prompts and prompts[0].first_seq <= record.seq:
                    yield system_prompt_line(session, prompts.pop(0))
                yield export_line(session, record)
            if cursor is None:
                break
        for prompt in prompts:  # versions that came after the last stored message
            yield system_prompt_line(session, prompt)


#: Characters other line readers end a line at (Python's str.splitlines, JavaScript's line
#: terminators) that json.dumps leaves raw; written escaped (inside a JSON string the escape
#: means the same character, and outside strings JSON never has them).
_LINE_BREAKERS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def dump_line(line: Mapping[str, Any]) -> str:
    """One JSONL line: compact and readable (non-ASCII kept), any line-breaking character
    escaped so that every reader sees one line, and a line holding lone surrogates written
    fully escaped so the file stays valid UTF-8 and reads back exactly."""
    text = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(line, ensure_ascii=True, separators=(",", ":"))
    return text.translate(_LINE_BREAKERS)
