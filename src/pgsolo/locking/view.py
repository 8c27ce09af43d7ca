"""The read-only side of a lock object, the same for both flavours."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._types import Lifetime
from ..errors import LockLostError, LockNotHeldError
from ..keys import Key

if TYPE_CHECKING:
    from .core import LockCore

__all__ = ["InnerLockView", "LockView"]


class LockView:
    """What a lock object shows of its :class:`~pgsolo.locking.core.LockCore`, without a
    round trip; shared by :class:`~pgsolo.Lock` and :class:`~pgsolo.AsyncLock`."""

    _core: LockCore

    @property
    def key(self) -> Key:
        return self._core.spec.key

    @property
    def lifetime(self) -> Lifetime:
        return self._core.spec.lifetime

    @property
    def shared(self) -> bool:
        return self._core.spec.shared

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


class InnerLockView:
    """What an object that holds its lock through an inner lock object shows of it, the
    same for both flavours: a semaphore (its slot's lock) and a Locker's lock (the lock
    on one of the Locker's connections). ``_lock`` is the inner lock while one is taken;
    ``_loss``, what is known of a loss once it is gone."""

    _lock: Any
    _loss: LockLostError | None = None

    @property
    def acquired(self) -> bool:
        """Whether this one holds the lock."""
        return self._lock is not None and bool(self._lock.acquired)

    @property
    def token(self) -> int | None:
        """The fencing token of this acquisition (``fencing=True``), or None."""
        return None if self._lock is None else self._lock.token

    @property
    def lost(self) -> bool:
        """Whether the keeper (``keep=``) found the lock gone while it was held."""
        return self.loss is not None

    @property
    def loss(self) -> LockLostError | None:
        """What the keeper found, or None."""
        return self._loss if self._lock is None else self._lock.loss

    def check(self) -> None:
        """Raise the :class:`~pgsolo.LockLostError` the keeper found, if it found one."""
        if (loss := self.loss) is not None:
            raise loss
