"""The lock objects users hold: :class:`AsyncLock` on an async connection, written here,
and ``Lock`` on a sync one, its twin generated from this file by ``scripts/unasync.py``
(``_sync/lock.py``). A lock object drives the plans of its
:class:`~pgsolo.locking.core.LockCore` with its driver, and starts and stops the keeper
around a held session lock; what it shows without a round trip is
:class:`~pgsolo.locking.view.LockView`'s."""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import Self

from ...drivers import AsyncDriver
from ...errors import LockLostError, LockNotHeldError
from ..core import LockCore
from ..view import LockView
from ..watch import Watch
from .drive import adrive
from .keeper import AsyncKeeper

__all__ = ["AsyncLock"]


class AsyncLock(LockView):
    """An advisory lock on an async connection; see :func:`~pgsolo.xact_lock` and
    :func:`~pgsolo.session_lock`."""

    def __init__(self, core: LockCore, driver: AsyncDriver) -> None:
        self._core = core
        self._driver = driver
        self._keeper: AsyncKeeper | None = None

    async def acquire(self) -> bool:
        """Try (or wait, if ``wait=`` was given) and return whether the lock was acquired.

        A wait that runs out raises :class:`~pgsolo.LockTimeoutError`.
        """
        await self._enter(False)
        return self._core.acquired

    async def release(self) -> None:
        """Release a session lock on the connection it was taken on. Raises the
        :class:`~pgsolo.LockLostError` the keeper found, if it found one."""
        await self.__aexit__(None, None, None, True)

    async def is_held(self) -> bool:
        return await adrive(self._core.is_held(), self._driver)

    def __aenter__(self) -> Awaitable[Self]:
        # The acquisition is _enter's, which acquire() shares, handed back to be run:
        # where it is a coroutine, one coroutine less on every lock's way to the server.
        return self._enter(True)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        releasing: bool = False,
        /,
    ) -> None:
        """Leave the block (``exc``: what ended it, if anything did), or release the lock
        (``releasing``: release(), which shares all of this): the common case by one round
        trip of the shell's own (LockCore.quick_release), anything else by its plan.
        Written as one function: every lock ends here, and each frame between it and the
        server costs every lock (a coroutine's most)."""
        core, driver, keeper = self._core, self._driver, self._keeper
        try:
            if keeper is not None:
                self._stop_keeper()
            loss_for_cancel = (
                keeper.undo_cancel(exc) if keeper is not None and not releasing else None
            )
            if exc_type is not None:
                await adrive(
                    core.exit(failed=True), driver, cleaning_up=not isinstance(exc, Exception)
                )
            elif not isinstance(quick := core.quick_release(not releasing), tuple):
                await adrive(quick, driver)
            else:
                statements, edge, seconds = quick
                try:
                    # The unlock alone goes the driver's own way if it has one, awaited here
                    # as _enter awaits the try: a frame between them and the server would
                    # cost every lock.
                    if (
                        edge is None
                        and (calls := driver.lone_calls) is not None
                        and (sending := calls.send(statements)) is not None
                    ):
                        try:
                            value = (await sending)[0][0]
                        except Exception as failure:
                            value = await calls.resend(failure, statements)
                    else:
                        value = await driver.fetch_value(statements, seconds, edge)
                    core.forget()  # off the books at once: a Ctrl-C may land at any line
                except BaseException as failure:
                    cleaning_up = not isinstance(failure, Exception)
                    await adrive(
                        core.quick_release_failed(failure), driver, cleaning_up=cleaning_up
                    )
                    raise
                if (stranded := core.quick_released(value)) is not None:
                    await adrive(stranded, driver)  # behind a proxy, moved off the session
        except (LockLostError, LockNotHeldError) as failure:
            if (instead := self._lost_instead(failure)) is not failure:
                raise instead from failure
            raise
        except BaseException as failure:
            if releasing:
                self._start_keeper()  # still held and on the books: still watched
            elif not isinstance(failure, Exception):  # interrupted (Ctrl-C) before the release
                await self._let_go()
            raise
        if loss_for_cancel is not None:
            raise loss_for_cancel from exc  # Keep(cancel=True) ended the block
        if exc_type is None and core.lost is not None:
            # The block ran to its end, but not all of it under the lock (or release() of a
            # re-entrant hold released only its count).
            raise core.lost

    async def _enter(self, context: bool, /) -> Self:
        """Take the lock (``context``: for a ``with`` block), and start its keeper: the
        common case by one round trip of the shell's own (LockCore.quick_acquisition),
        anything else by its plan. Whatever cuts it short lets go of what it took."""
        core, driver = self._core, self._driver
        if core.acquired:
            core.begin()  # refused, outside the try: the hold it has stays
        try:
            quick = core.quick_acquisition(context)
            if not isinstance(quick, tuple):
                await adrive(quick, driver)
            else:
                statements, edge, seconds = quick
                try:
                    # The try alone goes the driver's own way if it has one, awaited here
                    # as __aexit__ awaits the unlock: a frame between them and the server
                    # would cost every lock.
                    if (
                        edge is None
                        and (calls := driver.lone_calls) is not None
                        and (sending := calls.send(statements)) is not None
                    ):
                        try:
                            value = (await sending)[0][0]
                        except Exception as failure:
                            value = await calls.resend(failure, statements)
                    else:
                        value = await driver.fetch_value(statements, seconds, edge)
                except BaseException as exc:
                    cleaning_up = not isinstance(exc, Exception)
                    await adrive(core.quick_failed(exc), driver, cleaning_up=cleaning_up)
                else:
                    core.quick_answer(value)
            if core.spec.keep is not None:  # a call less for every other lock
                self._start_keeper()
        except BaseException:
            await self._let_go()
            raise
        return self

    async def _let_go(self) -> None:
        """The acquisition raised after the plan took the lock (a Ctrl-C as it returned):
        the caller never gets it, so nothing may stay held."""
        self._stop_keeper()
        await adrive(self._core.let_go(), self._driver, cleaning_up=True)

    def _start_keeper(self) -> None:
        keep = self._core.spec.keep
        if keep is not None and self._core.acquired and self._keeper is None:
            self._keeper = AsyncKeeper(Watch(self._core, keep), self._driver)
            self._keeper.start()

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
