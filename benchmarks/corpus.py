"""A deterministic corpus of agent transcripts with a realistic vocabulary.

Words follow a Zipf distribution over ``VOCABULARY`` pseudo-words (so common words are very
common and rare ones rare, as in real text), turns carry tool calls and tool results of
realistic sizes, and every ``NEEDLE_EVERY``-th message carries a unique needle token whose
position is known, so recall can be checked exactly. Same seed, same corpus, on any machine.
"""

from __future__ import annotations

import bisect
import itertools
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

VOCABULARY = 30_000
ZIPF_S = 1.07
NEEDLE_EVERY = 97
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qui", "dra", "mon",
              "tel", "ber", "gos", "fin", "hul", "jex", "wam"]


def _words(n: int, rng: random.Random) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


@dataclass
class Corpus:
    seed: int = 7
    vocabulary: int = VOCABULARY
    words: list[str] = field(init=False)
    _cum: list[float] = field(init=False)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.words = _words(self.vocabulary, rng)
        weights = [1.0 / (rank ** ZIPF_S) for rank in range(1, self.vocabulary + 1)]
        self._cum = list(itertools.accumulate(weights))

    def word_at_rank(self, rank: int) -> str:
        """The word of a given frequency rank (1 = most common)."""
        return self.words[rank - 1]

    def _sentence(self, rng: random.Random, n: int) -> str:
        total = self._cum[-1]
        picks = [self.words[bisect.bisect_left(self._cum, rng.random() * total)] for _ in range(n)]
        return " ".join(picks)

    @staticmethod
    def needle(index: int) -> str:
        return f"needle{index:07d}zq"

    def turns(self, count: int, *, session: str = "s", start: int = 0) -> Iterator[list[dict]]:
        """``count`` turns of 4 messages (user, assistant tool call, tool result, answer)."""
        rng = random.Random(f"{self.seed}:{session}:{start}")
        for t in range(start, start + count):
            call = f"call_{session}_{t}"
            turn = [
                {"role": "user", "content": self._sentence(rng, rng.randint(8, 40))},
                {"role": "assistant", "content": self._sentence(rng, rng.randint(5, 25)),
                 "tool_calls": [{"id": call, "type": "function", "function": {
                     "name": rng.choice(["shell", "read_file", "grep", "write_file"]),
                     "arguments": '{"arg": "%s"}' % self._sentence(rng, rng.randint(2, 8))}}]},
                {"role": "tool", "tool_call_id": call,
                 "content": self._sentence(rng, rng.randint(40, 400))},
                {"role": "assistant", "content": self._sentence(rng, rng.randint(20, 120))},
            ]
            yield turn

    def needle_positions(self, messages: int) -> list[int]:
        return list(range(0, messages, NEEDLE_EVERY))


def plant_needles(turn: list[dict], first_index: int) -> list[int]:
    """Put a needle into each message of the turn whose global index is a needle position."""
    planted = []
    for offset, msg in enumerate(turn):
        index = first_index + offset
        if index % NEEDLE_EVERY == 0 and isinstance(msg.get("content"), str):
            msg["content"] += " " + Corpus.needle(index)
            planted.append(index)
    return planted


class FastCorpus(Corpus):
    """The same vocabulary, Zipf law and turn shape as ``Corpus``, drawn with numpy: about 30x
    faster, for the ten-million-message benchmark, where drawing every word with ``random``
    would take longer than storing it. Deterministic per (seed, session, start) as well, but
    not the same text as ``Corpus`` for the same arguments."""

    def __post_init__(self) -> None:
        super().__post_init__()
        import numpy as np

        self._np = np
        self._words = np.array(self.words, dtype=object)
        self._cum_np = np.array(self._cum)

    def turns(self, count: int, *, session: str = "s", start: int = 0) -> Iterator[list[dict]]:
        np = self._np
        rng = np.random.default_rng(zlib.crc32(f"{self.seed}:{session}:{start}".encode()))
        # Word counts per message, as Corpus draws them: user, assistant, arguments, tool, answer.
        bounds = np.array([[8, 40], [5, 25], [2, 8], [40, 400], [20, 120]])
        lengths = rng.integers(bounds[:, 0], bounds[:, 1] + 1, size=(count, 5))
        picks = self._words[np.searchsorted(self._cum_np, rng.random(int(lengths.sum())) * self._cum[-1])]
        tools = rng.integers(0, 4, size=count)
        at = 0
        for k in range(count):
            parts = []
            for n in lengths[k]:
                parts.append(" ".join(picks[at:at + n]))
                at += n
            t = start + k
            call = f"call_{session}_{t}"
            yield [
                {"role": "user", "content": parts[0]},
                {"role": "assistant", "content": parts[1],
                 "tool_calls": [{"id": call, "type": "function", "function": {
                     "name": ("shell", "read_file", "grep", "write_file")[tools[k]],
                     "arguments": '{"arg": "%s"}' % parts[2]}}]},
                {"role": "tool", "tool_call_id": call, "content": parts[3]},
                {"role": "assistant", "content": parts[4]},
            ]
