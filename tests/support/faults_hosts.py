"""Hosts that hold lcm's context, several on one session, in real processes (issue 30).

A real host (Hermes) keeps the list that ``compress()`` returned (lcm's summary messages, cut
copies of huge messages, the verbatim tail) and appends its new turns to that list; a
restarted host reloads the list it persisted. Other hosts re-send their whole raw history. Here
two or three such hosts, each in its own spawned process with its own engine, write one
session of one agent at once, with real compaction on a small window (extractive summaries)
and random jitter between messages, so compactions race and hosts overtake each other:

* ``agree``: every host speaks the same conversation. Expected: one session, every message
  exactly once, in order, no fork.
* ``diverge``: the hosts share the first turns, then each says its own things. Expected: each
  host's conversation whole and in order along one line of sessions (the session up to the
  fork point, then its fork), each message stored once, no session mixing two hosts.

Each run is counted as expected / stored / lost / duplicated / misplaced (a message in a
session it should not be in: any fork of an ``agree`` run, another host's line in a
``diverge`` run), plus ``foreign``: messages lcm handed a host that the host never had (the
cause of issue 30: a host that holds such a list sends them back as its own). All but the
first two must be zero.

    python -m tests.support.faults_hosts --url sqlite:////tmp/h.db --runs 10 --turns 60 [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.support.storing import family_of, lineage_of, stored_rows

#: The window every host runs with: compaction every few turns.
WINDOW = 4000
#: Every this many turns a tool result far larger than the window (handed back cut).
BIG_EVERY = 23
SYSTEM = {"role": "system", "content": "You are one of several hosts on this conversation."}


def turn(tag: str, i: int) -> list[dict[str, Any]]:
    """One 4-message turn of conversation ``tag``: user, tool call, tool result, reply. Every
    third reply is a bare "ok" (people and models repeat themselves); every ``BIG_EVERY``-th
    result is larger than the window."""
    call = f"call_{tag}_{i}"
    result = (f"log line {i} of {tag}: " * 2500) if i % BIG_EVERY == BIG_EVERY - 1 else (
        f"result {i} of {tag}: " + "lorem ipsum dolor sit amet " * 12)
    reply = "ok" if i % 3 == 2 else f"step {i} of {tag} is done: " + "the answer in words " * 6
    return [
        {"role": "user", "content": f"question {i} from {tag}: do step {i} (token{tag}x{i})"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "shell", "arguments": json.dumps({"i": i})}}]},
        {"role": "tool", "tool_call_id": call, "content": result},
        {"role": "assistant", "content": reply},
    ]


@dataclass(frozen=True)
class Host:
    """One host of a run: ``view`` holds what lcm hands it, ``raw`` re-sends its raw history."""

    name: str
    mode: str  # "view" or "raw"
    seed: int
    jitter: float = 0.002  # seconds, at most, between two messages
    pause: float = 0.02  # seconds, at most, between two turns (so hosts overtake each other)
    restart: float = 0.05  # chance per turn of a restart (a new engine; a view host reloads its list)
    own_from: int | None = None  # the turn from which it says its own things (None: never)

    def script(self, turns: int) -> list[dict[str, Any]]:
        """Every message this host's conversation holds, in order."""
        return [m for i in range(turns) for m in turn(self.tag(i), i)]

    def tag(self, i: int) -> str:
        return self.name if self.own_from is not None and i >= self.own_from else "shared"


def _engine(url: str, key: str) -> Any:
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine

    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, summarizer="extractive", embeddings="off"))
    engine.update_model("test-model", WINDOW)
    engine.on_session_start(key)
    return engine


