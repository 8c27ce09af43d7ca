"""A transaction lock on one connection: :class:`XactLockCore`, which takes it and owns
the transaction pgsolo opens for it.

On a connection with no transaction open and none about to open by itself, ``with
xact_lock(...)`` opens a transaction with the lock (on a bare connection BEGIN goes in the
same round trip; a framework opens it its own way, see :class:`~pgsolo.locking.plans.Own`)
and ends it with the block: a failure of the block rolls it back, and
so does a transaction that failed inside the block without saying so. With
``verify_commit`` (jobs) the transaction is marked when it opens, and commits only if it
is still the one that took the lock, in the same round trip as the COMMIT; otherwise it is
rolled back and :class:`~pgsolo.LockLostError` raised. Otherwise the lock belongs to the
caller's transaction, and COMMIT or ROLLBACK releases it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Generator
from typing import NoReturn

from .. import sql
from ..drivers import DriverBase, TxStatus
from ..errors import (
    ConnectionStateError,
    LockLostError,
    TransactionFailedError,
    UsageError,
)
from . import failures, holdings, placement, waits
from .core import LockCore, is_token
from .plans import ROLLBACK, Own, Plan, Quick
from .recovery import connection_gone, quietly
from .spec import LockSpec

__all__ = ["XactLockCore"]


class XactLockCore(LockCore):
    """A transaction lock: held until the transaction that took it ends."""

    def __init__(self, driver: DriverBase, spec: LockSpec) -> None:
        super().__init__(driver, spec)
        self.opened_transaction = False
        # verify_commit: commit pgsolo's own transaction only if it is still the one that
        # took the lock (the work may have committed it and begun another).
        self.transaction_marker: str | None = None
        # What goes with the COMMIT to check the marker: made with it, before the lock,
        # not while the lock is held and others wait for it.
        self.commit_check: list[str] = []
        # A quick acquisition's wait: when it ends (time.monotonic()), and whether its first
        # slice was the last (always, for a try). Numbers, not the slices' generator: one
        # that outlived its acquisition would be closed whenever the lock died.
        self.deadline = 0.0
        self.last_slice = True

    @property
    def holds_anything(self) -> bool:
        return self.acquired or self.opened_transaction

    def _opens_own(self, status: TxStatus, *, context: bool) -> bool:
        """Whether a transaction lock taken now opens pgsolo's own transaction and ends it
        with the block: a context manager on a connection with no transaction open and
        none about to open by itself. A job owns its transaction even on a connection that
        begins by itself (``verify_commit``: the work commits with the lock, or not at
        all)."""
        return (
            context
            and status is TxStatus.IDLE
            and (self.spec.verify_commit or not self.driver.begins_implicitly)
        )

    # - acquire -

    def _acquire(self, *, context: bool) -> Plan[bool]:
        driver, key = self.driver, self.spec.key
        conn = driver.connection
        status = driver.transaction_status()
        pid = driver.backend_pid()
        # A transaction pgsolo opens is tracked like a session lock, so that a second
        # thread or task on the same connection cannot join it and "get" the key too.
        owns = self._opens_own(status, context=context)
        if not owns and holdings.is_claimed(conn, pid, key):
            return failures.busy_here(self, pid)
        if not owns and holdings.owned_elsewhere(conn, pid):
            raise holdings.shared_transaction_error(pid)
        claimed = False
        try:  # from the claim on, it is withdrawn at any exception (a Ctrl-C at any line)
            if owns:
                claim, _route, self.held = holdings.claim(
                    conn, pid, key, self.spec.shared, False, self, "xact", holdings.context_token()
                )
                if claim == "busy":
                    return failures.busy_here(self, pid)
                claimed = True
            status = self._usable_status(status)
            # The caller's transaction: one already open, or the one a driver that begins
            # by itself is about to open (psycopg with autocommit=False: the caller commits
            # or rolls back, never pgsolo).
            joins = not owns and (
                status is TxStatus.INTRANS
                or (status is TxStatus.IDLE and self.driver.begins_implicitly)
            )
            slices = waits.slices(self.spec.wait_ms)
            started = time.perf_counter()
            acquired = yield from self._slices(
                slices, status, owns=owns, joins=joins, started=started
            )
        except BaseException:
            holdings.withdraw(conn, key, self)
            if claimed:
                holdings.set_transaction_owner(conn, pid, None)
            raise
        if owns:
            self._settle_claim(conn)
        return acquired

    def _settle_claim(self, conn: object) -> None:
        """The key claimed on ``conn`` for pgsolo's own transaction: confirmed if the lock
        was taken, withdrawn if not."""
        if not self.acquired:
            holdings.withdraw(conn, self.spec.key, self)
        elif self.held is not None:  # claimed, as every lock that opens its own is
            holdings.confirm(self.held)

    def _slices(
        self,
        slices: Generator[waits.Slice, None, None],
        status: TxStatus,
        *,
        owns: bool,
        joins: bool,
        started: float,
    ) -> Plan[bool]:
        """Take the lock in ``slices``, one after another until one takes it or the last
        runs out; then whether it is held, and logged."""
        # Each slice of a wait in a transaction of its own (pgsolo's, opened again) or a
        # savepoint of the caller's, rolled back when the slice runs out (waits.py).
        # Closed as the loop ends, not whenever this frame dies: one a traceback keeps dies
        # at the cyclic GC's moment, and closing the slices runs pgsolo's code there.
        try:
            for lock_timeout, last in slices:
                opening = self._opening(status, owns=owns)
                if opening and lock_timeout is not None:  # a job's marker, with its wait
                    statements, opening = [self._marked_wait(lock_timeout)], []
                else:
                    statements = placement.xact_acquisition(
                        self.spec, lock_timeout, in_callers_transaction=joins
                    )
                step = (
                    self._waiting(statements, lock_timeout)
                    if opening is None
                    else Own([*opening, *statements], "begin", (lock_timeout or 0) / 1000)
                )
                try:
                    value = yield step
                except BaseException as exc:
                    if (yield from self._slice_failed(exc, started, joins=joins, last=last)):
                        continue
                break
        finally:
            slices.close()
        if value is None:  # sql.acquire's answer on a server in recovery: nothing taken
            yield from self._abandon_own_transaction()
            raise failures.standby_refused(self, started)
        try:  # a Ctrl-C from here on ends pgsolo's own transaction, with the lock
            return self._granted(value, started, self.driver.backend_pid())
        except BaseException:
            self.acquired = False
            self.token = None
            yield from self._after_failure(in_callers_transaction=joins)
            raise

    def _slice_failed(
        self, exc: BaseException, started: float, *, joins: bool, last: bool
    ) -> Plan[bool]:
        """After a slice of the acquisition failed or was interrupted (``exc``), with
        pgsolo's own transaction rolled back, or the slice's savepoint in the caller's:
        True to go on with the next slice; raises otherwise."""
        next_slice = not last and failures.timed_out(self.driver, exc)
        # Read as the failure left the connection: ending pgsolo's own transaction
        # through a framework may reconnect (Django does).
        error = None if next_slice else failures.acquisition_error(self, exc, started)
        yield from self._after_failure(in_callers_transaction=joins)
        if next_slice:
            return True
        if error is None:
            error = yield from failures.cut_short(self, exc, started)
        if error is not None:
            raise error from exc
        raise exc

    def _granted(self, value: object, started: float, pid: int) -> bool:
        """The server's answer to the acquisition (``value``, not a standby's) on backend
        ``pid``: whether the lock is held, and logged."""
        self.acquired = self.spec.wait_ms is not None or value is True or is_token(value)
        self.token = int(str(value)) if value is not True and is_token(value) else None
        self.backend_pid = pid if self.acquired else None
        self.log(logging.DEBUG, "acquired" if self.acquired else "busy", started)
        return self.acquired

    def _opening(self, status: TxStatus, *, owns: bool) -> list[str] | None:
        """The statements to send as pgsolo's own transaction opens, before the lock, if
        it opens one (``owns``); None when it does not. A plain acquire with no
        transaction to hold the lock is refused."""
        if owns:
            self.opened_transaction = True
            if self.spec.verify_commit:
                self.transaction_marker = marker = secrets.token_hex(8)
                spec = self.spec
                self.commit_check = (
                    sql.same_transaction(marker)
                    if self.driver.ends_by_message
                    else [sql.assert_same_transaction(spec.key, marker, shared=spec.shared)]
                )
                return [sql.mark_transaction(marker)]
            return []
        if status is TxStatus.IDLE and not self.driver.begins_implicitly:
            raise ConnectionStateError(
                "a transaction-level lock needs an open transaction, and this autocommit"
                " connection has none: PostgreSQL would release the lock as soon as this"
                f" statement ended. Open one first (`{self.driver.transaction_hint}`), use"
                " the lock as a context manager (it opens one), or use session_lock()."
            )
        return None

    def _marked_wait(self, lock_timeout: int) -> str:
        """A slice of a job's wait in the transaction pgsolo opened: the wait marks the
        transaction itself, one statement less for the server to parse, plan and run."""
        spec = self.spec
        return sql.xact_wait(
            spec.key,
            lock_timeout,
            shared=spec.shared,
            fencing=spec.fencing,
            marker=self.transaction_marker,
        )

    def _abandon_own_transaction(self) -> Plan[None]:
        """Roll back the transaction pgsolo opened for a lock it did not get."""
        if self.opened_transaction:
            self.opened_transaction = False
            yield from quietly(self.driver, ROLLBACK)

    def _after_failure(self, *, in_callers_transaction: bool) -> Plan[None]:
        """After a failed or interrupted acquisition: roll back pgsolo's own transaction,
        or undo the savepoint of a wait in the caller's."""
        if self.opened_transaction:
            yield from self._abandon_own_transaction()
        elif (
            in_callers_transaction
            and self.spec.wait_ms is not None
            and self.driver.transaction_status() is TxStatus.INERROR
        ):
            yield from quietly(self.driver, [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])

    # - release, exit -

    def release(self) -> Plan[None]:
        raise UsageError(
            "a transaction-level lock has no unlock: it is released by COMMIT or ROLLBACK"
        )
        yield  # a plan, like every other lock operation

    def exit(self, *, failed: bool) -> Plan[None]:
        """End the transaction pgsolo opened for the lock, if it opened one, and let go of
        the connection's claim on it. With ``verify_commit``, the transaction commits only
        if the lock is still held then (same round trip); otherwise it is rolled back and
        :class:`LockLostError` raised."""
        if not self.opened_transaction:
            return
        if (held := self.held) is not None and held.books.closed:
            # A pool's reset closed the books the key was claimed on (a claim withdrawn
            # when the try found it busy too): it rolled pgsolo's transaction back.
            self._ended_elsewhere(failed=failed)  # raises, unless the block failed
            return
        try:
            yield from self._end_own_transaction(failed=failed)
        except BaseException as exc:
            yield from self._after_interrupted_end(exc)
            raise
        finally:
            self.forget()

    def _ended_elsewhere(self, *, failed: bool) -> None:
        """pgsolo's own transaction was rolled back by the reset of the pool the connection
        went back to (a warning said so then): nothing is sent, since the connection may
        be another's by now, its COMMIT the next borrower's. A block that ended without an
        error learns that nothing of it committed."""
        self.opened_transaction = False
        self.transaction_marker = None
        self.acquired = False
        if failed:
            return
        key = self.spec.key
        self.log(logging.WARNING, "lost", None, {"reason": "lock-released"})
        raise LockLostError(
            f"transaction lock {key} was lost: its connection went back to its pool before"
            " the block ended, and the pool's reset rolled its transaction back; nothing of"
            " the block committed",
            key=key,
            reason="lock-released",
        )

    def forget(self) -> None:
        """pgsolo's own transaction has ended (or never began): the lock is no longer
        held here. The books first: a Ctrl-C that cuts this short leaves
        ``opened_transaction`` set, so that ``let_go()`` comes here again."""
        taken = self.held if self.acquired else None
        holdings.end_transaction(self.driver.connection, self.driver.backend_pid(), self, taken)
        self.opened_transaction = False
        self.transaction_marker = None

    def _after_interrupted_end(self, exc: BaseException) -> Plan[None]:
        """A Ctrl-C (``exc``) in pgsolo's own code before the COMMIT or ROLLBACK went out
        (it lands at any line): the transaction, and the lock in it, must not outlive
        it."""
        if not isinstance(exc, Exception) and self.driver.transaction_status() in (
            TxStatus.INTRANS,
            TxStatus.INERROR,
        ):
            yield from quietly(self.driver, ROLLBACK)

    def _end_own_transaction(self, *, failed: bool) -> Plan[None]:
        driver, key = self.driver, self.spec.key
        status = driver.transaction_status()
        if status is TxStatus.IDLE:
            return  # the block ended the transaction itself
        if failed:
            yield from quietly(driver, ROLLBACK)
            return
        if status is TxStatus.INERROR:
            yield ROLLBACK
            raise TransactionFailedError(
                f"the transaction holding {key} failed inside the block (an error was"
                " caught there and not re-raised); it was rolled back and nothing committed"
            )
        if not self.acquired:
            yield ROLLBACK
            return
        try:
            yield Own(self._commit_check(), "commit")
        except Exception as exc:
            if not self._marker_gone(exc):
                yield from self._commit_failed(exc)
            try:  # the work ran RESET ALL, or ended the transaction: pg_locks says which
                yield Own(sql.held_at_commit(key, shared=self.spec.shared), "commit")
            except Exception as again:
                yield from self._commit_failed(again)
        self.log(logging.DEBUG, "released")

    def _commit_check(self) -> list[str]:
        """What goes with the COMMIT: with ``verify_commit``, the check that fails it if
        the transaction is not the one that took the lock."""
        return self.commit_check if self.transaction_marker is not None else []

    def _marker_gone(self, exc: Exception) -> bool:
        """Whether the COMMIT failed (``exc``) because the check that went with it on a
        bare connection (:func:`~pgsolo.sql.same_transaction`) found the transaction's
        marker gone: the COMMIT did not run, and the transaction is still open (failed, in
        the check's savepoint) for :func:`~pgsolo.sql.held_at_commit` to ask again. A
        failed COMMIT would have ended it."""
        driver = self.driver
        return (
            self.transaction_marker is not None
            and driver.ends_by_message
            and sql.meaning(driver.sqlstate(exc)) is sql.Meaning.UNDEFINED_OBJECT
            and driver.transaction_status() is TxStatus.INERROR
        )

    def _commit_failed(self, exc: BaseException) -> Plan[NoReturn]:
        """The COMMIT of pgsolo's own transaction failed (``exc``): raise what that means."""
        driver, key = self.driver, self.spec.key
        if not isinstance(exc, Exception):
            raise exc
        if connection_gone(driver, exc, self.backend_pid):
            self.log(logging.WARNING, "lost", None, {"reason": "connection-lost"})
            raise LockLostError(
                f"transaction lock {key} was lost with its connection before its"
                f" transaction committed ({' '.join(str(exc).split())}); the work's"
                " statements in it did not commit",
                key=key,
                reason="connection-lost",
            ) from exc
        if sql.meaning(driver.sqlstate(exc)) is not sql.Meaning.LOCK_GONE:
            raise exc
        yield from quietly(driver, ROLLBACK)
        # The same cause as a job's work that ends the transaction and begins none:
        # the work ended the locked transaction. One reason, whichever a library
        # reports (psycopg says the transaction ended; Django and SQLAlchemy, whose
        # books still say it is open, only let the commit check find it).
        self.log(logging.WARNING, "lost", None, {"reason": "work-ended-transaction"})
        raise LockLostError(
            f"transaction lock {key} was no longer held when the work was about to"
            " commit: the work ended the locked transaction (and began another); the"
            " transaction was rolled back",
            key=key,
            reason="work-ended-transaction",
        ) from exc

    # - the common case, without a plan -

    def quick_acquisition(self, context: bool, /) -> Quick | Plan[bool]:
        """The common case: a try, or a wait's first slice, as a block begins on a
        connection with no transaction open, which opens pgsolo's own transaction with the
        lock (BEGIN in the same message on a bare connection). Anything else, and a key
        this connection holds already: the plan that takes it."""
        self.begin()
        driver, spec = self.driver, self.spec
        status = driver.transaction_status()
        if not self._opens_own(status, context=context):
            return self._acquire(context=context)
        conn, pid = driver.connection, driver.backend_pid()
        # Marked as pgsolo's own first: whatever cuts the acquisition short from here on
        # ends it in let_go(), which lets go of the claim and its ownership together.
        opening = self._opening(status, owns=True) or []
        try:
            claim, _, self.held = holdings.claim(
                conn, pid, spec.key, spec.shared, False, self, "xact", holdings.context_token()
            )
        except ConnectionStateError:  # another's: nothing of it is this lock's to end
            self.opened_transaction = False
            self.transaction_marker = None
            raise
        if claim != "new":  # on this connection's books already: nothing was opened yet
            self.opened_transaction = False
            self.transaction_marker = None
            return self._acquire(context=context)  # which says it is busy here
        self.claimed_on = pid
        self.started = time.perf_counter()
        if spec.wait_ms is None:
            return [*opening, *placement.quick_try(driver, spec)], "begin", 0.0
        # A wait: its first slice here; if that runs out, the others are quick_failed's.
        lock_timeout, self.last_slice, self.deadline = waits.first_slice(spec.wait_ms)
        if self.transaction_marker is not None:
            return [self._marked_wait(lock_timeout)], "begin", lock_timeout / 1000
        acquisition = placement.quick_try(driver, spec, lock_timeout)
        return [*opening, *acquisition], "begin", lock_timeout / 1000

    def quick_answer(self, value: object) -> bool:
        if value is None:  # a server in recovery: the shell's let_go() rolls back
            holdings.withdraw(self.driver.connection, self.spec.key, self)
            raise failures.standby_refused(self, self.started)
        # The backend the key was claimed on; an ORM session with nothing checked out
        # reaches one only with the lock's own BEGIN (none was known then: pid 0).
        pid = self.claimed_on or self.driver.backend_pid()
        acquired = self._granted(value, self.started, pid)
        self._settle_claim(self.driver.connection)
        return acquired

    def quick_failed(self, exc: BaseException) -> Plan[bool]:
        conn, started = self.driver.connection, self.started
        try:
            # Raises, unless the slice ran out and a next one follows.
            yield from self._slice_failed(exc, started, joins=False, last=self.last_slice)
            acquired = yield from self._slices(
                waits.slices_until(self.deadline),
                TxStatus.IDLE,
                owns=True,
                joins=False,
                started=started,
            )
        except BaseException:
            holdings.withdraw(conn, self.spec.key, self)
            holdings.set_transaction_owner(conn, self.driver.backend_pid(), None)
            raise
        self._settle_claim(conn)
        return acquired

    def let_go(self) -> Plan[None]:
        try:
            yield from super().let_go()
        finally:
            if not self.acquired:  # an acquisition the shell began, cut short
                holdings.withdraw(self.driver.connection, self.spec.key, self)

    def quick_release(self, exiting: bool, /) -> Quick | Plan[None]:
        """The common case: the block ends without an error, with pgsolo's own
        transaction open and the lock taken in it, as :meth:`exit` would commit it."""
        if not exiting:
            return self.release()
        if (
            self.transaction_marker is None
            and self.opened_transaction
            and self.acquired
            and self.driver.transaction_status() is TxStatus.INTRANS
            and (held := self.held) is not None
            and not held.books.closed
        ):
            return [], "commit", 0.0
        return self.exit(failed=False)

    def quick_released(self, value: object) -> None:
        self.log(logging.DEBUG, "released")

    def quick_release_failed(self, exc: BaseException) -> Plan[None]:
        try:
            yield from self._commit_failed(exc)
        except BaseException as failure:
            yield from self._after_interrupted_end(failure)
            raise
        finally:
            self.forget()
