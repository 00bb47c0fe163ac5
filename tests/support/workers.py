"""Code run in separate processes by the concurrency and crash tests (spawned, so importable)."""

from __future__ import annotations

import os
import signal
import sys
import time

from lcm.records import NewSummary
from lcm.store import Store
from tests.support.storing import append_messages


def turn(worker: str, i: int) -> list[dict]:
    """One 4-message turn with a tool call, a unique token, and a repeated 'ok'."""
    call = f"call_{worker}_{i}"
    return [
        {"role": "user", "content": f"turn {i} from {worker}: token{worker}x{i}"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "shell", "arguments": f"{{\"i\": {i}}}"}}]},
        {"role": "tool", "tool_call_id": call, "content": f"result {i}"},
        {"role": "assistant", "content": "ok"},
    ]


def wait_until(start_at: float | None) -> None:
    """Start together: spawned processes come up at different times."""
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))


def append_turns(url: str, agent: str, session_key: str, worker: str, turns: int,
                 start_at: float | None = None) -> int:
    """Append ``turns`` turns, each in its own transaction, as a host would."""
    store = Store.open(url)
    session = store.sessions.get_or_create(agent, session_key)
    wait_until(start_at)
    anchor = None
    for i in range(turns):
        result = append_messages(store, session.id, turn(worker, i), after_identity=anchor)
        anchor = result.last_identity
    return turns


def resend_transcript(url: str, agent: str, session_key: str, turns: int,
                      start_at: float | None = None) -> int:
    """Ingest a growing transcript, re-sending everything each time (a restarted host)."""
    store = Store.open(url)
    session = store.sessions.get_or_create(agent, session_key)
    wait_until(start_at)
    transcript: list[dict] = []
    for i in range(turns):
        transcript.extend(turn("shared", i))
        append_messages(store, session.id, transcript)
    return turns


def open_store(url: str) -> str:
    return Store.open(url).health.check_schema().status


def crash_during_summary(url: str) -> None:
    """Write messages, then die (SIGKILL) after the summary row is written, before its edges."""
    store = Store.open(url)
    session = store.sessions.get_or_create("agent-a", "crash")
    ids = append_messages(store, session.id, [{"role": "user", "content": f"m{i}"} for i in range(8)]).store_ids

    def die(step: str) -> None:
        if step == "summary_inserted":
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    store.fault_hook = die
    store.summaries.write(session.id, NewSummary(depth=0, content="doomed", token_count=1,
                                               source_ids=tuple(ids[:4]), kind="extractive"))


def _engine(url: str):
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine

    engine = LcmEngine(LcmConfig.from_env({}, database_url=url))
    engine.update_model("test-model", 10_000_000)
    return engine


def host_same_transcript(url: str, session_key: str, turns: int, seed: int,
                         start_at: float | None = None) -> int:
    """A host process growing the shared transcript turn by turn, at its own pace, sometimes
    restarting (a new engine with no memory) or sending a copied list."""
    import random

    rng = random.Random(seed)
    engine = _engine(url)
    engine.on_session_start(session_key)
    wait_until(start_at)
    transcript: list[dict] = [{"role": "system", "content": "shared system"}]
    for i in range(turns):
        if rng.random() < 0.3:
            transcript = transcript + turn("shared", i)  # a new list, as a restarted host sends
        else:
            transcript.extend(turn("shared", i))
        if rng.random() < 0.1:
            engine = _engine(url)
            engine.on_session_start(session_key)
        engine.on_turn_complete(transcript)
        time.sleep(rng.random() * 0.01)
    return turns


def host_own_transcript(url: str, session_key: str, worker: str, turns: int,
                        start_at: float | None = None) -> tuple[str, str]:
    """A host that shares the first turn with the others, then says its own things."""
    engine = _engine(url)
    engine.on_session_start(session_key)
    transcript: list[dict] = [{"role": "system", "content": "shared system"}, *turn("common", 0)]
    engine.on_turn_complete(transcript)
    wait_until(start_at)
    for i in range(1, turns):
        transcript.extend(turn(worker, i))
        engine.on_turn_complete(transcript)
    return worker, engine.session.session_key


def host_with_compaction(url: str, session_key: str, turns: int) -> None:
    """A host that compacts on a small window, re-sending its whole transcript from the start
    (what a restarted host does): run again and again, killed at random points."""
    from lcm.config import LcmConfig
    from lcm.engine import LcmEngine
    from tests.conftest import SMALL_ENGINE

    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, **SMALL_ENGINE))
    engine.update_model("test-model", 3000)
    engine.on_session_start(session_key)
    transcript: list[dict] = [{"role": "system", "content": "kill test"}]
    for i in range(turns):
        transcript = transcript + turn("k", i)
        transcript = engine.compress(transcript)  # the host keeps what lcm hands back
        print(i, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "host-with-compaction":
        host_with_compaction(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        crash_during_summary(sys.argv[1])
