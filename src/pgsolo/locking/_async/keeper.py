"""The keeper of one held session lock on an async connection: a worker of its own that
beats every ``interval`` seconds and judges each answer with
:class:`~pgsolo.locking.keeper.Watch`. See :mod:`pgsolo.locking.keeper`."""

from __future__ import annotations

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
from ...drivers import AsyncDriver
from ...errors import LockLostError
from ..keeper import Keep, Watch

if TYPE_CHECKING:
    from ..core import LockCore

__all__ = ["AsyncKeeper"]


class AsyncKeeper:
    """Watches one lock on an async connection, from a worker of its own."""

    def __init__(self, core: LockCore, driver: AsyncDriver, keep: Keep) -> None:
        self._watch = Watch(core, keep)
        self._driver = driver
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
        while not await self._stopping.wait(watch.keep.interval):
            row, failure = None, None
            try:
                row = await self._driver.beat(watch.statement, watch.keep.timeout)
            except Exception as exc:
                failure = exc
            error = watch.verdict(row, failure, self._driver)
            if self._stopping.is_set():
                return  # released meanwhile: the answer may be about the release
            if error is not None:
                watch.declare(error)
                if watch.keep.cancel:
                    self.cancelled_holder = acancel_worker(self._holder, f"pgsolo: {error}")
                return
