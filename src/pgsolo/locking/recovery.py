"""Putting a connection right after a lock statement did not go as planned.

A statement can fail, or be interrupted (a cancelled task, a signal) before, during or
after the server ran it. Then pgsolo cleans up without raising (:func:`quietly`: a dead
connection has nothing left to clean), puts the connection back as it was, and, for a
session lock, asks the server whether the key is held after all, so that nothing stays
held that nobody knows of and nothing is forgotten that is still held.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import TxStatus
from ..errors import LockLostError, PgsoloError
from . import failures
from .placement import in_savepoint, unlock_statement
from .plans import ROLLBACK, Elsewhere, Own, Plan
from .routing import transaction_pooling_error

if TYPE_CHECKING:
    from .core import LockCore

__all__ = [
    "abandon_own_transaction",
    "after_failed_release",
    "after_session_failure",
    "after_xact_failure",
    "connection_gone",
    "drop_hold",
    "quietly",
    "recover",
    "release_if_held",
    "release_stranded",
]


def connection_gone(core: LockCore, exc: BaseException) -> bool:
    """Whether ``exc``, an error of one of pgsolo's statements for ``core``'s held lock
    (not an interruption, and not pgsolo's own already, as a deadline's is), came with the
    end of the session that held the lock: the connection is closed, or the framework
    over it has reconnected already as it closed its books on the failure (Django does),
    and a new backend holds nothing of the lock's."""
    if isinstance(exc, PgsoloError) or not isinstance(exc, Exception):
        return False
    return core.driver.is_closed() or core.driver.backend_pid() != core.backend_pid


def quietly(core: LockCore, statements: list[str] | Own) -> Plan[object]:
    """Send clean-up statements; a dead connection has nothing left to clean, but the end
    of pgsolo's own transaction (:class:`Own`) is always sent: a framework closes its
    books on the transaction even when the connection is gone."""
    if core.driver.is_closed() and not isinstance(statements, Own):
        return None
    try:
        return (yield statements)
    except Exception as exc:
        logger.debug("pgsolo clean-up %r failed: %r", statements, exc)
        return None


def drop_hold(core: LockCore) -> Plan[None]:
    """Leave ``core.hold`` (a session lock's savepoint in the caller's transaction) if it
    is still there, at no cost to the caller's transaction either way: the RELEASE runs in
    a savepoint opened after the hold, which it releases too, and which alone fails (and
    is rolled back) if the hold is gone."""
    hold, core.hold = core.hold, None
    if hold is None:
        return
    try:
        yield [sql.SAVEPOINT, sql.release_savepoint(hold)]
    except Exception as exc:
        logger.debug("pgsolo: leaving savepoint %s failed: %r", hold, exc)
        yield from quietly(core, [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])


def recover(core: LockCore, status: TxStatus, *, again: bool = True) -> Plan[object]:
    """After a failed or interrupted session-lock statement on a connection that was in
    ``status``: put the connection back as it was, then ask the server whether this
    backend holds the key (True/False, or None when it cannot tell). A question that
    fails is asked once more (``again``): the cancellation of the interrupted statement
    can reach the server after that statement ended, and cancel the question instead."""
    now = core.driver.transaction_status()
    if status is TxStatus.INTRANS:
        if now is TxStatus.INERROR:  # the error happened inside our savepoint
            yield from quietly(core, [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])
    elif now in (TxStatus.INTRANS, TxStatus.INERROR):  # a transaction we opened
        yield from quietly(core, [sql.ROLLBACK])
    question = in_savepoint(core.driver, status, [sql.held_here(core.key, shared=core.shared)])
    held = yield from quietly(core, question)
    if held is None and again and not core.driver.is_closed():
        return (yield from recover(core, status, again=False))
    return held


def abandon_own_transaction(core: LockCore) -> Plan[None]:
    """Roll back the transaction pgsolo opened for a transaction lock it did not get."""
    if core.opened_transaction:
        core.opened_transaction = False
        yield from quietly(core, ROLLBACK)


def after_xact_failure(core: LockCore, *, in_callers_transaction: bool) -> Plan[None]:
    """After a failed or interrupted transaction-lock acquisition: roll back pgsolo's own
    transaction, or undo the savepoint of a wait in the caller's."""
    if core.opened_transaction:
        yield from abandon_own_transaction(core)
    elif (
        in_callers_transaction
        and core.wait_ms is not None
        and core.driver.transaction_status() is TxStatus.INERROR
    ):
        yield from quietly(core, [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])


