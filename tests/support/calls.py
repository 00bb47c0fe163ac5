"""Counting repository calls: every public method of a store's five repositories (and of the
conversation writer ``sessions.family`` yields), recorded as ``"aggregate.method"`` in call
order. Works on ``lcm.store.Store`` and on the in-memory store alike: it wraps the instance."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

AGGREGATES = ("sessions", "messages", "summaries", "search", "health")


def _wrap(target: Any, prefix: str, calls: list[str]) -> None:
    for name in dir(target):
        if name.startswith("_"):
            continue
        method = getattr(target, name)
        if not callable(method):
            continue

        def counted(*args: Any, __method: Callable[..., Any] = method, __name: str = name, **kwargs: Any) -> Any:
            calls.append(f"{prefix}.{__name}")
            return __method(*args, **kwargs)

        setattr(target, name, functools.wraps(method)(counted))


def count_calls(store: Any) -> list[str]:
    """Start recording ``store``'s repository calls; the returned list fills as they happen."""
    calls: list[str] = []
    for aggregate in AGGREGATES:
        _wrap(getattr(store, aggregate), aggregate, calls)
    sessions = store.sessions
    family = sessions.family  # already counting

    @contextmanager
    def counted_family(session_pk: int) -> Iterator[Any]:
        with family(session_pk) as writer:
            _wrap(writer, "family", calls)
            yield writer

    sessions.family = counted_family
    return calls
