"""``LcmEngine``: the host-neutral context engine (Hermes ``ContextEngine`` method set).

Per turn the host hands the engine its live transcript (``compress``, ``handle_tool_call``,
``on_turn_complete``, ``on_session_end``); the engine stores each message exactly once
(``lcm.ingest``), and when the prompt nears the window it compacts the oldest raw messages into
the summary DAG (``lcm.compaction``) and returns a context assembled from summaries and the
verbatim fresh tail (``lcm.assembly``). Nothing here knows which database is underneath.

Construction reads the settings (``LcmConfig``) and does no I/O: Hermes instantiates engines
just to list them. The database opens on the first session start or first use. Copies
(``copy.deepcopy``, which Hermes applies to a plugin engine per agent, and
``clone_for_agent()``) share the process-wide store and configuration, never a session.
Every host-facing method catches its own failures: an lcm problem degrades to "no
compaction" with the reason in ``get_status()``, never to an exception inside the host.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from lcm.assembly import Assembly, assemble, summary_message_cost
from lcm.compaction import Compactor, Outcome, tail_start_index
from lcm.config import LcmConfig
from lcm.config import default_sqlite_path
from lcm.errors import DatabaseUnavailableError, InvalidMessageError, LcmError, NotFoundError
from lcm.host import HERMES_AVAILABLE, ContextEngineBase, hermes_home_from, profile_name
from lcm.ingest import IngestResult, Ingestor, message_key
from lcm.messages import content_hash, message_text
from lcm.records import CompactionView, SessionRecord
from lcm.store import Store
from lcm.summarize import Summarizer
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE, TokenCounter
from lcm.transcript import OwnMessages, generated_digest, is_real_user, role_of, split_transcript

log = logging.getLogger("lcm")

DEFAULT_SESSION_KEY = "default"
NO_TARGET = float("inf")  # no window known: compact only when forced
TAIL_SHARE_OF_TARGET = 0.5  # the fresh tail's share of the compaction target when no cap is set


class LcmEngine(ContextEngineBase):
    """Lossless context management behind the host's context-engine contract."""

    def __init__(self, config: LcmConfig | None = None, *, store: Store | None = None,
                 summarizer: Summarizer | None = None, tokens: TokenCounter | None = None,
                 **kwargs: Any):
        self.config = config if config is not None else LcmConfig.from_env()
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0
        self.threshold_percent = self.config.context_threshold
        self.protect_first_n = 0
        self.protect_last_n = self.config.fresh_tail_count
        self.context_length = int(kwargs.get("context_length") or 0)
        self.threshold_tokens = int(self.context_length * self.threshold_percent)
        self.model: str | None = kwargs.get("model")
        self._store = store
        self._summarizer = summarizer
        self._tokens = tokens
        self._hermes_home = hermes_home_from(kwargs)
        self._inside_hermes = HERMES_AVAILABLE and (self._hermes_home is not None or
                                                    kwargs.get("inside_hermes", False))
        self._session: SessionRecord | None = None
        #: A host session start that failed (database down, locked): retried on next use, so
        #: the host's messages never land in another session meanwhile.
        self._pending_start: tuple[str, dict[str, Any]] | None = None
        self._own: OwnMessages | None = None
        self._ingestor: Ingestor | None = None
        self._carry_from: int | None = None
        self._overhead = 0
        self._stalled_at: int | None = None  # prompt size at which compaction last found nothing
        self._handed: list[Any] | None = None  # the last context handed to (or kept by) the host
        self._last_outcome: dict[str, Any] | None = None
        self._last_error: str | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ identity & copies

    @property
    def name(self) -> str:
        return "lcm"

    def __deepcopy__(self, memo: dict[int, Any]) -> "LcmEngine":
        """A fresh engine for another agent: same configuration and shared store, own state."""
        clone = type(self)(self.config, store=self._store, summarizer=None, tokens=self._tokens)
        clone.context_length = self.context_length
        clone.threshold_tokens = self.threshold_tokens
        clone.model = self.model
        clone._hermes_home = self._hermes_home
        clone._inside_hermes = self._inside_hermes
        return clone

    def clone_for_agent(self) -> "LcmEngine":
        return copy.deepcopy(self)

    # ------------------------------------------------------------------ lazily opened parts

    @property
    def agent_id(self) -> str:
        return self.config.agent_id or profile_name(self._hermes_home)

    def database_url(self) -> str:
        if self.config.database_url:
            return self.config.database_url
        if self._hermes_home is not None:
            return f"sqlite:///{self._hermes_home / 'lcm.db'}"
        return f"sqlite:///{default_sqlite_path()}"

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.open(self.database_url())
        return self._store

    @property
    def tokens(self) -> TokenCounter:
        if self._tokens is None:
            self._tokens = TokenCounter(self.model)
        return self._tokens

    @property
    def summarizer(self) -> Summarizer:
        if self._summarizer is None:
            self._summarizer = Summarizer(self.config, self.tokens, inside_hermes=self._inside_hermes)
        return self._summarizer

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
            self._ingestor = Ingestor(self.store, self.tokens, own=self.own_messages,
                                      stands_for=self.own_messages.stands_for)
        return self._ingestor

    @property
    def compactor(self) -> Compactor:
        return Compactor(self.store, self.summarizer, self.planning_config())

    def planning_config(self) -> LcmConfig:
        """The settings compaction plans with. With no fixed fresh-tail cap
        (``LCM_FRESH_TAIL_MAX_TOKENS=0``) the tail still yields to the window: it may take at most
        half of the compaction target, or a count-based tail of huge turns would protect the
        whole window and no compaction could ever make room (the newest user turn always stays)."""
        if self.config.fresh_tail_max_tokens or not self.context_length:
            return self.config
        target = self._target()
        if target == NO_TARGET:
            return self.config
        return replace(self.config, fresh_tail_max_tokens=max(1, int(target * TAIL_SHARE_OF_TARGET)))

    @property
    def session(self) -> SessionRecord:
        """The bound session. A host session start that failed is retried here (and raises
        again while the database is still unavailable): the host's messages never go to
        another session. Bound to ``default`` only when the host never started one."""
        if self._session is None and self._pending_start is not None:
            session_id, kwargs = self._pending_start
            self._start_session(session_id, kwargs)
        if self._session is None:
            self._session = self.store.sessions.get_or_create(self.agent_id, DEFAULT_SESSION_KEY)
        return self._session

    # ------------------------------------------------------------------ host lifecycle

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        try:
            with self._lock:
                self._session = None
                self._start_session(session_id, kwargs)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self._failed("on_session_start", exc)

    def open_session(self, session_id: str, **kwargs: Any) -> SessionRecord:
        """``on_session_start`` for callers that want failures raised (the command line)."""
        with self._lock:
            self._start_session(session_id, kwargs)
            return self.session

    def _start_session(self, session_id: str, kwargs: dict[str, Any]) -> None:
        self._pending_start = (session_id, dict(kwargs))
        self._bind_session(session_id, kwargs)
        self._pending_start = None

    def _bind_session(self, session_id: str, kwargs: dict[str, Any]) -> None:
        home = hermes_home_from(kwargs)
        if home is not None and self._hermes_home is None and self._store is None:
            self._hermes_home = home
            self._inside_hermes = HERMES_AVAILABLE
        if kwargs.get("context_length") and not self.context_length:
            self.update_model(kwargs.get("model") or self.model or "", int(kwargs["context_length"]))
        key = str(session_id or DEFAULT_SESSION_KEY)
        platform = _short(kwargs.get("platform"), 64)
        conversation_id = _short(kwargs.get("conversation_id"), 255)
        old_key = kwargs.get("old_session_id")
        if kwargs.get("boundary_reason") == "compression" and old_key:
            current = self._session if self._session is not None and (
                old_key in self.store.sessions.keys(self._session.id)) else self.store.sessions.find(
                self.agent_id, str(old_key))
            if current is not None:  # the same conversation continues under a new host id
                self._session = self.store.sessions.alias(self.agent_id, key, current.id)
                return
        session = self.store.sessions.get_or_create(self.agent_id, key, platform=platform,
                                                   conversation_id=conversation_id)
        if self._carry_from is not None and self._carry_from != session.id:
            self._carry(self._carry_from, session)
        self._carry_from = None
        self._session = session

    def _carry(self, from_pk: int, to: SessionRecord) -> None:
        """/new: the next session starts with the old one's summaries of depth >= retain depth."""
        depth = self.config.new_session_retain_depth
        if depth == 0:
            return
        nodes = self.store.summaries.carried(from_pk) + self.store.summaries.uncondensed(from_pk)
        keep = [n for n in nodes if depth < 0 or n.depth >= depth]
        if keep:
            self.store.summaries.carry(to.id, [n.id for n in keep])
            log.info("lcm: carried %d summaries into the new session %s", len(keep), to.session_key)

    def carry_over_new_session_context(self, old_session_id: str, new_session_id: str) -> None:
        """Hermes' explicit carry hook (/new with carry-over): same as the reset-then-start path."""
        try:
            with self._lock:
                old = self.store.sessions.find(self.agent_id, str(old_session_id))
                new = self.store.sessions.find(self.agent_id, str(new_session_id))
                if old is not None and new is not None and old.id != new.id:
                    self._carry(old.id, new)
        except Exception as exc:  # noqa: BLE001
            self._failed("carry_over_new_session_context", exc)

    def on_session_reset(self, **kwargs: Any) -> None:
        with self._lock:
            self._pending_start = None
            super().on_session_reset()
            if self._session is not None:
                self._carry_from = self._session.id
                if self._ingestor is not None:
                    self._ingestor.forget(self._session.id)
            self._session = None
            self._last_outcome = None
            self._handed = None

    def on_session_end(self, session_id: str, messages: list[dict[str, Any]] | None = None,
                       **kwargs: Any) -> None:
        try:
            with self._lock:
                target = self._session
                if target is None or session_id not in self.store.sessions.keys(target.id):
                    target = self.store.sessions.find(self.agent_id, str(session_id)) if session_id else None
                if target is not None and messages:
                    self.ingestor.ingest(target.id, messages)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_session_end", exc)

    def on_turn_complete(self, messages: list[dict[str, Any]], usage: Mapping[str, Any] | None = None,
                         **kwargs: Any) -> None:
        if usage:
            self.update_from_response(dict(usage))
        try:
            with self._lock:
                self._ingest(messages)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_turn_complete", exc)

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "", **kwargs: Any) -> None:
        self.model = model or self.model
        self.context_length = int(context_length or 0)
        self.threshold_tokens = int(self.context_length * self.threshold_percent)

    def update_from_response(self, usage: dict[str, Any]) -> None:
        usage = usage or {}
        prompt = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        completion = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        self.last_prompt_tokens = prompt
        self.last_completion_tokens = completion
        self.last_total_tokens = int(usage.get("total_tokens") or prompt + completion)

    # ------------------------------------------------------------------ when to compact

    @property
    def assembly_cap(self) -> int:
        """The hard cap on the assembled prompt (LCM_MAX_ASSEMBLY_TOKENS, else the window)."""
        return self.config.max_assembly_tokens or self.context_length

    def _pressure(self, tokens: int) -> bool:
        cap = self.assembly_cap
        return (self.threshold_tokens > 0 and tokens >= self.threshold_tokens) or (cap > 0 and tokens >= cap)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """Pressure (threshold or assembly cap reached), unless the last compaction at this size
        already found nothing to do: the host's transcript reaches the store only through
        ``compress()`` on hosts without ``on_turn_complete``, so the store cannot be asked."""
        tokens = prompt_tokens if prompt_tokens is not None else max(self.last_prompt_tokens, 0)
        if not self._pressure(tokens):
            return False
        return self._stalled_at is None or tokens > self._stalled_at

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        rough = sum(len(json.dumps(m, ensure_ascii=False, default=str)) for m in messages)
        rough = rough // CHARS_PER_TOKEN_ESTIMATE + self._overhead
        return self._pressure(int(rough)) and self.has_content_to_compress(messages)

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        """Is anything in this transcript outside the fresh tail (or ready to condense)?"""
        try:
            _, conversation = split_transcript(messages, self.own_messages)
            roles = [role_of(m) for m in conversation]
            sizes = [len(message_text(m)) // CHARS_PER_TOKEN_ESTIMATE + 4 if isinstance(m, Mapping)
                     else 0 for m in conversation]
            users = [i for i, m in enumerate(conversation) if is_real_user(m)]
            start = tail_start_index(roles, sizes, newest_user=users[-1] if users else None,
                                     count=self.config.fresh_tail_count,
                                     max_tokens=self.planning_config().fresh_tail_max_tokens)
            if start > 0:
                return True
            with self._lock:
                return self._session is not None and self.compactor.condensable(
                    self.store.summaries.compaction_view(self._session.id)) is not None
        except Exception as exc:  # noqa: BLE001
            self._failed("has_content_to_compress", exc)
            return False

    # ------------------------------------------------------------------ compress

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False, memory_context: str = "",
                 **kwargs: Any) -> list[dict[str, Any]]:
        """Store the transcript, compact as needed, return the assembled context.

        Returns ``messages`` itself (the host's "nothing to do") when nothing changes, when the
        result would not be smaller, or when anything fails (the reason is in the status).
        """
        try:
            with self._lock:
                return self._compress(messages, current_tokens, focus_topic, force)
        except Exception as exc:  # noqa: BLE001 - the host keeps its transcript; status says why
            self._failed("compress", exc)
            self._last_outcome = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                                  "at": time.time()}
            return messages

    def _ingest(self, messages: Sequence[Any]) -> IngestResult:
        result = self.ingestor.ingest(self.session.id, messages)
        self._session = result.session
        return result

    def _compress(self, messages, current_tokens, focus_topic, force):
        try:
            seen = self._ingest(messages)
        except InvalidMessageError as exc:
            self._record({"status": "stopped", "reason": f"a message cannot be stored: {exc}",
                          "at": time.time()})
            return messages
        session = seen.session
        if not seen.at_end:
            # The host is behind the stored session: anything assembled from the session would
            # hand it messages it never had, which it would then send back as new ones.
            self._record({"status": "not_needed", "reason": (
                "the host's transcript is behind the stored session (another writer, or a restarted "
                "host re-sending its history): its context is left as it is"), "passes": 0,
                "at": time.time()})
            return messages
        sys_tokens = self.tokens.count_message_text(message_text(seen.system)) if seen.system else 0
        own_summaries = [m for m in messages if self.own_messages(m)]
        input_tokens = sys_tokens + sum(seen.token_counts) + sum(
            self.tokens.count_message_text(message_text(m)) for m in own_summaries)
        host_total = current_tokens if current_tokens else (
            self.last_prompt_tokens if self.last_prompt_tokens > 0 else 0)
        if host_total:
            self._overhead = max(0, int(host_total) - input_tokens)
        outcome: Outcome = self.compactor.run(session, estimate=self._estimator(sys_tokens),
                                              target=self._target(), force=force, focus=focus_topic)
        # Nothing could be done at this size: should_compress stops promising until it grows.
        self._stalled_at = self._overhead + input_tokens if (
            outcome.passes == 0 and outcome.status == "stopped") else None
        host_size = self._overhead + input_tokens
        cap = self.assembly_cap
        if outcome.passes == 0 and self._extends_handed(messages):
            # Nothing compacted and the host holds what lcm last handed over plus new
            # messages: assembling again would give back exactly this list.
            kept = outcome.as_dict()
            kept["over_budget"] = bool(cap) and host_size > cap
            self._record(kept)
            return messages
        view = self.store.summaries.compaction_view(session.id)
        session = self._session = view.session
        assembly = self._assemble(view, seen.system)
        result: dict[str, Any] = outcome.as_dict()
        result.update({"assembled_tokens": assembly.tokens, "over_budget": assembly.over_budget,
                       "omitted_messages": assembly.omitted_raw[2] if assembly.omitted_raw else 0,
                       "omitted_summaries": assembly.omitted_summaries})
        if assembly.over_budget:
            result["reason"] += (f"; over budget: the fresh tail alone needs more than the "
                                 f"{self.assembly_cap}-token cap")
        out = assembly.messages
        if out == list(messages) or assembly.tokens >= self._overhead + input_tokens:
            if out != list(messages):
                result["reason"] += "; the assembled context would not be smaller: the host keeps its own"
                self._stalled_at = host_size
            else:
                self._handed = list(messages)
            # What the host keeps is what it sends: over the cap is over budget, whatever the reason.
            result["over_budget"] = bool(result["over_budget"]) or (bool(cap) and host_size > cap)
            self._record(result)
            return messages
        self.compression_count += 1
        self._hand_over(session, assembly)
        self._handed = list(out)
        self._record(result)
        return out

    def _target(self) -> float:
        """Under the threshold, and under the assembly cap when that is lower: summarizing is
        always preferred to leaving messages out of the context."""
        limits = [t for t in (self.threshold_tokens, self.assembly_cap) if t > 0]
        return min(limits) if limits else NO_TARGET

    def _estimator(self, sys_tokens: int):
        """The context size a session state would assemble to (no database reads)."""
        def estimate(s: SessionRecord) -> int:
            return (self._overhead + sys_tokens + s.raw_tokens
                    + summary_message_cost(s.summary_count, s.summary_tokens))
        return estimate

    # ------------------------------------------------------------------ driven from the store

    def attach(self, session_key: str) -> SessionRecord:
        """Bind to an existing session of this agent (never creating one): the command line's
        way in. NotFoundError when the agent has no such session."""
        with self._lock:
            found = self.store.sessions.find(self.agent_id, str(session_key))
            if found is None:
                raise NotFoundError(f"agent {self.agent_id!r} has no session {session_key!r} "
                                    "(lcm sessions lists them)")
            self._session, self._handed = found, None
            return found

    def compact_stored(self, *, force: bool = False, focus_topic: str | None = None) -> dict[str, Any]:
        """Compact the bound session from what is stored, with no host transcript: what an
        import does after each turn. Same planning, bounds and outcome as ``compress``."""
        with self._lock:
            session = self.store.sessions.get(self.session.id)
            outcome = self.compactor.run(session, estimate=self._estimator(0), target=self._target(),
                                         force=force, focus=focus_topic)
            if outcome.passes:
                self._session = self.store.sessions.get(session.id)
                self.ingestor.forget(session.id)  # a host view, if any, is out of date now
                self._handed = None
            result = outcome.as_dict()
            self._record(result)
            return result

    def assemble_context(self, system: Mapping[str, Any] | None = None) -> Assembly:
        """The context lcm would hand the host now for the bound session (nothing written)."""
        with self._lock:
            view = self.store.summaries.compaction_view(self.session.id)
            self._session = view.session
            return self._assemble(view, system)

    def _extends_handed(self, messages: Sequence[Any]) -> bool:
        handed = self._handed
        if handed is None or len(messages) < len(handed):
            return False
        return all(a is b for a, b in zip(handed, messages, strict=False))

    def _assemble(self, view: CompactionView, system: Mapping[str, Any] | None) -> Assembly:
        session = view.session
        plan = self.compactor.plan_tail(session)
        budget = self.assembly_cap or None
        first_raw = load_from = session.covered_seq + 1
        if budget is not None and session.raw_tokens > 2 * budget:
            load_from = self._backlog_start(session, plan.tail_start, budget)
        skipped = (first_raw, load_from - 1, load_from - first_raw) if load_from > first_raw else None
        raw = self.store.messages.get_range(session.id, first_seq=load_from)
        return assemble(system=system, nodes=view.nodes, carried_ids=frozenset(n.id for n in view.carried),
                        raw=raw, tail_start_seq=plan.tail_start, budget=budget,
                        overhead=self._overhead, tokens=self.tokens, skipped=skipped,
                        newest_user_seq=plan.newest_user)

    def _backlog_start(self, session: SessionRecord, tail_start: int, budget: int) -> int:
        """Where to start loading raw messages when the raw region is far beyond the budget:
        at a turn start (assistant message) no further back than what could still fit."""
        metas = self.store.messages.metas(session.id, first_seq=max(session.covered_seq + 1,
                                                                    tail_start - 5000),
                                         last_seq=tail_start - 1)
        acc, cut = 0, 0
        for i in range(len(metas) - 1, -1, -1):
            acc += metas[i].token_count
            if acc > budget:
                cut = i + 1
                break
        return next((m.seq for m in metas[cut:] if m.role == "assistant"), tail_start)

    def _hand_over(self, session: SessionRecord, assembly: Assembly) -> None:
        """The host now holds ``assembly``: remember the messages lcm generated for it (so
        they are known as lcm's own when they come back, in this process or another) and
        where its transcript resumes."""
        verbatim = {id(r.message) for r in assembly.included}
        stands_for = {id(copy): message_key(original.message, content_hash(original.message))
                      for copy, original in assembly.cut}
        digests = {d: stands_for.get(id(m)) for m in assembly.messages if id(m) not in verbatim
                   for d in (generated_digest(m),) if d is not None}
        self.store.messages.remember_generated(self.agent_id, digests)
        self.own_messages.add(digests)
        first = assembly.raw_first_seq if assembly.raw_first_seq is not None else session.last_seq + 1
        self.store.sessions.set_host_view(session.id, first)
        self.ingestor.remember(self.store.sessions.get(session.id), assembly.included, assembly.messages)

    # ------------------------------------------------------------------ status & tools

    def _record(self, outcome: dict[str, Any]) -> None:
        """Keep the outcome for status; persist it when it says something (a "not needed" on
        every turn would be a write per turn for nothing)."""
        self._last_outcome = outcome
        if outcome.get("status") == "not_needed" and not outcome.get("passes"):
            return
        try:
            if self._session is not None:
                self.store.sessions.record_compaction(self._session.id, outcome)
        except Exception as exc:  # noqa: BLE001
            self._failed("record_compaction", exc)

    def _failed(self, where: str, exc: BaseException) -> None:
        self._last_error = f"{where}: {type(exc).__name__}: {exc}"
        level = logging.WARNING if isinstance(exc, LcmError) else logging.ERROR
        log.log(level, "lcm %s failed: %s", where, exc, exc_info=not isinstance(exc, LcmError))

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status.update({
            "engine": "lcm", "agent_id": self.agent_id,
            "session_id": self._session.session_key if self._session else None,
            "fresh_tail_count": self.config.fresh_tail_count,
            "max_assembly_tokens": self.assembly_cap,
            "last_compaction": self._last_outcome or (self._session.last_compaction if self._session else None),
            "last_error": self._last_error,
        })
        if self._store is not None:
            status.update({"backend": self._store.backend_name, "database": self._store.location,
                           "summarizer": self.summarizer.describe()})
        return status

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        from lcm.tools import TOOL_SCHEMAS

        return [dict(s) for s in TOOL_SCHEMAS]

    def handle_tool_call(self, name: str, args: dict[str, Any], **kwargs: Any) -> str:
        """Ingest the live transcript first (so this turn is findable), then run the tool."""
        from lcm.tools import run_tool

        try:
            with self._lock:
                messages = kwargs.get("messages")
                if messages:
                    try:
                        self._ingest(messages)
                    except InvalidMessageError as exc:
                        log.warning("lcm: could not store the live transcript: %s", exc)
                return run_tool(self, name, args)
        except DatabaseUnavailableError as exc:
            self._failed(f"tool {name}", exc)
            return json.dumps({"error": f"{name}: the lcm database is unavailable right now ({exc}); "
                                        "nothing was lost, try again shortly"})
        except Exception as exc:  # noqa: BLE001 - a tool never raises into the host
            self._failed(f"tool {name}", exc)
            return json.dumps({"error": f"{name} failed inside lcm: {type(exc).__name__}: {exc}"})


def _short(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()[:limit]
