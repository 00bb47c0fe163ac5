"""Auto-recall: before a model call, the stored turns that best match the new user message and
that the context lacks, as one bounded block the host adds to the API copy of that message.

The model gets back what compaction moved out of its prompt without having to think of
``lcm_grep``. The search is ``lcm_grep``'s (``lcm.tools.retrieval.find``: all of the agent's
sessions, words and neighbours, meaning above the floor when embeddings are on); each hit is
quoted verbatim (cut to fit), with its store id, so the model can ``lcm_expand`` it whole.

The block is wrapped in ``<lcm_recall>`` tags (``lcm.messages.RECALL_OPEN``): whatever a host
sends back, lcm strips it before storing (``lcm.messages.clean_message``), so it is never
stored as conversation. In Hermes it rides the ``pre_llm_call`` hook's context, which Hermes
appends to the API copy of the user message and replays byte-identically on later turns: the
cached prompt prefix is untouched.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lcm.context.session import ContextSession
from lcm.messages import RECALL_CLOSE, RECALL_HEADER, content_hash, content_substance, content_text, message_text
from lcm.records import MessageRecord
from lcm.tools.retrieval import find
from lcm.transcript import same_objects_prefix

#: Hits asked of the search; the block takes the best of them that fit. On LoCoMo's dev split
#: (benchmarks/locomo_prompt.py) evidence in the prompt was 0.80 with 8 and a 600-token block,
#: 0.85 with 12 and 800, 0.87 with 16 and 1,000 (210 tokens per turn on average).
CANDIDATES = 16
#: Characters of the user message used as the query (its beginning says what it is about).
QUERY_CHARS = 2_000
#: A quoted turn gets at most this share of the block and this many tokens, so one long turn
#: (a pasted log) cannot fill it alone; its beginning says what it is, lcm_expand has the rest.
MAX_SHARE_PER_HIT = 0.5
MAX_TOKENS_PER_HIT = 250
#: A quoted turn longer than its share at this many characters a token is cut to that length
#: before its tokens are counted, so the tokenizer reads about a share's worth of text, not a
#: whole pasted log: counted whole and then cut, the hits one recall considered came to
#: ~22,000 characters (3 ms of a ~13 ms recall at 100k messages). Prose runs about 4.2
#: characters a token, so a line cut here keeps nearly its share; denser text (code, numbers,
#: CJK) is cut further by the count that follows.
PRECUT_CHARS_PER_TOKEN = 4
#: What a cut line's first try aims under its budget: its ending (`` …`` and the newline, two
#: tokens) and slack for text whose tokens are not spread evenly (its label is denser than
#: prose). Each miss is one more count of the line (about 0.13 ms here); on the proxy
#: benchmark's store the first try fitted in 20% of cuts aiming at the budget, 62% at 3 under
#: it, 87% at 6, 98% at 8: a line gives up at most this many tokens of its share.
CUT_SLACK_TOKENS = 6
#: Whether the search starts with the rows that have every word of the message. The message was
#: stored just before it is recalled (the proxy, a host's turn), so that search always finds
#: at least the message itself, and any other row with every word also leads the any-word
#: search that follows (it has each word's weight). Skipping it: see docs/benchmarks.md.
EVERY_WORD_FIRST = False
#: The newest matches of each word (and pair of words) the recall's any-word search reads
#: (``lcm_grep`` reads 1,000: ``lcm.store.search.ANY_TERM_MATCHES``). A word with more is
#: taken as common: its rows are reached through its pairs with the rarest words, at any age,
#: and a row with that word alone is seen among its newest matches only. A block holds the best
#: 16, which rows with two or more of the message's words lead; on PostgreSQL each match read
#: is a heap page (at 100k messages a word of 900 matches cost ~1.5 ms, ~20 words a recall).
#: Measured (docs/benchmarks.md, ninth session), PostgreSQL recall at 100k messages in process,
#: p50: 14.3-15.1 ms at 1,000, 9.0-10.3 at 300. LoCoMo's dev split, evidence in the prompt
#: (full text / hybrid): PostgreSQL 0.859 / 0.867 at 300-1,000, 0.854 / 0.859 at 250; SQLite
#: 0.856 / 0.867 at 1,000, 0.856 / 0.872 at 100-500.
TERM_MATCHES = 300


@dataclass
class RecallBlock:
    """What auto-recall adds for one user message: ``text`` ("" when nothing), the store ids
    quoted, the block's tokens, and how the search was answered."""

    text: str = ""
    store_ids: list[int] = field(default_factory=list)
    tokens: int = 0
    mode: str = "full_text"
    considered: int = 0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "store_ids": self.store_ids, "tokens": self.tokens, "mode": self.mode,
                "considered": self.considered, **({"reason": self.reason} if self.reason else {})}


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _line(record: MessageRecord, text: str) -> str:
    return f"[store_id={record.store_id} · {_when(record.ts)} · {record.role}] {text}"


