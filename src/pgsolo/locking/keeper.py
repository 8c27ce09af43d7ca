"""The keeper: a heartbeat that watches a held session lock and reports its loss.

A session lock is only as good as the connection under it. When the backend is
terminated, the server restarts or fails over, or a NAT drops an idle TCP flow,
PostgreSQL releases the lock and another worker can start, while this one carries on.
The keeper notices: every ``interval`` seconds it asks, on the lock's own connection,
which backend answers and whether that backend still holds the key.

Sharing the connection. A beat is sent only when nobody else is using the connection:
it takes the driver's own connection lock without waiting (psycopg serialises every
statement on it), and only when no transaction is open. Otherwise the beat is skipped:
the caller's statement or transaction is in flight, and if the session is gone that
statement fails by itself. So a beat never runs inside the caller's transaction and never
interleaves with the caller's statements. Each beat has a hard deadline (``timeout``): a
server that does not answer in time gets its connection shut down (a half-open TCP
connection would otherwise hang every statement on it) and the lock counts as lost.

On loss the keeper records a :class:`~pgsolo.LockLostError` on the lock (``lock.lost``,
``lock.check()``), logs it, calls ``on_lost`` (in the keeper's thread or task) and, for
an async lock with ``cancel=True``, cancels the task that took the lock; that task's
``async with`` block then ends with the :class:`~pgsolo.LockLostError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import sql
from .._types import DAY, check_seconds
from ..drivers import AsyncDriver, BeatFailed, DriverBase, SyncDriver
from ..errors import InvalidArgumentError, LockLostError
from ..reasons import LostReason

if TYPE_CHECKING:
    from .core import LockCore

__all__ = ["AsyncKeeper", "Keep", "Keeper"]

logger = logging.getLogger("pgsolo")

MIN_INTERVAL = 0.01
MAX_INTERVAL = DAY  # for interval and timeout alike: a longer one watches nothing


@dataclass(frozen=True, slots=True)
class Keep:
    """How a session lock is watched (``session_lock(..., keep=Keep(...))``;
    ``keep=True`` is ``Keep()``).

    ``interval``: seconds between beats. ``timeout``: seconds the server has to answer a
    beat before the connection is shut down and the lock counted as lost. Both are from
    0.01 to 86400 (one day); anything else raises :class:`~pgsolo.InvalidArgumentError`
    here, before any lock is taken. ``on_lost``:
    called with the :class:`~pgsolo.LockLostError` once, from the keeper's thread (sync)
    or task (async); what it raises is logged. ``cancel``: for an async lock, cancel the
    task that took the lock.
    """

    interval: float = 1.0
    timeout: float = 10.0
    on_lost: Callable[[LockLostError], object] | None = None
    cancel: bool = False

    def __post_init__(self) -> None:
        for label, value in (("interval", self.interval), ("timeout", self.timeout)):
            check_seconds(f"Keep {label}", value, MIN_INTERVAL, MAX_INTERVAL)
        if self.on_lost is not None and not callable(self.on_lost):
            raise InvalidArgumentError(f"on_lost must be callable, got {self.on_lost!r}")
        if not isinstance(self.cancel, bool):
            raise InvalidArgumentError(f"cancel must be True or False, got {self.cancel!r}")


def as_keep(keep: bool | Keep | None) -> Keep | None:
    if keep is None or keep is False:
        return None
    if keep is True:
        return Keep()
    if isinstance(keep, Keep):
        return keep
    raise InvalidArgumentError(f"keep must be True, False or a pgsolo.Keep, got {keep!r}")


class _Watch:
    """What a beat's answer means; shared by both keepers."""

    def __init__(self, core: LockCore, keep: Keep) -> None:
        self.core = core
        self.keep = keep
        self.statement = sql.keeper_beat(core.key, shared=core.shared)
        # Remembered now: a report of the loss comes after the connection is gone.
        core.driver.server_info()

    def crashed(self, failure: Exception) -> LockLostError:
        logger.error("pgsolo keeper: watching %s failed", self.core.key, exc_info=failure)
        return self._lost("keeper-failed", "the keeper failed, so nothing vouches for the lock")

    def verdict(
        self, row: Sequence[str | None] | None, failure: Exception | None, driver: DriverBase
    ) -> LockLostError | None:
        """The loss a beat found, if any. ``row`` None without a failure: the beat was
        skipped (the connection was in use)."""
        if isinstance(failure, BeatFailed):
            return self.failed(failure, driver)
        if failure is not None:
            return self.crashed(failure)
        return None if row is None else self.judge(row)

    def judge(self, row: Sequence[str | None]) -> LockLostError | None:
        pid, held, in_recovery = row  # keeper_beat's columns
        expected = self.core.server_pid
        if expected is not None and pid != str(expected):
            return self._lost(
                "connection-moved",
                f"the connection now reaches backend pid {pid}, not {expected} that holds"
                " the lock (a transaction-pooling proxy moved it)",
            )
        if in_recovery == "t":
            return self._lost(
                "server-in-recovery",
                "the server answering the lock's connection is in recovery (a standby),"
                " where an advisory lock coordinates nothing",
            )
        if held != "t":
            return self._lost(
                "lock-released", "pg_locks no longer shows it on the lock's connection"
            )
        return None

    def failed(self, exc: BeatFailed, driver: DriverBase) -> LockLostError | None:
        if exc.unresponsive:
            return self._lost(
                "connection-unresponsive",
                f"the server did not answer within {self.keep.timeout:g}s, so pgsolo shut"
                " the connection down",
            )
        if driver.is_closed():
            return self._lost("connection-lost", str(exc))
        # A live session keeps its session locks: a failed statement on it says nothing
        # about the lock. Try again next beat.
        logger.warning("pgsolo keeper: checking lock %s failed: %s", self.core.key, exc)
        return None

    def _lost(self, reason: LostReason, detail: str) -> LockLostError:
        return LockLostError(
            f"session lock {self.core.key} was lost while held ({reason}): {detail}",
            key=self.core.key,
            reason=reason,
        )

    def declare(self, error: LockLostError) -> None:
        self.core.lost = error
        self.core.log_lost(error)
        if self.keep.on_lost is not None:
            try:
                self.keep.on_lost(error)
            except Exception:
                logger.exception("pgsolo keeper: the on_lost callback of %s failed", self.core.key)


