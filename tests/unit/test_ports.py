"""Both implementations of the storage ports keep to them: every method a port declares exists on
lcm.store.Store's repositories and on the in-memory store, with the same parameters. (mypy
checks the real store wherever it is passed as the ports; this keeps the test double honest.)"""

from __future__ import annotations

import inspect

import pytest

from lcm.context import ports
from lcm.store.family import FamilyWriter
from lcm.store.health import HealthRepository
from lcm.store.messages import MessageRepository
from lcm.store.search import SearchRepository
from lcm.store.sessions import SessionRepository
from lcm.store.summaries import SummaryRepository
from lcm.store.vectors import VectorRepository
from tests.support import memory_store as memory

PAIRS = [
    (ports.SessionPort, SessionRepository, memory.MemorySessions),
    (ports.FamilyPort, FamilyWriter, memory.MemoryFamily),
    (ports.MessagePort, MessageRepository, memory.MemoryMessages),
    (ports.SummaryPort, SummaryRepository, memory.MemorySummaries),
    (ports.SearchPort, SearchRepository, memory.MemorySearch),
    (ports.VectorPort, VectorRepository, memory.MemoryVectors),
    (ports.HealthPort, HealthRepository, memory.MemoryHealth),
]


def _methods(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)]


def _parameters(function: object) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(("port", "real", "double"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_each_implementation_has_the_ports_methods_with_its_parameters(port, real, double):
    assert _methods(port), f"{port.__name__} declares nothing"
    for name in _methods(port):
        expected = _parameters(getattr(port, name))
        for implementation in (real, double):
            method = getattr(implementation, name, None)
            assert method is not None, f"{implementation.__name__} has no {name}"
            assert _parameters(method) == expected, f"{implementation.__name__}.{name}"


def test_the_memory_store_exposes_every_aggregate():
    """(``lcm.store.Store`` is checked by mypy: the command line passes one as ``StorePorts``.)"""
    aggregates = [name for name in vars(ports.StorePorts) if not name.startswith("_")]
    store = memory.MemoryStore()
    assert aggregates and all(hasattr(store, name) for name in aggregates)
