"""What sync and async code differ by, as pairs of helpers: one name for async code (it
starts with ``a`` or ``A``), the same name without it for sync code.

pgsolo writes code that has both flavours once, async, under a directory named
``_async/``; ``scripts/unasync.py`` writes the sync twin under ``_sync/``, mapping every
async name of this module to its sync one. So a difference between the flavours that is
more than a name lives here: the async helper does what a task needs, and its sync twin
is often trivial (a thread cannot be cancelled; a sync call has nothing to await).
Standard library only: every layer may use it. Helpers that know psycopg are in
:mod:`pgsolo.drivers._psycopg_acompat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import os
import select
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Final, TypeAlias, TypeVar

from . import _threads
from ._interrupts import CtrlCHeld

__all__ = [
    "AIS_ASYNC",
    "IS_ASYNC",
    "AEvent",
    "AMutex",
    "ASpawned",
    "AStop",
    "AWorker",
    "Event",
    "Mutex",
    "Spawned",
    "Stop",
    "Worker",
    "acancel_worker",
    "acurrent_worker",
    "afinished",
    "ainterrupts_deferred",
    "apause",
    "aresult_of",
    "arun_blocking",
    "aspawn",
    "astop_worker",
    "ato_its_end",
    "atry_lock",
    "auncancel_current",
    "aundisturbed",
    "cancel_worker",
    "current_worker",
    "interrupts_deferred",
    "pause",
    "result_of",
    "run_blocking",
    "spawn",
    "stop_worker",
    "to_its_end",
    "try_lock",
    "uncancel_current",
    "undisturbed",
]

T = TypeVar("T")

IS_ASYNC: Final = False
AIS_ASYNC: Final = True
"""Whether the code at hand runs in tasks on an event loop (async) or in threads."""

# -- workers: a thread, or a task -------------------------------------------------------

Worker: TypeAlias = threading.Thread
AWorker: TypeAlias = asyncio.Task[Any]
"""Who runs the code at hand: it may hold a lock, and a task can be cancelled."""

Spawned: TypeAlias = _threads.Spawned
ASpawned: TypeAlias = asyncio.Task[Any]
"""Background work that pgsolo started (:func:`spawn`), to be stopped."""


def spawn(run: Callable[[], object], name: str) -> Spawned:
    """Run ``run()`` in a daemon thread called ``name`` while it runs (a thread kept from
    an earlier run if one is idle: :mod:`pgsolo._threads`)."""
    return _threads.spawn_thread(run, name)


def aspawn(run: Callable[[], Coroutine[Any, Any, object]], name: str) -> ASpawned:
    """Run ``run()`` in a new task called ``name``."""
    return asyncio.create_task(run(), name=name)


def current_worker() -> Worker | None:
    return threading.current_thread()


def acurrent_worker() -> AWorker | None:
    return asyncio.current_task()


def stop_worker(worker: Spawned, join_within: float) -> None:
    """Wait up to ``join_within`` seconds for ``worker`` to end (not from inside it: a
    worker stopping itself just goes on to its end)."""
    if not worker.runs_here():
        worker.join(join_within)


def astop_worker(worker: ASpawned, join_within: float) -> None:
    """Cancel ``worker`` (not from inside it) without awaiting it, so that a second
    cancellation of the caller cannot land here; ``join_within`` is for a thread."""
    if worker is not asyncio.current_task():
        worker.cancel()


def cancel_worker(worker: Worker | None, message: str) -> bool:
    """A thread cannot be cancelled: False, nothing done."""
    return False


def acancel_worker(worker: AWorker | None, message: str) -> bool:
    """Cancel ``worker`` with ``message`` unless it is over; whether it was cancelled."""
    if worker is None or worker.done():
        return False
    worker.cancel(message)
    return True


def uncancel_current(ended_with: BaseException | None) -> bool:
    """Nothing was cancelled (see :func:`cancel_worker`): False."""
    return False


def auncancel_current(ended_with: BaseException | None) -> bool:
    """Undo one cancellation (by :func:`acancel_worker`) of the current task, however it
    ended; whether it ended with that cancellation (``ended_with``) and none other is
    pending."""
    task = asyncio.current_task()
    remaining = task.uncancel() if task is not None else 1
    return isinstance(ended_with, asyncio.CancelledError) and remaining == 0


# -- an event with a timed wait, and a wait for a socket that the event cuts short --------


class Event:
    """:class:`threading.Event`'s ``set``, ``is_set`` and ``wait(seconds)``, plus
    :meth:`wait_readable`: a thread blocked in poll(2) for a socket wakes once the event is
    set (through a pipe of that wait's own), so that whoever sets it need not wait for the
    socket's timeout."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._guard = threading.Lock()  # a pipe is never written after it is closed
        self._wakers: set[int] = set()  # the write ends of the waits in progress

    def set(self) -> None:
        with self._guard:
            if self._event.is_set():
                return
            self._event.set()
            for waker in self._wakers:
                os.write(waker, b"\0")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)

    def wait_readable(self, fd: int, seconds: float) -> bool:
        """Whether ``fd`` became readable (or hung up) within ``seconds``, before the
        event was set. poll(2), not select(2): descriptors above 1023 are fine."""
        wake_read, wake_write = os.pipe()
        try:
            with self._guard:
                if self._event.is_set():
                    return False
                self._wakers.add(wake_write)
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                poller.register(wake_read, select.POLLIN)
                ready = poller.poll(max(0.0, seconds) * 1000)
            finally:
                with self._guard:
                    self._wakers.discard(wake_write)
        finally:
            os.close(wake_read)
            os.close(wake_write)
        return not self._event.is_set() and any(ready_fd == fd for ready_fd, _ in ready)


