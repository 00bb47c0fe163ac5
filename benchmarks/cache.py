"""Prompt-cache cost: lcm against Hermes' own ``ContextCompressor`` on the same transcript, in
the same run, driven by the same host loop.

Providers cache the longest prompt prefix they saw recently; a cached token costs about a tenth
of a fresh one. So what a context engine costs is decided by how much of each request repeats
the previous one, and by what its summarizer reads. This phase replays a scripted agent
conversation (user turns, tool rounds with results of realistic, long-tailed sizes, answers)
through a host loop shaped like Hermes 0.19's: before every model call ``should_compress`` on
the request's size, ``compress`` when it says so, then the request, then
``update_from_response`` with the usage a caching provider would report. Both engines
summarize through Hermes' auxiliary client (``call_llm``), replaced here by a deterministic
stand-in that answers with as many tokens as it is asked for, and counts what it reads.

Per engine, window and variant it reports: the share of request bytes that repeat the previous
request's prefix, busted requests (less than half repeated), compaction bursts and turns per
burst after the first, summarizer calls and input tokens per 100 turns, the largest prompt
against the window, the input cost priced the way providers bill (a prefix repeated within the
cache TTL at 0.1, the rest and every summarizer input token at 1), and what is still
recoverable verbatim at the end. The ``idle`` variant puts a pause longer than the cache TTL
before every 10th turn: the cache is cold then whatever the engine does, and lcm compacts then
if it is over its target (``LCM_CACHE_TTL_SECONDS``).

Runs in the Hermes test venv (``hermes-agent`` with this checkout installed):
``python -m benchmarks --only cache`` finds or builds it (``tests/support/hermes_host.py``).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: Tokens the host sends besides its messages (tool schemas): part of every request's prefix.
OVERHEAD_TOKENS = 6_000
CACHE_TTL_S = 300
CACHED_PRICE = 0.1
#: Seconds a model call takes, and a person's pause between turns (drawn from this range).
CALL_SECONDS = 8
PAUSE_SECONDS = (20, 90)
#: The idle variant: a pause longer than the cache TTL before every IDLE_EVERY-th turn.
IDLE_EVERY = 10
IDLE_SECONDS = 1_200
WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")

WORDS = ("the deploy service config staging database port migration error trace request user "
         "build cache index query table schema worker queue retry timeout token session agent "
         "file path line function module test result value field record commit branch release "
         "server client latency memory disk network policy rollout metric alert log").split()


# --------------------------------------------------------------------------- the transcript

def _text(rng: random.Random, tokens: int, tag: str) -> str:
    words = [rng.choice(WORDS) for _ in range(max(1, tokens))]
    return f"{tag} " + " ".join(words)


def _sized(rng: random.Random, median: int, low: int, high: int) -> int:
    return int(min(high, max(low, rng.lognormvariate(0, 0.9) * median)))


@dataclass
class Turn:
    user: dict[str, Any]
    #: The model's answers in order: tool-call messages each followed by its result, then text.
    steps: list[tuple[dict[str, Any], dict[str, Any] | None]]


def script(turns: int, seed: int = 7) -> list[Turn]:
    """A coding agent's conversation: most turns call tools (0-8 rounds), tool results are
    long-tailed (median ~600 tokens, up to 8,000), answers 60-600 tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        user = {"role": "user", "content": _text(rng, _sized(rng, 80, 10, 600), f"[turn {i}] please")}
        rounds = rng.choices([0, 1, 2, 3, 5, 8], weights=[25, 25, 20, 15, 10, 5])[0]
        steps: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        for r in range(rounds):
            call_id = f"call_{i}_{r}"
            call = {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "terminal", "arguments": json.dumps({"command": _text(rng, 12, "run")})}}]}
            result = {"role": "tool", "tool_call_id": call_id,
                      "content": _text(rng, _sized(rng, 600, 40, 8_000), f"output {i}.{r}")}
            steps.append((call, result))
        steps.append(({"role": "assistant", "content": _text(rng, _sized(rng, 200, 60, 600), f"done {i}")}, None))
        out.append(Turn(user, steps))
    return out


SYSTEM = {"role": "system", "content": "You are a coding agent. " + _text(random.Random(1), 3_000, "rules")}


# --------------------------------------------------------------------------- the wire and the cache

def wire(message: dict[str, Any]) -> str:
    return json.dumps({k: message[k] for k in WIRE_KEYS if k in message}, ensure_ascii=False,
                      separators=(",", ":"))


