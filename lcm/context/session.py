"""``ContextSession``: one conversation's context, host-neutral.

A host adapter (``lcm.hermes`` for Hermes; the command line) binds it to a session
(:meth:`ContextSession.start`) and hands it the live transcript each turn
(:meth:`ContextSession.turn`, in ``lcm.context.turn``): every message is stored exactly once
(``lcm.context.ingest``), the oldest raw messages are compacted into the summary DAG when the
context nears the window (``lcm.context.compactor``), and the context handed back is assembled
from summaries and the verbatim fresh tail (``lcm.context.assembly``). This module binds the
context to a session, makes its parts, stores what the host sends and keeps its outcomes.
It reaches the database only through the storage ports (``lcm.context.ports``), knows no host,
and raises what fails: catching is the adapter's job (a host must never see an exception from
its context engine).

Construction does no I/O: the store opens on first use (``open_store``). Not thread-safe: an
adapter serving several threads holds a lock around every call, as the Hermes adapter does.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lcm.config import LcmConfig
from lcm.context.budget import Window, planning_config
from lcm.context.compactor import Compactor
from lcm.context.embed import BackgroundIndexer, Embedder, embedder_for
from lcm.context.filters import Filters, Rule
from lcm.context.ingest import Ingestor, IngestResult
from lcm.context.ports import StorePorts
from lcm.context.summarize import HostRoute, Summarizer
from lcm.context.turn import RULE_REASON, Turns, worth_keeping
from lcm.context.usage import Usage
from lcm.errors import InvalidMessageError, LcmError, NotFoundError
from lcm.prepare import prepare_system_prompt
from lcm.records import SessionRecord
from lcm.redact import Redactor
from lcm.tokens import TokenCounter
from lcm.transcript import OwnMessages

log = logging.getLogger("lcm")

DEFAULT_SESSION_KEY = "default"
DEFAULT_AGENT = "default"
#: Host-supplied session attributes are cut to what their columns hold.
PLATFORM_CHARS = 64
CONVERSATION_ID_CHARS = 255


@dataclass(frozen=True)
class StartRequest:
    """A session start to make (again, after a failure): the host's key and what it said."""

    session_key: str
    platform: str | None = None
    conversation_id: str | None = None
    continues: str | None = None  # the host key this session continues under a new one


def short(value: Any, limit: int) -> str | None:
    """A host-supplied attribute: a non-blank string cut to ``limit`` characters, else None."""
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()[:limit]