def recall_block(context: ContextSession, user_message: Any, *, max_tokens: int,
                 context_messages: Sequence[Mapping[str, Any]] | None = None,
                 held: HeldContext | None = None) -> RecallBlock:
    """The block for ``user_message`` (a message, or its text) within ``max_tokens``.

    Left out: hits already in the context (``context_messages``, the messages the host is about
    to send; without them, the current session's messages not yet summarized, which lcm's
    assembled context holds verbatim) and the user message itself. Nothing is added when
    nothing matches: no shared content word, nothing above the similarity floor. ``held``: the
    conversation's :class:`HeldContext`, kept by the caller between recalls.
    """
    text = (content_text(user_message.get("content")) if isinstance(user_message, Mapping)
            else str(user_message or ""))[:QUERY_CHARS]
    if not text.strip():
        return RecallBlock(reason="the user message has no text")
    # The session's raw messages are in the context and left out anyway: the search does not
    # stop to stem them (PostgreSQL, 1-3 ms a recall). Compacted ones still are stemmed first.
    current = context.current
    found = find(context, text, mode=None, scope="all", session_pk=None, sort="relevance", limit=CANDIDATES,
                 snippets=False, held_session=current.id if current is not None else None,
                 every_word_first=EVERY_WORD_FIRST, term_matches=TERM_MATCHES)
    block = RecallBlock(mode=found.mode, considered=len(found.hits))
    hits = [h for h in found.hits if h.kind == "message"]
    if not hits:
        block.reason = "nothing stored matches it" + (f": {found.notes[-1]}" if found.notes else "")
        return block
    records = {r.store_id: r for r in context.store.messages.get_many([h.id for h in hits], agent=context.agent_id)}
    in_context = _held(context_messages, held)
    asked = {"role": "user", "content": text}
    asked_key, asked_hash = _key(asked), content_hash(asked)
    chosen: list[MessageRecord] = []
    for hit in hits:
        record = records.get(hit.id)
        if record is None or _in_context(record, in_context, context) or _is_asked(record, asked_key, asked_hash):
            continue
        chosen.append(record)
    if not chosen:
        block.reason = "every match is already in the context"
        return block
    return _render(context, chosen, max_tokens, block)


class _Held:
    """The context's messages, for "is this stored message one of them" (by content hash).

    A message is hashed only when a hit has its role and text: hashing every message of a
    long context on every recall cost ~0.6 ms of a ~10 ms SQLite recall. The text is taken as
    :func:`lcm.messages.substance` takes it (recall blocks stripped), so two messages with
    one hash always share a key here."""

    def __init__(self, messages: Sequence[Mapping[str, Any]]):
        self._by_key: dict[tuple[Any, str | None], list[Mapping[str, Any]]] = {}
        for m in messages:
            if isinstance(m, Mapping):
                self._by_key.setdefault(_key(m), []).append(m)

    def holds(self, message: Mapping[str, Any]) -> bool:
        same = self._by_key.get(_key(message))
        if not same:
            return False
        digest = content_hash(message)
        return any(content_hash(m) == digest for m in same)


