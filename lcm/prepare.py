"""How a host message becomes stored rows: the rules, computed before any transaction.

Everything expensive about a write happens here, outside the database lock: encoding the message
into columns (``lcm.messages``), counting its tokens, building the text the search index gets
(lcm's own recall traffic left out, ``lcm.transcript``), compressing a large payload. The store
receives :class:`PreparedMessage` values and only decides *where* they go (``seq``, which ones
are already stored); it never decides what a message means.

The same rules serve the upgrade migrations (``lcm.store.upgrades``): a revision that changes
what a stored value means recomputes it with these functions, so there is one copy of each rule.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lcm import codec
from lcm.errors import InvalidMessageError
from lcm.messages import (
    CONTENT_TEXT,
    EncodedMessage,
    chain_identity,
    clean_message,
    encode_message,
    message_text,
    uid_identity,
    without_recall_blocks,
)
from lcm.textindex import index_body
from lcm.tokens import TokenCounter
from lcm.transcript import recall_call_ids as recall_call_ids_of
from lcm.transcript import searchable_text

#: How large payloads are compressed (recorded per payload row as its ``codec``).
PAYLOAD_CODEC = "zlib"
PAYLOAD_LEVEL = 6


@dataclass(frozen=True, slots=True)
class Payload:
    """A message's large fields, compressed and addressed by content (stored once)."""

    sha256: str
    data: bytes
    size_chars: int


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A message ready for storage: its columns, token count, index text and payload."""

    encoded: EncodedMessage
    token_count: int
    #: What the search index gets: None when that is exactly the ``content`` column.
    search_text: str | None
    body: str  # the index text itself (also handed to the backend's index upkeep)
    payload: Payload | None
    #: False: ``token_count`` is an estimate (``lcm.tokens.EstimatedTokens``), counted later.
    token_exact: bool = True


@dataclass(frozen=True, slots=True)
class PreparedSystemPrompt:
    """A leading system prompt ready for storage: its lossless text, digest and tokens."""

    text: str  # ``lcm.codec.encode_json`` of the message (Hermes' bookkeeping keys left out)
    digest: str  # sha256 of ``text``: two versions are the same exactly when their texts are
    token_count: int


def prepare_system_prompt(message: Mapping[str, Any], tokens: TokenCounter) -> PreparedSystemPrompt:
    """A system prompt as stored: the message as sent (less ``_db_persisted``), losslessly."""
    text = codec.encode_json(clean_message(message))
    return PreparedSystemPrompt(text, hashlib.sha256(text.encode("utf-8")).hexdigest(),
                                tokens.count_message_text(message_text(message)))


def index_text(message: Mapping[str, Any], recall_ids: Collection[str] = frozenset()) -> str:
    """The text the search index gets for a message: all of it but lcm's own recall traffic
    (``recall_ids``: calls to lcm's tools made earlier in the conversation)."""
    return index_body(searchable_text(message, frozenset(recall_ids)))


def recall_calls(messages: Sequence[Any]) -> frozenset[str]:
    """Ids of the calls to lcm's own tools among these messages: their results are stored but
    never indexed (an lcm_grep must not find the lcm_grep that asked for it)."""
    return recall_call_ids_of(messages)


def compress_payload(text: str) -> Payload:
    raw = text.encode("utf-8")
    return Payload(hashlib.sha256(raw).hexdigest(), zlib.compress(raw, PAYLOAD_LEVEL), len(text))


def decompress_payload(data: bytes) -> str:
    return zlib.decompress(data).decode("utf-8")


def prepare_message(message: Mapping[str, Any], tokens: TokenCounter,
                    recall_ids: Collection[str] = frozenset()) -> PreparedMessage:
    """One message (see :func:`prepare_messages`)."""
    enc = encode_message(message)  # refuses what is not a message; stores it without lcm's recall block
    message = without_recall_blocks(message)  # so what is indexed is what is stored
    body = index_text(message, recall_ids)
    same = enc.content_kind == CONTENT_TEXT and enc.content == body and enc.tool_calls is None
    return PreparedMessage(
        encoded=enc,
        token_count=tokens.count_message_text(enc.text),
        search_text=None if same else body,
        body=body,
        payload=compress_payload(enc.payload) if enc.payload is not None else None,
        token_exact=tokens.exact,
    )


def prepare_messages(messages: Sequence[Mapping[str, Any]], tokens: TokenCounter,
                     recall_call_ids: Collection[str] = ()) -> list[PreparedMessage]:
    """Messages ready for the store. ``recall_call_ids``: calls to lcm's own tools made earlier
    in the conversation (those in ``messages`` are found here); their results are stored but
    not indexed. Raises InvalidMessageError for a message that cannot be stored at all."""
    recall = frozenset(recall_call_ids) | recall_calls(messages)
    return [prepare_message(m, tokens, recall) for m in messages]


def message_identity(previous: str, content_hash: str, uid: str | None) -> str:
    """A message's identity in its session: the host's uid when it gave one, else its content
    hash chained to the identity of the message before it (``previous``; "" at the start), so
    re-sending a transcript matches what is stored while the same text twice is two messages."""
    return uid_identity(uid) if uid else chain_identity(previous, content_hash)


def chain_identities(prepared: Iterable[PreparedMessage], after_identity: str | None) -> list[str]:
    """The identities of a contiguous run of messages following ``after_identity``."""
    out: list[str] = []
    previous = after_identity or ""
    for p in prepared:
        previous = message_identity(previous, p.encoded.content_hash, p.encoded.uid)
        out.append(previous)
    return out


def first_of_each(identities: Sequence[str]) -> list[int]:
    """Indexes of the first occurrence of each identity (a uid repeated in one call is one row)."""
    seen: set[str] = set()
    out = []
    for i, identity in enumerate(identities):
        if identity not in seen:
            seen.add(identity)
            out.append(i)
    return out


def row_time(given: Any, host: float | None, now: float) -> float:
    """The time a message is recorded at: as given (an import restoring an export), else the
    host's ``timestamp`` key, else now."""
    if given is not None:
        if not isinstance(given, (int, float)) or isinstance(given, bool) or given != given:
            raise InvalidMessageError(f"a message time must be Unix seconds, got {given!r}")
        return float(given)
    return host if host is not None else now
