"""Where pgsolo's statements go on a connection, and in what company.

Inside the caller's transaction a lock statement runs in a savepoint, so that its failure
costs the caller nothing; outside any, pgsolo closes whatever transaction the driver opened
by itself. A wait bounds each of its slices (:mod:`~pgsolo.locking.waits`) with ``SET
LOCAL lock_timeout`` and puts the connection's own value back in the same round trip. The
statement lists are built here from what they need (the lock's
:class:`~pgsolo.locking.spec.LockSpec`, the backend pid that guards a statement behind a
proxy, the lock's hold); sending them and reading the answers is the lock core's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import sql
from ..drivers import DriverBase, TxStatus

if TYPE_CHECKING:
    from .spec import LockSpec

__all__ = [
    "in_savepoint",
    "outside_transaction",
    "quick_try",
    "quick_unlock",
    "release_failed_hold",
    "release_hold",
    "session_acquisition",
    "unlock_statement",
    "xact_acquisition",
]


def outside_transaction(
    driver: DriverBase, statements: list[str], status: TxStatus | None = None
) -> list[str]:
    """Statements that must not leave a transaction open behind them (``status``: the
    connection's, if the caller has just read it).

    A driver that opens transactions by itself would leave the session "idle in
    transaction" for as long as a session lock is held; close what it opened.
    """
    if driver.begins_implicitly and (status or driver.transaction_status()) is TxStatus.IDLE:
        return [*statements, sql.COMMIT]
    return statements


# The common case's statements, by the plain values they are made of: a lock of a key is
# taken again and again, and a lookup by them costs a third of building the statements
# again through sql's caches, which hash a Key by a call of Python. Emptied when full:
# a process that locks ever new keys (a tenant's id) must not keep them all.
_QUICK: dict[tuple[object, ...], tuple[str, ...]] = {}
_QUICK_MAX = 4096


def quick_try(
    driver: DriverBase,
    spec: LockSpec,
    lock_timeout_ms: int | None = None,
    *,
    guard: int | None = None,
) -> Sequence[str]:
    """The try of ``spec`` (or the slice of its wait that waits up to
    ``lock_timeout_ms``) on a connection with no transaction open, for a session lock
    (behind a proxy, only on backend ``guard``), or a transaction lock after what opens
    pgsolo's own transaction: what :func:`session_acquisition` and
    :func:`xact_acquisition` build then. A wait of 2 s or more always begins with a
    slice of the same length, so its first slice is as common as a try."""
    session = spec.lifetime == "session"
    implicit = session and driver.begins_implicitly
    shape = (
        spec.key.value,
        spec.lifetime,
        spec.shared,
        spec.fencing,
        implicit,
        lock_timeout_ms,
        guard,
    )
    statements = _QUICK.get(shape)
    if statements is None:
        built = (
            session_acquisition(driver, spec, TxStatus.IDLE, guard, None, lock_timeout_ms)
            if session
            else xact_acquisition(spec, lock_timeout_ms, in_callers_transaction=False)
        )
        statements = tuple(built)
        _remember(shape, statements)
    return statements


def quick_unlock(driver: DriverBase, spec: LockSpec, guard: int | None) -> Sequence[str]:
    """The unlock of a session lock on a connection with no transaction open (behind a
    proxy, only on backend ``guard``)."""
    implicit = driver.begins_implicitly
    shape = (spec.key.value, "unlock", spec.shared, implicit, guard)
    statements = _QUICK.get(shape)
    if statements is None:
        statements = tuple(
            outside_transaction(driver, [unlock_statement(spec, guard)], TxStatus.IDLE)
        )
        _remember(shape, statements)
    return statements


def _remember(shape: tuple[object, ...], statements: tuple[str, ...]) -> None:
    if len(_QUICK) >= _QUICK_MAX:
        _QUICK.clear()
    _QUICK[shape] = statements


def in_savepoint(driver: DriverBase, status: TxStatus, statements: list[str]) -> list[str]:
    """Statements for a session lock, placed so that they can fail or be interrupted
    without costing the caller's transaction or leaving one of ours open."""
    if status is TxStatus.INTRANS:
        return [sql.SAVEPOINT, *statements, sql.SAVEPOINT_RELEASE]
    return outside_transaction(driver, statements)


def unlock_statement(spec: LockSpec, guard: int | None) -> str:
    """The unlock of a session lock; behind a proxy, only on the backend that holds it
    (``guard``)."""
    unlock = sql.unlock(spec.key, shared=spec.shared)
    return unlock if guard is None else sql.session_guarded(guard, unlock)


def release_hold(driver: DriverBase, spec: LockSpec, guard: int | None, hold: str) -> list[str]:
    """The unlock of a session lock in the caller's transaction, leaving its
    ``hold`` first. The RELEASE runs in a savepoint of its own (which it releases too, as
    it was opened after the hold): if the caller released or rolled back past the hold,
    only that savepoint fails (SQLSTATE 3B001), before the unlock, and the caller's
    transaction is untouched. The unlock runs in a savepoint too, as any of pgsolo's
    statements in the caller's transaction."""
    return [
        sql.SAVEPOINT,
        sql.release_savepoint(hold),
        *in_savepoint(driver, TxStatus.INTRANS, [unlock_statement(spec, guard)]),
    ]


def release_failed_hold(spec: LockSpec, guard: int | None, hold: str) -> list[str]:
    """The unlock of a session lock in a transaction that failed inside its
    block: roll back to the ``hold`` (undoing only the block's work, which the caller must
    roll back anyway), unlock, and fail the transaction again, as the failure left it
    (:func:`pgsolo.sql.unlock_keeping_failure`: the answer comes back as the error's
    SQLSTATE). If the hold is gone, the first statement fails and nothing else runs."""
    return [
        sql.rollback_to_savepoint(hold),
        sql.release_savepoint(hold),
        sql.unlock_keeping_failure(unlock_statement(spec, guard)),
    ]


def session_acquisition(
    driver: DriverBase,
    spec: LockSpec,
    status: TxStatus,
    guard: int | None,
    hold: str | None,
    lock_timeout_ms: int | None,
) -> list[str]:
    """The statements that take a session lock on a connection in ``status``, waiting up
    to ``lock_timeout_ms`` (one slice of a wait; None: a try); behind a proxy, only on
    backend ``guard``.

    Inside the caller's transaction they open the lock's ``hold``
    (:func:`pgsolo.sql.hold_savepoint`) first, and leave it open for the block: a failure
    of what follows is undone by rolling back to it, and a busy try leaves it."""
    acquire = _acquire(spec)
    if guard is not None:  # behind a proxy: only on the session the route was checked on
        acquire = sql.session_guarded(guard, acquire)
    if status is TxStatus.INTRANS:
        assert hold is not None  # noqa: S101 - the core names it in a transaction
        opening_hold = sql.savepoint(hold)
        if lock_timeout_ms is None:
            return [opening_hold, acquire]
        # Rolling back to the inner savepoint restores lock_timeout; the lock stays.
        return [
            opening_hold,
            sql.SAVEPOINT,
            sql.set_local_lock_timeout(lock_timeout_ms),
            acquire,
            sql.SAVEPOINT_UNDO,
            sql.SAVEPOINT_RELEASE,
        ]
    if lock_timeout_ms is None:
        return outside_transaction(driver, [acquire], status)
    # SET LOCAL dies with this short transaction; the session lock outlives it.
    opening = [] if driver.begins_implicitly else [sql.BEGIN]
    return [*opening, sql.set_local_lock_timeout(lock_timeout_ms), acquire, sql.COMMIT]


def xact_acquisition(
    spec: LockSpec, lock_timeout_ms: int | None, *, in_callers_transaction: bool
) -> list[str]:
    """The statements that take a transaction lock, waiting up to
    ``lock_timeout_ms`` (one slice of a wait; None: a try), after those that open
    pgsolo's own transaction if it opens one (:mod:`pgsolo.locking.transaction`)."""
    if lock_timeout_ms is None:
        return [_acquire(spec)]
    # The bound is for the wait only: the protected statements that follow run with the
    # connection's own lock_timeout, which the waiting statement puts back.
    wait = sql.xact_wait(spec.key, lock_timeout_ms, shared=spec.shared, fencing=spec.fencing)
    if in_callers_transaction:
        # A savepoint keeps the caller's transaction usable if the slice times out (or the
        # server turns out to be a standby), and the statement is inside it: one that an
        # interruption cancels fails in the savepoint, never in the caller's transaction
        # (what the statement set outlives the savepoint's release).
        return [sql.SAVEPOINT, wait, sql.SAVEPOINT_RELEASE]
    return [wait]


def _acquire(spec: LockSpec) -> str:
    """The statement that takes the lock. A transaction lock refuses a standby in it; a
    session lock was checked once per connection (the route's stamp)."""
    return sql.acquire(
        spec.key,
        spec.lifetime,
        wait=spec.wait_ms is not None,
        shared=spec.shared,
        fencing=spec.fencing,
        refuse_standby=spec.lifetime == "xact",
    )
