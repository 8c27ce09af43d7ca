"""Putting a connection right after a lock statement did not go as planned.

A statement can fail, or be interrupted (a cancelled task, a signal) before, during or
after the server ran it. Then pgsolo cleans up without raising (:func:`quietly`: a dead
connection has nothing left to clean), puts the connection back as it was, and, for a
session lock, asks the server whether the key is held after all, so that nothing stays
held that nobody knows of and nothing is forgotten that is still held.

These are the steps that change no lock's state; the lock core that owns the state calls
them and keeps its books (:class:`~pgsolo.locking.session.SessionLockCore`,
:class:`~pgsolo.locking.transaction.XactLockCore`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import DriverBase, TxStatus
from ..errors import PgsoloError
from .failures import timed_out
from .placement import in_savepoint, unlock_statement
from .plans import Own, Plan

if TYPE_CHECKING:
    from .spec import LockSpec

__all__ = [
    "after_session_failure",
    "connection_gone",
    "drop_hold",
    "quietly",
    "recover",
    "release_if_held",
]


def connection_gone(driver: DriverBase, exc: BaseException, backend_pid: int | None) -> bool:
    """Whether ``exc``, an error of one of pgsolo's statements for a lock held by backend
    ``backend_pid`` (not an interruption, and not pgsolo's own already, as a deadline's
    is), came with the end of the session that held the lock: the connection is closed,
    or the framework over it has reconnected already as it closed its books on the
    failure (Django does), and a new backend holds nothing of the lock's."""
    if isinstance(exc, PgsoloError) or not isinstance(exc, Exception):
        return False
    return driver.is_closed() or driver.backend_pid() != backend_pid


def quietly(driver: DriverBase, statements: list[str] | Own) -> Plan[object]:
    """Send clean-up statements; a dead connection has nothing left to clean, but the end
    of pgsolo's own transaction (:class:`Own`) is always sent: a framework closes its
    books on the transaction even when the connection is gone."""
    if driver.is_closed() and not isinstance(statements, Own):
        return None
    try:
        return (yield statements)
    except Exception as exc:
        logger.debug("pgsolo clean-up %r failed: %r", statements, exc)
        return None


def drop_hold(driver: DriverBase, hold: str | None) -> Plan[None]:
    """Leave ``hold`` (a session lock's savepoint in the caller's transaction; the caller
    has taken it off its books) if it is still there, at no cost to the caller's
    transaction either way: the RELEASE runs in a savepoint opened after the hold, which it
    releases too, and which alone fails (and is rolled back) if the hold is gone."""
    if hold is None:
        return
    try:
        yield [sql.SAVEPOINT, sql.release_savepoint(hold)]
    except Exception as exc:
        logger.debug("pgsolo: leaving savepoint %s failed: %r", hold, exc)
        yield from quietly(driver, [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])


def recover(
    driver: DriverBase, spec: LockSpec, status: TxStatus, *, again: bool = True
) -> Plan[object]:
    """After a failed or interrupted session-lock statement on a connection that was in
    ``status``: put the connection back as it was, then ask the server whether this
    backend holds the key (True/False, or None when it cannot tell). A question that
    fails is asked once more (``again``): the cancellation of the interrupted statement
    can reach the server after that statement ended, and cancel the question instead."""
    now = driver.transaction_status()
    if status is TxStatus.INTRANS:
        if now is TxStatus.INERROR:  # the error happened inside our savepoint
            yield from quietly(driver, [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])
    elif now in (TxStatus.INTRANS, TxStatus.INERROR):  # a transaction we opened
        yield from quietly(driver, [sql.ROLLBACK])
    question = in_savepoint(driver, status, [sql.held_here(spec.key, shared=spec.shared)])
    held = yield from quietly(driver, question)
    if held is None and again and not driver.is_closed():
        return (yield from recover(driver, spec, status, again=False))
    return held


def after_session_failure(
    driver: DriverBase,
    spec: LockSpec,
    status: TxStatus,
    exc: BaseException,
    hold: str | None,
    guard: int | None,
) -> Plan[bool]:
    """After a failed or interrupted session-lock acquisition (``exc``) on a connection
    that was in ``status``, with the lock's ``hold`` (taken off the caller's books):
    whether the lock is the caller's after all (granted just as the wait timed out; its
    hold, if any, is open again). A lock granted before another interruption is released,
    so that nothing is left behind: one that lands while this puts the connection right
    or asks whether the lock was granted, too (a cancellation just after a slice timed
    out, as its holder let the key go)."""
    try:
        if hold is not None:  # opened first: every other statement of the message is inside it
            if driver.transaction_status() is TxStatus.INERROR:
                undo = [sql.rollback_to_savepoint(hold), sql.release_savepoint(hold)]
                yield from quietly(driver, undo)
            else:  # interrupted before the server ran the message, or after
                yield from drop_hold(driver, hold)
        # With fencing the token was not read: the caller cannot have that lock.
        if spec.wait_ms is not None and timed_out(driver, exc) and not spec.fencing:
            granted = (yield from recover(driver, spec, status)) is True
            if granted and hold is not None:  # the block still needs its hold
                yield [sql.savepoint(hold)]
        else:
            granted = False
            yield from release_if_held(driver, spec, status, guard)
    except BaseException:
        # An interruption, or a failure of the statement that opens the hold again: the
        # key may be held, and nobody would know of it.
        yield from release_if_held(driver, spec, status, guard)
        raise
    return granted


def release_if_held(
    driver: DriverBase, spec: LockSpec, status: TxStatus, guard: int | None
) -> Plan[object]:
    """After an interrupted session-lock acquisition or release on a connection that was
    in ``status``: put the connection back as it was, and release the key if the server
    says this backend holds it, so that nothing is left behind. Whether the key is held
    now (None when the server cannot tell). Two rounds, as :func:`recover` asks twice: a
    late cancellation can fail the unlock as well as the question."""
    held = None
    for _ in range(2):
        held = yield from recover(driver, spec, status)
        if held is not True:
            return held
        now = driver.transaction_status()
        unlock = in_savepoint(driver, now, [unlock_statement(spec, guard)])
        if (yield from quietly(driver, unlock)) is True:
            return False
    return held
