"""Plain records the store returns and accepts.

Nothing outside ``lcm.store`` sees SQLAlchemy rows or sessions: the rest of lcm works with these
immutable values, which keeps it unaware of the backend and lets the engine core run over any
implementation of its storage ports (``lcm.context.ports``), an in-memory one included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

CheckStatus = Literal["ok", "warn", "fail"]
SortMode = Literal["recency", "relevance", "hybrid"]
SORT_MODES: tuple[SortMode, ...] = ("recency", "relevance", "hybrid")
MatchKind = Literal["all", "any", "semantic", "neighbour"]
SearchMode = Literal["full_text", "semantic", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = ("full_text", "semantic", "hybrid")


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: int
    agent: str
    agent_pk: int
    session_key: str
    platform: str | None
    conversation_id: str | None
    created_at: float
    updated_at: float
    last_seq: int
    message_count: int
    token_count: int
    covered_seq: int
    covered_tokens: int
    host_view_seq: int = 0
    last_compaction: dict[str, Any] | None = None
    summary_count: int = 0  # uncondensed + carried summaries: what the context shows
    summary_tokens: int = 0
    parent_id: int | None = None  # a fork's parent session (its internal id)
    fork_seq: int | None = None  # the parent's last message the fork shares
    skipped_count: int = 0  # messages of this session that could not be stored at all
    #: Where an imported session came from (JSON: format, path, id in that store); None when
    #: lcm recorded it live.
    origin: dict[str, Any] | None = None
    #: The first seq whose token count may still be an estimate (None: all exact); see
    #: ``MessageRepository.settle_tokens``.
    estimated_from: int | None = None

    @property
    def raw_tokens(self) -> int:
        """Tokens of the messages not yet covered by a leaf summary."""
        return self.token_count - self.covered_tokens


@dataclass(frozen=True, slots=True)
class MessageMeta:
    """A stored message without its body: what alignment and planning need."""

    store_id: int
    seq: int
    identity: str
    content_hash: str
    role: str
    token_count: int
    ts: float
    tool_call_id: str | None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A stored message with its exact original body."""

    store_id: int
    session_pk: int
    session_key: str
    seq: int
    role: str
    ts: float
    token_count: int
    message: dict[str, Any]
    problem: tuple[str, ...] = ()  # what lcm changed to store the message (usually nothing)
    identity: str = ""  # the message's identity in its session (see ``lcm.prepare``)

    def to_item(self) -> dict[str, Any]:
        """The contract's message item (``stored_with_changes`` only when lcm changed it)."""
        item = {
            "store_id": self.store_id,
            "session_id": self.session_key,
            "seq": self.seq,
            "timestamp": self.ts,
            "token_count": self.token_count,
            "message": self.message,
        }
        if self.problem:
            item["stored_with_changes"] = list(self.problem)
        return item


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did: each input message's stored id, and whether it was new."""

    session: SessionRecord
    store_ids: tuple[int, ...]
    new_flags: tuple[bool, ...]
    last_identity: str
    token_counts: tuple[int, ...] = ()  # lcm's token count of each input message

    @property
    def inserted(self) -> int:
        return sum(self.new_flags)

    @property
    def skipped(self) -> int:
        return len(self.new_flags) - self.inserted


@dataclass(frozen=True, slots=True)
class GeneratedMessage:
    """What a message lcm generated for a context stands for, so that the host sending it back
    tells lcm something (recorded by digest, ``MessagePort.remember_generated``).

    A cut copy of a stored message too large for the window *is* that message
    (``stands_for``: the original's alignment key). lcm's summary message stands in for a
    session's messages up to ``through_seq`` (``session_pk``): the host's next conversation
    message after it is that session's message ``through_seq + 1``. lcm's acknowledgement of
    its own summary stands for nothing."""

    stands_for: str | None = None
    session_pk: int | None = None
    through_seq: int | None = None

    @property
    def covers(self) -> tuple[int, int] | None:
        """(session pk, last seq) a summary message stands in for, else None."""
        if self.session_pk is None or self.through_seq is None:
            return None
        return self.session_pk, self.through_seq


@dataclass(frozen=True, slots=True)
class SystemPromptRecord:
    """A version of a session's leading system prompt (kept once per session, by digest)."""

    id: int
    session_pk: int
    digest: str
    message: dict[str, Any]
    token_count: int
    first_seq: int  # seq of the first message it preceded
    created_at: float