class ContextSession(Turns):
    """A conversation's context over a store: ingest, compact, assemble, hand over."""

    def __init__(self, config: LcmConfig, store: StorePorts | None = None, *,
                 open_store: Callable[[], StorePorts] | None = None,
                 summarizer: Summarizer | None = None, tokens: TokenCounter | None = None,
                 host_route: HostRoute | None = None, agent_id: str | None = None,
                 context_length: int = 0, model: str | None = None,
                 clock: Callable[[], float] = time.time, embedder: Embedder | None = None,
                 background_embedding: bool = True, apply_filters: bool = True):
        if store is None and open_store is None:
            raise ValueError("a ContextSession needs a store or a way to open one (open_store)")
        self.config = config
        self.window = Window.from_config(config, context_length)
        self.model = model
        self.agent_id = agent_id or config.agent_id or DEFAULT_AGENT
        self.usage = Usage()
        #: Contexts handed to the host with something compacted away (the host's count).
        self.compactions = 0
        #: The session this context is bound to (None until a start or first use).
        self.current: SessionRecord | None = None
        self.last_outcome: dict[str, Any] | None = None
        self.last_error: str | None = None
        self.last_recall: dict[str, Any] | None = None  # what auto-recall last added (lcm_status)
        #: Tokens the host adds around the transcript (its tools, its framing), learned from
        #: the prompt sizes it reports.
        self.overhead = 0
        #: Set by a host that knows its overhead exactly (lcm proxy: the tools it adds and the
        #: recall block's room), which then is not learned from the prompt sizes reported: a
        #: proxy's upstream reports the size of lcm's assembled prompt, not of what its client sent.
        self.fixed_overhead: int | None = None
        #: Set by a host whose every transcript is its whole conversation from its first message
        #: (lcm proxy: a chat client re-sends its history on every request): a transcript of
        #: which nothing is stored then opens a fork that shares nothing (an edited first
        #: message), instead of following the stored history (see ``alignment.plan``).
        self.whole_transcripts = False
        self._store = store
        self._open_store = open_store
        self._summarizer = summarizer
        #: The embedder (None: LCM_EMBEDDINGS off), made on first use unless given; its
        #: background indexer embeds what each turn stored.
        self._embedder: Embedder | None = embedder
        self._embedder_made = embedder is not None
        self._indexer: BackgroundIndexer | None = None
        #: Session and message filters (LCM_IGNORE_*/LCM_STATELESS_*), for a host's sessions;
        #: what the bound session's key made of it: stored, ignored, or read-only.
        self.filters: Filters | None = Filters(config) if apply_filters else None
        self.rule: Rule = "store"
        #: Secrets out of every message before it is stored (LCM_SENSITIVE_PATTERNS_ENABLED).
        self.redactor: Redactor | None = (Redactor.of(config.sensitive_patterns)
                                          if config.sensitive_patterns_enabled else None)
        #: False for short-lived processes (the command line), which embed in the foreground
        #: when they are done (``lcm.context.embed.backfill``) instead of leaving a thread behind.
        self.background_embedding = background_embedding
        #: The host's own LLM route for summaries (taken when the summarizer is first made).
        self.host_route = host_route
        self._tokens = tokens
        #: A session start that failed (database locked or down): retried on next use, so the
        #: host's messages never land in another session meanwhile.
        self._pending_start: StartRequest | None = None
        self._own: OwnMessages | None = None
        self._ingestor: Ingestor | None = None
        self._carry_from: int | None = None
        self._stalled_at: int | None = None  # context size at which compaction last found nothing
        self._handed: list[Any] | None = None  # the last context handed to (or kept by) the host
        self._own_counted: tuple[list[Any], int] = ([], 0)
        #: Wall clock (injectable): how long the host has been idle, for the cold-cache rule.
        self.clock = clock
        #: When the host's model last answered (its prompt cache was last touched); None before
        #: the first answer and after a compaction (the next request rewrites the cache anyway).
        self.last_request_at: float | None = None
        #: The compaction trigger when the last turn was handled: a lower one now means the
        #: window shrank, and the next turn compacts down to the new target.
        self._trigger_seen: float | None = None
        #: (session, system prompt) last kept: the next turn's prompt is compared with it.
        self._system_held: tuple[int, dict[str, Any]] | None = None

    def clone(self, *, open_store: Callable[[], StorePorts] | None = None) -> ContextSession:
        """A fresh context for another agent or copy of the host: same settings, store (or
        ``open_store``, the copy's own way to open it), tokenizer and window, none of this one's
        session state."""
        twin = ContextSession(self.config, self._store, open_store=open_store or self._open_store,
                              tokens=self._tokens, host_route=self.host_route,
                              agent_id=self.agent_id, model=self.model, clock=self.clock,
                              embedder=self._embedder, background_embedding=self.background_embedding,
                              apply_filters=self.filters is not None)
        twin.window = copy.copy(self.window)
        return twin

    # ------------------------------------------------------------------ lazily made parts

    @property
    def store(self) -> StorePorts:
        if self._store is None:
            assert self._open_store is not None  # checked in __init__
            self._store = self._open_store()
        return self._store

    @property
    def store_opened(self) -> bool:
        return self._store is not None

    @property
    def tokens(self) -> TokenCounter:
        if self._tokens is None:
            self._tokens = TokenCounter(self.model)
        return self._tokens

    @property
    def summarizer(self) -> Summarizer:
        if self._summarizer is None:
            self._summarizer = Summarizer(self.config, self.tokens, host_route=self.host_route)
        return self._summarizer

    @property
    def embedder(self) -> Embedder | None:
        """What turns text into vectors (LCM_EMBEDDINGS), or None when embeddings are off."""
        if not self._embedder_made:
            self._embedder = embedder_for(self.config)
            self._embedder_made = True
        return self._embedder

    @property
    def indexer(self) -> BackgroundIndexer | None:
        """The background indexer of this agent's vectors (None when embeddings are off)."""
        if self._indexer is None and self.embedder is not None:
            self._indexer = BackgroundIndexer(self.store.vectors, self.embedder, self.agent_id)
        return self._indexer

    def embed_soon(self) -> None:
        """Rows were committed: have the background indexer embed them (never waits)."""
        indexer = self.indexer if self.background_embedding else None
        if indexer is not None:
            indexer.notify()

    @property
    def own_messages(self) -> OwnMessages:
        """Recognises the messages lcm generated (by digest, never by their text)."""
        if self._own is None:
            agent = self.agent_id
            self._own = OwnMessages(lambda digests: self.store.messages.generated(agent, digests))
        return self._own

    @property
    def ingestor(self) -> Ingestor:
        if self._ingestor is None:
            filters, own = self.filters, self.own_messages
            skip = (lambda m: own(m) or filters.ignored_message(m)) if filters is not None and (
                filters.message_patterns) else own
            self._ingestor = Ingestor(self.store, self.tokens, own=skip,
                                      stands_for=self.own_messages.stands_for,
                                      covers=self.own_messages.covers,
                                      redact=self.redactor.messages if self.redactor is not None else None,
                                      whole=self.whole_transcripts)
        return self._ingestor

    @property
    def compactor(self) -> Compactor:
        return Compactor(self.store, self.summarizer, planning_config(self.config, self.window))

    def set_model(self, model: str | None, context_length: int) -> None:
        """The host's model and its window (a model switch, or a smaller window after a
        context-length error)."""
        self.model = model or self.model
        self.window.resize(context_length)

    # ------------------------------------------------------------------ binding to a session

    @property
    def session(self) -> SessionRecord:
        """The bound session. A session start that failed is retried here (and raises again
        while the database is still unavailable): the host's messages never go to another
        session. Bound to ``default`` only when the host never started one."""
        if self.current is None and self._pending_start is not None:
            self._start(self._pending_start)
        if self.current is None and self.rule != "store":
            raise NotFoundError(f"this session is not stored ({RULE_REASON[self.rule]}): search the agent's "
                                "other sessions with session_scope='all'")
        if self.current is None:
            self.current = self.store.sessions.get_or_create(self.agent_id, DEFAULT_SESSION_KEY)
        return self.current

    def start(self, session_key: str | None, *, platform: str | None = None,
              conversation_id: str | None = None, continues: str | None = None) -> SessionRecord | None:
        """Bind to the host's session ``session_key`` (created on first use). ``continues``: the
        host key of the conversation this one continues under a new key (the same session,
        reached by both keys from now on). After :meth:`reset`, the new session starts with the
        previous one's summaries (``LCM_NEW_SESSION_RETAIN_DEPTH``)."""
        self.current = None
        request = StartRequest(str(session_key or DEFAULT_SESSION_KEY), short(platform, PLATFORM_CHARS),
                               short(conversation_id, CONVERSATION_ID_CHARS), continues or None)
        self.rule = self.filters.session_rule(request.session_key, request.platform) if self.filters else "store"
        if self.rule != "store":  # nothing is written for it: not even a session row
            self._pending_start, self._carry_from = None, None
            self.current = (self.store.sessions.find(self.agent_id, request.session_key)
                            if self.rule == "stateless" else None)
            return self.current
        return self._start(request)

    def _start(self, request: StartRequest) -> SessionRecord:
        self._pending_start = request
        sessions = self.store.sessions
        if request.continues is not None:
            found = sessions.find(self.agent_id, request.continues)
            if found is not None:  # the same conversation continues under a new host key
                self.current = sessions.alias(self.agent_id, request.session_key, found.id)
                self._pending_start = None
                return self.current
        session = sessions.get_or_create(self.agent_id, request.session_key, platform=request.platform,
                                         conversation_id=request.conversation_id)
        if self._carry_from is not None and self._carry_from != session.id:
            self._carry(self._carry_from, session)
        self._carry_from = None
        self.current = session
        self._pending_start = None
        return session

    def attach(self, session_key: str) -> SessionRecord:
        """Bind to an existing session of this agent (never creating one): the command line's
        way in. NotFoundError when the agent has no such session."""
        found = self.store.sessions.find(self.agent_id, str(session_key))
        if found is None:
            raise NotFoundError(f"agent {self.agent_id!r} has no session {session_key!r} "
                                "(lcm sessions lists them)")
        self.current, self._handed = found, None
        return found

    def reset(self) -> None:
        """The host starts a new conversation (/new): the next session carries this one's
        summaries; nothing about this one is kept in memory."""
        self._pending_start = None
        if self.current is not None:
            self._carry_from = self.current.id
            if self._ingestor is not None:
                self._ingestor.forget(self.current.id)
        self.current = None
        self.last_outcome = None
        self._handed = None
        self.usage = Usage()
        self.last_request_at = None
        self.compactions = 0

    def _carry(self, from_pk: int, to: SessionRecord) -> None:
        """/new: the next session starts with the old one's summaries of depth >= retain depth."""
        depth = self.config.new_session_retain_depth
        if depth == 0:
            return
        summaries = self.store.summaries
        nodes = summaries.carried(from_pk) + summaries.uncondensed(from_pk)
        keep = [n for n in nodes if depth < 0 or n.depth >= depth]
        if keep:
            summaries.carry(to.id, [n.id for n in keep])
            log.info("lcm: carried %d summaries into the new session %s", len(keep), to.session_key)

    def carry_over(self, old_key: str, new_key: str) -> None:
        """Carry the summaries of the agent's session ``old_key`` into ``new_key`` (a host's
        explicit /new with carry-over)."""
        old = self.store.sessions.find(self.agent_id, str(old_key))
        new = self.store.sessions.find(self.agent_id, str(new_key))
        if old is not None and new is not None and old.id != new.id:
            self._carry(old.id, new)

    def find(self, session_key: str) -> SessionRecord | None:
        """The agent's session with this host key (or alias), or None."""
        if self.current is not None and session_key in self.store.sessions.keys(self.current.id):
            return self.current
        return self.store.sessions.find(self.agent_id, str(session_key)) if session_key else None

    # ------------------------------------------------------------------ storing what the host sends

    def ingest(self, messages: Sequence[Any]) -> IngestResult | None:
        """Store the host's transcript (each message exactly once) in the bound session, and its
        leading system prompt once per version (None: the session is filtered, nothing stored)."""
        if self.rule != "store":
            return None
        return self._ingest_bound(messages)

    def _ingest_bound(self, messages: Sequence[Any]) -> IngestResult:
        result = self.ingestor.ingest(self.session.id, messages)
        self.current = result.session
        self._keep_system(result)
        if result.added:
            self.embed_soon()
        return result

    def ingest_into(self, session: SessionRecord, messages: Sequence[Any]) -> IngestResult:
        """Store a transcript in another session of the agent (one the host says has ended)."""
        result = self.ingestor.ingest(session.id, messages)
        self._keep_system(result)
        if result.added:
            self.embed_soon()
        return result

    def keep_system_prompt(self, system: Mapping[str, Any]) -> None:
        """The host's system prompt, sent apart from its transcript (Hermes builds each
        request's system message itself and hands ``compress()`` the conversation only): kept
        as the version in force from the next message stored on."""
        if self.rule != "store":
            return
        session = self.session
        self._keep(session.id, system, lambda: self.store.sessions.get(session.id).last_seq + 1)

    def _keep_system(self, result: IngestResult) -> None:
        """The transcript's leading system prompt, in force from the first message it came with."""
        if result.system is not None:
            session = result.session
            self._keep(session.id, result.system, lambda: session.last_seq - result.added + 1)

    def _keep(self, session_pk: int, system: Mapping[str, Any], first_seq: Callable[[], int]) -> None:
        """Keep a system prompt when this session has not seen this version: compared with the
        last one seen first (most turns send the same prompt), so the digest is computed, and
        the store asked, only when it changed."""
        held = self._system_held
        if held is not None and held[0] == session_pk and held[1] == system:
            return
        try:
            kept = self.redactor.message(system) if self.redactor is not None else system
            prompt = prepare_system_prompt(kept, self.tokens)
        except (ValueError, InvalidMessageError) as exc:  # not storable: the turn goes on
            log.warning("lcm: the system prompt cannot be stored: %s", exc)
            return
        self.store.sessions.keep_system_prompt(session_pk, prompt, first_seq=first_seq())
        self._system_held = (session_pk, copy.deepcopy(dict(system)))

    def observe_response(self, usage: Mapping[str, Any]) -> None:
        """The host's model answered: its token counts and cache counters, and the time (the
        provider's prompt cache was touched now)."""
        self.usage.update(usage)
        if self.usage.prompt_tokens > 0:
            self.last_request_at = self.clock()

    # ------------------------------------------------------------------ outcomes and failures

    def record(self, outcome: dict[str, Any]) -> None:
        """Keep the outcome for status, and with the session when it says something."""
        self.last_outcome = outcome
        if not worth_keeping(outcome) or self.current is None or self.rule != "store":
            return
        try:
            self.store.sessions.record_compaction(self.current.id, outcome)
        except Exception as exc:  # noqa: BLE001 - the outcome is kept in memory all the same
            self.note_failure("record_compaction", exc)

    def note_failure(self, where: str, exc: BaseException) -> None:
        """Remember (for status) and log what failed; an lcm error is a warning, anything else
        an error with its traceback."""
        self.last_error = f"{where}: {type(exc).__name__}: {exc}"
        level = logging.WARNING if isinstance(exc, LcmError) else logging.ERROR
        log.log(level, "lcm %s failed: %s", where, exc, exc_info=not isinstance(exc, LcmError))
