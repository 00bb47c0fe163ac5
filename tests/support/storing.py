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


def stored_rows(store: Any, session: Any) -> list[dict[str, Any]]:
    """A session's own stored messages, in order."""
    return [r.message for r in store.messages.get_range(session.id, limit=1_000_000)]


def family_of(store: Any, agent: str, key: str) -> list[Any]:
    """The session ``key`` of ``agent`` and its forks, recursively (the session first)."""
    out, todo = [], [store.sessions.find(agent, key)]
    while todo:
        session = todo.pop()
        out.append(session)
        todo.extend(store.sessions.forks(session.id))
    return out


def lineage_of(store: Any, session: Any, upto: int | None = None) -> list[dict[str, Any]]:
    """A session's conversation: its parent's up to the fork point (a seq of the parent's own),
    then its own messages (up to its own seq ``upto``)."""
    own = stored_rows(store, session)[:upto]
    if session.parent_id is None:
        return own
    return lineage_of(store, store.sessions.get(session.parent_id), session.fork_seq) + own
