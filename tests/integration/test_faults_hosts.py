"""Several hosts that hold lcm's context, in real processes, on one session (issue 30; the fault
suite): real engines, real compaction on a 4,000-token window, random jitter, restarts; hosts
that keep what ``compress()`` returned mixed with hosts that re-send their raw history; many
seeds, on both backends (``tests/support/faults_hosts.py``).

Counted per run as expected / stored / lost / duplicated / misplaced, forks against the forks
the conversations call for, messages handed to a host that it never had, contexts handed back
over the window or breaking the message-sequence rules: every figure but the first two zero.
Before the fix, the ``agree`` runs handed a host that fell a turn behind its own list back, over
the window, on every call (77 times in a 40-turn run), and the ``diverge`` runs stored 12-111
messages twice in 3-7 forks where one or two were due."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import pytest

from tests.support import faults_hosts

pytestmark = pytest.mark.slow

RUNS = 6
TURNS = 30


@pytest.fixture(scope="module")
def hosts_pool() -> Iterator[ProcessPoolExecutor]:
    """Host processes (spawned once for the module; each run starts new engines in them)."""
    with faults_hosts.pool() as executor:
        yield executor


@pytest.mark.parametrize("scenario", ["agree", "diverge"])
def test_hosts_holding_lcms_context_store_each_message_once(db_url, scenario, hosts_pool):
    figures = faults_hosts.run_many(db_url, range(RUNS), scenario, TURNS, hosts_pool)
    bad = [asdict(f) for f in figures if not f.clean]
    assert not bad, bad
    assert all(f.stored == f.expected for f in figures)
