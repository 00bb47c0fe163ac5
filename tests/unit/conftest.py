"""Unit tests run without a database: the engine core over the in-memory store
(``tests/support/memory_store.py``), pure functions, and a scripted LLM on 127.0.0.1."""

from __future__ import annotations

import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from tests.conftest import SMALL_ENGINE
from tests.support.memory_store import MemoryStore


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def make_engine(store: MemoryStore):
    """Engines on one in-memory store (engines made by one test share it, like processes
    sharing a database), with SMALL_ENGINE sizes unless overridden."""

    def factory(context_length: int = 3000, **overrides):
        engine = LcmEngine(LcmConfig.from_env({}, **{**SMALL_ENGINE, **overrides}), store=store)
        engine.update_model("test-model", context_length)
        return engine

    return factory
