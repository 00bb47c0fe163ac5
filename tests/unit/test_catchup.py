"""The background catch-up thread (``lcm.store.catchup``): when it runs, that it survives a
failure, and that it leaves no thread behind once idle."""

from __future__ import annotations

import threading
import time

from lcm.store.catchup import BackgroundCatchUp


class Recorder:
    def __init__(self, fail_first: bool = False):
        self.calls: list[float] = []
        self.fail_first = fail_first
        self.threads: set[str] = set()

    def __call__(self) -> None:
        self.calls.append(time.monotonic())
        self.threads.add(threading.current_thread().name)
        if self.fail_first and len(self.calls) == 1:
            raise RuntimeError("the database went away")


def test_a_full_batch_runs_at_once_on_a_thread_of_its_own():
    run = Recorder()
    bg = BackgroundCatchUp(run, batch=10, idle_s=30)
    started = time.monotonic()
    bg.added(4)
    bg.added(6)  # the batch is full: no waiting for the idle spell
    assert bg.wait_idle(10)
    assert len(run.calls) == 1 and run.calls[0] - started < 5
    assert run.threads == {"lcm-catch-up"}


def test_what_is_left_runs_after_an_idle_spell_and_the_thread_then_ends():
    run = Recorder()
    bg = BackgroundCatchUp(run, batch=1000, idle_s=0.05)
    bg.added(3)
    thread = bg._thread
    assert thread is not None
    thread.join(10)  # it ends by itself once idle
    assert not thread.is_alive() and bg._thread is None
    assert len(run.calls) == 1  # three messages, caught up once the writes paused
    bg.added(1)  # a new write starts a new thread
    assert bg.wait_idle(10) and len(run.calls) == 2


def test_a_failed_catch_up_is_logged_and_the_next_one_still_runs(caplog):
    run = Recorder(fail_first=True)
    bg = BackgroundCatchUp(run, batch=1, idle_s=0.05)
    bg.added(1)
    deadline = time.monotonic() + 10
    while not run.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    bg.added(1)
    assert bg.wait_idle(10)
    assert len(run.calls) == 2
    assert any("background catch-up of 1 messages failed" in r.getMessage() for r in caplog.records)


def test_dropping_the_backlog_ends_the_thread_without_running_it():
    run = Recorder()
    bg = BackgroundCatchUp(run, batch=1000, idle_s=30)
    bg.added(5)
    bg.drop_waiting()
    assert bg.wait_idle(10)
    assert run.calls == []