class Tokens:
    """Tokens as the provider counts them (lcm's tiktoken counter), memoized per message."""

    def __init__(self) -> None:
        from lcm.tokens import TokenCounter

        self.counter = TokenCounter("bench-model")
        self.memo: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        found = self.memo.get(text)
        if found is None:
            found = self.memo[text] = self.counter.count_text(text)
        return found

    def request(self, wired: list[str]) -> int:
        return OVERHEAD_TOKENS + sum(self(w) for w in wired)


def repeated_prefix(previous: list[str], current: list[str], tokens: Tokens) -> tuple[int, int]:
    """(characters, tokens) of ``current`` that repeat the start of ``previous``."""
    chars, count = 0, 0
    for a, b in zip(previous, current, strict=False):
        if a == b:
            chars, count = chars + len(a), count + tokens(a)
            continue
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return chars + n, count + (tokens.counter.count_text(b[:n]) if n else 0)
    return chars, count


@dataclass
class Meter:
    """What one engine's requests and summarizer calls cost."""

    window: int
    tokens: Tokens
    requests: int = 0
    request_chars: int = 0
    repeated_chars: int = 0
    busted: int = 0
    largest_tokens: int = 0
    cost: float = 0.0
    cost_uncached: float = 0.0
    cache_read_tokens: int = 0
    prompt_tokens: int = 0
    summarizer_calls: int = 0
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    previous: list[str] = field(default_factory=list)
    previous_at: float | None = None

    def request(self, messages: list[dict[str, Any]], now: float) -> dict[str, int]:
        """Price one main request; the usage a caching provider would report for it."""
        current = [wire(m) for m in messages]
        chars = sum(len(c) for c in current)
        tokens = self.tokens.request(current)
        repeated, repeated_tokens = repeated_prefix(self.previous, current, self.tokens) if self.previous else (0, 0)
        warm = self.previous_at is not None and now - self.previous_at <= CACHE_TTL_S
        cached = OVERHEAD_TOKENS + repeated_tokens if warm else 0
        self.requests += 1
        if self.previous:
            self.request_chars += chars
            self.repeated_chars += repeated
            self.busted += repeated < chars / 2
        self.largest_tokens = max(self.largest_tokens, tokens)
        self.cost += CACHED_PRICE * cached + (tokens - cached)
        self.cost_uncached += tokens
        self.cache_read_tokens += cached
        self.prompt_tokens += tokens
        self.previous, self.previous_at = current, now
        return {"prompt_tokens": tokens, "completion_tokens": 200, "total_tokens": tokens + 200,
                "input_tokens": tokens - cached, "cache_read_tokens": cached, "cache_write_tokens": 0}

    def summarizer(self, input_tokens: int, output_tokens: int) -> None:
        self.summarizer_calls += 1
        self.summarizer_input_tokens += input_tokens
        self.summarizer_output_tokens += output_tokens
        self.cost += input_tokens
        self.cost_uncached += input_tokens


class FakeAuxiliaryLLM:
    """Stands in for Hermes' ``call_llm``: a summary of the size the caller asks for (lcm's
    "at most about N tokens", Hermes' "Target ~N tokens"), never more than a third of what it
    read."""

    def __init__(self, tokens: Tokens) -> None:
        self.meter: Meter | None = None
        self.tokens = tokens

    def __call__(self, **kwargs: Any) -> Any:
        prompt = "\n".join(str(m.get("content") or "") for m in kwargs.get("messages") or [])
        read = self.tokens.counter.count_text(prompt)
        asked = re.search(r"(?:Target ~|at most about |under )(\d+) tokens", prompt)
        want = int(asked.group(1)) if asked else int(kwargs.get("max_tokens") or 1_000)
        size = max(20, min(want, read // 3))
        if self.meter is not None:
            self.meter.summarizer(read, size)
        rng = random.Random(len(prompt))
        text = "Summary: " + " ".join(rng.choice(WORDS) for _ in range(size))
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])


# --------------------------------------------------------------------------- the host loop

