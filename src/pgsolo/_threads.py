"""Threads that outlive their run: pgsolo's background work in a thread (a keeper, a
Locker's janitor) goes to an idle thread when there is one, and a thread whose run is over
waits for the next one instead of ending.

Why: a keeper watches one lock for as long as it is held, and a Celery task or a job run
from a connection string holds its lock for a millisecond or two. A thread started for
the keeper and joined at the release cost 40-130 µs a run against the embedded server, a
tenth of what the article's recipe costs in all (the start waits for the new thread to
run, the join for it to end, and the two threads take turns with the GIL meanwhile). An
idle thread handed the run costs about what no keeper costs.

What a run sees is what a thread of its own gave it: a fresh context (no context variable
of an earlier run), the thread named for the run while it runs, an exception that escapes
it reported by :func:`threading.excepthook`. :meth:`Spawned.join` waits for the run, not
the thread; the thread takes its idle name before the run counts as over, so once a join
returns no thread carries the run's name.

Idle threads are daemons, as the threads they stand for were: one that gets no run for
:data:`IDLE_SECONDS` ends, and at most :data:`MAX_IDLE` wait at once. A forked child has
none of its parent's threads: it forgets the idle ones, and a run under way in the parent
counts as over in the child, as :meth:`threading.Thread.is_alive` says of a thread of the
parent.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["IDLE_NAME", "IDLE_SECONDS", "MAX_IDLE", "Spawned", "Threads", "spawn_thread"]

IDLE_NAME = "pgsolo idle thread"
IDLE_SECONDS = 60.0
MAX_IDLE = 16

_Inbox = queue.SimpleQueue["Spawned"]


def _taken() -> None:
    """What a handle keeps once its thread has taken the run."""


class Spawned:
    """One run handed to a thread by :func:`spawn_thread`."""

    __slots__ = ("_done", "_run", "thread")

    def __init__(self, run: Callable[[], object], thread: threading.Thread | None) -> None:
        self._run = run
        self._done = threading.Event()
        self.thread = thread  # the one it is handed to

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def runs_here(self) -> bool:
        """Whether the current thread is the one running it, and it is not over."""
        return self.thread is threading.current_thread() and self.is_alive()

    def run_in(self, thread: threading.Thread) -> None:
        # Let go of the run as it starts: a keeper's run holds its lock's connection, which
        # an idle thread (or a handle kept after the stop) must not keep alive.
        run, self._run = self._run, _taken
        try:
            contextvars.Context().run(run)
        except BaseException as exc:  # what a thread of its own does with it
            threading.excepthook(
                threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, thread))
            )
        finally:
            thread.name = IDLE_NAME

    def over(self) -> None:
        self._done.set()

    def over_in_child(self) -> None:
        """Over, in a forked child: with an event of its own, as the parent's may have
        been held by a thread the child does not have."""
        self._done = threading.Event()
        self._done.set()


class Threads:
    """The idle threads, each waiting on an inbox of its own, and the runs under way."""

    def __init__(self, *, idle_seconds: float = IDLE_SECONDS, max_idle: int = MAX_IDLE) -> None:
        self._idle_seconds = idle_seconds
        self._max_idle = max_idle
        self._guard = threading.Lock()
        self._idle: list[tuple[threading.Thread, _Inbox]] = []
        self._running: set[Spawned] = set()

    def spawn(self, run: Callable[[], object], name: str) -> Spawned:
        with self._guard:
            idle = self._idle.pop() if self._idle else None  # the warmest one
            spawned = Spawned(run, None if idle is None else idle[0])
            self._running.add(spawned)
        if idle is not None:
            thread, inbox = idle
            thread.name = name  # named from now on, as a new thread would be
            inbox.put(spawned)
            return spawned
        spawned.thread = threading.Thread(
            target=self._serve, args=(_Inbox(), spawned), name=name, daemon=True
        )
        try:
            spawned.thread.start()
        except BaseException:
            self.finished(spawned)
            raise
        return spawned

    def finished(self, spawned: Spawned) -> None:
        with self._guard:
            self._running.discard(spawned)
        spawned.over()

    def _serve(self, inbox: _Inbox, first: Spawned) -> None:
        thread = threading.current_thread()
        spawned: Spawned | None = first
        while spawned is not None:
            try:
                spawned.run_in(thread)
            finally:
                self.finished(spawned)
            spawned = self._next(thread, inbox)

    def _next(self, thread: threading.Thread, inbox: _Inbox) -> Spawned | None:
        """The next run handed to this thread, or None when it is to end."""
        idle = (thread, inbox)
        with self._guard:
            if len(self._idle) >= self._max_idle:
                return None
            self._idle.append(idle)
        try:
            return inbox.get(timeout=self._idle_seconds)
        except queue.Empty:
            with self._guard:
                if idle in self._idle:  # nobody handed it a run meanwhile
                    self._idle.remove(idle)
                    return None
        # A spawn took it off the list just as the wait ended, and puts the run in its
        # inbox at once; a Ctrl-C between the two puts nothing there, and then the
        # thread ends instead of waiting for ever.
        try:
            return inbox.get(timeout=self._idle_seconds)
        except queue.Empty:
            return None

    def forget_parent(self) -> None:
        """In a forked child: the parent's threads are not here."""
        self._guard = threading.Lock()
        self._idle = []
        for spawned in self._running:
            spawned.over_in_child()
        self._running = set()


_pool = Threads()

if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_pool.forget_parent)


def spawn_thread(run: Callable[[], object], name: str) -> Spawned:
    """Run ``run()`` in a daemon thread named ``name`` while it runs: an idle one if
    there is one, else a new one."""
    return _pool.spawn(run, name)
