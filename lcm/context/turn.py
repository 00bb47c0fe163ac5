"""The turn: ingest the host's transcript, compact when a cause is due, assemble, hand over.

``Turns`` is the part of ``lcm.context.session.ContextSession`` that every host call goes
through (``compress()`` is :meth:`Turns.turn`); the session class adds binding to a session,
its lazily made parts and its outcomes. Split out of the session module so each stays one job:
the compaction policy (when, and why), the turn and its measures, and the hand-over (what the
host now holds, what lcm generated for it, where its transcript resumes). What a turn needs of
the session is declared here and provided by ``ContextSession``.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from lcm.config import LcmConfig
from lcm.context.alignment import message_key
from lcm.context.assembly import Assembly, LeftOut, assemble, load_raw
from lcm.context.budget import NO_TARGET, Window, context_estimate, planning_config
from lcm.context.compactor import CompactionResult, Compactor
from lcm.context.filters import Rule
from lcm.context.ingest import Ingestor, IngestResult, with_exact_counts
from lcm.context.lineage import inherited, inherited_records
from lcm.context.planning import TailPlan, condensable, tail_start_index
from lcm.context.ports import StorePorts
from lcm.context.until import view_until
from lcm.context.usage import Usage
from lcm.errors import InvalidMessageError
from lcm.messages import content_hash, message_text
from lcm.records import CompactionView, GeneratedMessage, SessionRecord, SettledTokens
from lcm.tokens import CHARS_PER_TOKEN_ESTIMATE, TokenCounter
from lcm.transcript import OwnMessages, generated_digest, is_real_user, role_of, same_objects_prefix, split_transcript

#: How far below every compaction cause lcm's estimate of a turn must be for its exact token
#: counts to wait (``_counts_can_wait``): characters / 4 undercounts code and JSON by about a
#: quarter; the host's own measure of its context, required too, is exact.
ESTIMATE_MARGIN = 1.5

#: Why a filtered session is not stored (see ``lcm.context.filters``).
RULE_REASON = {"ignore": "LCM_IGNORE_SESSION_PATTERNS matches it",
               "stateless": "LCM_STATELESS_SESSION_PATTERNS makes it read-only"}


def worth_keeping(outcome: Mapping[str, Any]) -> bool:
    """Persist an outcome that says something (a "not needed" every turn would be a write per
    turn for nothing)."""
    return not (outcome.get("status") == "not_needed" and not outcome.get("passes"))


class Turns(ABC):
    """The turn, its policy and its hand-over, over state the session keeps."""

    config: LcmConfig
    window: Window
    usage: Usage
    agent_id: str
    current: SessionRecord | None
    rule: Rule
    compactions: int
    overhead: int
    fixed_overhead: int | None
    last_outcome: dict[str, Any] | None
    clock: Callable[[], float]
    last_request_at: float | None
    _stalled_at: int | None
    _handed: list[Any] | None
    _trigger_seen: float | None
    #: The host messages :meth:`_measure` last read and the tokens of lcm's own among them.
    _own_counted: tuple[list[Any], int]

    @property
    @abstractmethod
    def store(self) -> StorePorts: ...
    @property
    @abstractmethod
    def tokens(self) -> TokenCounter: ...
    @property
    @abstractmethod
    def own_messages(self) -> OwnMessages: ...
    @property
    @abstractmethod
    def ingestor(self) -> Ingestor: ...
    @property
    @abstractmethod
    def compactor(self) -> Compactor: ...
    @property
    @abstractmethod
    def session(self) -> SessionRecord: ...
    @abstractmethod
    def _ingest_bound(self, messages: Sequence[Any]) -> IngestResult: ...
    @abstractmethod
    def embed_soon(self) -> None: ...
    @abstractmethod
    def record(self, outcome: dict[str, Any]) -> None: ...

    # ------------------------------------------------------------------ when to compact

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
        result would not be smaller, or when the host's transcript does not end in the session.
        A host behind the session's end is handed a context that ends where its transcript ends.
        """
        if self.rule != "store":
            self.record({"status": "not_needed", "reason": f"this session is not stored ({RULE_REASON[self.rule]}): "
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
        # The host keeps what it sent, as if lcm had handed it over: until a compaction is due,
        # its next turns extend it and are not assembled again (a host that resumed with fewer
        # messages than lcm holds raw, under a window they all fit, paid a read of the whole
        # raw region on every turn: 160 ms at 2,500 messages).
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
        input_tokens = sys_tokens + sum(seen.token_counts) + self._own_tokens(messages)
        host_total = current_tokens if current_tokens else max(self.usage.prompt_tokens, 0)
        if self.fixed_overhead is not None:  # a host that knows what it adds (lcm proxy)
            self.overhead = self.fixed_overhead
        elif host_total:
            self.overhead = max(0, int(host_total) - input_tokens)
        return sys_tokens, self.overhead + input_tokens

    def _own_tokens(self, messages: Sequence[Any]) -> int:
        """Tokens of lcm's own messages (its summaries) among the host's. A host that extends
        the list it sent last (the same objects, as the ingest's fast path requires) has only
        its new messages looked at: every message's test cost 0.5 ms a turn at 400 messages."""
        last, total = self._own_counted
        start = len(last)
        if same_objects_prefix(last, messages) < start:
            start, total = 0, 0
        own, count = self.own_messages, self.tokens.count_message_text
        total += sum(count(message_text(m)) for m in messages[start:] if own(m))
        self._own_counted = (list(messages), total)
        return total

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
        return handed is not None and same_objects_prefix(handed, messages) == len(handed)

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
            session.id, first, outcome=outcome if worth_keeping(outcome) else None)
        self.current = after
        self.ingestor.remember(after, assembly.included, assembly.messages)
