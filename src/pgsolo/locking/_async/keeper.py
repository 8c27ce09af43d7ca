"""The keeper of one held session lock on an async connection: a worker of its own that
beats every ``interval`` seconds and judges each answer with
:class:`~pgsolo.locking.watch.Watch`, and between beats watches the connection's socket
for a server that ends the session. See :mod:`pgsolo.locking.keeper`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..._acompat import (
    AEvent,
    AWorker,
    acancel_worker,
    acurrent_worker,
    aspawn,
    astop_worker,
    auncancel_current,
)
from ...drivers import AsyncDriver, heartbeat_of
from ...errors import LockLostError
from ..watch import Keep, Watch

if TYPE_CHECKING:
    from ..core import LockCore

__all__ = ["AsyncKeeper"]

# When the socket is readable because the caller is using the connection, the keeper
# leaves the bytes to the caller and looks again after a pause: short at first (the
# caller reads its answer at once), doubling while the caller stays busy, so that input
# the caller leaves unread for long (in a transaction) costs a few wake-ups per beat.
FIRST_PAUSE = 0.001


class AsyncKeeper:
    """Watches one lock on an async connection, from a worker of its own."""

    def __init__(self, core: LockCore, driver: AsyncDriver, keep: Keep) -> None:
        self._watch = Watch(core, keep)
        self._driver = driver
        self._heartbeat = heartbeat_of(driver.heartbeat())  # refused before any SQL
        self._stopping = AEvent()
        self._worker: AWorker | None = None
        self._holder: AWorker | None = None
        self.cancelled_holder = False

    def start(self) -> None:
        self._holder = acurrent_worker()
        self._worker = aspawn(self._run, f"pgsolo-keeper {self._watch.core.key}")

    def undo_cancel(self, ended_with: BaseException | None) -> LockLostError | None:
        """Once the holder's block or work is over: undo the keeper's one cancellation of
        the holder (``Keep(cancel=True)``), however it ended (it may have swallowed the
        cancellation or turned it into another error). Returns the loss to raise instead
        when it ended with that cancellation and no other is pending."""
        if not self.cancelled_holder:
            return None
        self.cancelled_holder = False
        return self._watch.core.lost if auncancel_current(ended_with) else None

    def stop(self) -> None:
        """Stop beating. A task is cancelled, not awaited, so that a second cancellation
        of the caller cannot land here and skip the release that follows: a beat in
        flight holds psycopg's connection lock, so the release waits for it anyway, and
        a cancelled keeper never judges what it saw. A thread is joined: once this
        returns no beat is in flight (unless called from the keeper's own thread, by
        ``on_lost``)."""
        self._stopping.set()
        worker, self._worker = self._worker, None
        if worker is not None:
            astop_worker(worker, self._watch.keep.timeout + 1)

    async def _run(self) -> None:
        watch = self._watch
        while not await self._watch_until(time.monotonic() + watch.keep.interval):
            row, failure = None, None
            try:
                row = await self._heartbeat.beat(watch.statement, watch.keep.timeout)
            except Exception as exc:
                failure = exc
            if await self._judged(watch.verdict(row, failure, self._driver)):
                return

    async def _watch_until(self, beat_at: float) -> bool:
        """Until ``beat_at``, watch the connection: a backend that is terminated, or a
        server that shuts down, says so and closes the socket, which is seen here at once
        rather than at the next beat. Whether the keeper is done (stopped, or the lock
        lost)."""
        pause = FIRST_PAUSE
        while (left := beat_at - time.monotonic()) > 0:
            news, failure = None, None
            try:
                news = await self._heartbeat.wait_for_news(left, self._stopping)
            except Exception as exc:
                failure = exc
            if failure is not None:
                # A failed read is judged as a failed beat is; one that says nothing
                # about the lock leaves the rest to the beat, when it is due.
                if await self._judged(self._watch.verdict(None, failure, self._driver)):
                    return True
                return await self._stopping.wait(max(0.0, beat_at - time.monotonic()))
            if self._stopping.is_set():
                return True
            if news == "busy":
                await self._stopping.wait(min(pause, left))
                pause *= 2
            else:
                pause = FIRST_PAUSE
        return self._stopping.is_set()

    async def _judged(self, error: LockLostError | None) -> bool:
        """Act on a verdict: whether the keeper is done."""
        if self._stopping.is_set():
            return True  # released meanwhile: what was seen may be about the release
        if error is None:
            return False
        watch = self._watch
        watch.declare(error)
        if watch.keep.cancel:
            self.cancelled_holder = acancel_worker(self._holder, f"pgsolo: {error}")
        return True
