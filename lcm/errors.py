"""Exceptions lcm raises. Every message says what happened and what to do about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def first_line(exc: BaseException) -> str:
    """The first line of what an exception (or the driver error under it, ``exc.orig``) says:
    error messages name the cause in one line."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


class LcmError(Exception):
    """Base class for lcm errors."""


class ConfigError(LcmError, ValueError):
    """A setting or URL is invalid."""


class InvalidMessageError(LcmError, ValueError):
    """Something that is not an OpenAI-format message was given to be stored."""


class NotFoundError(LcmError, LookupError):
    """An id does not exist in the caller's scope (or at all: the two are indistinguishable)."""


class SchemaMismatchError(LcmError):
    """The database schema is not the one this lcm version works with."""


class DatabaseUnavailableError(LcmError):
    """The database cannot be reached or opened (wrong URL, server down, bad credentials).

    ``retryable``: the connection dropped before anything was committed (a server restart, a
    pooler restart, a killed backend), so running the same operation again on a new connection
    is safe and likely to work. A drop while the commit was in flight is not retryable: whether
    it landed is unknown, and lcm's next turn reconciles either way (ingest aligns by identity).
    """

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


def retry_dropped(action: Callable[[], T]) -> T:
    """``action()``, run once more when it failed on a dropped connection before any commit.

    Host adapters wrap each turn-level operation (store a turn, compact, run a tool) in this:
    those operations are idempotent (messages are aligned by identity, compaction is planned
    from what is stored), so a second run does exactly what the first would have done.
    """
    try:
        return action()
    except DatabaseUnavailableError as exc:
        if not exc.retryable:
            raise
        return action()


class AccessDeniedError(LcmError):
    """The database role may not do this (on PostgreSQL with per-agent roles: a row of another
    agent, or an agent id that is not the role's own)."""


class IntegrityViolation(LcmError):
    """A write would break a storage invariant (coverage, contiguity, depth); nothing was written."""


class ConcurrentUpdateError(IntegrityViolation):
    """Another writer changed the same rows first (e.g. two engines compacting one session)."""


class StaleViewError(ConcurrentUpdateError):
    """The session changed since the caller last saw it; nothing was written."""
