""":class:`AsyncSemaphore`: at most ``limit`` holders at once, on an async connection; its
sync twin ``Semaphore`` is generated from this file by ``scripts/unasync.py``."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING, Self

from ...errors import LockTimeoutError, LockUnavailableError, PgsoloError, UsageError
from ...keys import Key
from ...locking import (
    AsyncLock,
    AsyncLocker,
    AsyncLockerLock,
    InnerLockView,
    held_session_locks,
    session_lock,
    slot_attempts,
)
from ..spec import SemaphoreSpec

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["AsyncSemaphore"]


class AsyncSemaphore(InnerLockView):
    """A semaphore on an async connection, or through an :class:`~pgsolo.AsyncLocker`; see
    :func:`~pgsolo.semaphore`.

    It holds one slot at a time: the session lock of one of its slots' keys, taken with the
    guarantees of :func:`~pgsolo.session_lock` (bounded waits that hold back no VACUUM, the
    keeper, the fencing token, nothing left held at any ending)."""

    def __init__(self, conn: AsyncConnectionLike | AsyncLocker, spec: SemaphoreSpec) -> None:
        self._conn = conn
        self._spec = spec
        # the slot's lock while this one holds it
        self._lock: AsyncLock | AsyncLockerLock | None = None
        self.slot: int | None = None
        """The slot this one holds (0 to ``limit - 1``), or None."""

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def limit(self) -> int:
        return self._spec.limit

    @property
    def key(self) -> Key | None:
        """The key of the slot held, or None."""
        return None if self._lock is None else self._lock.key

    async def acquire(self) -> bool:
        """Take a free slot: try every slot once (``wait=None``: then give up, False),
        else wait for one, the first that frees, and raise
        :class:`~pgsolo.LockTimeoutError` once ``wait`` seconds have gone by. One that
        holds a slot already is refused (:class:`~pgsolo.UsageError`): it holds one at a
        time, and its first would be left held."""
        self._refuse_held()  # before the try: the slot it holds is not this call's to let go
        try:
            if await self._take_free():
                return True
        except BaseException:
            await self._let_go()  # cut short, perhaps just after a slot's grant
            raise
        spec = self._spec
        if spec.wait is None:
            return False
        raise LockTimeoutError(
            f"semaphore {spec.name!r} had no free slot of {spec.limit} within {spec.wait:g}s",
            key=spec.name,
            timeout=spec.wait,
        )

    async def _take_free(self) -> bool:
        """Whether a slot was taken, in the order of :func:`slot_attempts`."""
        spec = self._spec
        for slot, wait in slot_attempts(spec.limit, spec.wait):
            if wait is not None and self._held_here(slot):
                continue  # PostgreSQL would grant it to this session again: never freed
            if await self._take(slot, wait=wait):
                return True
        return False

    async def release(self) -> None:
        """Give the slot back (raises the :class:`~pgsolo.LockLostError` the keeper found).
        One cut short with the slot still held keeps it, for ``release()`` again."""
        lock = self._lock
        if lock is None:
            return
        try:
            await lock.release()
        finally:
            self._forget_unless_held(lock)

    async def __aenter__(self) -> Self:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock = self._lock
        if lock is None:
            return
        try:
            await lock.__aexit__(exc_type, exc, tb)
        finally:
            self._forget_unless_held(lock)

    def _forget_unless_held(self, lock: AsyncLock | AsyncLockerLock) -> None:
        """After a release, or one cut short (a Ctrl-C lands at any line): the slot stays
        this one's while its lock is still held, so that release() can let it go."""
        if not lock.acquired:
            self._lock, self.slot = None, None

    def _refuse_held(self) -> None:
        if self._lock is not None:
            raise UsageError(
                f"semaphore {self._spec.name!r} is already acquired by this object (slot"
                f" {self.slot}); release it first, or make another semaphore object"
            )

    async def _take(self, slot: int, *, wait: float | None) -> bool:
        """Try (or wait ``wait`` seconds for) one slot; whether it is this one's now. The
        lock is kept before it is taken, so that an interruption just after its grant
        finds it to give back (:meth:`_let_go`)."""
        spec, conn = self._spec, self._conn
        keep, key = spec.keep or False, spec.keys[slot]
        lock: AsyncLock | AsyncLockerLock
        if isinstance(conn, AsyncLocker):
            lock = conn.session_lock(key, wait=wait, keep=keep, fencing=spec.fencing)
        else:
            lock = session_lock(conn, key, wait=wait, keep=keep, fencing=spec.fencing)
        self._lock = lock
        try:
            await lock.__aenter__()
        except LockTimeoutError:  # the turn ran out: nothing is held
            self._lock = None
            return False
        # Anything else goes to acquire(), whose _let_go() lets the lock go if it is held
        # (an interruption just as __aenter__ returned lands here, after the grant).
        if lock.acquired:
            self.slot = slot
            return True
        self._lock = None
        return False

    def _held_here(self, slot: int) -> bool:
        """Whether this connection holds ``slot`` already (through another semaphore
        object), so that a turn waiting on it would wait for itself. Asked on each turn:
        what the connection holds may change between two. A wait when it holds every
        slot is refused, as a wait for a lock it holds is."""
        spec, conn = self._spec, self._conn
        if isinstance(conn, AsyncLocker):
            return False  # a Locker's wait tries: a slot held through it frees like any other
        here = set(held_session_locks(conn))
        if all(key in here for key in spec.keys):
            raise LockUnavailableError(
                f"every slot of semaphore {spec.name!r} ({spec.limit}) is held on this"
                " connection already; waiting for one would never end. Use another"
                " connection.",
                key=spec.name,
            )
        return spec.keys[slot] in here

    async def _let_go(self) -> None:
        """The acquisition was cut short (a cancellation, a Ctrl-C), perhaps just after a
        slot's grant: nothing may stay held."""
        lock, self._lock, self.slot = self._lock, None, None
        if lock is not None and lock.acquired:
            # What went wrong is already on its way out: a failed release (the connection
            # died, and the lock with it) must not replace it.
            with contextlib.suppress(PgsoloError):
                await lock.release()

    def __repr__(self) -> str:
        state = f"slot {self.slot}" if self.acquired else "no slot"
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} {state}>"