@dataclass
class Clock:
    now: float = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def drive(engine: Any, turns: list[Turn], meter: Meter, clock: Clock, *, idle: bool,
          progress: Callable[[int], None] | None = None,
          recall: list[int] | None = None) -> tuple[list[dict[str, Any]], int, int | None]:
    """The host loop; (the final context, compaction bursts, the turn of the first burst).

    ``recall`` (a list, filled with each turn's block size): lcm's auto-recall block is added to
    the API copy of each user message, as Hermes adds ``pre_llm_call`` context, and replayed
    with it on later requests until a compaction hands back a new list (Hermes' ``api_content``)."""
    rng = random.Random(11)
    messages: list[dict[str, Any]] = [SYSTEM]
    api: dict[int, dict[str, Any]] = {}  # id of a held user message -> the copy sent for it
    bursts, first = 0, None
    for i, turn in enumerate(turns):
        clock.now += IDLE_SECONDS if idle and i and i % IDLE_EVERY == 0 else rng.uniform(*PAUSE_SECONDS)
        if recall is not None:
            block = engine.recall(turn.user, messages)
            recall.append(block.tokens)
            if block.text:
                api[id(turn.user)] = {**turn.user, "content": f"{turn.user['content']}\n\n{block.text}"}
        messages = [*messages, turn.user]
        for answer, result in turn.steps:
            tokens = meter.tokens.request([wire(api.get(id(m), m)) for m in messages])
            if engine.should_compress(tokens):
                compacted = engine.compress(messages, current_tokens=tokens)
                if compacted is not messages and compacted != messages:
                    bursts += 1
                    first = i if first is None else first
                messages = compacted
            usage = meter.request([api.get(id(m), m) for m in messages], clock.now)
            clock.now += CALL_SECONDS
            engine.update_from_response(usage)
            messages = [*messages, answer] + ([result] if result is not None else [])
        if progress is not None:
            progress(i)
    return messages, bursts, first


def _hermes_compressor(window: int) -> Any:
    from agent.context_compressor import ContextCompressor

    # Hermes' defaults (compression.threshold 0.50, raised to 0.75 under a 512k window by
    # Hermes itself; target_ratio 0.20; protect_last_n 20).
    return ContextCompressor("bench-model", threshold_percent=0.50, protect_first_n=3, protect_last_n=20,
                             summary_target_ratio=0.20, quiet_mode=True, config_context_length=window)


def _lcm_engine(url: str, window: int, clock: Clock, env: dict[str, str], name: str) -> Any:
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine

    config = LcmConfig.from_env(env, database_url=url, agent_id=f"bench-{window}-{name}")
    engine = LcmEngine(config, inside_hermes=True)
    engine.context.clock = clock
    engine.update_model("bench-model", window)
    return engine


