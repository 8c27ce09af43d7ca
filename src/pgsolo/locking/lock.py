"""The lock objects users hold: :class:`Lock` on a sync connection, :class:`AsyncLock` on
an async one. Each drives the plans of its :class:`~pgsolo.locking.core.LockCore` with its
driver, and starts and stops the keeper around a held session lock."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from .._types import Lifetime
from ..drivers import AsyncDriver, SyncDriver
from ..errors import LockLostError, LockNotHeldError
from ..keys import Key
from .core import LockCore
from .keeper import AsyncKeeper, Keeper
from .plans import adrive, drive

__all__ = ["AsyncLock", "Lock"]


class _LockView:
    _core: LockCore

    @property
    def key(self) -> Key:
        return self._core.key

    @property
    def lifetime(self) -> Lifetime:
        return self._core.lifetime

    @property
    def shared(self) -> bool:
        return self._core.shared

    @property
    def acquired(self) -> bool:
        """Whether this object acquired the lock (and, for a session lock, still holds it)."""
        return self._core.acquired

    @property
    def backend_pid(self) -> int | None:
        """The backend pid the lock was taken on, as the connection announced it."""
        return self._core.backend_pid

    @property
    def token(self) -> int | None:
        """The fencing token of this acquisition (``fencing=True``): larger than any
        token issued for this key before. Downstream systems reject writes that carry a
        smaller token than one they have seen, so a holder that lost its lock cannot
        overwrite the work of the next one."""
        return self._core.token

    @property
    def lost(self) -> bool:
        """Whether the keeper (``keep=``) found the lock gone while it was held."""
        return self._core.lost is not None

    @property
    def loss(self) -> LockLostError | None:
        """What the keeper found (``reason`` says how the lock went), or None."""
        return self._core.lost

    def check(self) -> None:
        """Raise :class:`~pgsolo.LockLostError` if the keeper found the lock gone.

        Cheap (no round trip): call it between steps of long work."""
        if self._core.lost is not None:
            raise self._core.lost

    def _lost_instead(self, exc: BaseException) -> BaseException:
        """What a failed release means once the keeper has seen the lock go."""
        lost = self._core.lost
        if lost is not None and isinstance(exc, LockLostError | LockNotHeldError):
            return lost
        return exc

    def __repr__(self) -> str:
        state = "acquired" if self.acquired else "not acquired"
        if self.lost:
            state = "lost"
        return f"<{type(self).__name__} {self.lifetime} {self.key} {state}>"


class Lock(_LockView):
    """An advisory lock on a sync connection; see :func:`xact_lock` and :func:`session_lock`."""

    def __init__(self, core: LockCore, driver: SyncDriver) -> None:
        self._core = core
        self._driver = driver
        self._keeper: Keeper | None = None

    def acquire(self) -> bool:
        """Try (or wait, if ``wait=`` was given) and return whether the lock was acquired.

        A wait that runs out raises :class:`~pgsolo.LockTimeoutError`.
        """
        acquired = drive(self._core.acquire(context=False), self._driver)
        self._start_keeper()
        return acquired

    def release(self) -> None:
        """Release a session lock on the connection it was taken on. Raises the
        :class:`~pgsolo.LockLostError` the keeper found, if it found one."""
        self._stop_keeper()
        try:
            drive(self._core.release(), self._driver)
        except (LockLostError, LockNotHeldError) as exc:
            if (instead := self._lost_instead(exc)) is not exc:
                raise instead from exc
            raise
        except BaseException:
            self._start_keeper()  # still held and on the books: still watched
            raise
        if self._core.lost is not None:  # a re-entrant hold released only its count
            raise self._core.lost

    def is_held(self) -> bool:
        return drive(self._core.is_held(), self._driver)

    def __enter__(self) -> Self:
        drive(self._core.acquire(context=True), self._driver)
        self._start_keeper()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_keeper()
        try:
            drive(self._core.exit(failed=exc_type is not None), self._driver)
        except (LockLostError, LockNotHeldError) as failure:
            if (instead := self._lost_instead(failure)) is not failure:
                raise instead from failure
            raise
        if exc_type is None and self._core.lost is not None:
            raise self._core.lost  # the block ran to its end, but not all of it under the lock

    def _start_keeper(self) -> None:
        if self._core.keep is not None and self._core.acquired and self._keeper is None:
            self._keeper = Keeper(self._core, self._driver, self._core.keep)
            self._keeper.start()

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()


class AsyncLock(_LockView):
    """An advisory lock on an async connection; the twin of :class:`Lock`."""

    def __init__(self, core: LockCore, driver: AsyncDriver) -> None:
        self._core = core
        self._driver = driver
        self._keeper: AsyncKeeper | None = None

    async def acquire(self) -> bool:
        acquired = await adrive(self._core.acquire(context=False), self._driver)
        self._start_keeper()
        return acquired

    async def release(self) -> None:
        self._stop_keeper()
        try:
            await adrive(self._core.release(), self._driver)
        except (LockLostError, LockNotHeldError) as exc:
            if (instead := self._lost_instead(exc)) is not exc:
                raise instead from exc
            raise
        except BaseException:
            self._start_keeper()
            raise
        if self._core.lost is not None:
            raise self._core.lost

    async def is_held(self) -> bool:
        return await adrive(self._core.is_held(), self._driver)

    async def __aenter__(self) -> Self:
        await adrive(self._core.acquire(context=True), self._driver)
        self._start_keeper()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        keeper = self._keeper
        self._stop_keeper()
        loss_for_cancel = keeper.undo_cancel(exc) if keeper is not None else None
        try:
            await adrive(self._core.exit(failed=exc_type is not None), self._driver)
        except (LockLostError, LockNotHeldError) as failure:
            if (instead := self._lost_instead(failure)) is not failure:
                raise instead from failure
            raise
        if loss_for_cancel is not None:
            raise loss_for_cancel from exc  # Keep(cancel=True) ended the block
        if self._core.lost is not None and exc_type is None:
            raise self._core.lost

    def _start_keeper(self) -> None:
        if self._core.keep is not None and self._core.acquired and self._keeper is None:
            self._keeper = AsyncKeeper(self._core, self._driver, self._core.keep)
            self._keeper.start()

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