def after_session_failure(core: LockCore, status: TxStatus, exc: BaseException) -> Plan[bool]:
    """After a failed or interrupted session-lock acquisition (``exc``) on a connection
    that was in ``status``: whether the lock is the caller's after all (granted just as
    the wait timed out). A lock granted before another interruption is released, so that
    nothing is left behind."""
    hold = core.hold
    if hold is not None:  # opened first: every other statement of the message is inside it
        if core.driver.transaction_status() is TxStatus.INERROR:
            core.hold = None
            undo = [sql.rollback_to_savepoint(hold), sql.release_savepoint(hold)]
            yield from quietly(core, undo)
        else:  # interrupted before the server ran the message, or after
            yield from drop_hold(core)
    # With fencing the token was not read: the caller cannot have that lock.
    if core.wait_ms is not None and failures.timed_out(core, exc) and not core.fencing:
        granted = (yield from recover(core, status)) is True
        if granted and hold is not None:  # the block still needs its hold
            yield [sql.savepoint(hold)]
            core.hold = hold
        return granted
    yield from release_if_held(core, status)
    return False


def release_if_held(core: LockCore, status: TxStatus) -> Plan[object]:
    """After an interrupted session-lock acquisition or release on a connection that was
    in ``status``: put the connection back as it was, and release the key if the server
    says this backend holds it, so that nothing is left behind. Whether the key is held
    now (None when the server cannot tell). Two rounds, as :func:`recover` asks twice: a
    late cancellation can fail the unlock as well as the question."""
    held = None
    for _ in range(2):
        held = yield from recover(core, status)
        if held is not True:
            return held
        now = core.driver.transaction_status()
        unlock = in_savepoint(core.driver, now, [unlock_statement(core)])
        if (yield from quietly(core, unlock)) is True:
            return False
    return held


def after_failed_release(
    core: LockCore, status: TxStatus, exc: BaseException, started: float
) -> Plan[None]:
    """After a failed or interrupted unlock (``exc``) on a connection that was in
    ``status``: a lost connection is a :class:`~pgsolo.LockLostError`; otherwise finish
    the unlock, or keep the lock on the books (acquired, tracked) so that ``release()``
    can be called again. The caller raises ``exc`` then."""
    driver = core.driver
    if driver.is_closed():
        core.forget()
        core.log(logging.WARNING, "lost", started, reason="connection-lost")
        raise LockLostError(
            f"session lock {core.key} was lost: the connection failed ({exc})",
            key=core.key,
            reason="connection-lost",
        ) from exc
    if status is TxStatus.INERROR and core.hold is not None:
        # The caller's failed transaction is not pgsolo's to end, and nothing can be
        # asked in it: the lock stays on the books, for release() again (which rolls
        # back to the hold, or, if it went with the interrupted release, the transaction).
        core.log(logging.WARNING, "error", started, error=repr(exc))
        return
    held = yield from release_if_held(core, TxStatus.IDLE if status is TxStatus.INERROR else status)
    if held is False:
        yield from drop_hold(core)  # if the interrupted release had not left it yet
        core.forget()
    core.log(logging.WARNING, "error", started, error=repr(exc))


def release_stranded(core: LockCore, started: float) -> Plan[None]:
    """The unlock did not reach the session holding the lock: a transaction-pooling
    proxy moved this connection. A new connection may land on that session (it is
    idle in the proxy's pool); the unlock is guarded, so it acts only there."""
    route = core.route
    assert route is not None  # noqa: S101 - the caller checked
    try:
        released = yield Elsewhere([unlock_statement(core)])
    except Exception as exc:
        released = None
        logger.debug("pgsolo: releasing %s from a second connection failed: %r", core.key, exc)
    core.forget()
    core.log(logging.WARNING, "lost", started, reason="connection-moved")
    remains = (
        "it was released from a second connection that landed on that backend"
        if released is True
        else f"it may still be held there: SELECT pg_terminate_backend({route.server_pid})"
        " releases it"
    )
    raise transaction_pooling_error(
        f"the unlock of {core.key} reached another server session than backend pid"
        f" {route.server_pid} that holds it; {remains}"
    )
