"""A session lock on one connection: :class:`SessionLockCore`, which takes it, gives it
back and owns what only a session lock has: the route to the server session that holds it
(checked once per connection, :mod:`~pgsolo.locking.routing`) and its hold, the savepoint
that holds its block when it is taken in the caller's transaction."""

from __future__ import annotations

import logging
import time
from typing import NoReturn

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import TxStatus
from ..errors import (
    LockLostError,
    LockNotHeldError,
    UnsafeConnectionError,
    UnsupportedConnectionError,
)
from ..reasons import LostReason
from . import failures, holdings, placement, recovery, waits
from .core import LockCore, is_token
from .placement import in_savepoint, unlock_statement
from .plans import Elsewhere, Plan, Quick
from .routing import Route, check_route, transaction_pooling_error

__all__ = ["SessionLockCore"]

_GRANTED_LATE: dict[str, object] = {"note": "granted as it timed out"}


class SessionLockCore(LockCore):
    """A session lock: held until released, or until its session ends."""

    # Each lock's own once set; until then the class's (a lock is built without a call of
    # its own: every lock is built for one acquisition). What answers the connection:
    route: Route | None = None
    # A session lock taken in the caller's transaction: the savepoint that holds its
    # block (pgsolo.sql.hold_savepoint), while pgsolo acquires or releases it (the
    # books keep it in between, for whichever Lock lets go of the key last).
    hold: str | None = None
    # A quick acquisition (quick_acquisition) sent its statement and has not taken
    # the answer yet: whatever cuts it short asks the server (let_go).
    quick_claim = False

    @property
    def server_pid(self) -> int | None:
        return self.route.server_pid if self.route is not None else None

    @property
    def holds_anything(self) -> bool:
        return self.acquired

    @property
    def _guard(self) -> int | None:
        """The backend pgsolo's statements for this lock must run on (behind a proxy)."""
        return self.route.guard if self.route is not None else None

    def forget(self) -> None:
        if self.held is not None:
            holdings.drop(self.held, self)
        self.acquired = False
        self.token = None
        self.hold = None

    def _drop_hold(self) -> Plan[None]:
        """Leave the hold, if there is one (off the books first)."""
        hold, self.hold = self.hold, None
        yield from recovery.drop_hold(self.driver, hold)

    # - acquire -

    def _acquire(
        self,
        *,
        context: bool,
        claimed: tuple[TxStatus, int, holdings.Claim, Route | None] | None = None,
    ) -> Plan[bool]:
        """Take the lock by its plan, once :meth:`quick_acquisition` found it is not the
        common case (``claimed``: what it found, and its claim of the key)."""
        assert claimed is not None  # noqa: S101 - quick_acquisition's, which claims first
        conn = self.driver.connection
        try:  # from the claim on, it is withdrawn unless the lock is confirmed held
            status, pid, claim, route = claimed
            if claim == "reentered":
                self.acquired, self.backend_pid = True, pid
                self.log(logging.DEBUG, "reentered")
                return True
            if claim == "busy":
                return failures.busy_here(self, pid)
            if route is None:
                route = yield from self._route(status, pid)
            self.route = route
            hold = sql.hold_savepoint(self.spec.key) if status is TxStatus.INTRANS else None
            started = time.perf_counter()
            value, note = yield from self._answer(status, route, hold, started)
            if value is None:  # the guard: not the session the route was checked on
                yield from self._drop_hold()
                raise _moved()
            # The server answered. A Ctrl-C can land at any line from here until the
            # caller holds the lock object: whatever interrupts reading the answer or
            # logging it lets the lock go (the server says whether it is held) first.
            try:
                if self._busy(value):
                    yield from self._drop_hold()
                    self.log(logging.DEBUG, "busy", started)
                    return False
                self._confirm(value, pid, started, note)
            except BaseException:
                self.acquired = False
                self.token = None
                yield from self._drop_hold()
                yield from recovery.release_if_held(self.driver, self.spec, status, self._guard)
                raise
            return True
        finally:
            self.hold = None
            if not self.acquired:
                holdings.withdraw(conn, self.spec.key, self)

    def _busy(self, value: object) -> bool:
        """Whether the answer to a try says another session holds the key."""
        return self.spec.wait_ms is None and value is not True and not is_token(value)

    def _confirm(
        self, value: object, pid: int, started: float, note: dict[str, object] | None = None
    ) -> None:
        """The server granted the lock (``value``): on the books, and logged."""
        self.token = int(str(value)) if value is not True and is_token(value) else None
        if self.held is not None:
            holdings.confirm(self.held, self.hold)
        self.acquired, self.backend_pid = True, pid
        self.lost = None
        self.log(logging.DEBUG, "acquired", started, note)

    # - the common case, without a plan -

    def quick_acquisition(self, context: bool, /) -> Quick | Plan[bool]:
        """The common case: a try on a connection with no transaction open, for a key it
        does not hold, whose route was checked (behind a proxy, the try is guarded by the
        backend's pid, as the plan's). Anything else: the plan that takes it, with the key
        claimed here, before any SQL, with the connection's route if it was checked before.

        A statement in flight (another thread or task sharing the connection) does not
        change the answer for a key this connection already holds, so only a new claim
        is refused for it.
        """
        self.begin()
        driver, spec = self.driver, self.spec
        # A connection that may change under the lock (an ORM Session's) says why.
        if refusal := driver.session_locks_refused:
            raise UnsupportedConnectionError(refusal)
        pid = driver.idle_pid()
        if pid is not None:
            status = TxStatus.IDLE
        else:
            status = driver.transaction_status()
            if status is not TxStatus.IDLE and status is not TxStatus.ACTIVE:
                self._usable_status(status)
            pid = driver.backend_pid()
        claim, route, self.held = holdings.claim(
            driver.connection, pid, spec.key, spec.shared, spec.reentrant, self
        )
        if claim == "new" and status is TxStatus.ACTIVE:
            holdings.withdraw(driver.connection, spec.key, self)
            self._usable_status(status)  # raises: the connection is running a statement
        if (
            claim != "new"
            or status is not TxStatus.IDLE
            or spec.wait_ms is not None
            or route is None
        ):
            return self._acquire(context=context, claimed=(status, pid, claim, route))
        self.route = route
        self.quick_claim = True
        self.claimed_on = pid
        self.started = time.perf_counter()
        return placement.quick_try(driver, spec, guard=route.guard), None, 0.0

    def quick_answer(self, value: object) -> bool:
        if value is not True and not is_token(value):  # _busy() of a try, without a call
            holdings.withdraw(self.driver.connection, self.spec.key, self)
            self.quick_claim = False
            if value is None and self._guard is not None:  # as the plan's _acquire
                raise _moved()
            self.log(logging.DEBUG, "busy", self.started)
            return False
        self._confirm(value, self.claimed_on, self.started)
        self.quick_claim = False
        return True

    def quick_failed(self, exc: BaseException) -> Plan[NoReturn]:
        """As the plan's one slice of a try: the key is let go if the server granted it."""
        try:
            guard = self._guard
            yield from self._after_slice(exc, TxStatus.IDLE, None, guard, self.started, last=True)
        finally:
            self.quick_claim = False
            if not self.acquired:
                holdings.withdraw(self.driver.connection, self.spec.key, self)
        raise exc  # what a try's last slice does after a failure, whatever it found

    def let_go(self) -> Plan[None]:
        if self.acquired:
            yield from super().let_go()
            return
        # An acquisition the shell began (quick_acquisition) and an interruption cut
        # short between its steps: nothing of it stays on the books, and if it sent its
        # statement, the server says whether the key is held.
        try:
            if self.quick_claim:
                guard = self._guard
                yield from recovery.release_if_held(self.driver, self.spec, TxStatus.IDLE, guard)
        except Exception as exc:
            logger.debug("pgsolo clean-up after an interruption failed: %r", exc)
        finally:
            self.quick_claim = False
            holdings.withdraw(self.driver.connection, self.spec.key, self)

    def _answer(
        self, status: TxStatus, route: Route, hold: str | None, started: float
    ) -> Plan[tuple[object, dict[str, object] | None]]:
        """The server's answer to the acquisition, with a note for the log. Each slice of
        a wait runs in a short transaction, or a savepoint of the caller's (waits.py); one
        that ran out is put right, as any failed acquisition, and may turn out granted as
        it timed out."""
        driver, spec, guard = self.driver, self.spec, route.guard
        for lock_timeout, last in waits.slices(spec.wait_ms):
            self.hold = hold  # opened again by each slice: one that ran out left it
            statements = placement.session_acquisition(
                driver, spec, status, guard, hold, lock_timeout
            )
            try:
                return (yield self._waiting(statements, lock_timeout)), None
            except BaseException as exc:
                if (yield from self._after_slice(exc, status, hold, guard, started, last=last)):
                    return True, _GRANTED_LATE
        raise RuntimeError("waits.slices() yields a last slice, whose failure is raised")

    def _after_slice(
        self,
        exc: BaseException,
        status: TxStatus,
        hold: str | None,
        guard: int | None,
        started: float,
        *,
        last: bool,
    ) -> Plan[bool]:
        """After a slice of the acquisition failed or was interrupted (``exc``), with the
        connection put right: True if the lock turns out granted as the slice timed out
        (its hold open again), False to go on with the next slice; raises otherwise."""
        driver, spec = self.driver, self.spec
        self.hold = None
        if (yield from recovery.after_session_failure(driver, spec, status, exc, hold, guard)):
            self.hold = hold
            return True
        if not last and failures.timed_out(driver, exc):
            return False
        error = failures.acquisition_error(self, exc, started)
        if error is None:
            error = yield from failures.cut_short(self, exc, started)
        if error is not None:
            raise error from exc
        raise exc

    def _route(self, status: TxStatus, pid: int) -> Plan[Route]:
        """What answers this connection, checked on its first session lock
        (pgsolo.locking.routing)."""
        driver = self.driver
        started = time.perf_counter()
        try:
            route = yield from check_route(driver, status)
        except BaseException as exc:
            if status is TxStatus.IDLE and driver.transaction_status() in (
                TxStatus.INTRANS,
                TxStatus.INERROR,
            ):  # the driver's own BEGIN, before an interrupted check
                yield from recovery.quietly(driver, [sql.ROLLBACK])
            # Logged and counted as any acquisition that failed (a connection's first
            # session lock fails here: pgsolo run's, a Django command's).
            if isinstance(exc, UnsafeConnectionError):
                self.log(logging.WARNING, "refused", started, {"reason": exc.reason})
            elif isinstance(exc, Exception):
                self.log(logging.WARNING, "error", started, {"error": repr(exc)})
            if (error := failures.connection_failed(self, exc)) is not None:
                raise error from exc
            raise
        holdings.set_route(driver.connection, pid, route)
        return route

    # - release, exit -

    def release(self) -> Plan[None]:
        key = self.spec.key
        if not self.acquired:
            self.log(logging.WARNING, "release-not-held")
            raise LockNotHeldError(f"session lock {key} is not held by this Lock object", key=key)
        if holdings.let_go_elsewhere(self.held):  # its Connection closed with it, or not
            self.forget()
            self.log(logging.DEBUG, "lost", None, {"reason": "lock-released"})  # warned of then
            raise LockNotHeldError(
                f"session lock {key} was released when its connection went back to its pool"
                " (or its request ended, or its Locker closed), as a warning said then;"
                " nothing was sent, since the connection may be another's by now",
                key=key,
            )
        held = self.held  # always set, for a lock that holds its key
        if held is not None and not holdings.last_hold_else_drop(held, self):
            yield from self._released_a_reentrant_hold()
            return
        try:
            yield from self._release_last(held)
        finally:
            if self.acquired and held is not None:
                holdings.kept(held)

    def _released_a_reentrant_hold(self) -> Plan[None]:
        """This lock's hold went off the books, and another's holds the key still: nothing
        to send."""
        self.acquired = False
        self.log(logging.DEBUG, "released", None, {"note": "re-entrant hold remains"})
        return
        yield  # a plan, like every other lock operation

    def _release_last(self, held: holdings.Held | None) -> Plan[None]:
        """Release the last hold of the key (``held``, marked on its way out)."""
        key, driver = self.spec.key, self.driver
        if driver.is_closed():
            self.forget()
            # Already reported by the keeper, if it was watching.
            level = logging.WARNING if self.lost is None else logging.DEBUG
            self.log(level, "lost", None, {"reason": "connection-lost"})
            raise LockLostError(
                f"session lock {key} was lost: its connection is closed, so PostgreSQL"
                " released the lock when the session ended",
                key=key,
                reason="connection-lost",
            )
        if driver.backend_pid() != self.backend_pid:
            raise UnsafeConnectionError(
                f"session lock {key} was taken on backend pid {self.backend_pid} but the"
                f" connection now talks to pid {driver.backend_pid()}; the lock cannot be"
                " released from here",
                reason="connection-moved",
            )
        status = driver.transaction_status()
        if status is TxStatus.INERROR and self._owned_elsewhere():
            # Nothing runs in it until its owner ends it, and it is not pgsolo's to end
            # here: the lock stays held and on the books, for release() again.
            raise holdings.shared_transaction_error(driver.backend_pid())
        # The hold ended with the transaction it was opened in, if that ended in the block.
        hold = held.hold if held is not None else None
        self.hold = hold if status is not TxStatus.IDLE else None
        self.started = started = time.perf_counter()
        try:
            value = yield from self._unlock(status)
            self.forget()  # off the books at once: a Ctrl-C may land at any line
        except BaseException as exc:
            yield from self._after_failed_release(status, exc, started)
            raise
        finally:
            self.hold = None
        if (stranded := self.quick_released(value)) is not None:
            yield from stranded

    def _owned_elsewhere(self) -> bool:
        """Whether the transaction open is pgsolo's own for another thread or task."""
        return holdings.owned_elsewhere(self.driver.connection, self.driver.backend_pid())

    def quick_released(self, value: object) -> Plan[None] | None:
        """The unlock begun at ``self.started`` answered ``value`` (the lock is off the
        books already): the quick release's end, and any other's. Behind a proxy, an
        unlock that reached another session than the one holding the key (NULL: the
        guard) returns the plan that releases it from there (:meth:`_release_stranded`)."""
        key = self.spec.key
        if value is None and self._guard is not None:
            return self._release_stranded(self.started)
        if value is not True:
            level = logging.WARNING if self.lost is None else logging.DEBUG  # keeper said it
            self.log(level, "lost", self.started, {"reason": "lock-released"})
            raise LockNotHeldError(
                f"session lock {key} was no longer held by backend pid {self.backend_pid}"
                " when released: something released it while the work ran"
                " (pg_advisory_unlock_all, DISCARD ALL, or a second unlock)",
                key=key,
            )
        if logger.isEnabledFor(logging.DEBUG):  # an event that counts nothing: no call else
            self.log(logging.DEBUG, "released", self.started)
        return None

    def quick_release(self, exiting: bool, /) -> Quick | Plan[None]:
        """The common case: the only hold of a key taken with a quick acquisition's
        conditions, on the same backend, with no transaction open."""
        driver, route = self.driver, self.route
        if (
            self.acquired
            and route is not None
            and (held := self.held) is not None
            and driver.idle_pid() == self.backend_pid
        ):
            if holdings.last_hold_else_drop(held, self):  # no other hold: an unlock lets it go
                self.started = time.perf_counter()
                return placement.quick_unlock(driver, self.spec, route.guard), None, 0.0
            if not holdings.let_go_elsewhere(held):  # others' remain: it dropped this one
                return self._released_a_reentrant_hold()
        return self.exit(failed=False) if exiting else self.release()

    def quick_release_failed(self, exc: BaseException) -> Plan[None]:
        try:
            yield from self._after_failed_release(TxStatus.IDLE, exc, self.started)
        finally:
            if self.acquired and self.held is not None:  # still held: re-entry open again
                holdings.kept(self.held)

    def _unlock(self, status: TxStatus) -> Plan[object]:
        """Unlock on a connection in ``status``; the unlock's answer. In the caller's
        transaction the lock's hold goes too (placement.release_hold); in one that failed
        in the block, pgsolo rolls back to the hold, never further
        (placement.release_failed_hold)."""
        driver, spec, hold, guard = self.driver, self.spec, self.hold, self._guard
        unlock = [unlock_statement(spec, guard)]
        if status is TxStatus.INTRANS and hold is None and self._owned_elsewhere():
            # Another thread's or task's, which its owner ends at any moment: the unlock
            # as outside one, in no savepoint that could go with it.
            status = TxStatus.IDLE
        if status is TxStatus.INTRANS:
            try:
                if hold is None:
                    return (yield in_savepoint(driver, status, unlock))
                return (yield placement.release_hold(driver, spec, guard, hold))
            except Exception as exc:
                meaning = sql.meaning(driver.sqlstate(exc))
                if hold is not None and meaning is sql.Meaning.SAVEPOINT_GONE:
                    # The caller released or rolled back past the hold: nothing to leave.
                    undo = [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE]
                    return (yield [*undo, *in_savepoint(driver, status, unlock)])
                if meaning is not sql.Meaning.TRANSACTION_FAILED:
                    raise
                status = TxStatus.INERROR  # failed, and the driver could not tell (asyncpg)
        if status is TxStatus.INERROR and hold is not None:
            try:
                yield placement.release_failed_hold(spec, guard, hold)
            except Exception as exc:
                code = driver.sqlstate(exc)
                if code in sql.UNLOCK_ANSWERS:
                    return sql.UNLOCK_ANSWERS[code]
                if sql.meaning(code) is not sql.Meaning.SAVEPOINT_GONE:
                    raise
        if status is TxStatus.INERROR:
            # No hold to roll back to: the failed transaction began in the block, or the
            # caller ended the one the lock was taken in. It can only be rolled back, and
            # the unlock must still happen.
            self.log(logging.WARNING, "rollback-before-release")
            return (yield placement.outside_transaction(driver, [sql.ROLLBACK, *unlock]))
        return (yield in_savepoint(driver, status, unlock))

    def _after_failed_release(
        self, status: TxStatus, exc: BaseException, started: float
    ) -> Plan[None]:
        """After a failed or interrupted unlock (``exc``) on a connection that was in
        ``status``: a lost connection is a :class:`~pgsolo.LockLostError` (an interruption
        goes on as it is, the lock off the books); otherwise
        finish the unlock, or keep the lock on the books (acquired, tracked) so that
        ``release()`` can be called again. The caller raises ``exc`` then."""
        driver, spec = self.driver, self.spec
        if driver.is_closed():
            self.forget()
            # As the keeper and pgsolo run's report say it: a deadline that shut the
            # connection down is an unresponsive one, not a lost one.
            reason: LostReason = (
                "connection-unresponsive" if failures.unresponsive(exc) else "connection-lost"
            )
            self.log(logging.WARNING, "lost", started, {"reason": reason})
            if not isinstance(exc, Exception):
                return  # an interruption is never turned into an error: it goes on
            raise LockLostError(
                f"session lock {spec.key} was lost: the connection failed ({exc})",
                key=spec.key,
                reason=reason,
            ) from exc
        if status is TxStatus.INERROR and self.hold is not None:
            # The caller's failed transaction is not pgsolo's to end, and nothing can be
            # asked in it: the lock stays on the books, for release() again (which rolls
            # back to the hold, or, if it went with the interrupted release, the
            # transaction).
            self.log(logging.WARNING, "error", started, {"error": repr(exc)})
            return
        asked = TxStatus.IDLE if status is TxStatus.INERROR else status
        held = yield from recovery.release_if_held(driver, spec, asked, self._guard)
        if held is False:
            yield from self._drop_hold()  # if the interrupted release had not left it yet
            self.forget()
        self.log(logging.WARNING, "error", started, {"error": repr(exc)})

    def _release_stranded(self, started: float) -> Plan[None]:
        """The unlock did not reach the session holding the lock: a transaction-pooling
        proxy moved this connection, which talks to another session now (the lock is off
        its books). A new connection may land on that session (it is idle in the proxy's
        pool); the unlock is guarded, so it acts only there."""
        route, key = self.route, self.spec.key
        assert route is not None  # noqa: S101 - the caller checked
        released = None
        try:
            released = yield Elsewhere([unlock_statement(self.spec, route.guard)])
        except Exception as exc:
            logger.debug("pgsolo: releasing %s from a second connection failed: %r", key, exc)
        finally:
            self.log(logging.WARNING, "lost", started, {"reason": "connection-moved"})
        remains = (
            "it was released from a second connection that landed on that backend"
            if released is True
            else f"it may still be held there: SELECT pg_terminate_backend({route.server_pid})"
            " releases it"
        )
        raise transaction_pooling_error(
            f"the unlock of {key} reached another server session than backend pid"
            f" {route.server_pid} that holds it; {remains}"
        )

    def exit(self, *, failed: bool) -> Plan[None]:
        if not self.acquired:
            return
        if not failed:
            yield from self.release()
            return
        try:
            yield from self.release()
        except Exception as exc:
            if self.lost is None:  # a loss the keeper declared was logged then: once
                logger.warning("pgsolo: releasing %s after a failure: %r", self.spec.key, exc)


def _moved() -> UnsafeConnectionError:
    """A statement guarded by the backend's pid answered NULL: the connection's statements
    run on another session than the one its route was checked on."""
    return transaction_pooling_error("this connection's statements moved to another server session")
