"""A conversation's context session, as the proxy drives it.

Per request: the client's messages are stored (exactly once: the engine's alignment matches a
re-sent history to what is stored, and an edited one becomes a fork) and turned into what the
upstream gets: lcm's assembled context when the conversation outgrew the window's threshold,
else the client's messages themselves; plus the auto-recall block on the new user message.
When the upstream has answered, the answer is stored as the client receives it, so the next
request (which carries it back) adds nothing twice. The lcm tools' own rounds (the model's calls
to lcm tools and their results) are never stored: the client never holds them, and storing
them would make every next request look like an edit of the conversation.

The prompt cache: a user message's recall block is remembered (``RECALLED_PER_CONVERSATION``)
and put on that message again in every later request, byte for byte, so the upstream sees the
same prefix it cached. A proxy restarted loses that memory: one cache miss per conversation.

One lock per conversation (a context session is not shared between threads); conversations
idle the longest are dropped past ``MAX_OPEN`` (their state is in the store; only the recall
memory and the usage counters are lost).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lcm.config import LcmConfig
from lcm.context.ports import StorePorts
from lcm.context.session import ContextSession
from lcm.context.summarize import Route
from lcm.context.summarize.routes import OpenAICompatibleRoute
from lcm.errors import retry_dropped
from lcm.messages import content_hash, has_hints, without_hints
from lcm.proxy.callers import Caller
from lcm.proxy.toolloop import is_lcm_offer
from lcm.proxy.windows import Windows
from lcm.tokens import TokenCounter
from lcm.tools.autorecall import HeldContext, recall_block
from lcm.transcript import same_objects_prefix

#: Conversations kept open at once (least recently used dropped first).
MAX_OPEN = 1_024
#: Recall blocks remembered per conversation (for the user messages still in its prompt).
RECALLED_PER_CONVERSATION = 256
#: The blank line ``with_block`` puts before a block (or the text part it takes), in tokens.
BLOCK_SEPARATOR_TOKENS = 2
#: A recall block takes at most 1/16 of the window (512 tokens of an 8k local model's; the
#: full LCM_AUTO_RECALL_MAX_TOKENS from a 16k window up), and never less than this.
RECALL_SHARE_OF_WINDOW = 16
MIN_RECALL_ROOM = 128
PLATFORM = "proxy"


@dataclass
class Conversation:
    caller: Caller
    context: ContextSession
    model: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The context as auto-recall last saw it, keyed for "is this hit already in it".
    held: HeldContext = field(default_factory=HeldContext)
    #: content hash of a user message → the recall block it was sent with, and its tokens.
    recalled: OrderedDict[str, tuple[str, int]] = field(default_factory=OrderedDict)
    #: The current request's API key, for the summarizer's calls to the same upstream during
    #: it. Memory only, replaced by each request: never stored, never logged.
    api_key: str | None = None
    #: The client's messages of the last request, and the context lcm made of them (the very
    #: objects the context session remembers handing over): see :meth:`Conversations.prepare`.
    client_seen: list[dict[str, Any]] | None = None
    handed: list[dict[str, Any]] | None = None
    #: What the last request's turn was given (its messages and the client's new ones), and
    #: the answer stored after it (the client sends its own copy of it back next time).
    view: list[dict[str, Any]] = field(default_factory=list)
    answer: dict[str, Any] | None = None
    #: The last request's messages before and after their recall blocks were put on.
    sent: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    #: The tokens of the recall block on each message the last request sent (0: none). The
    #: blocks go out again with their messages (the prompt cache), so they are part of the
    #: prompt: the next request's budget counts them (``Conversations.prepare``).
    block_tokens: list[int] = field(default_factory=list)
    #: Whether this request re-sent the last one's messages re-encoded (the same messages in
    #: another form: moved cache marks, see :meth:`Conversations._as_held`).
    reencoded: bool = False


class Conversations:
    """The open conversations of one proxy process over one store."""

    def __init__(self, store: StorePorts, config: LcmConfig, windows: Windows, upstream: str, *,
                 summarize_upstream: bool = True, auto_recall: bool | None = None):
        self.store = store
        self.config = config
        self.windows = windows
        self.upstream = upstream.rstrip("/")
        #: The summarizer calls the upstream (the request's model and key) unless LCM_SUMMARY_*
        #: names another endpoint or LCM_SUMMARIZER says otherwise.
        self.summarize_upstream = summarize_upstream and not config.summary_base_url
        self.auto_recall = config.auto_recall if auto_recall is None else auto_recall
        self._open: OrderedDict[tuple[str, str], Conversation] = OrderedDict()
        self._lock = threading.Lock()
        self._tool_sizes: dict[int | str, int] = {}
        self.tokens = TokenCounter()

    def get(self, caller: Caller, model: str) -> Conversation:
        key = (caller.agent, caller.session_key)
        with self._lock:
            found = self._open.get(key)
            if found is not None:
                self._open.move_to_end(key)
                return found
        made = self._open_conversation(caller, model)
        with self._lock:
            found = self._open.setdefault(key, made)
            self._open.move_to_end(key)
            while len(self._open) > MAX_OPEN:
                self._open.popitem(last=False)
        return found

    def _open_conversation(self, caller: Caller, model: str) -> Conversation:
        context = ContextSession(self.config, self.store, agent_id=caller.agent, model=model,
                                 context_length=self.windows.of(model))
        context.whole_transcripts = True  # a chat client re-sends its conversation from the start
        conversation = Conversation(caller, context, model)
        if self.summarize_upstream:  # the request's model and key, when a summary is due
            def route(asked: str | None) -> Route:
                return OpenAICompatibleRoute(self.upstream, asked or conversation.model, conversation.api_key)
            context.host_route = route
        return conversation

    # ------------------------------------------------------------------ a request

    def prepare(self, caller: Caller, messages: list[dict[str, Any]], model: str, api_key: str | None,
                tools: list[dict[str, Any]] | None = None, *,
                max_output: int = 0) -> tuple[Conversation, list[dict[str, Any]]]:
        """Store the caller's messages in its conversation; that conversation and what the
        upstream gets (see the module). ``tools``: what the upstream is offered (its size is
        part of every prompt). ``max_output``: the tokens the request lets the answer take
        (the window holds them beside the prompt). One call, so a request costs one hop to a
        worker thread here."""
        conversation = self.get(caller, model)
        with conversation.lock:
            # Around the messages: the tools, room for this request's recall block, and the
            # blocks the messages held from the last request carry again.
            overhead = (self._tools_tokens(tools) + (self._recall_room(conversation) if self.auto_recall else 0)
                        + sum(conversation.block_tokens))
            conversation.api_key = api_key
            context = conversation.context
            context.fixed_overhead = overhead
            context.window.reserved_output = max_output
            if model != conversation.model:
                conversation.model = model
                context.set_model(model, self.windows.of(model))
            if context.current is None or context.current.session_key != conversation.caller.session_key:
                retry_dropped(lambda: context.start(conversation.caller.session_key, platform=PLATFORM))
            view = self._as_held(conversation, messages)
            sendable = retry_dropped(lambda: context.turn(view))
            conversation.client_seen, conversation.handed, conversation.view = messages, sendable, view
            return conversation, self._with_recall(conversation, list(sendable), messages)

    @staticmethod
    def _as_held(conversation: Conversation, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The client's messages as a host that holds its context would hand them over.

        A chat client re-sends its whole history; a host like Hermes keeps what lcm handed it
        and appends. When this request's messages start with the last request's, the turn is
        given the context made of those (the same objects) plus the new messages: lcm sees a
        host extending what it was handed, so nothing is re-assembled or re-counted until a
        compaction is due, the upstream's prompt prefix stays byte for byte what it cached, and
        the work per request is bounded by the window, not by the history. Anything else (an
        edited or shorter history) goes to the turn as sent: alignment finds the fork.

        A client that re-encodes what it re-sends (moves its prompt-cache marks, switches a
        content between a string and one text part) sends the same messages in another form:
        compared by substance where they differ, they still extend what was held, and the
        upstream gets each in the client's current form (see :meth:`_with_recall`)."""
        seen, handed = conversation.client_seen, conversation.handed
        conversation.reencoded = False
        if seen is None or handed is None or len(messages) < len(seen):
            return messages
        resent = messages[:len(seen)]
        if resent != seen:
            if not all(a == b or content_hash(a) == content_hash(b) for a, b in zip(resent, seen, strict=True)):
                return messages
            conversation.reencoded = True
        new = messages[len(seen):]
        kept = conversation.answer
        if new and kept is not None and content_hash(new[0]) == content_hash(kept):
            new = [kept, *new[1:]]  # the stored answer itself: the ingest extends what it saw last
        return [*handed, *new]

    def _recall_room(self, conversation: Conversation) -> int:
        """A recall block's size at most: LCM_AUTO_RECALL_MAX_TOKENS, and no more than
        ``RECALL_SHARE_OF_WINDOW`` of the model's window (every block is sent again with its
        message: on a small local model's window, full-size blocks would crowd out the
        conversation)."""
        window = conversation.context.window.context_length
        room = self.config.auto_recall_max_tokens
        return min(room, max(MIN_RECALL_ROOM, window // RECALL_SHARE_OF_WINDOW)) if window else room

    def _tools_tokens(self, tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the tools' definitions as the upstream gets them: lcm's (the same objects
        every request, ``toolloop.LCM_OFFERS``) counted once each, by identity; the client's
        remembered per set, by their rendering. Rendering and hashing every request's tools
        cost 0.15 ms a request."""
        if not tools:
            return 0
        theirs = [t for t in tools if not is_lcm_offer(t)]
        ours = 0
        for tool in tools:
            if is_lcm_offer(tool):
                ours += self._remembered(id(tool), functools.partial(self._count_rendered, [tool]))
        if not theirs:
            return ours
        rendered = _rendered(theirs)
        return ours + self._remembered(hashlib.sha256(rendered.encode()).hexdigest(),
                                       functools.partial(self.tokens.count_text, rendered))

    def _count_rendered(self, tools: list[dict[str, Any]]) -> int:
        return self.tokens.count_text(_rendered(tools))

    def _remembered(self, key: int | str, count: Callable[[], int]) -> int:
        """A tool set's tokens by ``key``, counted once (``_tool_sizes``, bounded)."""
        with self._lock:
            known = self._tool_sizes.get(key)
        if known is None:
            known = count()
            with self._lock:
                if len(self._tool_sizes) > 256:
                    self._tool_sizes.clear()
                self._tool_sizes[key] = known
        return known

    def _with_recall(self, conversation: Conversation, sendable: list[dict[str, Any]],
                     client: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The recall block on the newest user message (when it is the last message: a tool
        round's continuation asks nothing new), and the remembered blocks on earlier ones.
        Each message goes out in the client's form of it (``in_clients_form``).

        The messages the last request also sent (the very objects: a held context) are taken
        as they went out then, so a request costs what is new in it, not its whole history."""
        out = list(sendable)
        last_in, last_out = conversation.sent
        # A client that re-encoded its history: every message in its form of now, each one's
        # remembered recall block put back on below.
        same = 0 if conversation.reencoded else same_objects_prefix(out, last_in)
        out[:same] = last_out[:same]
        tokens = conversation.block_tokens[:same] + [0] * (len(out) - same)
        in_clients_form(out, client, start=same)
        last_user = next((i for i in range(len(out) - 1, -1, -1) if out[i].get("role") == "user"), None)
        for i in range(same, len(out)):
            message = out[i]
            if message.get("role") != "user":
                continue
            digest = content_hash(message)
            kept = conversation.recalled.get(digest)
            if kept is None and i == last_user == len(out) - 1 and self.auto_recall:
                found = recall_block(conversation.context, message, max_tokens=self._recall_room(conversation),
                                     context_messages=out, held=conversation.held)
                conversation.context.last_recall = found.as_dict() | {"text": None}
                kept = conversation.recalled[digest] = (found.text, found.tokens)
                while len(conversation.recalled) > RECALLED_PER_CONVERSATION:
                    conversation.recalled.popitem(last=False)
            if kept is not None and kept[0]:
                out[i] = with_block(message, kept[0])
                tokens[i] = kept[1] + BLOCK_SEPARATOR_TOKENS
        conversation.sent, conversation.block_tokens = (sendable, out), tokens
        return out

    def keep(self, conversation: Conversation, messages: list[dict[str, Any]], answer: dict[str, Any] | None,
             usage: Mapping[str, Any] | None) -> None:
        """Store the answer the client received (after its request's messages), and what the
        upstream said the prompt cost."""
        with conversation.lock:
            context = conversation.context
            if usage:
                context.observe_response(usage)
            if answer is not None:
                # After the turn's own view when it was this request's (bounded by the window),
                # else after the client's messages.
                mine = conversation.client_seen is messages
                held = conversation.view if mine else messages
                retry_dropped(lambda: context.ingest([*held, answer]))
                conversation.answer = answer if mine else None

    def run_locked(self, conversation: Conversation, action: Callable[[ContextSession], Any]) -> Any:
        with conversation.lock:
            return retry_dropped(lambda: action(conversation.context))


def _rendered(tools: list[dict[str, Any]]) -> str:
    """Tool definitions as JSON, keys sorted: what their token count is counted on."""
    return json.dumps(tools, sort_keys=True, separators=(",", ":"))


def in_clients_form(out: list[dict[str, Any]], client: list[dict[str, Any]], *, start: int = 0) -> None:
    """Put each message of ``out`` from ``start`` (lcm's context: stored or held messages) in the
    form the client sends it now, in place, where the forms can differ: a content of parts, a
    provider hint on the message.

    A client that uses prompt caching marks its newest messages with ``cache_control`` (on a
    part, or on a message without text) and moves the marks on every request; lcm stores a
    message as first sent, marks included. Sent back from the store, every message once marked
    would carry its mark again, and a provider refuses more than a few (Anthropic: 4). So a
    message the client still sends goes out as the client sends it now (found by substance, see
    ``lcm.messages.content_substance``) and any other one without its hints."""
    forms: dict[str, dict[str, Any]] | None = None
    theirs: set[int] = set()

    def may_differ(message: Mapping[str, Any]) -> bool:
        return isinstance(message.get("content"), list) or has_hints(message)

    for i in range(start, len(out)):
        message = out[i]
        if not may_differ(message):
            continue
        if forms is None:
            listed = [m for m in client if may_differ(m)]
            forms, theirs = {content_hash(m): m for m in listed}, {id(m) for m in listed}
        if id(message) in theirs:  # the client's own object: already its form
            continue
        now = forms.get(content_hash(message))
        out[i] = now if now is not None else dict(without_hints(message))


def with_block(message: Mapping[str, Any], block: str) -> dict[str, Any]:
    """A copy of the user message with the recall block after its text (lcm strips the block
    from anything sent back, so it is never stored as conversation)."""
    out = copy.copy(dict(message))
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [*content, {"type": "text", "text": block}]
    else:
        out["content"] = f"{content or ''}\n\n{block}"
    return out


def api_key_of(authorization: str | None) -> str | None:
    """The key in an ``Authorization: Bearer <key>`` header (None for anything else)."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None