def _key(message: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The role and the text of a content that is text (a string, or one plain text part: the
    same message, see ``content_substance``); None for any other content and for no text."""
    said = content_substance(message.get("content"))
    return message.get("role"), said if isinstance(said, str) else None


class HeldContext(_Held):
    """A :class:`_Held` kept from one recall to the next of a conversation (``recall_block``'s
    ``held``): a host that sends what it held plus new messages (the same objects: Hermes,
    ``lcm proxy``) has only what changed keyed again. Keying every message of a 140-message
    context cost ~0.6 ms of each proxied recall."""

    def __init__(self) -> None:
        super().__init__(())
        self._messages: list[Mapping[str, Any]] = []
        self._contents: list[Any] = []
        self._keys: list[tuple[Any, str | None] | None] = []

    def update(self, messages: Sequence[Mapping[str, Any]]) -> HeldContext:
        """Now holding ``messages``. What they share with what it held (the same message
        objects with the same content objects: a message edited in place is keyed again) is
        kept; the rest is dropped and the new messages keyed. (The newest user message always
        differs: the proxy sends it with its recall block the next time.)"""
        contents = [m.get("content") if isinstance(m, Mapping) else None for m in messages]
        start = min(same_objects_prefix(self._messages, messages), same_objects_prefix(self._contents, contents))
        for old, key in zip(self._messages[start:], self._keys[start:], strict=True):
            if key is not None:
                same = self._by_key[key]
                del same[next(i for i, m in enumerate(same) if m is old)]  # by identity, not ==
                if not same:
                    del self._by_key[key]
        del self._keys[start:]
        for m in messages[start:]:
            key = _key(m) if isinstance(m, Mapping) else None
            if key is not None:
                self._by_key.setdefault(key, []).append(m)
            self._keys.append(key)
        self._messages, self._contents = list(messages), contents
        return self


def _held(messages: Sequence[Mapping[str, Any]] | None, kept: HeldContext | None) -> _Held | None:
    if messages is None:
        return None
    return kept.update(messages) if kept is not None else _Held(messages)


def _is_asked(record: MessageRecord, asked_key: tuple[Any, str | None], asked_hash: str) -> bool:
    """Whether ``record`` is the user message being asked (by content hash). Its role and text
    are compared first: a message whose key differs has another hash, and hashing each of a
    recall's ~30 hits cost ~0.4 ms."""
    return _key(record.message) == asked_key and content_hash(record.message) == asked_hash


def _in_context(record: MessageRecord, held: _Held | None, context: ContextSession) -> bool:
    if held is not None:
        return held.holds(record.message)
    session = context.session
    return record.session_pk == session.id and record.seq > session.covered_seq


def _render(context: ContextSession, chosen: list[MessageRecord], max_tokens: int,
            block: RecallBlock) -> RecallBlock:
    """The block: a header, one line per hit (best first, each cut to its share), a closing tag;
    lines that no longer fit are left out.

    Each piece is counted with the newline that follows it, and the block's count is their sum:
    exact, because a tokenizer's pieces never run across a newline into a text that starts with
    a non-space character (every line starts with ``[store_id=``, the closing tag with ``<``),
    and no line ends in a space (GPT-2's split joins a trailing space to the newline only at the
    end of a text), so the block splits into the same pieces as its lines do
    (tests/unit/test_recall_block_count.py, on the split of every OpenAI encoding). With the
    character estimate (no tokenizer) the sum is an upper bound. Counting the whole block again
    cost 0.5-0.7 ms a recall."""
    count, remembered = context.tokens.count_text, context.tokens.count_remembered
    header = remembered(RECALL_HEADER + "\n")
    room = max_tokens - header - remembered(RECALL_CLOSE)
    per_hit = max(20, min(MAX_TOKENS_PER_HIT, int(max_tokens * MAX_SHARE_PER_HIT)))
    lines: list[str] = []
    for record in chosen:
        body = " ".join(message_text(record.message).split())
        line = _line(record, body).rstrip()  # no line ends in a space (see above)
        limit = min(per_hit, room)
        if len(line) > limit * PRECUT_CHARS_PER_TOKEN:
            line = line[:limit * PRECUT_CHARS_PER_TOKEN].rstrip() + " …"
        size = remembered(line + "\n")
        if size > limit:
            line, size = _cut(line, limit, size, count)
        if not line or size > room:
            continue
        lines.append(line)
        block.store_ids.append(record.store_id)
        room -= size
        if room < 20:
            break
    if not lines:
        block.reason = "no match fits in LCM_AUTO_RECALL_MAX_TOKENS"
        return block
    block.text = "\n".join([RECALL_HEADER, *lines, RECALL_CLOSE])
    block.tokens = max_tokens - room
    return block


def _cut(line: str, tokens: int, total: int, count: Callable[[str], int]) -> tuple[str, int]:
    """``line`` (``total`` tokens with its newline) cut with an ellipsis to at most ``tokens``
    tokens with its newline, and that size; ("", 0) when not even its label fits. The cut
    starts at the line's length scaled to the budget less ``CUT_SLACK_TOKENS`` and shortens by
    a tenth until it fits: one count in most cuts, where a bisection on characters took a dozen
    (this runs on every request that recalls a long turn)."""
    size = len(line) * max(tokens - CUT_SLACK_TOKENS, 0) // max(total, 1)
    while size > 0:
        cut = line[:size].rstrip()
        counted = count(cut + " …\n")
        if counted <= tokens:  # nothing of the text left after the label: no line
            return (cut + " …", counted) if "] " in cut and not cut.endswith("]") else ("", 0)
        size = size * 9 // 10 - 1
    return "", 0
