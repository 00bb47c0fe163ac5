"""The local model embeds a token sequence once while its vector is recent or being computed:
auto-recall's query and the background indexer both embed a user message within milliseconds
of each other (``lcm.context.embed.local._Recent``). Real model, real threads."""

from __future__ import annotations

import threading
import time

import pytest

from lcm.context.embed import local

np = pytest.importorskip("numpy")


@pytest.fixture
def embedder(monkeypatch):
    """A fresh embedder (its own recent vectors) whose forward passes are counted."""
    made = local.MiniLMEmbedder()
    made.embed(["warm up: the model loads"])
    encoder = made._loaded()
    calls: list[int] = []
    real = encoder.forward

    def counted(ids, mask):
        calls.append(int(ids.shape[0]))
        return real(ids, mask)

    monkeypatch.setattr(encoder, "forward", counted)
    encoder.recent = local._Recent()  # nothing remembered from the warm-up
    return made, encoder, calls


def test_a_text_embedded_again_is_not_computed_again_and_gets_the_same_vector(embedder):
    made, _, calls = embedder
    first = made.embed(["Where did Caroline move from four years ago?", "something else"])
    assert sum(calls) == 2
    again = made.embed(["Where did Caroline move from four years ago?"])
    assert sum(calls) == 2  # nothing computed
    np.testing.assert_array_equal(again[0], first[0])
    fresh = local.MiniLMEmbedder().embed(["Where did Caroline move from four years ago?"])
    np.testing.assert_allclose(again[0], fresh[0], atol=1e-6)


def _embed_in_a_thread(made, encoder, monkeypatch, text: str, *, fails: bool):
    """``made.embed([text])`` started in a thread whose forward pass takes 0.3 s (then fails,
    or computes); returns once that pass has begun: (the thread, its result or error)."""
    computing = encoder.forward
    started = threading.Event()

    def held(ids, mask):
        started.set()
        time.sleep(0.3)
        if fails:
            raise RuntimeError("out of memory")
        return computing(ids, mask)

    monkeypatch.setattr(encoder, "forward", held)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["vectors"] = made.embed([text])
        except RuntimeError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    monkeypatch.setattr(encoder, "forward", computing)  # later passes compute at once
    return thread, outcome


def test_a_text_being_embedded_by_another_thread_is_waited_for(embedder, monkeypatch):
    made, encoder, calls = embedder
    thread, outcome = _embed_in_a_thread(made, encoder, monkeypatch, "the same message", fails=False)
    mine = made.embed(["the same message"])  # claimed by the other thread: waits for it
    thread.join()
    assert sum(calls) == 1
    np.testing.assert_array_equal(outcome["vectors"], mine)


def test_a_failed_computation_leaves_nothing_behind_and_the_waiter_computes(embedder, monkeypatch):
    made, encoder, calls = embedder
    text = "a message whose first embedding fails"
    thread, outcome = _embed_in_a_thread(made, encoder, monkeypatch, text, fails=True)
    vector = made.embed([text])
    thread.join()
    assert "error" in outcome and float(np.linalg.norm(vector[0])) == pytest.approx(1.0, abs=1e-4)
    assert sum(calls) == 1  # the waiter computed it once the claim was released
