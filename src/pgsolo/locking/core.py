"""One advisory lock on one connection: its state, and the plans both shells drive.

The logic lives once, in :class:`LockCore`, as generators that yield the statements to
send and receive what the server answered (a "sans-I/O" core, driven by
:mod:`pgsolo.locking.plans`). :class:`~pgsolo.locking.lock.Lock` drives them with a sync
driver and :class:`~pgsolo.locking.lock.AsyncLock` with an async one, so the two cannot
drift.

The core keeps the state and the top-level plans (acquire, release, exit, is_held); the
functions it calls take it explicitly: which statements and where
(:mod:`~pgsolo.locking.placement`), pgsolo's own transaction for a transaction lock
(:mod:`~pgsolo.locking.transaction`), what a failed acquisition means
(:mod:`~pgsolo.locking.failures`) and putting the connection right after a failure or
an interruption (:mod:`~pgsolo.locking.recovery`).
"""

from __future__ import annotations

import logging
import math
import time

from .. import metrics, sql
from .._logging import locks_logger as logger
from .._logging import log_event
from .._types import Lifetime, check_seconds
from ..drivers import DriverBase, TxStatus
from ..errors import (
    ConnectionStateError,
    InvalidArgumentError,
    LockLostError,
    LockNotHeldError,
    UnsafeConnectionError,
    UnsupportedConnectionError,
    UsageError,
)
from ..keys import Key
from . import failures, holdings, placement, recovery, transaction, waits
from .placement import in_savepoint, unlock_statement
from .plans import Own, Plan, Wait
from .routing import Route, check_route, transaction_pooling_error
from .watch import Keep

__all__ = ["MAX_WAIT_SECONDS", "LockCore", "require_no_transaction", "wait_ms_of"]

MAX_WAIT_SECONDS = 2_147_483  # lock_timeout is an int of milliseconds on the server


# Events of the log that end an acquisition, as the metrics' outcomes name them.
_OUTCOMES = {"reentered": "acquired", "refused": "error"}


