"""One advisory lock on one connection: its state, and the plans both shells drive.

The logic lives once, in :class:`LockCore`, as generators that yield the statements to
send and receive what the server answered (a "sans-I/O" core, driven by
:mod:`pgsolo.locking.plans`). :class:`~pgsolo.locking.lock.Lock` drives them with a sync
driver and :class:`~pgsolo.locking.lock.AsyncLock` with an async one, so the two cannot
drift.
"""

from __future__ import annotations

import logging
import math
import secrets
import time

from .. import sql
from .._logging import log_event, logger
from .._types import Lifetime, check_seconds
from ..drivers import DriverBase, TxStatus
from ..errors import (
    ConnectionStateError,
    InvalidArgumentError,
    LockDeadlockError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
    NotMigratedError,
    TransactionFailedError,
    UnsafeConnectionError,
    UsageError,
)
from ..keys import Key, advisory_keys_in
from . import holdings
from .keeper import Keep
from .plans import Elsewhere, Plan, Wait, outside_transaction
from .routing import Route, check_route, in_recovery_error, transaction_pooling_error

__all__ = ["MAX_WAIT_SECONDS", "LockCore", "require_no_transaction", "wait_ms_of"]

MAX_WAIT_SECONDS = 2_147_483  # lock_timeout is an int of milliseconds on the server


# -- what each connection holds --------------------------------------------------------
#
# PostgreSQL lets one session take the same key any number of times, so two threads or
# tasks sharing a connection would both "get" a lock. pgsolo keeps its own count per
# connection object and refuses a second holder unless re-entrancy was asked for.


# -- the core ---------------------------------------------------------------------------