@dataclass(frozen=True, slots=True)
class NewSummary:
    """A summary to write: ``source_ids`` are message store ids (depth 0) or node ids."""

    depth: int
    content: str
    token_count: int
    source_ids: tuple[int, ...]
    kind: str
    expand_hint: str = ""
    model: str | None = None
    meta: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SummaryRecord:
    id: int
    session_pk: int
    depth: int
    content: str
    token_count: int
    source_token_count: int
    source_count: int
    first_seq: int
    last_seq: int
    earliest_at: float
    latest_at: float
    expand_hint: str
    kind: str
    model: str | None
    parent_id: int | None
    meta: dict[str, Any] | None
    created_at: float

    @property
    def source_type(self) -> str:
        return "messages" if self.depth == 0 else "nodes"


@dataclass(frozen=True, slots=True)
class WrittenSummary:
    """A summary just written, and its session as the same transaction left it (coverage and
    summary counters moved): a compaction goes on from these without reading again."""

    node: SummaryRecord
    session: SessionRecord


@dataclass(frozen=True, slots=True)
class CompactionView:
    """What planning a compaction pass needs, read at once: the session (with its counters),
    its uncondensed summaries (highest depth first, then oldest) and the carried ones."""

    session: SessionRecord
    uncondensed: tuple[SummaryRecord, ...]
    carried: tuple[SummaryRecord, ...]

    @property
    def nodes(self) -> tuple[SummaryRecord, ...]:
        """The summaries an assembled context shows, in order: carried, then uncondensed."""
        return self.carried + self.uncondensed


@dataclass(frozen=True, slots=True)
class DepthStats:
    depth: int
    count: int
    uncondensed: int
    tokens: int


@dataclass(frozen=True, slots=True)
class SearchHit:
    kind: Literal["message", "summary"]
    id: int  # store id for messages, node id for summaries
    session_pk: int
    session_key: str
    ts: float
    snippet: str
    score: float | None = None  # higher is better; only for relevance/hybrid sorts
    role: str | None = None
    depth: int | None = None
    #: How it matched: every word of the query ("all"), some of its content words ("any"), by
    #: meaning ("semantic"), or next to such hits in its session ("neighbour").
    match: MatchKind = "all"


@dataclass(frozen=True, slots=True)
class SettledTokens:
    """What ``MessageRepository.settle_tokens`` counted: the exact count of each message that
    had an estimate, by store id, and the session as it now is (None: nothing was estimated)."""

    counts: dict[int, int] = field(default_factory=dict)
    session: SessionRecord | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: list[SearchHit]
    #: True when more rows matched than were considered for ranking or filtering, so a
    #: relevance order or a filtered result covers only the newest candidates.
    candidates_clamped: bool = False
    notes: tuple[str, ...] = field(default=())
    #: Newest messages stored but not yet caught up by the index, on a store that could not
    #: catch them up (read-only, e.g. ``lcm ui``): SQLite did not search them, PostgreSQL only
    #: by their exact words (not stemmed yet); 0 normally.
    unindexed: int = 0
    #: What that means on this backend, in words (``Backend.unindexed_note``; also in ``notes``).
    unindexed_note: str = ""
    #: When asked for (``SearchRepository.messages``' ``neighbours``): each any-word hit's id
    #: with the messages just before and after it in its session, as ``adjacent_messages``
    #: gives them (read with the hits, in the same statement).
    adjacent: dict[int, tuple[SearchHit | None, SearchHit | None]] | None = None


class Candidate(NamedTuple):
    """A search match before its row is loaded: id and (for ranked sorts) score.

    A tuple, not a frozen dataclass: one auto-recall at 100k messages makes about 10,000 of
    them (each word's newest matches), and a frozen dataclass costs twice as much to build."""

    id: int
    score: float | None = None


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    status: CheckStatus
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class EmbedItem:
    """A message or summary waiting for its vector: its scope and the text to embed."""

    kind: Literal["message", "summary"]
    id: int
    agent_pk: int
    session_pk: int
    role: str | None
    ts: float
    text: str


@dataclass(frozen=True, slots=True)
class VectorCoverage:
    """How much of a store (or of one agent) has vectors of ``model``."""

    model: str | None
    messages: int
    messages_embedded: int
    summaries: int
    summaries_embedded: int
    #: Vectors of other models (an earlier embedder), by model: never searched.
    other_models: dict[str, int]

    @property
    def pending(self) -> int:
        return self.messages - self.messages_embedded + self.summaries - self.summaries_embedded

    @property
    def share(self) -> float:
        total = self.messages + self.summaries
        return round((self.messages_embedded + self.summaries_embedded) / total, 4) if total else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "messages": self.messages, "messages_embedded": self.messages_embedded,
                "summaries": self.summaries, "summaries_embedded": self.summaries_embedded,
                "pending": self.pending, "coverage": self.share, "other_models": dict(self.other_models)}
