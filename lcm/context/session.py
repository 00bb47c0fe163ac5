"""``ContextSession``: one conversation's context, host-neutral.

A host adapter (``lcm.hermes`` for Hermes; the command line) binds it to a session
(:meth:`ContextSession.start`) and hands it the live transcript each turn
(:meth:`ContextSession.turn`): every message is stored exactly once (``lcm.context.ingest``),
the oldest raw messages are compacted into the summary DAG when the context nears the window
(``lcm.context.compactor``), and the context handed back is assembled from summaries and the
verbatim fresh tail (``lcm.context.assembly``). It reaches the database only through the
storage ports (``lcm.context.ports``), knows no host, and raises what fails: catching is the
adapter's job (a host must never see an exception from its context engine).

Construction does no I/O: the store opens on first use (``open_store``). Not thread-safe: an
adapter serving several threads holds a lock around every call, as the Hermes adapter does.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lcm.config import LcmConfig
from lcm.context.assembly import Assembly, LeftOut, assemble, load_raw
from lcm.context.budget import NO_TARGET, Window, context_estimate, planning_config
from lcm.context.compactor import CompactionResult, Compactor
from lcm.context.embed import BackgroundIndexer, Embedder, embedder_for
from lcm.context.filters import Filters, Rule
from lcm.context.ingest import Ingestor, IngestResult, message_key, with_exact_counts
from lcm.context.lineage import inherited, inherited_records
from lcm.context.planning import TailPlan, condensable, tail_start_index
from lcm.context.ports import StorePorts
from lcm.context.summarize import HostRoute, Summarizer
from lcm.context.until import view_until
from lcm.errors import InvalidMessageError, LcmError, NotFoundError
from lcm.messages import content_hash, message_text
from lcm.prepare import prepare_system_prompt
from lcm.records import CompactionView, GeneratedMessage, SessionRecord, SettledTokens
from lcm.redact import Redactor
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE, TokenCounter
from lcm.transcript import OwnMessages, generated_digest, is_real_user, role_of, split_transcript

#: How far below every compaction cause lcm's estimate of a turn must be for its exact token
#: counts to wait (``_counts_can_wait``): characters / 4 undercounts code and JSON by about a
#: quarter; the host's own measure of its context, required too, is exact.
ESTIMATE_MARGIN = 1.5

log = logging.getLogger("lcm")

DEFAULT_SESSION_KEY = "default"
#: Why a filtered session is not stored (see ``lcm.context.filters``).
_RULE_REASON = {"ignore": "LCM_IGNORE_SESSION_PATTERNS matches it",
                "stateless": "LCM_STATELESS_SESSION_PATTERNS makes it read-only"}
DEFAULT_AGENT = "default"
#: Host-supplied session attributes are cut to what their columns hold.
PLATFORM_CHARS = 64
CONVERSATION_ID_CHARS = 255


def _count(usage: Mapping[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` the usage reports as a number (nested ``a.b`` keys allowed)."""
    for key in keys:
        value: Any = usage
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