def _estimate(messages: Sequence[dict[str, Any]]) -> int:
    """The host's rough size of a request (what Hermes passes as ``current_tokens``)."""
    return sum(len(json.dumps(m)) // 4 for m in messages)


def _foreign(handed: Sequence[dict[str, Any]], had: Sequence[dict[str, Any]]) -> int:
    """Messages in ``handed`` (lcm's answer) that are not a verbatim suffix of what the host had
    (lcm's own summary messages and cut copies aside): each one the host would send back as
    its own."""
    from lcm.transcript import CUT_NOTE, is_lcm_summary

    verbatim = [m for m in handed if m.get("role") != "system" and not is_lcm_summary(m)]
    if not verbatim:
        return 0
    tail = had[len(had) - len(verbatim):] if len(verbatim) <= len(had) else []
    bad = 0
    for i, m in enumerate(verbatim):
        mine = tail[i] if i < len(tail) else None
        if mine is None:
            bad += 1
        elif m != mine and not (CUT_NOTE in str(m.get("content")) and m.get("role") == mine.get("role")
                                and m.get("tool_call_id") == mine.get("tool_call_id")):
            bad += 1
    return bad


def run_host(url: str, key: str, host: Host, turns: int, start_at: float) -> dict[str, Any]:
    """Drive one host (in its own process) through ``turns`` turns, as Hermes does: each
    message appended to the list it holds, ``compress()`` when ``should_compress`` says so (and
    now and then unasked), the list it gets back kept (``view``) or ignored (``raw``), and
    ``on_turn_complete`` at the end of each turn."""
    from tests.support.conversation import sequence_problems

    rng = random.Random(host.seed)
    engine = _engine(url, key)
    time.sleep(max(0.0, start_at - time.time()))
    had: list[dict[str, Any]] = []  # the host's raw conversation
    held: list[dict[str, Any]] = [SYSTEM]  # the list it sends
    foreign = invalid = over = 0
    for i in range(turns):
        if i and rng.random() < host.restart:
            engine = _engine(url, key)  # a new process: no memory; it reloads what it persisted
            held = copy.deepcopy(held)
        for m in turn(host.tag(i), i):
            had.append(m)
            held.append(m)  # in place, as Hermes appends
            tokens = _estimate(held)
            if m["role"] == "assistant":
                engine.update_from_response({"prompt_tokens": tokens, "completion_tokens": 20})
            if engine.should_compress(tokens) or rng.random() < 0.25:
                out = engine.compress(held, current_tokens=tokens)
                foreign += _foreign(out, had)
                over += host.mode == "view" and _estimate(out) > WINDOW
                invalid += bool(sequence_problems(out, SYSTEM))
                if host.mode == "view":
                    held = out
            time.sleep(rng.random() * host.jitter)
        engine.on_turn_complete(held)
        time.sleep(rng.random() * host.pause)
    return {"host": host.name, "session_key": engine.session.session_key, "foreign": foreign,
            "invalid": invalid, "over_window": over, "last_error": engine.context.last_error}


@dataclass
class Figures:
    scenario: str
    hosts: str
    expected: int
    stored: int
    lost: int
    duplicated: int
    misplaced: int
    forks: int
    forks_expected: int
    foreign: int
    invalid: int
    over_window: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.misplaced or self.foreign or self.invalid or self.errors
                    or self.over_window or self.forks != self.forks_expected)


def _key(m: dict[str, Any]) -> str:
    return json.dumps(m, sort_keys=True)