def _is_token(value: object) -> bool:
    """A fencing token came back (a positive int; 0 is a busy try, a bool a plain one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def wait_ms_of(wait: float | None) -> int | None:
    """``wait`` in whole milliseconds (rounded up), or None for a try."""
    if wait is None:
        return None
    try:
        seconds = check_seconds("wait", wait, 0, MAX_WAIT_SECONDS, above_low=True)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc}; use wait=None to try once without waiting") from None
    return max(1, math.ceil(seconds * 1000))


def require_no_transaction(driver: DriverBase, subject: str, reason: str) -> None:
    """Refuse a connection with a transaction open, for calls that must own it."""
    status = driver.transaction_status()
    if status is not TxStatus.IDLE:
        raise ConnectionStateError(
            f"{subject} needs a connection with no transaction open (status"
            f" {status.value}): {reason}"
        )


class LockCore:
    """One lock on one connection: its state, and the plans both shells drive."""

    def __init__(
        self,
        driver: DriverBase,
        key: Key,
        lifetime: Lifetime,
        *,
        wait_ms: int | None,
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
        self.token: int | None = None  # the fencing token of this acquisition
        self.lost: LockLostError | None = None  # set by the keeper
        # xact: commit pgsolo's own transaction only if it is still the one that took the
        # lock (the work may have committed it and begun another).
        self.verify_commit = verify_commit
        self.transaction_marker: str | None = None

    @property
    def server_pid(self) -> int | None:
        """The pid of the backend holding a session lock, as the server says (behind a
        proxy, ``backend_pid`` is the proxy's own)."""
        return self.route.server_pid if self.route is not None else None

    # - logging -

    def _log(self, level: int, event: str, started: float | None = None, **extra: object) -> None:
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
        log_event(level, "advisory lock", "event", event, fields)

    def log_lost(self, error: LockLostError) -> None:
        self._log(logging.ERROR, "lost", reason=error.reason, error=str(error))

    def _failure(self, exc: BaseException, started: float) -> BaseException | None:
        """Log a failed acquisition; return the pgsolo error it means, if it means one."""
        meaning = sql.meaning(self.driver.sqlstate(exc))
        if meaning is sql.Meaning.IN_RECOVERY:
            return self._standby_refused(started)
        self._log(logging.WARNING, "error", started, error=repr(exc))
        if meaning is sql.Meaning.DEADLOCK:
            keys = advisory_keys_in(self.driver.error_detail(exc) or "") or (self.key,)
            return LockDeadlockError(
                f"deadlock: waiting for {self.lifetime} lock {self.key} would never end, so"
                f" PostgreSQL cancelled the wait; the sessions involved were waiting for"
                f" advisory locks {', '.join(str(k) for k in keys)}. Take several keys in"
                " one fixed order everywhere (for example sorted), or one key for the group.",
                key=self.key,
                keys=keys,
            )
        if self.fencing and meaning is sql.Meaning.NOT_MIGRATED:
            return NotMigratedError(
                "fencing tokens are kept in pgsolo's tables, which this database does not"
                " have: run `pgsolo migrate` first (nothing is held)"
            )
        return None

    def _standby_refused(self, started: float | None = None) -> UnsafeConnectionError:
        self._log(logging.WARNING, "refused", started, reason="server-in-recovery")
        return in_recovery_error(self.driver.server_info().address)

    def _timed_out(self, exc: BaseException) -> bool:
        return sql.meaning(self.driver.sqlstate(exc)) is sql.Meaning.LOCK_TIMEOUT

    @property
    def _wait_seconds(self) -> float:
        return (self.wait_ms or 0) / 1000

    def _timeout_error(self, exc: BaseException | None = None) -> LockTimeoutError:
        info = self.driver.server_info()
        return LockTimeoutError(
            f"timed out after {self._wait_seconds:g}s waiting for {self.lifetime} lock"
            f" {self.key} on database {info.database!r} at {info.address}",
            key=self.key,
            timeout=self._wait_seconds,
        )

    def _usable_status(self, status: TxStatus | None = None) -> TxStatus:
        if status is None:
            status = self.driver.transaction_status()
        if status is TxStatus.INERROR:
            raise ConnectionStateError(
                "the connection's transaction has failed; roll it back before taking a lock"
            )
        if status in (TxStatus.ACTIVE, TxStatus.UNKNOWN):
            raise ConnectionStateError(
                f"the connection cannot take a lock now (status {status.value}):"
                " it is closed, broken, or running another statement"
            )
        return status

    def _quietly(self, statements: list[str]) -> Plan[object]:
        """Send clean-up statements; a dead connection has nothing left to clean."""
        if self.driver.is_closed():
            return None
        try:
            return (yield statements)
        except Exception as exc:
            logger.debug("pgsolo clean-up %s failed: %r", statements, exc)
            return None

    # - plans -

    def acquire(self, *, context: bool) -> Plan[bool]:
        if self.acquired:
            raise UsageError(f"lock {self.key} is already acquired by this Lock object")
        self.token = None
        if self.lifetime == "xact":
            return (yield from self._acquire_xact(context=context))
        return (yield from self._acquire_session())

    def _busy_here(self, pid: int) -> bool:
        """Refuse a key this connection already holds through pgsolo."""
        self._log(logging.INFO, "busy", reason="held-by-this-connection")
        if self.wait_ms is None:
            return False
        hint = "" if self.lifetime == "xact" else ", or reentrant=True if that is on purpose"
        raise LockUnavailableError(
            f"{self.lifetime} lock {self.key} is already held on this connection (backend pid"
            f" {pid}); PostgreSQL would grant it again, so two holders sharing one connection"
            f" would both run. Use another connection{hint}.",
            key=self.key,
        )

    def _acquire_xact(self, *, context: bool) -> Plan[bool]:
        driver = self.driver
        conn = driver.connection
        status = driver.transaction_status()
        pid = driver.backend_pid()
        # A transaction pgsolo opens is tracked like a session lock, so that a second
        # thread or task on the same connection cannot join it and "get" the key too.
        owns = context and status is TxStatus.IDLE
        if owns:
            claim = holdings.claim(
                conn, pid, self.key, shared=self.shared, reentrant=False, lifetime="xact"
            )
            if claim == "busy":
                return self._busy_here(pid)
            holdings.set_transaction_owner(conn, pid, holdings.context_token())
        elif holdings.is_claimed(conn, pid, self.key):
            return self._busy_here(pid)
        elif holdings.transaction_owner(conn, pid) not in (None, holdings.context_token()):
            raise ConnectionStateError(
                f"the transaction open on this connection (backend pid {pid}) is one pgsolo"
                " opened for another thread or task; joining it would share its locks and"
                " its COMMIT. Use a connection per thread or task."
            )
        try:
            acquired = yield from self._acquire_xact_claimed(status, context=context)
        except BaseException:
            if owns:
                holdings.unclaim(conn, self.key)
                holdings.set_transaction_owner(conn, pid, None)
            raise
        if owns:
            if acquired:
                holdings.confirm(conn, self.key)
            else:
                holdings.unclaim(conn, self.key)
        return acquired

    def _acquire_xact_claimed(self, status: TxStatus, *, context: bool) -> Plan[bool]:
        driver = self.driver
        status = self._usable_status(status)
        statements: list[str] = []
        # A plain acquire on a connection that begins by itself joins the transaction
        # the driver is about to open: the caller's, like one already open.
        in_callers_transaction = status is TxStatus.INTRANS or (
            status is TxStatus.IDLE and not context and driver.begins_implicitly
        )
        if status is TxStatus.IDLE:
            if context:
                self.opened_transaction = True
                if not driver.begins_implicitly:
                    statements.append(sql.BEGIN)
                if self.verify_commit:
                    self.transaction_marker = secrets.token_hex(8)
                    statements.append(sql.mark_transaction(self.transaction_marker))
            elif not driver.begins_implicitly:
                raise ConnectionStateError(
                    "a transaction-level lock needs an open transaction, and this autocommit"
                    " connection has none: PostgreSQL would release the lock as soon as this"
                    " statement ended. Open one first (with conn.transaction(): ...), use the"
                    " lock as a context manager (it opens one), or use session_lock()."
                )
        acquire = sql.acquire(
            self.key,
            "xact",
            wait=self.wait_ms is not None,
            shared=self.shared,
            fencing=self.fencing,
            refuse_standby=True,
        )
        if self.wait_ms is None:
            statements.append(acquire)
        elif in_callers_transaction:
            # A savepoint keeps the caller's transaction usable if the wait times out
            # (or the server turns out to be a standby).
            statements += [
                sql.SAVE_LOCK_TIMEOUT,
                sql.SAVEPOINT,
                sql.REFUSE_STANDBY,
                sql.set_local_lock_timeout(self.wait_ms),
                acquire,
                sql.SAVEPOINT_RELEASE,
                sql.RESTORE_LOCK_TIMEOUT,
            ]
        else:
            # The bound is for the wait only: the protected statements that follow run
            # with the connection's own lock_timeout, put back in the same round trip.
            statements += [
                sql.SAVE_LOCK_TIMEOUT,
                sql.REFUSE_STANDBY,
                sql.set_local_lock_timeout(self.wait_ms),
                acquire,
                sql.RESTORE_LOCK_TIMEOUT,
            ]
        if self.fencing and self.wait_ms is not None:  # the restore's row came last
            statements.append(sql.LAST_FENCING_TOKEN)
        started = time.perf_counter()
        try:
            value = yield self._waiting(statements)
        except BaseException as exc:
            if self.opened_transaction:
                self.opened_transaction = False
                yield from self._quietly([sql.ROLLBACK])
            elif (
                in_callers_transaction
                and self.wait_ms is not None
                and driver.transaction_status() is TxStatus.INERROR
            ):
                yield from self._quietly([sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])
            if self.wait_ms is not None and self._timed_out(exc):
                self._log(logging.INFO, "timeout", started)
                raise self._timeout_error() from exc
            if (failure := self._failure(exc, started)) is not None:
                raise failure from exc
            raise
        if value is None:  # sql.acquire's answer on a server in recovery: nothing taken
            if self.opened_transaction:
                self.opened_transaction = False
                yield from self._quietly([sql.ROLLBACK])
            raise self._standby_refused(started)
        self.acquired = self.wait_ms is not None or value is True or _is_token(value)
        self.token = int(str(value)) if _is_token(value) else None
        self.backend_pid = driver.backend_pid() if self.acquired else None
        self._log(logging.INFO, "acquired" if self.acquired else "busy", started)
        return self.acquired

    def _claim_session(self) -> tuple[TxStatus, int, holdings.Claim]:
        """Check the connection and claim the key on it, before any SQL.

        A statement in flight (another thread or task sharing the connection) does not
        change the answer for a key this connection already holds, so only a new claim
        is refused for it.
        """
        driver = self.driver
        status = driver.transaction_status()
        if status is not TxStatus.ACTIVE:
            self._usable_status(status)
        pid = driver.backend_pid()
        claim = holdings.claim(
            driver.connection, pid, self.key, shared=self.shared, reentrant=self.reentrant
        )
        if claim == "new" and status is TxStatus.ACTIVE:
            holdings.unclaim(driver.connection, self.key)
            self._usable_status(status)  # raises: the connection is running a statement
        return status, pid, claim

    def _acquire_session(self) -> Plan[bool]:
        driver = self.driver
        conn = driver.connection
        status, pid, claim = self._claim_session()
        if claim == "reentered":
            self.acquired, self.backend_pid = True, pid
            self._log(logging.DEBUG, "reentered")
            return True
        if claim == "busy":
            return self._busy_here(pid)
        confirmed = False
        try:  # from here on, the claim is dropped unless the lock is confirmed held
            self.route = route = yield from self._route(status, pid)
            started = time.perf_counter()
            try:
                value = yield self._waiting(self._session_acquire_statements(status, route))
            except BaseException as exc:
                granted = (yield from self._recover(status)) is True
                timed_out = self.wait_ms is not None and self._timed_out(exc)
                if granted and timed_out and not self.fencing:
                    confirmed = True
                    self._log(logging.INFO, "acquired", started, note="granted as it timed out")
                elif granted:  # interrupted after the grant: leave nothing behind
                    yield from self._quietly(self._in_savepoint(status, [self._unlock_sql]))
                if not confirmed:
                    if timed_out:
                        self._log(logging.INFO, "timeout", started)
                        raise self._timeout_error() from exc
                    if (failure := self._failure(exc, started)) is not None:
                        raise failure from exc
                    raise
            else:
                if value is None:  # the guard: not the session the route was checked on
                    raise transaction_pooling_error(
                        "this connection's statements moved to another server session"
                    )
                if self.wait_ms is None and value is not True and not _is_token(value):
                    self._log(logging.INFO, "busy", started)
                    return False
                confirmed = True
                self.token = int(str(value)) if _is_token(value) else None
                self._log(logging.INFO, "acquired", started)
            holdings.confirm(conn, self.key)
            self.acquired, self.backend_pid = True, pid
            self.lost = None
            return True
        finally:
            if not confirmed:
                holdings.unclaim(conn, self.key)

    def _route(self, status: TxStatus, pid: int) -> Plan[Route]:
        """What answers this connection, checked once per connection (pgsolo.proxy)."""
        driver = self.driver
        route = holdings.route_of(driver.connection, pid)
        if route is not None:
            return route
        try:
            route = yield from check_route(driver, status)
        except BaseException:
            if status is TxStatus.IDLE and driver.transaction_status() in (
                TxStatus.INTRANS,
                TxStatus.INERROR,
            ):  # the driver's own BEGIN, before an interrupted check
                yield from self._quietly([sql.ROLLBACK])
            raise
        holdings.set_route(driver.connection, pid, route)
        return route

    def _session_acquire_statements(self, status: TxStatus, route: Route) -> list[str]:
        acquire = sql.acquire(
            self.key,
            "session",
            wait=self.wait_ms is not None,
            shared=self.shared,
            fencing=self.fencing,
        )
        if not route.direct:  # behind a proxy: only on the session the route was checked on
            acquire = sql.session_guarded(route.server_pid, acquire)
        if self.wait_ms is None:
            return self._in_savepoint(status, [acquire])
        if status is TxStatus.INTRANS:
            # Rolling back to the savepoint restores lock_timeout; the session lock stays.
            return [
                sql.SAVEPOINT,
                sql.set_local_lock_timeout(self.wait_ms),
                acquire,
                sql.SAVEPOINT_UNDO,
                sql.SAVEPOINT_RELEASE,
            ]
        # SET LOCAL dies with this short transaction; the session lock outlives it.
        opening = [] if self.driver.begins_implicitly else [sql.BEGIN]
        return [*opening, sql.set_local_lock_timeout(self.wait_ms), acquire, sql.COMMIT]

    def _waiting(self, statements: list[str]) -> list[str] | Wait:
        """The acquisition's statements, marked as waiting for the lock when they may."""
        return statements if self.wait_ms is None else Wait(statements, self._wait_seconds)

    def _in_savepoint(self, status: TxStatus, statements: list[str]) -> list[str]:
        """Statements for a session lock, placed so that they can fail or be interrupted
        without costing the caller's transaction or leaving one of ours open."""
        if status is TxStatus.INTRANS:
            return [sql.SAVEPOINT, *statements, sql.SAVEPOINT_RELEASE]
        return outside_transaction(self.driver, statements)

    def _recover(self, status: TxStatus) -> Plan[object]:
        """After a failed or interrupted session-lock statement: put the connection back
        as it was, then ask the server whether this backend holds the key (True/False,
        or None when it cannot tell)."""
        now = self.driver.transaction_status()
        if status is TxStatus.INTRANS:
            if now is TxStatus.INERROR:  # the error happened inside our savepoint
                yield from self._quietly([sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE])
        elif now in (TxStatus.INTRANS, TxStatus.INERROR):  # a transaction we opened
            yield from self._quietly([sql.ROLLBACK])
        held = self._in_savepoint(status, [sql.held_here(self.key, shared=self.shared)])
        return (yield from self._quietly(held))

    @property
    def _unlock_sql(self) -> str:
        unlock = sql.unlock(self.key, shared=self.shared)
        if self.route is not None and not self.route.direct:
            return sql.session_guarded(self.route.server_pid, unlock)
        return unlock

    def release(self) -> Plan[None]:
        if self.lifetime == "xact":
            raise UsageError(
                "a transaction-level lock has no unlock: it is released by COMMIT or ROLLBACK"
            )
        if not self.acquired:
            self._log(logging.WARNING, "release-not-held")
            raise LockNotHeldError(
                f"session lock {self.key} is not held by this Lock object", key=self.key
            )
        driver = self.driver
        conn = driver.connection
        if holdings.hold_count(conn, self.key) > 1:
            holdings.unclaim(conn, self.key)
            self.acquired = False
            self._log(logging.DEBUG, "released", note="re-entrant hold remains")
            return
        if driver.is_closed():
            self._forget()
            # Already reported by the keeper, if it was watching.
            level = logging.WARNING if self.lost is None else logging.DEBUG
            self._log(level, "lost", reason="connection-lost")
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
        if status is TxStatus.INERROR:
            # An aborted transaction can only be rolled back; the unlock must still happen.
            self._log(logging.WARNING, "rollback-before-release")
            statements = outside_transaction(driver, [sql.ROLLBACK, self._unlock_sql])
        else:
            statements = self._in_savepoint(status, [self._unlock_sql])
        started = time.perf_counter()
        try:
            value = yield statements
        except BaseException as exc:
            if driver.is_closed():
                self._forget()
                self._log(logging.WARNING, "lost", started, reason="connection-lost")
                raise LockLostError(
                    f"session lock {self.key} was lost: the connection failed ({exc})",
                    key=self.key,
                    reason="connection-lost",
                ) from exc
            # Interrupted or failed midway: finish the job, or keep the lock on the books
            # (acquired, tracked) so that release() can be called again.
            held = yield from self._recover(TxStatus.IDLE if status is TxStatus.INERROR else status)
            if held is True:
                unlock = self._in_savepoint(driver.transaction_status(), [self._unlock_sql])
                if (yield from self._quietly(unlock)) is True:
                    held = False
            if held is False:
                self._forget()
            self._log(logging.WARNING, "error", started, error=repr(exc))
            raise
        if value is None and self.route is not None and not self.route.direct:
            yield from self._release_stranded(started)
        self._forget()
        if value is not True:
            level = logging.WARNING if self.lost is None else logging.DEBUG  # keeper said it
            self._log(level, "lost", started, reason="lock-released")
            raise LockNotHeldError(
                f"session lock {self.key} was no longer held by backend pid {self.backend_pid}"
                " when released: something released it while the work ran"
                " (pg_advisory_unlock_all, DISCARD ALL, or a second unlock)",
                key=self.key,
            )
        self._log(logging.DEBUG, "released", started)

    def _release_stranded(self, started: float) -> Plan[None]:
        """The unlock did not reach the session holding the lock: a transaction-pooling
        proxy moved this connection. A new connection may land on that session (it is
        idle in the proxy's pool); the unlock is guarded, so it acts only there."""
        route = self.route
        assert route is not None  # noqa: S101 - the caller checked
        try:
            released = yield Elsewhere([self._unlock_sql])
        except Exception as exc:
            released = None
            logger.debug("pgsolo: releasing %s from a second connection failed: %r", self.key, exc)
        self._forget()
        self._log(logging.ERROR, "lost", started, reason="connection-moved")
        remains = (
            "it was released from a second connection that landed on that backend"
            if released is True
            else f"it may still be held there: SELECT pg_terminate_backend({route.server_pid})"
            " releases it"
        )
        raise transaction_pooling_error(
            f"the unlock of {self.key} reached another server session than backend pid"
            f" {route.server_pid} that holds it; {remains}"
        )

    def _forget(self) -> None:
        holdings.unclaim(self.driver.connection, self.key)
        self.acquired = False
        self.token = None

    def exit(self, *, failed: bool) -> Plan[None]:
        """Leave the ``with`` block: release the session lock, or end the transaction
        pgsolo opened. A failure of the block itself is never masked. With
        ``verify_commit``, the transaction commits only if the lock is still held then
        (same round trip); otherwise it is rolled back and :class:`LockLostError` raised."""
        if self.lifetime == "session":
            if not self.acquired:
                return
            if not failed:
                yield from self.release()
                return
            try:
                yield from self.release()
            except Exception as exc:
                logger.warning("pgsolo: releasing %s after a failure: %r", self.key, exc)
            return
        if not self.opened_transaction:
            return
        self.opened_transaction = False
        try:
            yield from self._end_own_transaction(failed=failed)
        finally:
            self.transaction_marker = None
            conn = self.driver.connection
            if self.acquired:
                holdings.unclaim(conn, self.key)
            holdings.set_transaction_owner(conn, self.driver.backend_pid(), None)

    def _end_own_transaction(self, *, failed: bool) -> Plan[None]:
        status = self.driver.transaction_status()
        if status is TxStatus.IDLE:
            return  # the block ended the transaction itself
        if failed:
            yield from self._quietly([sql.ROLLBACK])
            return
        if status is TxStatus.INERROR:
            yield [sql.ROLLBACK]
            raise TransactionFailedError(
                f"the transaction holding {self.key} failed inside the block (an error was"
                " caught there and not re-raised); it was rolled back and nothing committed"
            )
        if not self.acquired:
            yield [sql.ROLLBACK]
            return
        marker = self.transaction_marker
        if marker is None:
            yield [sql.COMMIT]
            self._log(logging.DEBUG, "released")
            return
        try:
            yield [sql.assert_same_transaction(self.key, marker, shared=self.shared), sql.COMMIT]
        except Exception as exc:
            if sql.meaning(self.driver.sqlstate(exc)) is not sql.Meaning.LOCK_GONE:
                raise
            yield from self._quietly([sql.ROLLBACK])
            self._log(logging.WARNING, "lost", reason="not-held-at-commit")
            raise LockLostError(
                f"transaction lock {self.key} was no longer held when the work was about to"
                " commit (the work ended the locked transaction and began another); the"
                " transaction was rolled back",
                key=self.key,
                reason="not-held-at-commit",
            ) from exc
        self._log(logging.DEBUG, "released")

    def is_held(self) -> Plan[bool]:
        """Ask the server (``pg_locks``) whether this backend holds the key right now."""
        if self.driver.is_closed():
            return False
        if self.driver.transaction_status() is TxStatus.INERROR:
            raise ConnectionStateError("the connection's transaction has failed; roll back first")
        statements = outside_transaction(self.driver, [sql.held_here(self.key, shared=self.shared)])
        return (yield statements) is True


# -- the public shells --------------------------------------------------------------------
