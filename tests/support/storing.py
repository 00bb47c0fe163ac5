"""Writing plain messages into a store the way ingest does (prepared, then appended): for tests
that build a stored history directly, without an engine."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from lcm.prepare import prepare_messages
from lcm.records import AppendResult
from lcm.tokens import TokenCounter

_TOKENS = TokenCounter()


def append_messages(store: Any, session_pk: int, messages: Sequence[Mapping[str, Any]], *,
                    recall_call_ids: Collection[str] = (), **options: Any) -> AppendResult:
    """``store.messages.append`` of ``messages`` prepared with lcm's default tokenizer."""
    prepared = prepare_messages(messages, _TOKENS, recall_call_ids)
    return store.messages.append(session_pk, prepared, **options)
