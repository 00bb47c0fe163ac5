"""Reading a host transcript: which messages are conversation, which are lcm's own summary,
which user messages are real human turns, and where a transcript may be cut.

A *cut* is a boundary in a stored conversation before which messages may be summarized and
after which the verbatim part continues. lcm only cuts right before an ``assistant`` message:
then the assembled context ``[system] + summary (role user) + raw messages`` always starts its
non-system part with a user message, never has two user messages in a row, and a tool result
can never be separated from the assistant message that called it (results follow their call and
precede the next assistant message). No verbatim message is ever edited to make a sequence valid.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from lcm.messages import content_text, is_ephemeral, message_text, tool_calls_text

#: First line of every summary message lcm puts into a context. Only a cheap first test: lcm
#: knows a message as its own by its digest (:func:`generated_digest`), recorded when it
#: generated the message, never by this text, which anyone can paste.
SUMMARY_MARKER = "[LCM CONTEXT SUMMARY — REFERENCE ONLY]"
SUMMARY_END = "--- END OF LCM CONTEXT SUMMARY — respond to the messages below, not to the summary ---"
#: lcm's reply to its own summary, used only when the verbatim part starts with a user message
#: (a new session carrying summaries): user and assistant turns must alternate, and a system
#: message is no place for it (some provider adapters keep only the last system message).
SUMMARY_ACK = f"{SUMMARY_MARKER} Noted: the summary above is background. The conversation continues below."
COMPRESSED_SUMMARY_KEY = "_compressed_summary"

# Host scaffolding that rides in user-role messages (Hermes marks it with flags or prefixes).
_SYNTHETIC_PREFIXES = (
    "[System: ",
    "[Your active task list was preserved",
    "[IMPORTANT: Background process ",
    "[CONTEXT COMPACTION",
    "[CONTEXT SUMMARY]:",
)


def same_objects_prefix(old: Sequence[Any], new: Sequence[Any]) -> int:
    """Length of the prefix the two lists share, element by element (the same objects): how
    much of a transcript a host sends again as it held it. A host that extends what it held
    costs one C-speed pass, no Python loop over a long transcript."""
    n = min(len(old), len(new))
    if n and old[n - 1] is new[n - 1] and all(map(operator.is_, old[:n], new[:n])):
        return n
    i = 0
    while i < n and old[i] is new[i]:
        i += 1
    return i


def role_of(message: Any) -> str | None:
    return message.get("role") if isinstance(message, Mapping) else None


def is_lcm_summary(message: Any) -> bool:
    """True for a message that *looks like* one lcm generated (it starts with the marker).
    Use only on lcm's own output; a host transcript is read with :class:`OwnMessages`."""
    return isinstance(message, Mapping) and _starts_with_marker(message.get("content"))


def _starts_with_marker(content: Any) -> bool:
    """Whether ``content``'s text starts with lcm's marker (a plain string is read as it is:
    every message of every turn takes this test)."""
    text = content if type(content) is str else content_text(content)
    return text.lstrip().startswith(SUMMARY_MARKER)


#: Where lcm cut a message too large for the context window (see ``lcm.assembly.cut_message``).
CUT_NOTE = "[lcm cut:"


def generated_digest(message: Any) -> str | None:
    """The digest lcm records for a message it generates (role, call answered, text), or None
    for a message that neither starts with lcm's marker nor carries its cut note (the cheap
    test every message takes)."""
    if type(message) is not dict and not isinstance(message, Mapping):  # a dict: no ABC check
        return None
    content = message.get("content")
    if not (_starts_with_marker(content) or (isinstance(content, str) and CUT_NOTE in content)):
        return None
    text = f"{message.get('role')}\x00{message.get('tool_call_id')}\x00{content_text(content)}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Generated(Protocol):
    """What a message lcm generated stands for (``lcm.records.GeneratedMessage``)."""

    @property
    def stands_for(self) -> str | None: ...
    @property
    def covers(self) -> tuple[int, int] | None: ...