def _sent(turns: list[Turn]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in turns:
        out.append(t.user)
        for answer, result in t.steps:
            out.append(answer)
            if result is not None:
                out.append(result)
    return out


def _report(meter: Meter, turns: int, bursts: int, first: int | None, window: int) -> dict[str, Any]:
    steady = turns - first - 1 if first is not None else 0
    return {
        "requests": meter.requests,
        "repeated_share": meter.repeated_chars / max(1, meter.request_chars),
        "busted": meter.busted, "bursts": bursts,
        "turns_per_burst": steady / (bursts - 1) if bursts > 1 else None,
        "summarizer_calls_per_100": 100 * meter.summarizer_calls / turns,
        "summarizer_input_per_100": 100 * meter.summarizer_input_tokens / turns,
        "summarizer_output_per_100": 100 * meter.summarizer_output_tokens / turns,
        "largest_prompt_share": meter.largest_tokens / window,
        "cost": meter.cost, "cost_uncached": meter.cost_uncached,
        "cost_cached_part": CACHED_PRICE * meter.cache_read_tokens,
        "cost_fresh_part": meter.prompt_tokens - meter.cache_read_tokens,
        "cost_summarizer_part": meter.summarizer_input_tokens,
        "mean_prompt_tokens": meter.prompt_tokens / max(1, meter.requests),
        "cache_read_tokens": meter.cache_read_tokens,
    }


def run_pair(url: str, *, turns: int, window: int, idle: bool, progress: bool = False,
             lcm_env: dict[str, str] | None = None, seed: int = 7,
             sweep: tuple[float, ...] = ()) -> dict[str, Any]:
    """Both engines on one window and variant; with ``sweep``, lcm again at each of those
    compaction targets (``LCM_COMPACTION_TARGET``) against the same Hermes run."""
    import agent.auxiliary_client
    import agent.context_compressor

    tokens = Tokens()
    llm = FakeAuxiliaryLLM(tokens)
    agent.context_compressor.call_llm = llm  # Hermes' compressor imported it by name
    agent.auxiliary_client.call_llm = llm  # lcm's Hermes route imports it when it calls
    conversation = script(turns, seed)
    sent = _sent(conversation)
    out: dict[str, Any] = {"window": window, "idle": idle, "turns": turns, "seed": seed}

    def tick(label: str) -> Callable[[int], None] | None:
        if not progress:
            return None
        return lambda i: print(f"  {label} {window // 1000}k{' idle' if idle else ''}: turn {i + 1}/{turns}",
                               end="\r", flush=True)

    meter, clock = Meter(window, tokens), Clock()
    llm.meter = meter
    hermes = _hermes_compressor(window)
    final, bursts, first = drive(hermes, conversation, meter, clock, idle=idle, progress=tick("hermes"))
    kept = {wire(m) for m in final}
    out["hermes"] = {**_report(meter, turns, bursts, first, window),
                     "recoverable_share": sum(wire(m) in kept for m in sent) / len(sent)}

    def lcm_side(env: dict[str, str], name: str, recall: list[int] | None = None) -> dict[str, Any]:
        meter, clock = Meter(window, tokens), Clock()
        llm.meter = meter
        engine = _lcm_engine(url, window, clock, env, name)
        session = f"cache-{window}-{int(idle)}"
        engine.on_session_start(session)
        final, bursts, first = drive(engine, conversation, meter, clock, idle=idle, progress=tick(f"lcm {name}"),
                                     recall=recall)
        engine.on_session_end(session, final)
        stored = [r.message for r in engine.store.messages.get_range(engine.session.id)]
        status = json.loads(engine.handle_tool_call("lcm_status", {}))
        return {**_report(meter, turns, bursts, first, window),
                "target_tokens": status["target_tokens"],
                "recoverable_share": sum(a == b for a, b in zip(stored, sent, strict=False)) / len(sent),
                "stored_exactly": stored == sent,
                "reported_cache_read_share": status["cache"]["cache_read_share"]}

    out["lcm"] = lcm_side(lcm_env or {}, "default")
    out["cost_ratio"] = out["lcm"]["cost"] / out["hermes"]["cost"]
    blocks: list[int] = []
    with_recall = lcm_side(lcm_env or {}, "recall", recall=blocks)
    out["auto_recall"] = {"cost_ratio_vs_lcm": with_recall["cost"] / out["lcm"]["cost"],
                          "cost_ratio_vs_hermes": with_recall["cost"] / out["hermes"]["cost"],
                          "block_tokens_per_turn": sum(blocks) / max(1, len(blocks)),
                          "turns_with_block": sum(1 for b in blocks if b) / max(1, len(blocks)),
                          "repeated_share": with_recall["repeated_share"],
                          "stored_exactly": with_recall["stored_exactly"]}
    out["sweep"] = []
    for target in sweep:
        side = lcm_side({**(lcm_env or {}), "LCM_COMPACTION_TARGET": str(target)}, f"t{target}")
        out["sweep"].append({"target": target, "cost_ratio": side["cost"] / out["hermes"]["cost"],
                             **{k: side[k] for k in ("repeated_share", "busted", "bursts", "turns_per_burst",
                                                     "summarizer_input_per_100", "mean_prompt_tokens",
                                                     "largest_prompt_share", "stored_exactly")}})
    if progress:
        print(" " * 60, end="\r")
    return out


def cases(windows: list[int]) -> Iterator[tuple[int, bool]]:
    for window in windows:
        for idle in (False, True):
            yield window, idle


#: Compaction targets lcm is also run at (without idle gaps): how the default was chosen.
SWEEP = (0.25, 0.3, 0.4, 0.5)


def run(backend: str, url: str, *, turns: int = 400, windows: list[int] | None = None,
        sweep: list[float] | None = None) -> dict[str, Any]:
    """The phase on one backend: every window, with and without idle gaps; the target sweep on
    the runs without them."""
    from lcm.store import Store

    Store.open(url, upgrade=True)  # a PostgreSQL schema is never upgraded implicitly
    targets = tuple(SWEEP if sweep is None else sweep)
    rows = [run_pair(url, turns=turns, window=w, idle=idle, sweep=() if idle else targets)
            for w, idle in cases(windows or [64_000, 200_000])]
    return {"rows": rows}


def main() -> None:
    """A quick look without the harness, one seed: ``python -m benchmarks.cache --seed 2``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seed", type=int, default=7, help="the scripted conversation's seed")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--target", type=float, help="LCM_COMPACTION_TARGET (default: lcm's)")
    args = parser.parse_args()
    env = {"LCM_COMPACTION_TARGET": str(args.target)} if args.target else {}
    with tempfile.TemporaryDirectory() as tmp:
        for w, idle in cases([64_000, 200_000]):
            r = run_pair(f"sqlite:///{Path(tmp) / f'c{w}{idle}.db'}", turns=args.turns, window=w, idle=idle,
                         progress=True, lcm_env=env, seed=args.seed)
            print(f"{w // 1000}k{' idle' if idle else ''}: cost ratio {r['cost_ratio']:.3f}, repeated prefix "
                  f"lcm {r['lcm']['repeated_share']:.1%} / hermes {r['hermes']['repeated_share']:.1%}, "
                  f"turns per burst lcm {r['lcm']['turns_per_burst']} / hermes {r['hermes']['turns_per_burst']}, "
                  f"stored exactly {r['lcm']['stored_exactly']}")


if __name__ == "__main__":
    main()
