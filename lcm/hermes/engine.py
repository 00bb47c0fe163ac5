"""``LcmEngine``: lcm behind Hermes' ``ContextEngine`` contract (the plugin registers it).

The adapter is thin: Hermes' attributes, its hook names and keyword arguments, the Hermes home
(where the database and the agent scope come from), Hermes' own LLM as the summarizer route,
one lock, and the firewall: every host-facing method catches its own failures, so an lcm
problem degrades to "no compaction" with the reason in ``get_status()``, never to an exception
inside the host. Everything else is the host-neutral ``lcm.context.ContextSession``.

Construction reads the settings (``LcmConfig``) and does no I/O: Hermes instantiates engines
just to list them. The database opens on the first session start or first use. Copies
(``copy.deepcopy``, which Hermes applies to a plugin engine per agent, and
``clone_for_agent()``) share the process-wide store and settings, never a session.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from lcm.config import LcmConfig, default_sqlite_path
from lcm.context.ports import StorePorts
from lcm.context.session import ContextSession
from lcm.context.summarize import Summarizer
from lcm.errors import DatabaseUnavailableError, InvalidMessageError, retry_dropped
from lcm.hermes import hooks
from lcm.hermes.host import HERMES_AVAILABLE, ContextEngineBase, hermes_home_from, profile_name
from lcm.hermes.routes import HermesAuxiliaryRoute
from lcm.records import SessionRecord
from lcm.tokens import TokenCounter
from lcm.tools import TOOL_SCHEMAS, run_tool
from lcm.tools.autorecall import HeldContext, RecallBlock, recall_block

log = logging.getLogger("lcm")

T = TypeVar("T")


class _Forward(Generic[T]):
    """An engine attribute that lives in the context session (``part`` of it): Hermes reads
    and sets ``threshold_tokens``, ``last_prompt_tokens`` and their like on the engine itself."""

    def __init__(self, part: str, name: str):
        self.part, self.name = part, name

    def __get__(self, engine: Any, owner: type | None = None) -> T:
        if engine is None:  # looked up on the class (introspection): the descriptor itself
            return self  # type: ignore[return-value]
        value: T = getattr(getattr(engine.context, self.part), self.name)
        return value

    def __set__(self, engine: Any, value: T) -> None:
        setattr(getattr(engine.context, self.part), self.name, value)


class LcmEngine(ContextEngineBase):  # type: ignore[misc]
    """Lossless context management behind the host's context-engine contract."""

    context_length: _Forward[int] = _Forward("window", "context_length")
    threshold_tokens: _Forward[int] = _Forward("window", "threshold_tokens")
    threshold_percent: _Forward[float] = _Forward("window", "threshold_percent")
    last_prompt_tokens: _Forward[int] = _Forward("usage", "prompt_tokens")
    last_completion_tokens: _Forward[int] = _Forward("usage", "completion_tokens")
    last_total_tokens: _Forward[int] = _Forward("usage", "total_tokens")

    def __init__(self, config: LcmConfig | None = None, *, store: StorePorts | None = None,
                 summarizer: Summarizer | None = None, tokens: TokenCounter | None = None,
                 **kwargs: Any):
        config = config if config is not None else LcmConfig.from_env()
        self._hermes_home: Path | None = hermes_home_from(kwargs)
        self._inside_hermes = HERMES_AVAILABLE and (self._hermes_home is not None
                                                    or bool(kwargs.get("inside_hermes", False)))
        self.context = ContextSession(
            config, store, open_store=self._open_store, summarizer=summarizer, tokens=tokens,
            host_route=self._host_route if self._inside_hermes else None, agent_id=self._agent_id(config),
            context_length=int(kwargs.get("context_length") or 0), model=kwargs.get("model"))
        self.protect_first_n = 0
        self.protect_last_n = config.fresh_tail_count
        self._lock = threading.RLock()
        self._host_session: str | None = None  # the host's id of the bound session
        self._held_context = HeldContext()  # what auto-recall last saw of the host's context

    # ------------------------------------------------------------------ identity & copies

    @property
    def name(self) -> str:
        return "lcm"

    @property
    def config(self) -> LcmConfig:
        return self.context.config

    @property
    def model(self) -> str | None:
        return self.context.model

    @property
    def compression_count(self) -> int:
        return self.context.compactions

    @compression_count.setter
    def compression_count(self, value: int) -> None:
        self.context.compactions = int(value)

    def __deepcopy__(self, memo: dict[int, Any]) -> LcmEngine:
        """A fresh engine for another agent: same settings and shared store, own state."""
        clone = copy.copy(self)
        clone.context = self.context.clone(open_store=clone._open_store)  # the copy's own Hermes home
        clone._lock = threading.RLock()
        clone._host_session = None
        return clone

    def clone_for_agent(self) -> LcmEngine:
        return copy.deepcopy(self)

    # ------------------------------------------------------------------ the Hermes home

    def _agent_id(self, config: LcmConfig) -> str:
        return config.agent_id or profile_name(self._hermes_home)

    def database_url(self) -> str:
        """``LCM_DATABASE_URL``, else ``lcm.db`` in the Hermes home, else ``~/.lcm/lcm.db``."""
        if self.config.database_url:
            return self.config.database_url
        if self._hermes_home is not None:
            return f"sqlite:///{self._hermes_home / 'lcm.db'}"
        return f"sqlite:///{default_sqlite_path()}"

    def _open_store(self) -> StorePorts:
        from lcm.store import Store  # SQLAlchemy loads when a store is first needed, not at import

        return Store.open(self.database_url())

    def _host_route(self, model: str | None) -> HermesAuxiliaryRoute:
        return HermesAuxiliaryRoute(model)

    @property
    def store(self) -> StorePorts:
        return self.context.store

    @property
    def agent_id(self) -> str:
        return self.context.agent_id

    @property
    def session(self) -> SessionRecord:
        return self.context.session

    @property
    def summarizer(self) -> Summarizer:
        return self.context.summarizer

    def _adopt_home(self, kwargs: Mapping[str, Any]) -> None:
        """A home the host names at session start, before the store opened: the database and
        the agent scope follow it."""
        home = hermes_home_from(dict(kwargs))
        if home is not None and self._hermes_home is None and not self.context.store_opened:
            self._hermes_home = home
            self._inside_hermes = HERMES_AVAILABLE
            self.context.agent_id = self._agent_id(self.config)
            self.context.host_route = self._host_route if self._inside_hermes else None

    # ------------------------------------------------------------------ host lifecycle

    def _guarded(self, where: str, action: Callable[[], T], fallback: T) -> T:
        try:
            with self._lock:
                return retry_dropped(action)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self.context.note_failure(where, exc)
            return fallback

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        self._guarded("on_session_start", lambda: self._start(session_id, kwargs), None)

    def open_session(self, session_id: str, **kwargs: Any) -> SessionRecord | None:
        """``on_session_start`` for callers that want failures raised."""
        with self._lock:
            return retry_dropped(lambda: self._start(session_id, kwargs))

    def _start(self, session_id: str, kwargs: Mapping[str, Any]) -> SessionRecord | None:
        self._adopt_home(kwargs)
        self._host_session = str(session_id)
        hooks.track(self)
        if kwargs.get("context_length") and not self.context_length:
            self.update_model(kwargs.get("model") or self.model or "", int(kwargs["context_length"]))
        continues = kwargs.get("old_session_id") if kwargs.get("boundary_reason") == "compression" else None
        return self.context.start(session_id, platform=kwargs.get("platform"),
                                  conversation_id=kwargs.get("conversation_id"),
                                  continues=str(continues) if continues else None)

    def carry_over_new_session_context(self, old_session_id: str, new_session_id: str) -> None:
        """Hermes' explicit carry hook (/new with carry-over): same as the reset-then-start path."""
        self._guarded("carry_over_new_session_context",
                      lambda: self.context.carry_over(old_session_id, new_session_id), None)

    def on_session_reset(self, **kwargs: Any) -> None:
        with self._lock:
            self.context.reset()

    def on_session_end(self, session_id: str, messages: list[dict[str, Any]] | None = None,
                       **kwargs: Any) -> None:
        def end() -> None:
            target = self.context.find(str(session_id)) if session_id else None
            if target is not None and messages:
                self.context.ingest_into(target, messages)
        self._guarded("on_session_end", end, None)

    def on_turn_complete(self, messages: list[dict[str, Any]], usage: Mapping[str, Any] | None = None,
                         **kwargs: Any) -> None:
        if usage:
            self.update_from_response(dict(usage))
        self._guarded("on_turn_complete", lambda: self.context.ingest(messages), None)

    def observe_request(self, session_id: str, system: Mapping[str, Any]) -> None:
        """The system message of a request the host is about to send (Hermes'
        ``pre_api_request`` hook, see ``lcm.hermes.hooks``): kept (once per version) when the
        request is for this engine's session."""
        if session_id == self._host_session:
            self._guarded("observe_request", lambda: self.context.keep_system_prompt(system), None)

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "", **kwargs: Any) -> None:
        self.context.set_model(model, context_length)

    def update_from_response(self, usage: dict[str, Any]) -> None:
        self.context.observe_response(usage or {})

    # ------------------------------------------------------------------ when to compact

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = prompt_tokens if prompt_tokens is not None else max(self.last_prompt_tokens, 0)
        return self.context.should_compact(int(tokens))

    def should_compress_preflight(self, messages: list[dict[str, Any]]) -> bool:
        return self._guarded("should_compress_preflight", lambda: self.context.preflight(messages), False)

    def has_content_to_compress(self, messages: list[dict[str, Any]]) -> bool:
        return self._guarded("has_content_to_compress",
                             lambda: self.context.has_content_to_compress(messages), False)

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False, memory_context: str = "",
                 **kwargs: Any) -> list[dict[str, Any]]:
        """Store the transcript, compact as needed, return the assembled context (``messages``
        itself when nothing changes or anything fails: the reason is in the status)."""
        try:
            with self._lock:
                return retry_dropped(lambda: self.context.turn(
                    messages, current_tokens=current_tokens, focus=focus_topic, force=force))
        except Exception as exc:  # noqa: BLE001 - the host keeps its transcript; status says why
            self.context.note_failure("compress", exc)
            self.context.last_outcome = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                                         "at": time.time()}
            return messages

    # ------------------------------------------------------------------ auto-recall

    def recall(self, user_message: Any, context_messages: Sequence[Mapping[str, Any]] | None = None, *,
               max_tokens: int | None = None) -> RecallBlock:
        """The auto-recall block for a user message (a message or its text): the stored turns of
        any of the agent's sessions that best match it and that ``context_messages`` (what the
        host is about to send; default: the session's messages not yet summarized) lack, quoted
        with their store ids, within ``max_tokens`` (default LCM_AUTO_RECALL_MAX_TOKENS).

        The engine method for any host: put ``block.text`` (empty when nothing matched) into
        the API copy of the user message; lcm strips it from whatever comes back. Computed
        whatever LCM_AUTO_RECALL says (the host asked); never raises: a failure is an empty
        block whose ``reason`` says why (and ``get_status()["last_error"]``)."""
        budget = max_tokens if max_tokens is not None else self.config.auto_recall_max_tokens
        return self._guarded("recall", lambda: recall_block(
            self.context, user_message, max_tokens=budget, context_messages=context_messages,
            held=self._held_context),
            RecallBlock(reason="auto-recall failed (lcm_status last_error says why)"))

    def recall_context(self, session_id: str, user_message: Any,
                       context_messages: Sequence[Mapping[str, Any]] | None) -> str:
        """Hermes' ``pre_llm_call`` (``lcm.hermes.hooks``): the block for this engine's session
        when LCM_AUTO_RECALL is on, else ""."""
        if session_id != self._host_session or not self.config.auto_recall:
            return ""
        block = self.recall(user_message, context_messages)
        self.context.last_recall = block.as_dict() | {"text": None, "at": time.time()}
        return block.text

    # ------------------------------------------------------------------ status & tools

    def get_status(self) -> dict[str, Any]:
        status: dict[str, Any] = super().get_status()
        context = self.context
        status.update({
            "engine": "lcm", "agent_id": context.agent_id,
            "session_id": context.current.session_key if context.current else None,
            "fresh_tail_count": self.config.fresh_tail_count,
            "max_assembly_tokens": context.window.assembly_cap,
            "compaction_target_tokens": context.window.target_tokens,
            "cache": context.usage.cache_report(),
            "last_compaction": context.last_outcome or (
                context.current.last_compaction if context.current else None),
            "last_error": context.last_error,
        })
        if context.store_opened:
            store = context.store
            status.update({"backend": store.backend_name, "database": store.location,
                           "summarizer": context.summarizer.describe()})
        return status

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [dict(s) for s in TOOL_SCHEMAS]

    def handle_tool_call(self, name: str, args: dict[str, Any], **kwargs: Any) -> str:
        """Ingest the live transcript first (so this turn is findable), then run the tool."""
        messages = kwargs.get("messages")

        def call() -> str:
            if messages:
                try:
                    self.context.ingest(messages)
                except InvalidMessageError as exc:
                    log.warning("lcm: could not store the live transcript: %s", exc)
            return run_tool(self.context, name, args)

        try:
            with self._lock:
                return retry_dropped(call)
        except DatabaseUnavailableError as exc:
            self.context.note_failure(f"tool {name}", exc)
            return json.dumps({"error": f"{name}: the lcm database is unavailable right now ({exc}); "
                                        "nothing was lost, try again shortly"})
        except Exception as exc:  # noqa: BLE001 - a tool never raises into the host
            self.context.note_failure(f"tool {name}", exc)
            return json.dumps({"error": f"{name} failed inside lcm: {type(exc).__name__}: {exc}"})