def _tree(scripts: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The messages of several conversations that share beginnings, each shared prefix once
    (what should be stored: the shared part once, then each conversation's own part)."""
    seen: set[int] = set()
    out = []
    for script in scripts:
        chain = 0
        for m in script:
            chain = hash((chain, _key(m)))
            if chain not in seen:
                seen.add(chain)
                out.append(m)
    return out


def run(url: str, hosts: Sequence[Host], turns: int, executor: Executor, *, key: str | None = None) -> Figures:
    """One run: the hosts on one new session at once; what was stored, counted."""
    from lcm.store import Store

    Store.open(url, upgrade=True)
    key = key or f"s-{time.time_ns()}"
    start_at = time.time() + 0.5
    futures = [executor.submit(run_host, url, key, h, turns, start_at) for h in hosts]
    results = [f.result(timeout=600) for f in futures]
    store = Store.open(url)
    sessions = family_of(store, "default", key)
    stored = [m for s in sessions for m in stored_rows(store, s)]
    scripts = {h.name: h.script(turns) for h in hosts}
    agree = all(h.own_from is None for h in hosts)
    if agree:
        expected = scripts[hosts[0].name]
        misplaced = sum(s.message_count for s in sessions if s.parent_id is not None)
        main = stored_rows(store, sessions[0])
        misplaced += sum(1 for a, b in zip(main, expected, strict=False) if a != b)
    else:
        expected = _tree(scripts.values())
        misplaced = 0
        for r in results:
            line = lineage_of(store, store.sessions.find("default", r["session_key"]))
            want = scripts[r["host"]]
            misplaced += sum(1 for a, b in zip(line, want, strict=False) if a != b) + abs(len(line) - len(want))
    want, have = Counter(map(_key, expected)), Counter(map(_key, stored))
    doctor = [f"doctor: {c.name} {c.status}: {c.detail}" for c in store.health.checks()
              if c.status == "fail" or (c.status == "warn" and c.name in ("duplicate_messages", "fork_repeats"))]
    return Figures(
        scenario="agree" if agree else "diverge", hosts="+".join(h.mode for h in hosts),
        expected=len(expected), stored=len(stored), lost=sum((want - have).values()),
        duplicated=sum((have - want).values()), misplaced=misplaced, forks=len(sessions) - 1,
        forks_expected=len({json.dumps(script, sort_keys=True) for script in scripts.values()}) - 1,
        foreign=sum(r["foreign"] for r in results), invalid=sum(r["invalid"] for r in results),
        over_window=sum(r["over_window"] for r in results),
        errors=[f"{r['host']}: {r['last_error']}" for r in results if r["last_error"]] + doctor)


def hosts_for(seed: int, scenario: str) -> list[Host]:
    """The hosts of one seeded run: two or three, view holders and raw re-senders mixed (most
    runs all view holders, the case of issue 30)."""
    rng = random.Random(seed)
    n = rng.choice((2, 2, 3))
    modes = ["view"] * n if rng.random() < 0.5 else [rng.choice(("view", "view", "raw")) for _ in range(n)]
    if "view" not in modes:
        modes[0] = "view"
    hosts = []
    for k, mode in enumerate(modes):
        own_from = rng.randint(3, 9) if scenario == "diverge" else None
        hosts.append(Host(name=f"h{k}", mode=mode, seed=seed * 100 + k,
                          jitter=rng.choice((0.001, 0.002, 0.004)), pause=rng.choice((0.03, 0.06)),
                          own_from=own_from))
    return hosts


def pool(workers: int = 3) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def run_many(url: str, seeds: Iterable[int], scenario: str, turns: int, executor: Executor) -> list[Figures]:
    return [run(url, hosts_for(seed, scenario), turns, executor, key=f"{scenario}-{seed}-{time.time_ns()}")
            for seed in seeds]


def main() -> None:
    from lcm.store import connection as db

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--runs", type=int, default=10, help="seeded runs per scenario")
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[Figures] = []
    with pool() as executor:
        for scenario in ("agree", "diverge"):
            rows += run_many(args.url, range(args.runs), scenario, args.turns, executor)
    backend = db.resolve_url(args.url).get_backend_name()
    db.dispose(db.resolve_url(args.url))
    if args.json:
        print(json.dumps({"backend": backend, "rows": [asdict(r) for r in rows]}, indent=2))
        return
    print(f"backend: {backend}, {args.turns} turns per host")
    print("| scenario | hosts | expected | stored | lost | duplicated | misplaced | forks (expected) | foreign "
          "| over the window | invalid |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.scenario} | {r.hosts} | {r.expected} | {r.stored} | {r.lost} | {r.duplicated} "
              f"| {r.misplaced} | {r.forks} ({r.forks_expected}) | {r.foreign} | {r.over_window} | {r.invalid} |")


if __name__ == "__main__":
    main()
