"""``lcm proxy``: what it adds to a request, against the same client talking to the upstream
directly, in the same run.

Three processes: a scripted OpenAI-compatible upstream (``tests/support/llm_server.py``: a
fixed 60-token answer, streamed as 200-character chunks when asked), the real ``lcm proxy``
command (twice: with auto-recall, the default, and with ``LCM_AUTO_RECALL=false``), and this
one as the client (httpx, one keep-alive connection per target). The store holds ``stored``
messages of the proxy's agent before the measured conversation starts (bulk-loaded, as a long
history of other sessions); the measured conversation re-sends its whole history every request,
as chat clients do, and grows by one turn each time, far below the window (no compaction).

Per request, interleaved so that noise hits every target alike: the direct call, then each
proxy. Reported: latency of a non-streamed request and time to the first streamed content
chunk, p50/p95, and what the proxy adds (its p50 minus the direct p50; goal ≤ 5 ms at 100k
stored messages). Then throughput (requests/s, every client its own conversation) at 1-64
concurrent clients for ``seconds`` each, proxy against direct, with the errors counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from benchmarks.common import append_messages, summary_ms
from benchmarks.corpus import Corpus
from lcm.store import Store

AGENT = "bench"
HISTORY_TURNS = 10  # the measured conversation's turns before the first measured request
ANSWER = " ".join(["token"] * 60)  # what the scripted upstream answers
_UPSTREAM = """
import sys, time
from tests.support.llm_server import ScriptedLLM, completion
answer = completion(" ".join(["token"] * 60), prompt_tokens=500, completion_tokens=60)
server = ScriptedLLM(handler=lambda body: answer)
print(server.url, flush=True)
sys.stdin.read()
"""


class _Process:
    """A child process that prints its base URL (first line, or a JSON object) and serves."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, **(env or {})}, cwd=os.getcwd())
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if first.startswith("{"):
            lines = [first]
            while not lines[-1].startswith("}"):
                lines.append(self.process.stdout.readline())
            self.url = json.loads("".join(lines))["base_url"]
        else:
            self.url = first.strip()
        if not self.url:
            raise RuntimeError(f"{command[:4]} did not start")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _preload(url: str, stored: int) -> None:
    store = Store.open(url, upgrade=True)
    corpus = Corpus()
    per_session = 2_000
    for s in range(max(1, stored // per_session)):
        session = store.sessions.get_or_create(AGENT, f"history-{s}")
        anchor = None
        turns = list(corpus.turns(min(per_session, stored) // 4, session=f"h{s}"))
        for b in range(0, len(turns), 100):
            batch = [m for t in turns[b:b + 100] for m in t]
            anchor = append_messages(store, session.id, batch, after_identity=anchor).last_identity
    store.health.optimize()


def _conversation(turns: int, key: str) -> list[dict[str, Any]]:
    """A chat (user and assistant text) of ``turns`` turns: the client's re-sent history."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in Corpus(seed=11).turns(turns, session=key):
        out += [turn[0], {"role": "assistant", "content": turn[3]["content"]}]
    return out


def _request(client: httpx.Client, base: str, history: list[dict[str, Any]], key: str, stream: bool) -> float:
    """Milliseconds to the whole answer (or, streamed, to its first content chunk)."""
    body = {"model": "gpt-4o", "messages": history, "stream": stream}
    headers = {"Authorization": "Bearer sk-bench", "X-LCM-Session": key, "X-LCM-Agent": AGENT}
    started = time.perf_counter()
    if not stream:
        answer = client.post(base + "/chat/completions", json=body, headers=headers)
        answer.raise_for_status()
        return (time.perf_counter() - started) * 1000
    first = None
    with client.stream("POST", base + "/chat/completions", json=body, headers=headers) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line.replace(" ", "") \
                    and '"content":""' not in line.replace(" ", ""):
                first = (time.perf_counter() - started) * 1000
    return first if first is not None else (time.perf_counter() - started) * 1000


def _cache_marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as a prompt-caching client sends it (Cline, Roo Code, Hermes through a
    gateway): ``cache_control`` on the system prompt and on the last two user messages, which
    then go as one text part; the marks move on with every request."""
    users = [i for i, m in enumerate(history) if m["role"] == "user"][-2:]
    mark = {"cache_control": {"type": "ephemeral"}}
    return [{**m, "content": [{"type": "text", "text": m["content"], **mark}]}
            if i in users or m["role"] == "system" else m for i, m in enumerate(history)]


#: A client that re-encodes what it re-sends, measured through the proxy without auto-recall.
MARKING_CLIENT = "proxy, no auto-recall, moving cache marks"


def _latency(targets: dict[str, str], runs: int, tag: str) -> dict[str, Any]:
    """Interleaved requests to every target; each target's conversation grows alike. ``tag``
    names this measurement's conversations: a conversation of an earlier measurement re-sent
    under its old key would be a replay of what is stored (another path, see docs/proxy.md).
    The :data:`MARKING_CLIENT` target sends its history as :func:`_cache_marked` makes it."""
    clients = {name: httpx.Client(timeout=60) for name in targets}
    times: dict[str, dict[str, list[float]]] = {name: {"request": [], "first_chunk": []} for name in targets}
    histories = {name: _conversation(HISTORY_TURNS, "measured") for name in targets}
    extra = Corpus(seed=12)
    try:
        def sent(name: str) -> list[dict[str, Any]]:
            return _cache_marked(histories[name]) if name == MARKING_CLIENT else histories[name]

        for name, base in targets.items():  # warm-up: connections, the proxy's conversation and caches
            _request(clients[name], base, sent(name), f"measured-{tag}-{name}", False)
            histories[name].append({"role": "assistant", "content": ANSWER})
        for i, turn in enumerate(extra.turns(runs, session="more")):
            stream = i % 2 == 1
            for name, base in targets.items():
                histories[name] = [*histories[name], turn[0]]
                ms = _request(clients[name], base, sent(name), f"measured-{tag}-{name}", stream)
                times[name]["first_chunk" if stream else "request"].append(ms)
                histories[name].append({"role": "assistant", "content": ANSWER})
    finally:
        for client in clients.values():
            client.close()
    out: dict[str, Any] = {name: {k: summary_ms(v) for k, v in t.items()} for name, t in times.items()}
    return out


def _throughput(targets: dict[str, str], clients: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"clients": clients}
    for name, base in targets.items():
        done = [0] * clients
        errors = [0] * clients
        first_errors: list[str] = []
        # Every client is made (its HTTP client, its conversation) before the clock starts: on a
        # slow VM, 64 of them took longer than the whole measuring window, which then counted
        # almost no requests over the set-up's seconds.
        ready = threading.Barrier(clients + 1)
        go = threading.Event()
        window: list[float] = []

        def worker(i: int, base: str = base, name: str = name, ready: threading.Barrier = ready,
                   go: threading.Event = go, window: list[float] = window, done: list[int] = done,
                   errors: list[int] = errors, first_errors: list[str] = first_errors) -> None:
            history = _conversation(3, f"t{i}")
            with httpx.Client(timeout=120) as http:
                ready.wait()
                go.wait()
                stop = window[0]
                while time.perf_counter() < stop:
                    history.append({"role": "user", "content": f"client {i} request {done[i]}"})
                    try:
                        _request(http, base, history, f"tp-{name}-{clients}-{i}", False)
                        done[i] += 1
                    except httpx.HTTPError as exc:
                        errors[i] += 1
                        if len(first_errors) < 3:  # what failed, kept for the report
                            body = exc.response.text[:300] if isinstance(exc, httpx.HTTPStatusError) else ""
                            first_errors.append(f"{type(exc).__name__}: {exc} {body}".strip())
                    history.append({"role": "assistant", "content": ANSWER})

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        ready.wait()  # every client made
        started = time.perf_counter()
        window.append(started + seconds)
        go.set()
        for t in threads:
            t.join()
        out[name] = {"requests_per_s": sum(done) / (time.perf_counter() - started), "errors": sum(errors),
                     "first_errors": first_errors}
    return out


def _proxy(upstream: str, url: str, **env: str) -> _Process:
    """A real ``lcm proxy`` on a free port; the default install's search (no vectors) unless
    ``env`` says otherwise: a store bulk-loaded here has no vectors, and a proxy with
    embeddings on would spend the run embedding it in the background (28 long messages a
    second on this machine), which is not a request's cost."""
    return _Process([sys.executable, "-m", "lcm", "proxy", "--upstream", upstream, "--url", url, "--port", "0",
                     "--json", "--agent", AGENT], env={"LCM_EMBEDDINGS": "off", **env})


def _embed(url: str) -> None:
    """Vectors for everything stored (``lcm embed``), so a proxy with embeddings on searches
    them as a store that has caught up would."""
    subprocess.run([sys.executable, "-m", "lcm", "embed", "--url", url, "--json"], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "LCM_EMBEDDINGS": "local"})


def _semantic_available() -> bool:
    """Whether the ``[semantic]`` extra's local model loads here."""
    from lcm.config import LcmConfig
    from lcm.context.embed import embedder_for
    try:
        return embedder_for(LcmConfig(embeddings="local")) is not None
    except Exception:  # noqa: BLE001 - the extra is not installed: no such row
        return False


def run(backend: str, url: str, *, sizes: list[int], runs: int = 60, concurrency: list[int] | None = None,
        seconds: float = 10.0, semantic_max_stored: int = 1_000) -> dict[str, Any]:
    """Latency at each stored size (both backends), then throughput (PostgreSQL only: SQLite
    is one writer, and the fleet benchmark covers many writers on it). Up to
    ``semantic_max_stored`` stored messages (embedded first), also a proxy with the
    ``[semantic]`` extra's local model (hybrid auto-recall), when it is installed."""
    upstream = _Process([sys.executable, "-c", _UPSTREAM])
    results: list[dict[str, Any]] = []
    stored_so_far = 0
    proxies: list[_Process] = []
    semantic = _semantic_available()
    try:
        for size in sizes:
            _preload(url, size - stored_so_far)
            stored_so_far = size
            proxies = [_proxy(upstream.url, url, LCM_AUTO_RECALL="true"),
                       _proxy(upstream.url, url, LCM_AUTO_RECALL="false")]
            targets = {"direct": upstream.url, "proxy": proxies[0].url, "proxy, no auto-recall": proxies[1].url,
                       MARKING_CLIENT: proxies[1].url}
            measured = _latency(targets, runs, f"{size}")
            added = {name: {k: measured[name][k]["p50"] - measured["direct"][k]["p50"]
                            for k in ("request", "first_chunk")} for name in targets if name != "direct"}
            if semantic and size <= semantic_max_stored:
                # Apart, with its own direct baseline: its background indexer embeds each new
                # message (tens of ms of CPU), which would slow every target interleaved with it.
                _embed(url)
                proxies.append(_proxy(upstream.url, url, LCM_AUTO_RECALL="true", LCM_EMBEDDINGS="local"))
                apart = _latency({"direct": upstream.url, "proxy, [semantic]": proxies[-1].url}, runs,
                                 f"{size}-semantic")
                measured["proxy, [semantic]"] = apart["proxy, [semantic]"]
                added["proxy, [semantic]"] = {k: apart["proxy, [semantic]"][k]["p50"] - apart["direct"][k]["p50"]
                                              for k in ("request", "first_chunk")}
            results.append({"stored": size, "latency": measured, "added_p50_ms": added})
            for p in proxies:
                p.close()
            proxies = []
        throughput: list[dict[str, Any]] = []
        if backend == "postgresql" and concurrency:
            proxies = [_proxy(upstream.url, url)]
            for clients in concurrency:
                throughput.append(_throughput({"direct": upstream.url, "proxy": proxies[0].url}, clients, seconds))
    finally:
        for p in proxies:
            p.close()
        upstream.close()
    return {"sizes": results, "throughput": throughput}