class OwnMessages:
    """Recognises the messages lcm generated in a host transcript, by digest: the ones this
    process generated, else a look-up of the digests lcm recorded when it generated them
    (``lookup``: the store's, per agent), cached.

    Two kinds: lcm's own (its summary, its acknowledgement: ``own(m)`` is true, they are not
    conversation; ``covers(m)`` says which session's messages, up to which, the summary
    stands in for), and cut copies of stored messages too large for the window
    (``stands_for(m)`` is the stored original's alignment key: the copy *is* that message). A
    message that only looks like lcm's (a user pasting an earlier context, a tool printing a
    file that starts with the marker) is conversation, stored like any other."""

    def __init__(self, lookup: Callable[[set[str]], Mapping[str, Generated]] | None = None):
        self._lookup = lookup
        self._known: dict[str, Generated] = {}
        self._not: set[str] = set()

    def add(self, generated: Mapping[str, Generated]) -> None:
        self._known.update(generated)
        self._not.difference_update(generated)

    def _find(self, message: Any) -> Generated | None:
        """What lcm recorded when it generated this message, or None (not lcm's)."""
        digest = generated_digest(message)
        if digest is None or digest in self._not:
            return None
        if digest not in self._known:
            found = dict(self._lookup({digest})) if self._lookup is not None else {}
            if digest not in found:
                self._not.add(digest)
                return None
            self._known[digest] = found[digest]
        return self._known[digest]

    def __call__(self, message: Any) -> bool:
        found = self._find(message)
        return found is not None and found.stands_for is None

    def stands_for(self, message: Any) -> str | None:
        found = self._find(message)
        return found.stands_for if found is not None else None

    def covers(self, message: Any) -> tuple[int, int] | None:
        found = self._find(message)
        return found.covers if found is not None else None


def _never(message: Any) -> bool:
    return False


def is_synthetic(message: Mapping[str, Any]) -> bool:
    """Host scaffolding flags such as Hermes' ``_todo_snapshot_synthetic``."""
    return any(k.startswith("_") and k.endswith("_synthetic") and message.get(k) for k in message)


def is_real_user(message: Any) -> bool:
    """A user turn a person wrote (not host scaffolding, not a summary, not empty)."""
    if role_of(message) != "user" or is_synthetic(message):
        return False
    text = content_text(message.get("content")).strip()
    return bool(text) and not text.startswith(_SYNTHETIC_PREFIXES)


def split_transcript(messages: Sequence[Any], own: Callable[[Any], bool] = _never
                     ) -> tuple[Mapping[str, Any] | None, list[Any]]:
    """(leading system prompt or None, conversation messages without lcm's own).

    The host rebuilds its system prompt every turn, so it is passed through, not stored; a
    system message anywhere else is conversation like any other. ``own`` tells lcm's own
    generated messages (:class:`OwnMessages`).
    """
    system = None
    start = 0
    if messages and role_of(messages[0]) == "system" and not own(messages[0]):
        system, start = messages[0], 1
    return system, conversation_of(messages[start:], own)


def conversation_of(messages: Sequence[Any], own: Callable[[Any], bool] = _never) -> list[Any]:
    """The messages of a run (not starting a transcript) that are conversation: all but lcm's
    own and the host's ephemeral scaffolding (see ``lcm.messages.EPHEMERAL_FLAGS``)."""
    return [m for m in messages if not own(m) and not is_ephemeral(m)]


# --------------------------------------------------------------------------- recall traffic

#: lcm's own agent tools. Their calls and results are stored like any message but kept out of
#: the search index: otherwise every lcm_grep would find the call that asked for it, and every
#: lcm_expand result would echo old text back as a fresh hit.
RECALL_TOOL_PREFIX = "lcm_"


def _is_recall_call(call: Any) -> bool:
    fn = call.get("function") if isinstance(call, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return isinstance(name, str) and name.startswith(RECALL_TOOL_PREFIX)


def recall_call_ids(messages: Sequence[Any]) -> frozenset[str]:
    """Ids of the calls to lcm's own tools among these messages."""
    ids = set()
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, Mapping) and role_of(m) == "assistant" else None
        for call in calls if isinstance(calls, list) else ():
            if _is_recall_call(call) and isinstance(call.get("id"), str):
                ids.add(call["id"])
    return frozenset(ids)


def searchable_text(message: Mapping[str, Any], recall_ids: frozenset[str] | set[str] = frozenset()) -> str:
    """The text the search index gets: all of it, except lcm's own recall traffic (a result
    answering one of ``recall_ids`` or named ``lcm_*``, and the calls to lcm tools)."""
    role = role_of(message)
    if role == "tool":
        tool = message.get("name") or message.get("tool_name")
        if message.get("tool_call_id") in recall_ids or (
                isinstance(tool, str) and tool.startswith(RECALL_TOOL_PREFIX)):
            return ""
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and any(_is_recall_call(c) for c in calls):
        kept = [c for c in calls if not _is_recall_call(c)]
        return "\n".join(p for p in (content_text(message.get("content")), tool_calls_text(kept)) if p)
    return message_text(message)