@dataclass
class Usage:
    """What the host's model reported for its last call (``-1``: unknown since a compaction),
    and the running prompt-cache figures of every call reported so far.

    Reads the shapes providers and hosts report: OpenAI's ``prompt_tokens`` with
    ``prompt_tokens_details.cached_tokens`` (and the Responses API's ``input_tokens_details``),
    Anthropic's ``input_tokens`` beside ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (which ``input_tokens`` does not include), and Hermes'
    normalized ``cache_read_tokens`` / ``cache_write_tokens``."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    #: Running totals since the session started: requests reported, their prompt tokens, and
    #: the prompt tokens the provider said it read from (and wrote to) its cache.
    requests: int = 0
    requests_with_cache: int = 0  # requests that reported a cache counter at all
    prompt_total: int = 0
    cache_read_total: int = 0
    cache_write_total: int = 0

    def update(self, usage: Mapping[str, Any]) -> None:
        read = _count(usage, "cache_read_tokens", "cache_read_input_tokens",
                      "prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens")
        write = _count(usage, "cache_write_tokens", "cache_creation_input_tokens")
        prompt = _count(usage, "prompt_tokens")
        if prompt is None:
            prompt = _count(usage, "input_tokens") or 0
            if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
                prompt += (read or 0) + (write or 0)  # Anthropic: input_tokens excludes the cache
        completion = _count(usage, "completion_tokens", "output_tokens") or 0
        self.prompt_tokens, self.completion_tokens = prompt, completion
        self.total_tokens = _count(usage, "total_tokens") or prompt + completion
        if prompt <= 0:
            return
        self.requests += 1
        self.prompt_total += prompt
        if read is not None or write is not None:
            self.requests_with_cache += 1
            self.cache_read_total += read or 0
            self.cache_write_total += write or 0

    def cache_report(self) -> dict[str, Any]:
        """The running cache figures, as ``lcm_status`` shows them."""
        share = (round(self.cache_read_total / self.prompt_total, 4)
                 if self.requests_with_cache and self.prompt_total else None)
        return {"requests": self.requests, "requests_reporting_cache": self.requests_with_cache,
                "prompt_tokens": self.prompt_total, "cache_read_tokens": self.cache_read_total,
                "cache_write_tokens": self.cache_write_total, "cache_read_share": share}


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


def _worth_keeping(outcome: Mapping[str, Any]) -> bool:
    """Persist an outcome that says something (a "not needed" every turn would be a write per
    turn for nothing)."""
    return not (outcome.get("status") == "not_needed" and not outcome.get("passes"))


class ContextSession:
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
        #: Tokens the host adds around the transcript (its tools, its framing), learned from
        #: the prompt sizes it reports.
        self.overhead = 0
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
                                      redact=self.redactor.messages if self.redactor is not None else None)
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
            raise NotFoundError(f"this session is not stored ({_RULE_REASON[self.rule]}): search the agent's "
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

    # ------------------------------------------------------------------ each turn

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

    def cache_cold(self) -> bool:
        """The host has been idle longer than LCM_CACHE_TTL_SECONDS since its model last
        answered: the provider's prompt cache has expired, so rewriting the prompt costs
        nothing extra now."""
        ttl = self.config.cache_ttl_seconds
        return bool(ttl) and self.last_request_at is not None and self.clock() - self.last_request_at > ttl

    def window_shrank(self) -> bool:
        """The trigger is lower than when the last turn was handled (a smaller model window)."""
        seen = self._trigger_seen
        return seen is not None and seen != NO_TARGET and self.window.trigger < seen

    def compaction_cause(self, tokens: int, *, force: bool = False) -> str | None:
        """Why a context of ``tokens`` should be compacted now, or None (the policy, in order):
        ``forced``; ``threshold`` (the trigger or the assembly cap is reached); and, over the
        target only, ``window_shrank`` and ``cold_cache`` (idle past LCM_CACHE_TTL_SECONDS: the
        next request misses the cache anyway, so compacting now delays the next burst under a
        warm one)."""
        if force:
            return "forced"
        if self.window.under_pressure(tokens):
            return "threshold"
        if tokens > self.window.target:
            if self.window_shrank():
                return "window_shrank"
            if self.cache_cold():
                return "cold_cache"
        return None

    def should_compact(self, prompt_tokens: int) -> bool:
        """A compaction is due (:meth:`compaction_cause`), unless the last compaction at this size
        already found nothing to do: a host that reaches the store only through :meth:`turn`
        gives the store nothing new to look at until its transcript grows. After a burst it is
        false again until the context reaches the trigger."""
        if self.rule != "store" or self.compaction_cause(prompt_tokens) is None:
            return False
        return self._stalled_at is None or prompt_tokens > self._stalled_at

    def preflight(self, messages: Sequence[Any]) -> bool:
        """A rough check before the host's model call: over the limits, and something to do."""
        rough = sum(len(json.dumps(m, ensure_ascii=False, default=str)) for m in messages)
        rough = rough // CHARS_PER_TOKEN_ESTIMATE + self.overhead
        return self.compaction_cause(int(rough)) is not None and self.has_content_to_compress(messages)

    def has_content_to_compress(self, messages: Sequence[Any]) -> bool:
        """Is anything in this transcript outside the fresh tail (or ready to condense)?"""
        _, conversation = split_transcript(messages, self.own_messages)
        roles = [role_of(m) for m in conversation]
        sizes = [len(message_text(m)) // CHARS_PER_TOKEN_ESTIMATE + 4 if isinstance(m, Mapping) else 0
                 for m in conversation]
        users = [i for i, m in enumerate(conversation) if is_real_user(m)]
        start = tail_start_index(roles, sizes, newest_user=users[-1] if users else None,
                                 count=self.config.fresh_tail_count,
                                 max_tokens=planning_config(self.config, self.window).fresh_tail_max_tokens)
        if start > 0:
            return True
        return self.current is not None and condensable(
            self.store.summaries.compaction_view(self.current.id), self.config) is not None

    def turn(self, messages: list[Any], *, current_tokens: int | None = None,
             focus: str | None = None, force: bool = False) -> list[Any]:
        """Store the transcript, compact as needed, return the context for the host.

        Returns ``messages`` itself (the host's "nothing to do") when nothing changes, when the
        result would not be smaller, or when the host is behind the stored session.
        """
        if self.rule != "store":
            self.record({"status": "not_needed", "reason": f"this session is not stored ({_RULE_REASON[self.rule]}): "
                         "the host's context passes through", "passes": 0, "at": time.time()})
            return messages
        try:
            seen = self._ingest_bound(messages)
        except InvalidMessageError as exc:
            self.record({"status": "stopped", "reason": f"a message cannot be stored: {exc}", "at": time.time()})
            return messages
        if seen.host_end is None:
            # Nothing of the host's conversation ends in this session (it is behind the point
            # where its conversation forked, or holds nothing storable): nothing to assemble for it.
            self.record({"status": "not_needed", "reason": (
                "the host's transcript does not end in the stored session (it holds nothing storable, "
                "or is behind where its conversation forked): its context is left as it is"), "passes": 0,
                "at": time.time()})
            return messages
        sys_tokens, host_size = self._measure(messages, seen, current_tokens)
        if not self._counts_can_wait(messages, seen, sys_tokens, host_size, current_tokens, force):
            seen = self._settled(seen)
            sys_tokens, host_size = self._measure(messages, seen, current_tokens)
        done = self._burst(seen.session, context_estimate(self.overhead, sys_tokens), host_size,
                           force=force, focus=focus)
        outcome = done.outcome
        # Nothing could be done at this size: should_compact stops promising until it grows.
        self._stalled_at = host_size if outcome.passes == 0 and outcome.status == "stopped" else None
        over_cap = bool(self.window.assembly_cap) and host_size > self.window.assembly_cap
        if outcome.passes == 0 and not outcome.cause and self._extends_handed(messages):
            # Nothing was due and the host holds what lcm last handed over plus new messages:
            # assembling again would give back exactly this list. (When a compaction was due
            # and found nothing to do, another host on the session may have done it: the host
            # is handed the smaller context below.)
            self.record({**outcome.as_dict(), "over_budget": over_cap})
            return messages
        view = done.view if done.view is not None else self.store.summaries.compaction_view(seen.session.id)
        self.current = view.session
        assembly = self._assemble(view, done.plan, seen.system, end=seen.host_end)
        if assembly is None:
            self.record({**outcome.as_dict(), "over_budget": over_cap, "reason": (
                f"{outcome.reason}; the host's transcript (to message {seen.host_end}) holds no user "
                "message: its context is left as it is")})
            return messages
        result = {**outcome.as_dict(), "assembled_tokens": assembly.tokens, "over_budget": assembly.over_budget,
                  "omitted_messages": assembly.omitted_raw[2] if assembly.omitted_raw else 0,
                  "omitted_summaries": assembly.omitted_summaries}
        if assembly.over_budget:
            result["reason"] += (f"; over budget: the fresh tail alone needs more than the "
                                 f"{self.window.assembly_cap}-token cap")
        if assembly.messages != list(messages) and assembly.tokens < host_size:
            self.compactions += 1
            if self._stalled_at is not None:
                # The host now holds the smaller context handed over (a cut copy of a huge
                # message, say): a stall is measured from there, or compaction would wait for
                # the host to regrow past the size it had before the cut.
                self._stalled_at = assembly.tokens
            self._hand_over(view.session, assembly, result)
            self._handed = list(assembly.messages)
            return assembly.messages
        if assembly.messages != list(messages):
            result["reason"] += "; the assembled context would not be smaller: the host keeps its own"
            self._stalled_at = host_size
        else:
            self._handed = list(messages)
        # What the host keeps is what it sends: over the cap is over budget, whatever the reason.
        result["over_budget"] = bool(result["over_budget"]) or over_cap
        self.record(result)
        return messages

    def settle_counts(self, session_pk: int) -> SettledTokens:
        """Exact token counts for the session's messages stored with estimates (a store that
        counts later, see ``MessagePort.counts_later``), before anything plans with them; the
        host view remembered for the session takes them too."""
        settled = self.store.messages.settle_tokens(session_pk, self.tokens.count_message_text)
        if settled.counts:
            self.ingestor.recount(session_pk, settled.counts)
        return settled

    def _counts_can_wait(self, messages: Sequence[Any], seen: IngestResult, sys_tokens: int, host_size: int,
                         current_tokens: int | None, force: bool) -> bool:
        """Whether this turn may keep estimated token counts: it will neither compact nor
        assemble. That needs the host's own measure of its context (exact, whatever lcm's
        counts), a host holding what lcm handed it plus new messages (so nothing is assembled),
        and every compaction cause out of reach by ``ESTIMATE_MARGIN``, so an estimate that
        undercounts dense text (code, JSON) cannot hide a compaction that is due. Otherwise the
        counts are made exact first, as they always were."""
        if force or not (current_tokens or self.usage.prompt_tokens > 0) or not self._extends_handed(messages):
            return False
        estimate = context_estimate(self.overhead, sys_tokens)(seen.session)
        return self.compaction_cause(int(max(host_size, estimate) * ESTIMATE_MARGIN)) is None

    def _settled(self, seen: IngestResult) -> IngestResult:
        """``seen`` with exact token counts (and the session's counters as they now are)."""
        if not self.store.messages.counts_later and seen.session.estimated_from is None:
            return seen  # every count is exact: no call at all
        settled = self.settle_counts(seen.session.id)
        if settled.session is None:
            return seen
        self.current = settled.session
        return replace(seen, session=settled.session,
                       token_counts=with_exact_counts(seen.store_ids, seen.token_counts, settled.counts))

    def _burst(self, session: SessionRecord, estimate: Callable[[SessionRecord], int], host_size: int, *,
               force: bool, focus: str | None) -> CompactionResult:
        """Compact when due (:meth:`compaction_cause`, on the larger of the host's size and
        lcm's estimate), down to the target."""
        window = self.window
        cause = self.compaction_cause(max(host_size, estimate(session)), force=force)
        # At the trigger a burst is due whatever lcm's own estimate says (the host measured);
        # for the other causes the estimate must be over the target.
        start = 0.0 if cause in ("forced", "threshold") else window.target if cause else window.trigger
        done = self.compactor.run(session, estimate=estimate, start=start, target=window.target,
                                  force=force, focus=focus, cause=cause or "")
        self._trigger_seen = window.trigger
        if done.outcome.passes:
            self.embed_soon()  # the new summaries
            self.last_request_at = None  # the next request writes the cache afresh anyway
        return done

    def _measure(self, messages: Sequence[Any], seen: IngestResult,
                 current_tokens: int | None) -> tuple[int, int]:
        """(the system prompt's tokens, the size of the host's context): lcm's count of what the
        host sent plus the host's overhead, learned from the prompt size it reports."""
        tokens = self.tokens
        sys_tokens = tokens.count_message_text(message_text(seen.system)) if seen.system else 0
        own_summaries = [m for m in messages if self.own_messages(m)]
        input_tokens = sys_tokens + sum(seen.token_counts) + sum(
            tokens.count_message_text(message_text(m)) for m in own_summaries)
        host_total = current_tokens if current_tokens else max(self.usage.prompt_tokens, 0)
        if host_total:
            self.overhead = max(0, int(host_total) - input_tokens)
        return sys_tokens, self.overhead + input_tokens

    def compact_stored(self, *, force: bool = False, focus: str | None = None) -> dict[str, Any]:
        """Compact the bound session from what is stored, with no host transcript: what an
        import does after each turn. Same planning, bounds and outcome as :meth:`turn`."""
        self.settle_counts(self.session.id)
        session = self.store.sessions.get(self.session.id)
        estimate = context_estimate(0, 0)
        done = self._burst(session, estimate, estimate(session), force=force, focus=focus)
        if done.outcome.passes and done.view is not None:
            self.current = done.view.session
            self.ingestor.forget(session.id)  # a host view, if any, is out of date now
            self._handed = None
        result = done.outcome.as_dict()
        self.record(result)
        return result

    def assemble_context(self, system: Mapping[str, Any] | None = None) -> Assembly:
        """The context lcm would hand the host now for the bound session (nothing written but
        exact token counts for messages stored with estimates)."""
        self.settle_counts(self.session.id)
        view = self.store.summaries.compaction_view(self.session.id)
        self.current = view.session
        assembly = self._assemble(view, None, system)
        assert assembly is not None  # only a context that must end early can be impossible
        return assembly

    def _extends_handed(self, messages: Sequence[Any]) -> bool:
        handed = self._handed
        if handed is None or len(messages) < len(handed):
            return False
        return all(a is b for a, b in zip(handed, messages, strict=False))

    def _assemble(self, view: CompactionView, plan: TailPlan | None,
                  system: Mapping[str, Any] | None, *, end: int | None = None) -> Assembly | None:
        """The context from the view and the tail plan the compaction made (planned here when
        it made none): one read of raw messages at most, none when the plan holds them.

        ``end``: the seq of the host's last message. The context ends there, whatever other
        writers stored since (``lcm.context.until``): a host handed a message it never had
        holds it from then on, and sends it back beside its own copy (issue 30). None when
        that host has no user message in the session: it keeps what it has."""
        if end is not None and end < view.session.last_seq:
            until = view_until(self.store, view, end)
            if until is None:
                return None
            view, plan = until, None
        session = view.session
        if plan is None:
            plan = self.compactor.plan_tail(session)
        budget = self.window.assembly_cap or None
        raw = load_raw(self.store.messages, session, plan, budget)
        runs = inherited(self.store, session, view.carried) if session.parent_id is not None else []
        # A fork's inherited messages come verbatim before its own until it has summaries of
        # its own (which come after them in time); from then on they are named as left out.
        verbatim = not view.uncondensed and session.covered_seq == 0
        return assemble(system=system, nodes=view.nodes, carried_ids=frozenset(n.id for n in view.carried),
                        raw=raw.records, tail_start_seq=plan.tail_start, budget=budget,
                        overhead=self.overhead, tokens=self.tokens, skipped=raw.skipped,
                        newest_user_seq=plan.newest_user,
                        inherited=inherited_records(self.store, runs) if verbatim else (),
                        inherited_left_out=() if verbatim else [
                            LeftOut(r.first_seq, r.last_seq, r.count, r.session_key, before_fork=True) for r in runs])

    def _hand_over(self, session: SessionRecord, assembly: Assembly, outcome: dict[str, Any]) -> None:
        """The host now holds ``assembly``: remember the messages lcm generated for it (so they
        are known as lcm's own when they come back, in this process or another), where its
        transcript resumes, and the outcome, in one write on the session."""
        first = assembly.raw_first_seq if assembly.raw_first_seq is not None else session.last_seq + 1
        # What the summary stands in for: everything before the first verbatim message (an
        # ancestor's, in a fork's context that starts with inherited messages).
        opening = assembly.included[0] if assembly.included else None
        covers = (opening.session_pk, opening.seq - 1) if opening is not None else (session.id, session.last_seq)
        verbatim = {id(r.message) for r in assembly.included}
        stands_for = {id(copy): message_key(original.message, content_hash(original.message))
                      for copy, original in assembly.cut}
        generated: dict[str, GeneratedMessage] = {}
        for m in assembly.messages:
            digest = generated_digest(m) if id(m) not in verbatim else None
            if digest is None:
                continue
            if id(m) in stands_for:  # a cut copy: it is the stored original
                generated[digest] = GeneratedMessage(stands_for=stands_for[id(m)])
            elif role_of(m) == "user":  # the summary: it stands in for everything before `first`
                generated[digest] = GeneratedMessage(session_pk=covers[0], through_seq=covers[1])
            else:  # the acknowledgement of the summary
                generated[digest] = GeneratedMessage()
        if generated:
            self.store.messages.remember_generated(self.agent_id, generated)
            self.own_messages.add(generated)
        self.last_outcome = outcome
        after = self.store.sessions.set_host_view(
            session.id, first, outcome=outcome if _worth_keeping(outcome) else None)
        self.current = after
        self.ingestor.remember(after, assembly.included, assembly.messages)

    # ------------------------------------------------------------------ outcomes and failures

    def record(self, outcome: dict[str, Any]) -> None:
        """Keep the outcome for status, and with the session when it says something."""
        self.last_outcome = outcome
        if not _worth_keeping(outcome) or self.current is None or self.rule != "store":
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