class AEvent:
    """The same for tasks (pass ``seconds`` positionally: the thread's event calls it
    ``timeout``)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()
        return self._event.is_set()

    async def wait_readable(self, fd: int, seconds: float) -> bool:
        """The same, on the event loop (its reader of ``fd``), no thread needed: a
        cancellation ends the wait at once."""
        if self._event.is_set():
            return False
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[object] = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        setting: asyncio.Future[object] = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait(
                {readable, setting}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            loop.remove_reader(fd)
            setting.cancel()
            readable.cancel()
        return not self._event.is_set() and readable.done() and not readable.cancelled()


# -- what a call gives back --------------------------------------------------------------


def result_of(value: T) -> T:
    """``value`` itself: a sync caller's function has nothing to await."""
    return value


async def aresult_of(value: object) -> object:
    """``value``, awaited if it is awaitable: an async caller may pass a plain function."""
    return await value if inspect.isawaitable(value) else value


async def afinished(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even if the current task is cancelled meanwhile (the
    cancellation goes on once it is over): for a change to a connection that must not be
    left half made, such as switching a driver's autocommit and back."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


def undisturbed(value: T, bound: float, within: float | None = None) -> T:
    """``value``: a thread's step cannot be interrupted by another thread."""
    return value


async def aundisturbed(step: Awaitable[T], bound: float, within: float | None = None) -> T:
    """Await ``step`` to its end although the current task is cancelled meanwhile, and
    absorb those cancellations: for the clean-up after an interruption, which the task
    ends with anyway. A second cancellation that cut the clean-up short (say, the
    release of a lock the first one interrupted) would leave behind what it cleans up.
    ``bound`` seconds after the first absorbed cancellation the step is cancelled after
    all, so that a connection that stopped answering cannot hold the task forever; and
    ``within`` seconds after it started, if given, whatever happens (TimeoutError)."""
    task = asyncio.ensure_future(step)
    loop = asyncio.get_running_loop()
    give_up = math.inf if within is None else loop.time() + within
    absorbed = False
    while not task.done() and (left := give_up - loop.time()) > 0:
        try:
            await asyncio.wait({task}, timeout=None if math.isinf(left) else left)
        except asyncio.CancelledError:
            if not absorbed:
                absorbed = True
                give_up = min(give_up, loop.time() + bound)
    if task.done():
        return task.result()
    task.cancel()  # past a bound: the step ends it its own way
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
    if absorbed:
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        return task.result()  # it ended its own way after all
    raise TimeoutError(f"no answer within {within:g} s")


class _NothingHeld:
    """A task's clean-up holds nothing back: :func:`aundisturbed` absorbs the
    cancellations that come meanwhile."""

    def release(self) -> None:
        return None


_NOTHING_HELD: Final = _NothingHeld()


def interrupts_deferred(bound: float) -> CtrlCHeld | _NothingHeld:
    """Ctrl-C held back from now until ``release()``, for the clean-up after an
    interruption: a second Ctrl-C (an impatient double press) that cut it short would
    leave behind what it cleans up, a lock among them. It comes once the clean-up ended,
    or at once ``bound`` seconds after the first one held back (:class:`CtrlCHeld`)."""
    return CtrlCHeld(give_up_after=bound)


def ainterrupts_deferred(bound: float) -> CtrlCHeld | _NothingHeld:
    """Nothing to hold back in a task (see :func:`interrupts_deferred`)."""
    return _NOTHING_HELD


def to_its_end(value: T, bound: float) -> T:
    """``value``: see :func:`undisturbed`."""
    return value


async def ato_its_end(step: Awaitable[T], bound: float) -> T:
    """Await ``step`` to its end although the current task is cancelled meanwhile; then
    the cancellation goes on, and what the step raised is dropped for it. For a step a
    cancellation must not cut in two, say the commit that ends a transaction lock: cut,
    SQLAlchemy discards the connection, whose backend holds the lock a moment after the
    task has ended. Bounded like :func:`aundisturbed`."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await aundisturbed(task, bound, within=bound)
        raise


def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, here."""
    return fn(*args)


async def arun_blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread of pgsolo's own (:mod:`pgsolo._threads`), so that the
    event loop goes on meanwhile. Not the loop's default executor: the application's
    ``to_thread`` calls may fill it, and a keeper's beat queued there, holding the
    connection's lock, made the holder's own statements wait seconds and the beat's
    deadline run late. If the caller is cancelled, the call still runs to its end before
    the cancellation goes on (whatever ``fn`` holds, say a connection, stays held until
    then)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            _settle_soon(loop, done, None, exc)
        else:
            _settle_soon(loop, done, result, None)

    _threads.spawn_thread(run, "pgsolo blocking call")
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({done})
        raise


def _settle_soon(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
    result: T | None,
    error: BaseException | None,
) -> None:
    """Settle ``future`` from another thread, in its loop (closed meanwhile: no one waits)."""

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle)


# -- a mutual exclusion that may be held across a round trip ----------------------------

Mutex = threading.Lock
AMutex = asyncio.Lock


# -- a lock taken only when it is free ----------------------------------------------------


@contextlib.contextmanager
def try_lock(lock: threading.Lock) -> Iterator[bool]:
    """Take ``lock`` if it is free, without waiting; yields whether it was taken (and
    releases it at the end of the block if so)."""
    if not lock.acquire(blocking=False):
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextlib.asynccontextmanager
async def atry_lock(lock: asyncio.Lock) -> AsyncIterator[bool]:
    """The same for an :class:`asyncio.Lock`: a free one is taken without yielding to
    another task."""
    if lock.locked():
        yield False
        return
    async with lock:
        yield True


# -- a pause that a caller's stop cuts short ------------------------------------------------

# What a caller sets to stop a loop of pgsolo's: the event of its own flavour.
Stop = threading.Event
AStop = asyncio.Event


def pause(seconds: float, stop: Stop | None) -> bool:
    """Sleep ``seconds``, less if ``stop`` is set meanwhile; whether it is set."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


async def apause(seconds: float, stop: AStop | None) -> bool:
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()