class Keeper:
    """A thread that watches one lock on a sync connection."""

    def __init__(self, core: LockCore, driver: SyncDriver, keep: Keep) -> None:
        self._watch = _Watch(core, keep)
        self._driver = driver
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"pgsolo-keeper {core.key}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; after this returns no beat is in flight (unless called from the
        keeper's own thread, by ``on_lost``)."""
        self._stopping.set()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(self._watch.keep.timeout + 1)

    def _run(self) -> None:
        watch = self._watch
        while not self._stopping.wait(watch.keep.interval):
            row, failure = None, None
            try:
                row = self._driver.beat(watch.statement, watch.keep.timeout)
            except Exception as exc:
                failure = exc
            error = watch.verdict(row, failure, self._driver)
            if self._stopping.is_set():
                return  # released meanwhile: the answer may be about the release
            if error is not None:
                watch.declare(error)
                return


class AsyncKeeper:
    """A task that watches one lock on an async connection."""

    def __init__(self, core: LockCore, driver: AsyncDriver, keep: Keep) -> None:
        self._watch = _Watch(core, keep)
        self._driver = driver
        self._task: asyncio.Task[None] | None = None
        self.holder: asyncio.Task[object] | None = None
        self.cancelled_holder = False

    def start(self) -> None:
        self.holder = asyncio.current_task()
        self._task = asyncio.create_task(self._run(), name=f"pgsolo-keeper {self._watch.core.key}")

    def undo_cancel(self, ended_with: BaseException | None) -> LockLostError | None:
        """Once the holder's block or work is over: undo the keeper's one cancellation of
        the holder task, however it ended (it may have swallowed the cancellation or
        turned it into another error). Returns the loss to raise instead when it ended
        with that cancellation and no other is pending."""
        if not self.cancelled_holder:
            return None
        self.cancelled_holder = False
        task = asyncio.current_task()
        remaining = task.uncancel() if task is not None else 1
        if isinstance(ended_with, asyncio.CancelledError) and remaining == 0:
            return self._watch.core.lost
        return None

    def stop(self) -> None:
        """Stop beating. Not awaited, so that a second cancellation of the caller cannot
        land here and skip the release that follows: a beat in flight holds psycopg's
        connection lock, so the release waits for it anyway, and a cancelled keeper
        never judges what it saw."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _run(self) -> None:
        watch = self._watch
        while True:
            await asyncio.sleep(watch.keep.interval)
            row, failure = None, None
            try:
                row = await self._driver.beat(watch.statement, watch.keep.timeout)
            except Exception as exc:
                failure = exc
            error = watch.verdict(row, failure, self._driver)
            if error is not None:
                watch.declare(error)
                if watch.keep.cancel and self.holder is not None and not self.holder.done():
                    self.cancelled_holder = True
                    self.holder.cancel(f"pgsolo: {error}")
                return
