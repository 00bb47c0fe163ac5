"""The context-size model: how large a context is, when to compact and what to aim for.

Pure. A session's assembled size is predicted from its counters (no database read, no
rendering): the host's overhead (its tools and anything else it adds), the system prompt, the
raw messages not yet under a leaf, and the summary message (its framing plus the summaries).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lcm.config import LcmConfig
from lcm.records import SessionRecord

#: No window known: compact only when forced.
NO_TARGET = float("inf")
#: With no fixed fresh-tail cap, the tail may take at most this share of the compaction target.
TAIL_SHARE_OF_TARGET = 0.5
#: Estimated framing cost in the summary message: per node (its tag line) and once (marker,
#: preamble, end line). Used to predict a context's size without rendering it.
NODE_FRAMING_TOKENS = 40
SUMMARY_FRAMING_TOKENS = 160


def summary_message_cost(count: int, tokens: int) -> int:
    """Estimated tokens of a summary message holding ``count`` nodes of ``tokens`` in all."""
    if count <= 0:
        return 0
    return SUMMARY_FRAMING_TOKENS + tokens + count * NODE_FRAMING_TOKENS


def added_framing(has_nodes: bool) -> int:
    """What one more summary adds to the context besides its own text."""
    return NODE_FRAMING_TOKENS + (0 if has_nodes else SUMMARY_FRAMING_TOKENS)


@dataclass
class Window:
    """The model's window and lcm's limits inside it. Mutable: a host changes model (and
    Hermes sets ``threshold_tokens`` and ``threshold_percent`` on the engine directly).

    Hysteresis: a compaction starts at the *trigger* (the threshold, or the assembly cap when
    lower) and brings the context down to the *target* (LCM_COMPACTION_TARGET of the window), so
    that many turns go by, each only appending to the prompt, before the next one."""

    threshold_percent: float
    #: LCM_COMPACTION_TARGET / LCM_CONTEXT_THRESHOLD: where a compaction ends relative to where
    #: it starts (kept when the host moves the threshold, so the hysteresis moves with it).
    target_ratio: float = 1.0
    max_assembly_tokens: int = 0  # LCM_MAX_ASSEMBLY_TOKENS; 0: the context window
    context_length: int = 0
    threshold_tokens: int = 0
    #: Tokens the next answer may take, which the window holds beside the prompt (lcm proxy: a
    #: request's ``max_completion_tokens`` / ``max_tokens``): the prompt is capped at the rest,
    #: at most half the window (a request asking for more gets half for its prompt).
    reserved_output: int = 0

    @classmethod
    def from_config(cls, config: LcmConfig, context_length: int = 0) -> Window:
        ratio = config.target_fraction / config.context_threshold if config.context_threshold > 0 else 1.0
        window = cls(config.context_threshold, min(1.0, ratio), config.max_assembly_tokens)
        window.resize(context_length)
        return window

    def resize(self, context_length: int) -> None:
        self.context_length = int(context_length or 0)
        self.threshold_tokens = int(self.context_length * self.threshold_percent)

    @property
    def assembly_cap(self) -> int:
        """The hard cap on the assembled prompt (LCM_MAX_ASSEMBLY_TOKENS, else the window), less
        the room the answer is to have (``reserved_output``)."""
        cap = self.max_assembly_tokens or self.context_length
        if self.reserved_output > 0 and self.context_length > 0:
            room = self.context_length - min(self.reserved_output, self.context_length // 2)
            cap = min(cap, room) if cap else room
        return cap

    @property
    def trigger(self) -> float:
        """Where a compaction starts: the threshold, or the assembly cap when that is lower."""
        limits = [t for t in (self.threshold_tokens, self.assembly_cap) if t > 0]
        return min(limits) if limits else NO_TARGET

    @property
    def target(self) -> float:
        """Where a compaction, once started, brings the context: the trigger times
        target/threshold (LCM_COMPACTION_TARGET of the window at the configured threshold; a
        threshold the host moves, or a lower assembly cap, moves it along)."""
        trigger = self.trigger
        return trigger if trigger == NO_TARGET else trigger * self.target_ratio

    @property
    def target_tokens(self) -> int | None:
        """:attr:`target` as a token count for people (None while no window is known)."""
        target = self.target
        return None if target == NO_TARGET else int(target)

    def under_pressure(self, tokens: int) -> bool:
        """The threshold or the assembly cap is reached."""
        cap = self.assembly_cap
        return (self.threshold_tokens > 0 and tokens >= self.threshold_tokens) or (cap > 0 and tokens >= cap)


def planning_config(config: LcmConfig, window: Window) -> LcmConfig:
    """The settings compaction plans with. With no fixed fresh-tail cap
    (``LCM_FRESH_TAIL_MAX_TOKENS=0``) the tail still yields to the window: it may take at most
    half of the compaction target, or a count-based tail of huge turns would protect the whole
    window and no compaction could ever make room (the newest user turn always stays)."""
    if config.fresh_tail_max_tokens or not window.context_length or window.target == NO_TARGET:
        return config
    return replace(config, fresh_tail_max_tokens=max(1, int(window.target * TAIL_SHARE_OF_TARGET)))


def context_estimate(overhead: int, system_tokens: int) -> Callable[[SessionRecord], int]:
    """The context size a session state would assemble to (no database reads)."""
    def estimate(session: SessionRecord) -> int:
        return (overhead + system_tokens + session.raw_tokens
                + summary_message_cost(session.summary_count, session.summary_tokens))
    return estimate
