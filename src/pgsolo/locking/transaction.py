"""The transaction pgsolo opens for a transaction lock taken as a context manager.

On a connection with no transaction open and none about to open by itself, ``with
xact_lock(...)`` opens a transaction with the lock (on a bare connection BEGIN goes in the
same round trip; a framework opens it its own way, see :class:`~pgsolo.locking.plans.Own`)
and ends it with the block: a failure of the block rolls it back, and
so does a transaction that failed inside the block without saying so. With
``verify_commit`` (jobs) the transaction is marked when it opens, and commits only if it
is still the one that took the lock, in the same round trip as the COMMIT; otherwise it is
rolled back and :class:`~pgsolo.LockLostError` raised.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from .. import sql
from ..drivers import TxStatus
from ..errors import ConnectionStateError, LockLostError, TransactionFailedError
from . import holdings
from .plans import ROLLBACK, Own
from .recovery import connection_gone, quietly

if TYPE_CHECKING:
    from .core import LockCore
    from .plans import Plan

__all__ = ["end", "joins_callers_transaction", "opening", "opens_own"]


def opens_own(core: LockCore, status: TxStatus, *, context: bool) -> bool:
    """Whether a transaction lock taken now opens pgsolo's own transaction and ends it
    with the block: a context manager on a connection with no transaction open and none
    about to open by itself. A job owns its transaction even on a connection that begins
    by itself (``verify_commit``: the work commits with the lock, or not at all)."""
    return (
        context
        and status is TxStatus.IDLE
        and (core.verify_commit or not core.driver.begins_implicitly)
    )


def joins_callers_transaction(core: LockCore, status: TxStatus, *, context: bool) -> bool:
    """Whether a transaction lock taken now belongs to the caller's transaction: one
    already open, or the one a driver that begins by itself is about to open (psycopg
    with ``autocommit=False``: the caller commits or rolls back, never pgsolo)."""
    if opens_own(core, status, context=context):
        return False
    return status is TxStatus.INTRANS or (status is TxStatus.IDLE and core.driver.begins_implicitly)


def opening(core: LockCore, status: TxStatus, *, context: bool) -> list[str] | None:
    """The statements to send as pgsolo's own transaction opens, before a transaction
    lock, if it opens one (:func:`opens_own`); None when it does not. A plain acquire
    with no transaction to hold the lock is refused."""
    if opens_own(core, status, context=context):
        core.opened_transaction = True
        if core.verify_commit:
            core.transaction_marker = secrets.token_hex(8)
            return [sql.mark_transaction(core.transaction_marker)]
        return []
    if status is TxStatus.IDLE and not core.driver.begins_implicitly:
        raise ConnectionStateError(
            "a transaction-level lock needs an open transaction, and this autocommit"
            " connection has none: PostgreSQL would release the lock as soon as this"
            f" statement ended. Open one first (`{core.driver.transaction_hint}`), use the"
            " lock as a context manager (it opens one), or use session_lock()."
        )
    return None


def end(core: LockCore, *, failed: bool) -> Plan[None]:
    """Leave the ``with`` block of a transaction lock: end the transaction pgsolo opened
    for it, if it opened one, and let go of the connection's claim on it."""
    if not core.opened_transaction:
        return
    core.opened_transaction = False
    try:
        yield from _end_own_transaction(core, failed=failed)
    finally:
        core.transaction_marker = None
        conn = core.driver.connection
        if core.acquired:
            holdings.unclaim(conn, core.key)
        holdings.set_transaction_owner(conn, core.driver.backend_pid(), None)


def _end_own_transaction(core: LockCore, *, failed: bool) -> Plan[None]:
    status = core.driver.transaction_status()
    if status is TxStatus.IDLE:
        return  # the block ended the transaction itself
    if failed:
        yield from quietly(core, ROLLBACK)
        return
    if status is TxStatus.INERROR:
        yield ROLLBACK
        raise TransactionFailedError(
            f"the transaction holding {core.key} failed inside the block (an error was"
            " caught there and not re-raised); it was rolled back and nothing committed"
        )
    if not core.acquired:
        yield ROLLBACK
        return
    marker = core.transaction_marker
    check = (
        []
        if marker is None
        else [sql.assert_same_transaction(core.key, marker, shared=core.shared)]
    )
    try:
        yield Own(check, "commit")
    except Exception as exc:
        if connection_gone(core, exc):
            core.log(logging.WARNING, "lost", reason="connection-lost")
            raise LockLostError(
                f"transaction lock {core.key} was lost with its connection before its"
                f" transaction committed ({' '.join(str(exc).split())}); the work's"
                " statements in it did not commit",
                key=core.key,
                reason="connection-lost",
            ) from exc
        if sql.meaning(core.driver.sqlstate(exc)) is not sql.Meaning.LOCK_GONE:
            raise
        yield from quietly(core, ROLLBACK)
        # The same cause as a job's work that ends the transaction and begins none: the
        # work ended the locked transaction. One reason, whichever a library reports
        # (psycopg says the transaction ended; Django and SQLAlchemy, whose books still
        # say it is open, only let the commit check find it).
        core.log(logging.WARNING, "lost", reason="work-ended-transaction")
        raise LockLostError(
            f"transaction lock {core.key} was no longer held when the work was about to"
            " commit: the work ended the locked transaction (and began another); the"
            " transaction was rolled back",
            key=core.key,
            reason="work-ended-transaction",
        ) from exc
    core.log(logging.DEBUG, "released")
