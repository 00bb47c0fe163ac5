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
    encoder._recent = None
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


def test_a_text_being_embedded_by_another_thread_is_waited_for(embedder, monkeypatch):
    made, encoder, calls = embedder
    computing = encoder.forward
    started = threading.Event()

    def slow(ids, mask):
        started.set()
        time.sleep(0.3)
        return computing(ids, mask)

    monkeypatch.setattr(encoder, "forward", slow)
    results: dict[str, object] = {}
    first = threading.Thread(target=lambda: results.__setitem__("a", made.embed(["the same message"])))
    first.start()
    assert started.wait(10)
    results["b"] = made.embed(["the same message"])  # claimed by the other thread: waits for it
    first.join()
    assert sum(calls) == 1
    np.testing.assert_array_equal(results["a"], results["b"])


def test_a_failed_computation_leaves_nothing_behind_and_the_waiter_computes(embedder, monkeypatch):
    made, encoder, calls = embedder
    computing = encoder.forward
    started = threading.Event()

    def failing(ids, mask):
        started.set()
        time.sleep(0.2)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(encoder, "forward", failing)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            made.embed(["a message whose first embedding fails"])
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(10)
    time.sleep(0.05)
    monkeypatch.setattr(encoder, "forward", computing)
    vector = made.embed(["a message whose first embedding fails"])
    thread.join()
    assert errors and float(np.linalg.norm(vector[0])) == pytest.approx(1.0, abs=1e-4)
    assert sum(calls) == 1  # the waiter computed it once the claim was released
