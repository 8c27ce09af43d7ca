"""pgsolo._threads: a run handed to a thread kept from an earlier run sees what a thread
of its own gave it, and a thread is never lost to a run nobody serves (a keeper that never
starts would leave a lock unwatched)."""

from __future__ import annotations

import contextvars
import functools
import gc
import linecache
import os
import signal
import sys
import threading
import warnings
import weakref
from types import FrameType
from typing import Any

import pytest

from _support import eventually
from pgsolo import _acompat
from pgsolo._threads import IDLE_NAME, Threads, spawn_thread

WITHIN = 10.0

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("_seen", default="fresh")


def _named(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def test_a_run_is_named_while_it_runs_and_a_join_waits_for_its_end() -> None:
    threads = Threads()
    release, ran = threading.Event(), threading.Event()

    def run() -> None:
        release.wait(WITHIN)
        ran.set()

    spawned = threads.spawn(run, "pgsolo-test first")
    assert [spawned.thread] == _named("pgsolo-test first")  # named from the start
    assert spawned.is_alive()
    spawned.join(0.05)
    assert spawned.is_alive()
    assert not ran.is_set()
    release.set()
    spawned.join(WITHIN)
    assert ran.is_set()
    assert not spawned.is_alive()
    assert _named("pgsolo-test first") == []  # the thread took its idle name before
    assert spawned.thread is not None
    assert spawned.thread.name == IDLE_NAME
    assert spawned.thread.daemon  # never keeps the process alive


def test_the_next_run_goes_to_the_idle_thread() -> None:
    threads = Threads()
    first = threads.spawn(lambda: None, "pgsolo-test one")
    first.join(WITHIN)
    ran_in: list[threading.Thread] = []
    release = threading.Event()

    def run() -> None:
        release.wait(WITHIN)
        ran_in.append(threading.current_thread())

    second = threads.spawn(run, "pgsolo-test two")
    assert _named("pgsolo-test two") == [first.thread]  # named as it is handed the run
    release.set()
    second.join(WITHIN)
    assert not second.is_alive()
    assert ran_in == [first.thread]


def test_runs_at_once_each_get_a_thread() -> None:
    threads = Threads(max_idle=2)
    together = threading.Barrier(6, timeout=WITHIN)  # five runs and this thread
    runs = [threads.spawn(together.wait, f"pgsolo-test run {n}") for n in range(5)]
    together.wait()  # each run is under way, or this would time out
    for spawned in runs:
        spawned.join(WITHIN)
    assert len({spawned.thread for spawned in runs}) == 5
    # Two of them wait for the next runs; the other three ended.
    eventually(
        lambda: (
            sum(spawned.thread is not None and spawned.thread.is_alive() for spawned in runs) == 2
        ),
        "the threads beyond max_idle to end",
    )


class _Held:
    """What a run holds on to: a keeper's run holds its lock's connection."""


def test_an_idle_thread_holds_nothing_of_its_last_run() -> None:
    threads = Threads()
    held = _Held()
    gone = weakref.ref(held)
    spawned = threads.spawn(functools.partial(id, held), "pgsolo-test holding")
    spawned.join(WITHIN)
    thread = spawned.thread
    del held, spawned
    gc.collect()
    assert thread is not None
    assert thread.is_alive()  # idle, waiting for the next run
    assert gone() is None  # a connection the run held is not kept alive by the thread


def test_each_run_starts_with_a_fresh_context() -> None:
    threads = Threads()
    _seen.set("the caller's")
    seen: list[str] = []

    def run() -> None:
        seen.append(_seen.get())
        _seen.set("a run's")

    for _ in range(2):  # the second run in the thread the first one set it in
        threads.spawn(run, "pgsolo-test context").join(WITHIN)
    assert seen == ["fresh", "fresh"]


def test_an_escaping_exception_is_reported_and_the_thread_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", reported.append)
    threads = Threads()

    def fail() -> None:
        raise ValueError("from the run")

    failed = threads.spawn(fail, "pgsolo-test failing")
    failed.join(WITHIN)
    assert not failed.is_alive()
    [args] = reported
    assert args.exc_type is ValueError
    assert str(args.exc_value) == "from the run"
    assert args.thread is failed.thread
    after = threads.spawn(lambda: None, "pgsolo-test after")
    after.join(WITHIN)
    assert after.thread is failed.thread


def test_an_idle_thread_ends_after_idle_seconds() -> None:
    threads = Threads(idle_seconds=0.05)
    spawned = threads.spawn(lambda: None, "pgsolo-test idle")
    spawned.join(WITHIN)
    thread = spawned.thread
    assert thread is not None
    eventually(lambda: not thread.is_alive(), "the idle thread to end")
    again = threads.spawn(lambda: None, "pgsolo-test again")  # served by a new one
    again.join(WITHIN)
    assert not again.is_alive()
    assert again.thread is not thread


def test_a_ctrl_c_as_a_run_is_handed_over_leaves_no_thread_waiting_for_ever() -> None:
    """Guards a Ctrl-C in ``spawn`` after it took an idle thread off the list and before
    it put the run in that thread's inbox: the thread, off the list, waited on its inbox
    for ever once its idle time was up. Here a real SIGINT comes exactly there."""
    threads = Threads(idle_seconds=0.05)
    first = threads.spawn(lambda: None, "pgsolo-test first")
    first.join(WITHIN)
    idle = first.thread
    assert idle is not None

    def at_the_hand_over(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not Threads.spawn.__code__:
            return None

        def in_spawn(frame: FrameType, event: str, arg: object) -> Any:
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if event == "line" and "inbox.put(" in line:
                sys.settrace(None)
                signal.raise_signal(signal.SIGINT)
            return in_spawn

        return in_spawn

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        eventually(lambda: len(threads._idle) == 1, "the first thread to wait idle")
        sys.settrace(at_the_hand_over)
        with pytest.raises(KeyboardInterrupt):
            threads.spawn(lambda: None, "pgsolo-test cut short")
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, before)
    assert not threads._idle  # taken off the list, its run never handed over
    eventually(lambda: not idle.is_alive(), "the thread left with nothing to end")


def test_a_stop_from_inside_the_run_does_not_wait_for_itself() -> None:
    stopped = threading.Event()
    me: list[_acompat.Spawned] = []
    started = threading.Event()

    def run() -> None:
        started.wait(WITHIN)
        _acompat.stop_worker(me[0], WITHIN)  # would wait WITHIN for its own end
        stopped.set()

    me.append(_acompat.spawn(run, "pgsolo-test self-stop"))
    started.set()
    assert stopped.wait(WITHIN / 2)
    me[0].join(WITHIN)
    assert not me[0].is_alive()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_has_none_of_the_parents_threads() -> None:
    release = threading.Event()
    under_way = spawn_thread(lambda: release.wait(WITHIN), "pgsolo-test under way")
    spawn_thread(lambda: None, "pgsolo-test idle").join(WITHIN)  # one idle thread, at least
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of a fork with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # the child: report, then leave at once, whatever happens
        try:
            under_way.join(WITHIN)  # over here: the thread that ran it is not
            ran = threading.Event()
            spawned = spawn_thread(ran.set, "pgsolo-test in the child")
            spawned.join(WITHIN)
            report = f"{under_way.is_alive()} {ran.is_set()} {spawned.is_alive()}"
            os.write(write_end, report.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as child_said:
            report = child_said.read().decode()
        assert os.waitpid(child, 0)[1] == 0
        assert under_way.is_alive()  # in the parent, it goes on
    finally:
        release.set()
    assert report == "False True False"
    under_way.join(WITHIN)
    assert not under_way.is_alive()