def _is_token(value: object) -> bool:
    """A fencing token came back (a positive int; 0 is a busy try, a bool a plain one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def wait_ms_of(wait: float | None) -> float | None:
    """``wait`` in whole milliseconds (rounded up), ``math.inf`` for a wait with no end
    (``wait=math.inf``), or None for a try."""
    if wait is None:
        return None
    if isinstance(wait, float) and wait == math.inf:
        return math.inf
    try:
        seconds = check_seconds("wait", wait, 0, MAX_WAIT_SECONDS, above_low=True)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{exc} (or math.inf, to wait for as long as it takes); use wait=None to try"
            " once without waiting"
        ) from None
    return max(1, math.ceil(seconds * 1000))


def require_no_transaction(driver: DriverBase, subject: str, reason: str) -> None:
    """Refuse a connection with a transaction open, for calls that must own it."""
    status = driver.transaction_status()
    if status is not TxStatus.IDLE:
        raise ConnectionStateError(
            f"{subject} needs a connection with no transaction open, and on this one"
            f" {status.words}: {reason}; {driver.ending_advice}"
        )


class LockCore:
    """One lock on one connection: its state, and the plans both shells drive."""

    def __init__(
        self,
        driver: DriverBase,
        key: Key,
        lifetime: Lifetime,
        *,
        wait_ms: float | None,
        shared: bool,
        reentrant: bool,
        fencing: bool = False,
        keep: Keep | None = None,
        verify_commit: bool = False,
    ) -> None:
        self.driver = driver
        self.key = key
        self.lifetime: Lifetime = lifetime
        self.wait_ms = wait_ms
        self.shared = shared
        self.reentrant = reentrant
        self.fencing = fencing
        self.keep = keep
        self.acquired = False
        self.backend_pid: int | None = None
        self.opened_transaction = False
        self.route: Route | None = None  # session locks: what answers the connection
        # A session lock taken in the caller's transaction: the savepoint that holds its
        # block (pgsolo.sql.hold_savepoint), while pgsolo acquires or releases it (the
        # books keep it in between, for whichever Lock lets go of the key last).
        self.hold: str | None = None
        self.token: int | None = None  # the fencing token of this acquisition
        self.lost: LockLostError | None = None  # set by the keeper
        # xact: commit pgsolo's own transaction only if it is still the one that took the
        # lock (the work may have committed it and begun another).
        self.verify_commit = verify_commit
        self.transaction_marker: str | None = None
        # The metrics count each acquisition's outcome, and each loss, once: a loss is
        # logged by the keeper that sees it and again by the release that confirms it.
        self.outcome_counted = True
        self.loss_counted = True

    @property
    def server_pid(self) -> int | None:
        """The pid of the backend holding a session lock, as the server says (behind a
        proxy, ``backend_pid`` is the proxy's own)."""
        return self.route.server_pid if self.route is not None else None

    @property
    def wait_seconds(self) -> float:
        return (self.wait_ms or 0) / 1000

    def log(self, level: int, event: str, started: float | None = None, **extra: object) -> None:
        """Log an event of this lock (``started``: when what it ends began), and count
        it in the metrics."""
        self._count(event, started, extra.get("reason"))
        if not logger.isEnabledFor(level):
            return
        info = self.driver.server_info()
        fields: dict[str, object] = {
            "key": self.key.text,
            "name": self.key.name,
            "lifetime": self.lifetime,
            "mode": "wait" if self.wait_ms is not None else "try",
            "shared": self.shared,
            "database": info.database,
            "server": info.address,
            "application_name": info.application_name,
            "backend_pid": self.driver.backend_pid(),
        }
        if started is not None:
            fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
        fields.update(extra)
        log_event(logger, level, "advisory lock", "event", event, fields)

    def _count(self, event: str, started: float | None, reason: object) -> None:
        if event == "lost" and not self.loss_counted:
            self.loss_counted = True
            metrics.observe_lock_lost(self.key.name, self.lifetime, str(reason or ""))
            return
        outcome = _OUTCOMES.get(event, event)
        if outcome in metrics.LOCK_OUTCOMES and not self.outcome_counted:
            self.outcome_counted = True
            self.loss_counted = outcome != "acquired"  # only a held lock can be lost
            wait = 0.0 if started is None else time.perf_counter() - started
            metrics.observe_lock(self.key.name, self.lifetime, outcome, wait)

    def log_lost(self, error: LockLostError) -> None:
        self.log(logging.WARNING, "lost", reason=error.reason, error=str(error))

    def forget(self) -> None:
        """The session lock is no longer held here: off the books."""
        holdings.unclaim(self.driver.connection, self.key)
        self.acquired = False
        self.token = None
        self.hold = None

    def _usable_status(self, status: TxStatus | None = None) -> TxStatus:
        if status is None:
            status = self.driver.transaction_status()
        if status is TxStatus.INERROR:
            raise ConnectionStateError(
                "the connection's transaction has failed; roll it back before taking a lock"
            )
        if status in (TxStatus.ACTIVE, TxStatus.UNKNOWN):
            raise ConnectionStateError(f"the connection cannot take a lock now: {status.words}")
        return status

    @staticmethod
    def _waiting(statements: list[str], lock_timeout_ms: int | None) -> list[str] | Wait:
        """A slice's statements, marked as waiting for the lock when they may."""
        return statements if lock_timeout_ms is None else Wait(statements, lock_timeout_ms / 1000)

    # - acquire -

    def acquire(self, *, context: bool) -> Plan[bool]:
        if self.acquired:
            raise UsageError(f"lock {self.key} is already acquired by this Lock object")
        self.token = None
        self.outcome_counted = False
        metrics.prepare()
        if self.lifetime == "xact":
            return (yield from self._acquire_xact(context=context))
        return (yield from self._acquire_session())

    def _acquire_xact(self, *, context: bool) -> Plan[bool]:
        driver = self.driver
        conn = driver.connection
        status = driver.transaction_status()
        pid = driver.backend_pid()
        # A transaction pgsolo opens is tracked like a session lock, so that a second
        # thread or task on the same connection cannot join it and "get" the key too.
        owns = transaction.opens_own(self, status, context=context)
        if not owns and holdings.is_claimed(conn, pid, self.key):
            return failures.busy_here(self, pid)
        if not owns and holdings.transaction_owner(conn, pid) not in (
            None,
            holdings.context_token(),
        ):
            raise ConnectionStateError(
                f"the transaction open on this connection (backend pid {pid}) is one pgsolo"
                " opened for another thread or task; joining it would share its locks and"
                " its COMMIT. Use a connection per thread or task."
            )
        claimed = False
        try:  # from the claim on, it is withdrawn at any exception (a Ctrl-C at any line)
            if owns:
                claim = holdings.claim(
                    conn,
                    pid,
                    self.key,
                    shared=self.shared,
                    reentrant=False,
                    claimant=self,
                    lifetime="xact",
                )
                if claim == "busy":
                    return failures.busy_here(self, pid)
                claimed = True
                holdings.set_transaction_owner(conn, pid, holdings.context_token())
            acquired = yield from self._acquire_xact_claimed(status, context=context)
        except BaseException:
            holdings.withdraw(conn, self.key, self)
            if claimed:
                holdings.set_transaction_owner(conn, pid, None)
            raise
        if owns:
            if acquired:
                holdings.confirm(conn, self.key)
            else:
                holdings.withdraw(conn, self.key, self)
        return acquired

    def _acquire_xact_claimed(self, status: TxStatus, *, context: bool) -> Plan[bool]:
        status = self._usable_status(status)
        joins = transaction.joins_callers_transaction(self, status, context=context)
        started = time.perf_counter()
        # Each slice of a wait in a transaction of its own (pgsolo's, opened again) or a
        # savepoint of the caller's, rolled back when the slice runs out (waits.py).
        for lock_timeout, last in waits.slices(self.wait_ms):
            opening = transaction.opening(self, status, context=context)
            statements = placement.xact_acquisition(
                self, lock_timeout, in_callers_transaction=joins
            )
            step = (
                self._waiting(statements, lock_timeout)
                if opening is None
                else Own([*opening, *statements], "begin", (lock_timeout or 0) / 1000)
            )
            try:
                value = yield step
            except BaseException as exc:
                next_slice = not last and failures.timed_out(self, exc)
                # Read as the failure left the connection: ending pgsolo's own transaction
                # through a framework may reconnect (Django does).
                error = None if next_slice else failures.acquisition_error(self, exc, started)
                yield from recovery.after_xact_failure(self, in_callers_transaction=joins)
                if next_slice:
                    continue
                if error is None:
                    error = yield from failures.cut_short(self, exc, started)
                if error is not None:
                    raise error from exc
                raise
            break
        if value is None:  # sql.acquire's answer on a server in recovery: nothing taken
            yield from recovery.abandon_own_transaction(self)
            raise failures.standby_refused(self, started)
        try:  # a Ctrl-C from here on ends pgsolo's own transaction, with the lock
            self.acquired = self.wait_ms is not None or value is True or _is_token(value)
            self.token = int(str(value)) if _is_token(value) else None
            self.backend_pid = self.driver.backend_pid() if self.acquired else None
            self.log(logging.DEBUG, "acquired" if self.acquired else "busy", started)
        except BaseException:
            self.acquired = False
            self.token = None
            yield from recovery.after_xact_failure(self, in_callers_transaction=joins)
            raise
        return self.acquired

    def _claim_session(self) -> tuple[TxStatus, int, holdings.Claim]:
        """Check the connection and claim the key on it, before any SQL.

        A statement in flight (another thread or task sharing the connection) does not
        change the answer for a key this connection already holds, so only a new claim
        is refused for it.
        """
        driver = self.driver
        # A connection that may change under the lock (an ORM Session's) says why.
        if refusal := driver.session_locks_refused:
            raise UnsupportedConnectionError(refusal)
        status = driver.transaction_status()
        if status is not TxStatus.ACTIVE:
            self._usable_status(status)
        pid = driver.backend_pid()
        claim = holdings.claim(
            driver.connection,
            pid,
            self.key,
            shared=self.shared,
            reentrant=self.reentrant,
            claimant=self,
        )
        if claim == "new" and status is TxStatus.ACTIVE:
            holdings.withdraw(driver.connection, self.key, self)
            self._usable_status(status)  # raises: the connection is running a statement
        return status, pid, claim

    def _acquire_session(self) -> Plan[bool]:
        conn = self.driver.connection
        confirmed = False
        try:  # from the claim on, it is withdrawn unless the lock is confirmed held
            status, pid, claim = self._claim_session()
            if claim == "reentered":
                self.acquired, self.backend_pid = True, pid
                self.log(logging.DEBUG, "reentered")
                return True
            if claim == "busy":
                return failures.busy_here(self, pid)
            self.route = route = yield from self._route(status, pid)
            hold = sql.hold_savepoint(self.key) if status is TxStatus.INTRANS else None
            started = time.perf_counter()
            value, note = yield from self._session_answer(status, route, hold, started)
            if value is None:  # the guard: not the session the route was checked on
                yield from recovery.drop_hold(self)
                raise transaction_pooling_error(
                    "this connection's statements moved to another server session"
                )
            # The server answered. A Ctrl-C can land at any line from here until the
            # caller holds the lock object: whatever interrupts reading the answer or
            # logging it lets the lock go (the server says whether it is held) first.
            try:
                if self.wait_ms is None and value is not True and not _is_token(value):
                    yield from recovery.drop_hold(self)
                    self.log(logging.DEBUG, "busy", started)
                    return False
                self.token = int(str(value)) if _is_token(value) else None
                holdings.confirm(conn, self.key, self.hold)
                self.acquired, self.backend_pid, confirmed = True, pid, True
                self.lost = None
                self.log(logging.DEBUG, "acquired", started, **note)
            except BaseException:
                self.acquired = confirmed = False
                self.token = None
                yield from recovery.drop_hold(self)
                yield from recovery.release_if_held(self, status)
                raise
            return True
        finally:
            self.hold = None
            if not confirmed:
                holdings.withdraw(conn, self.key, self)

    def _session_answer(
        self, status: TxStatus, route: Route, hold: str | None, started: float
    ) -> Plan[tuple[object, dict[str, object]]]:
        """The server's answer to a session lock's acquisition, with a note for the log.
        Each slice of a wait runs in a short transaction, or a savepoint of the caller's
        (waits.py); one that ran out is put right, as any failed acquisition, and may turn
        out granted as it timed out."""
        for lock_timeout, last in waits.slices(self.wait_ms):
            self.hold = hold  # opened again by each slice: one that ran out left it
            statements = placement.session_acquisition(self, status, route, lock_timeout)
            try:
                return (yield self._waiting(statements, lock_timeout)), {}
            except BaseException as exc:
                if (yield from recovery.after_session_failure(self, status, exc)):
                    return True, {"note": "granted as it timed out"}
                if not last and failures.timed_out(self, exc):
                    continue
                error = failures.acquisition_error(self, exc, started)
                if error is None:
                    error = yield from failures.cut_short(self, exc, started)
                if error is not None:
                    raise error from exc
                raise
        raise RuntimeError("waits.slices() yields a last slice, whose failure is raised")

    def _route(self, status: TxStatus, pid: int) -> Plan[Route]:
        """What answers this connection, checked once per connection (pgsolo.locking.routing)."""
        driver = self.driver
        route = holdings.route_of(driver.connection, pid)
        if route is not None:
            return route
        try:
            route = yield from check_route(driver, status)
        except BaseException as exc:
            if status is TxStatus.IDLE and driver.transaction_status() in (
                TxStatus.INTRANS,
                TxStatus.INERROR,
            ):  # the driver's own BEGIN, before an interrupted check
                yield from recovery.quietly(self, [sql.ROLLBACK])
            if (error := failures.connection_failed(self, exc)) is not None:
                raise error from exc
            raise
        holdings.set_route(driver.connection, pid, route)
        return route

    # - release, exit -

    def release(self) -> Plan[None]:
        if self.lifetime == "xact":
            raise UsageError(
                "a transaction-level lock has no unlock: it is released by COMMIT or ROLLBACK"
            )
        if not self.acquired:
            self.log(logging.WARNING, "release-not-held")
            raise LockNotHeldError(
                f"session lock {self.key} is not held by this Lock object", key=self.key
            )
        driver = self.driver
        if holdings.hold_count(driver.connection, self.key) > 1:
            holdings.unclaim(driver.connection, self.key)
            self.acquired = False
            self.log(logging.DEBUG, "released", note="re-entrant hold remains")
            return
        if driver.is_closed():
            self.forget()
            # Already reported by the keeper, if it was watching.
            level = logging.WARNING if self.lost is None else logging.DEBUG
            self.log(level, "lost", reason="connection-lost")
            raise LockLostError(
                f"session lock {self.key} was lost: its connection is closed, so PostgreSQL"
                " released the lock when the session ended",
                key=self.key,
                reason="connection-lost",
            )
        if driver.backend_pid() != self.backend_pid:
            raise UnsafeConnectionError(
                f"session lock {self.key} was taken on backend pid {self.backend_pid} but the"
                f" connection now talks to pid {driver.backend_pid()}; the lock cannot be"
                " released from here",
                reason="connection-moved",
            )
        status = driver.transaction_status()
        # The hold ended with the transaction it was opened in, if that ended in the block.
        self.hold = holdings.hold_of(driver.connection, self.key)
        if status is TxStatus.IDLE:
            self.hold = None
        started = time.perf_counter()
        try:
            value = yield from self._unlock(status)
            stranded = value is None and self.route is not None and not self.route.direct
            if not stranded:  # off the books at once: a Ctrl-C may land at any line
                self.forget()
        except BaseException as exc:
            yield from recovery.after_failed_release(self, status, exc, started)
            raise
        finally:
            self.hold = None
        if stranded:
            yield from recovery.release_stranded(self, started)
        if value is not True:
            level = logging.WARNING if self.lost is None else logging.DEBUG  # keeper said it
            self.log(level, "lost", started, reason="lock-released")
            raise LockNotHeldError(
                f"session lock {self.key} was no longer held by backend pid {self.backend_pid}"
                " when released: something released it while the work ran"
                " (pg_advisory_unlock_all, DISCARD ALL, or a second unlock)",
                key=self.key,
            )
        self.log(logging.DEBUG, "released", started)

    def _unlock(self, status: TxStatus) -> Plan[object]:
        """Unlock on a connection in ``status``; the unlock's answer. In the caller's
        transaction the lock's hold goes too (placement.release_hold); in one that failed
        in the block, pgsolo rolls back to the hold, never further
        (placement.release_failed_hold)."""
        driver, hold = self.driver, self.hold
        unlock = [unlock_statement(self)]
        if status is TxStatus.INTRANS:
            try:
                if hold is None:
                    return (yield in_savepoint(driver, status, unlock))
                return (yield placement.release_hold(self, hold))
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
                yield placement.release_failed_hold(self, hold)
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

    def exit(self, *, failed: bool) -> Plan[None]:
        """Leave the ``with`` block: release the session lock, or end the transaction
        pgsolo opened. A failure of the block itself is never masked. With
        ``verify_commit``, the transaction commits only if the lock is still held then
        (same round trip); otherwise it is rolled back and :class:`LockLostError` raised."""
        if self.lifetime == "xact":
            yield from transaction.end(self, failed=failed)
            return
        if not self.acquired:
            return
        if not failed:
            yield from self.release()
            return
        try:
            yield from self.release()
        except Exception as exc:
            if self.lost is None:  # a loss the keeper declared was logged then: once
                logger.warning("pgsolo: releasing %s after a failure: %r", self.key, exc)

    def let_go(self) -> Plan[None]:
        """An interruption (Ctrl-C) after the lock was taken and before the code that
        releases it took over: release it, or end pgsolo's own transaction, so that
        nothing is left behind; the interruption goes on."""
        if self.acquired or self.opened_transaction:
            try:
                yield from self.exit(failed=True)
            except Exception as exc:
                logger.debug("pgsolo clean-up after an interruption failed: %r", exc)

    def is_held(self) -> Plan[bool]:
        """Ask the server (``pg_locks``) whether this backend holds the key right now."""
        if self.driver.is_closed():
            return False
        if self.driver.transaction_status() is TxStatus.INERROR:
            raise ConnectionStateError("the connection's transaction has failed; roll back first")
        statements = placement.outside_transaction(
            self.driver, [sql.held_here(self.key, shared=self.shared)]
        )
        return (yield statements) is True
