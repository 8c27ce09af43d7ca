"""``xact_lock`` and ``session_lock``: validate everything, then pick the lock core for
the lifetime (:func:`lock_core`) and the shell for the connection's driver."""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

from .._types import Lifetime
from ..drivers import DriverBase, adapt, is_async
from ..errors import UsageError
from ..keys import KeyLike, Registry, key_of
from ._async.lock import AsyncLock
from ._sync.lock import Lock
from .core import LockCore
from .session import SessionLockCore
from .spec import Keep, LockSpec, as_keep, check_flags, refuse_keeper, try_spec, wait_ms_of
from .transaction import XactLockCore

if TYPE_CHECKING:
    from ..drivers.kinds import AsyncConnectionLike, SyncConnectionLike

__all__ = ["lock_core", "session_lock", "xact_lock"]


# The core of each lifetime, each owning the state only it has.
_CORES: dict[Lifetime, type[LockCore]] = {"xact": XactLockCore, "session": SessionLockCore}


def lock_core(driver: DriverBase, spec: LockSpec) -> LockCore:
    """The core that takes and gives back the lock of ``spec`` on ``driver``'s
    connection (:data:`_CORES`)."""
    return _CORES[spec.lifetime](driver, spec)


def _make(  # positional only: keywords bind at twice the cost, and every lock comes here
    conn: object,
    key: KeyLike,
    lifetime: Lifetime,
    wait: float | None,
    shared: bool,
    reentrant: bool,
    namespace: int | None,
    registry: Registry | None,
    fencing: bool,
    keep: bool | Keep | None,
    /,
) -> Lock | AsyncLock:
    # Validate everything before touching the connection.
    if (
        wait is None
        and shared is False
        and reentrant is False
        and fencing is False
        and (keep is None or keep is False)
        and namespace is None
        and registry is None
    ):  # a plain try, as most locks are: its spec made once per key
        spec = try_spec(key, lifetime)
        driver = adapt(conn)
    else:
        resolved = key_of(key, namespace, registry)
        wait_ms = wait_ms_of(wait)
        if shared is not False or reentrant is not False or fencing is not False:
            check_flags(shared=shared, reentrant=reentrant, fencing=fencing)
        keeping = None if keep is None or keep is False else as_keep(keep)
        driver = adapt(conn)
        if keeping is not None:
            refuse_keeper(driver)
            if keeping.cancel and not is_async(driver):
                raise UsageError(
                    "Keep(cancel=True) cancels an asyncio task: it needs an async connection"
                )
        # Positional: a named tuple binds keywords in Python, at twice the cost.
        spec = LockSpec(resolved, lifetime, wait_ms, shared, reentrant, fencing, keeping)
    core = _CORES[lifetime](driver, spec)  # lock_core(), without a call: every lock comes here
    if is_async(driver):
        return AsyncLock(core, driver)
    return Lock(core, driver)


@overload
def xact_lock(
    conn: AsyncConnectionLike,
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
) -> AsyncLock: ...
@overload
def xact_lock(
    conn: SyncConnectionLike,
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
) -> Lock: ...
def xact_lock(
    conn: SyncConnectionLike | AsyncConnectionLike,
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
) -> Lock | AsyncLock:
    """A transaction-level advisory lock: released by COMMIT or ROLLBACK, never leaked.

    As a context manager it opens a transaction when none is open (BEGIN and the lock in
    one round trip), commits it at the end of the block and rolls it back on an error.
    Inside a transaction the caller already has, it joins that transaction and the lock
    lasts until the caller ends it. ``wait=None`` tries once (``lock.acquired`` tells the
    answer); ``wait=S`` waits up to S seconds and raises :class:`~pgsolo.LockTimeoutError`
    after that; ``wait=math.inf`` waits for as long as it takes. Any wait runs in slices
    of at most 2 s, each bounded by a server-side ``lock_timeout``, so that it never holds
    back VACUUM (:mod:`pgsolo.locking.waits`).

    ``fencing=True`` issues a fencing token (``lock.token``) in the same transaction as the
    lock; it needs ``pgsolo migrate``.
    """
    return _make(conn, key, "xact", wait, shared, False, namespace, registry, fencing, None)


@overload
def session_lock(
    conn: AsyncConnectionLike,
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    reentrant: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
    keep: bool | Keep = False,
) -> AsyncLock: ...
@overload
def session_lock(
    conn: SyncConnectionLike,
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    reentrant: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
    keep: bool | Keep = False,
) -> Lock: ...
def session_lock(
    conn: SyncConnectionLike | AsyncConnectionLike,
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    reentrant: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
    keep: bool | Keep = False,
) -> Lock | AsyncLock:
    """A session-level advisory lock, for work that spans commits or external calls.

    It stays on the connection it was taken on until released (the ``with`` block
    releases it in ``finally``) or until the session ends. A second acquisition of a
    key this connection already holds is refused (busy for a try, an error for a wait)
    unless ``reentrant=True``, in which case holds are counted. ``wait=`` as for
    :func:`xact_lock`.

    Before the first session lock on a connection pgsolo checks that the connection
    reaches one server session for good: behind a transaction-pooling proxy it raises
    :class:`~pgsolo.UnsafeConnectionError` and takes nothing (see :mod:`pgsolo.locking.routing`).

    ``keep=True`` (or a :class:`~pgsolo.Keep`) watches the lock while it is held
    (``lock.lost``, ``lock.check()``, ``on_lost``); ``fencing=True`` issues a fencing
    token (``lock.token``) in the same round trip as the lock; it needs ``pgsolo migrate``.
    """
    return _make(conn, key, "session", wait, shared, reentrant, namespace, registry, fencing, keep)
