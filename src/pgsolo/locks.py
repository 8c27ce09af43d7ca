"""Advisory locks: transaction or session lifetime, try or wait, exclusive or shared.

The logic lives once, in :class:`_LockCore`, as generators that yield the statements to
send and receive what the server answered (a "sans-I/O" core). :class:`Lock` drives them
with a sync driver and :class:`AsyncLock` with an async one, so the two cannot drift.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, overload

from . import sql
from ._plans import Elsewhere, Plan, Wait, adrive, drive, outside_transaction
from .drivers import (
    AsyncDriver,
    DriverBase,
    SyncDriver,
    TxStatus,
    adapt,
    adapt_async,
    adapt_sync,
    as_sync,
    is_async,
)
from .durations import check_seconds
from .errors import (
    ConnectionStateError,
    InvalidArgumentError,
    LockDeadlockError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
    TransactionFailedError,
    UnsafeConnectionError,
    UsageError,
)
from .keeper import AsyncKeeper, Keep, Keeper, as_keep
from .keys import Key, KeyLike, Registry, advisory_keys_in, as_key
from .proxy import Route, check_route, in_recovery_error, transaction_pooling_error

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "AsyncLock",
    "Lock",
    "async_pool_reset",
    "held_session_locks",
    "pool_reset",
    "session_lock",
    "xact_lock",
]

logger = logging.getLogger("pgsolo")


MAX_WAIT_SECONDS = 2_147_483  # lock_timeout is an int of milliseconds on the server


# -- what each connection holds --------------------------------------------------------
#
# PostgreSQL lets one session take the same key any number of times, so two threads or
# tasks sharing a connection would both "get" a lock. pgsolo keeps its own count per
# connection object and refuses a second holder unless re-entrancy was asked for.


@dataclass
class _Held:
    shared: bool
    count: int
    pending: bool  # the first acquisition is still on its way to the server
    lifetime: sql.Lifetime = "session"


@dataclass
class _Holdings:
    pid: int
    keys: dict[Key, _Held]
    # The thread or task whose pgsolo-opened transaction is open on this connection:
    # another one must not join it (it would get the keys of that transaction too).
    transaction_owner: tuple[int, int] | None = None
    # What answers this connection (pgsolo.proxy), found before its first session lock.
    route: Route | None = None


_HOLDINGS: weakref.WeakKeyDictionary[object, _Holdings] = weakref.WeakKeyDictionary()
_HOLDINGS_LOCK = threading.Lock()

Claim = Literal["new", "reentered", "busy"]


def _claim(
    conn: object,
    pid: int,
    key: Key,
    *,
    shared: bool,
    reentrant: bool,
    lifetime: sql.Lifetime = "session",
) -> Claim:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is None or holdings.pid != pid:
            holdings = _HOLDINGS[conn] = _Holdings(pid, {})
        held = holdings.keys.get(key)
        if held is None:
            holdings.keys[key] = _Held(shared, 1, pending=True, lifetime=lifetime)
            return "new"
        if reentrant and (held.lifetime, held.shared) == (lifetime, shared) and not held.pending:
            held.count += 1
            return "reentered"
        return "busy"


def _route_of(conn: object, pid: int) -> Route | None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        return holdings.route if holdings and holdings.pid == pid else None


def _set_route(conn: object, pid: int, route: Route) -> None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is not None and holdings.pid == pid:
            holdings.route = route


def _context_token() -> tuple[int, int]:
    """Who is running: this thread, and this asyncio task if there is one."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        task = None
    return threading.get_ident(), id(task) if task is not None else 0


def _set_transaction_owner(conn: object, pid: int, owner: tuple[int, int] | None) -> None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is None or holdings.pid != pid:
            holdings = _HOLDINGS[conn] = _Holdings(pid, {})
        holdings.transaction_owner = owner


def _transaction_owner(conn: object, pid: int) -> tuple[int, int] | None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        return holdings.transaction_owner if holdings and holdings.pid == pid else None


def _hold_count(conn: object, key: Key) -> int:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        held = holdings.keys.get(key) if holdings else None
        return held.count if held else 0


def _is_claimed(conn: object, pid: int, key: Key) -> bool:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        return holdings is not None and holdings.pid == pid and key in holdings.keys


def _confirm(conn: object, key: Key) -> None:
    with _HOLDINGS_LOCK:
        if (holdings := _HOLDINGS.get(conn)) and (held := holdings.keys.get(key)):
            held.pending = False


def _unclaim(conn: object, key: Key) -> int:
    """Drop one hold of ``key``; return how many remain on this connection."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        held = holdings.keys.get(key) if holdings else None
        if holdings is None or held is None:
            return 0
        held.count -= 1
        if held.count <= 0:
            del holdings.keys[key]
            return 0
        return held.count


def _forget_all(conn: object) -> list[Key]:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.pop(conn, None)
    return list(holdings.keys) if holdings else []


def held_session_locks(conn: object) -> list[Key]:
    """The session locks pgsolo took on ``conn`` and has not released."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is None:
            return []
        return [
            k
            for k, held in holdings.keys.items()
            if held.lifetime == "session" and not held.pending
        ]


# -- the core ---------------------------------------------------------------------------


def _is_token(value: object) -> bool:
    """A fencing token came back (a positive int; 0 is a busy try, a bool a plain one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _validate_wait(wait: float | None) -> int | None:
    """``wait`` in whole milliseconds (rounded up), or None for a try."""
    if wait is None:
        return None
    try:
        seconds = check_seconds("wait", wait, 0, MAX_WAIT_SECONDS, above_low=True)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc}; use wait=None to try once without waiting") from None
    return max(1, math.ceil(seconds * 1000))


def _require_no_transaction(driver: DriverBase, subject: str, reason: str) -> None:
    """Refuse a connection with a transaction open, for calls that must own it."""
    status = driver.transaction_status()
    if status is not TxStatus.IDLE:
        raise ConnectionStateError(
            f"{subject} needs a connection with no transaction open (status"
            f" {status.value}): {reason}"
        )


class _LockCore:
    """One lock on one connection: its state, and the plans both shells drive."""

    def __init__(
        self,
        driver: DriverBase,
        key: Key,
        lifetime: sql.Lifetime,
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
        self.lifetime: sql.Lifetime = lifetime
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
            "event": event,
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
        logger.log(
            level,
            "advisory lock %s: %s",
            event,
            " ".join(f"{k}={v}" for k, v in fields.items() if k != "event" and v is not None),
            extra={"pgsolo": fields},
        )

    def log_lost(self, error: LockLostError) -> None:
        self._log(logging.ERROR, "lost", reason=error.reason, error=str(error))

    def _failure(self, exc: BaseException, started: float) -> BaseException | None:
        """Log a failed acquisition; return the pgsolo error it means, if it means one."""
        state = self.driver.sqlstate(exc)
        if state == sql.SQLSTATE_IN_RECOVERY:
            return self._standby_refused(started)
        self._log(logging.WARNING, "error", started, error=repr(exc))
        if state == sql.SQLSTATE_DEADLOCK:
            keys = advisory_keys_in(self.driver.error_detail(exc) or "") or (self.key,)
            return LockDeadlockError(
                f"deadlock: waiting for {self.lifetime} lock {self.key} would never end, so"
                f" PostgreSQL cancelled the wait; the sessions involved were waiting for"
                f" advisory locks {', '.join(str(k) for k in keys)}. Take several keys in"
                " one fixed order everywhere (for example sorted), or one key for the group.",
                key=self.key,
                keys=keys,
            )
        if self.fencing and state in sql.SQLSTATES_NOT_MIGRATED:
            return UsageError(
                "fencing tokens are kept in pgsolo's tables, which this database does not"
                " have: run `pgsolo migrate` first (nothing is held)"
            )
        return None

    def _standby_refused(self, started: float | None = None) -> UnsafeConnectionError:
        self._log(logging.WARNING, "refused", started, reason="server-in-recovery")
        return in_recovery_error(self.driver.server_info().address)

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
            claim = _claim(
                conn, pid, self.key, shared=self.shared, reentrant=False, lifetime="xact"
            )
            if claim == "busy":
                return self._busy_here(pid)
            _set_transaction_owner(conn, pid, _context_token())
        elif _is_claimed(conn, pid, self.key):
            return self._busy_here(pid)
        elif _transaction_owner(conn, pid) not in (None, _context_token()):
            raise ConnectionStateError(
                f"the transaction open on this connection (backend pid {pid}) is one pgsolo"
                " opened for another thread or task; joining it would share its locks and"
                " its COMMIT. Use a connection per thread or task."
            )
        try:
            acquired = yield from self._acquire_xact_claimed(status, context=context)
        except BaseException:
            if owns:
                _unclaim(conn, self.key)
                _set_transaction_owner(conn, pid, None)
            raise
        if owns:
            if acquired:
                _confirm(conn, self.key)
            else:
                _unclaim(conn, self.key)
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
            if self.wait_ms is not None and driver.sqlstate(exc) == sql.SQLSTATE_LOCK_NOT_AVAILABLE:
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

    def _claim_session(self) -> tuple[TxStatus, int, Claim]:
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
        claim = _claim(
            driver.connection, pid, self.key, shared=self.shared, reentrant=self.reentrant
        )
        if claim == "new" and status is TxStatus.ACTIVE:
            _unclaim(driver.connection, self.key)
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
                timed_out = (
                    self.wait_ms is not None
                    and driver.sqlstate(exc) == sql.SQLSTATE_LOCK_NOT_AVAILABLE
                )
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
            _confirm(conn, self.key)
            self.acquired, self.backend_pid = True, pid
            self.lost = None
            return True
        finally:
            if not confirmed:
                _unclaim(conn, self.key)

    def _route(self, status: TxStatus, pid: int) -> Plan[Route]:
        """What answers this connection, checked once per connection (pgsolo.proxy)."""
        driver = self.driver
        route = _route_of(driver.connection, pid)
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
        _set_route(driver.connection, pid, route)
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
        if _hold_count(conn, self.key) > 1:
            _unclaim(conn, self.key)
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
        _unclaim(self.driver.connection, self.key)
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
                _unclaim(conn, self.key)
            _set_transaction_owner(conn, self.driver.backend_pid(), None)

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
            if self.driver.sqlstate(exc) != sql.SQLSTATE_LOCK_GONE:
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


class _LockView:
    _core: _LockCore

    @property
    def key(self) -> Key:
        return self._core.key

    @property
    def lifetime(self) -> sql.Lifetime:
        return self._core.lifetime

    @property
    def shared(self) -> bool:
        return self._core.shared

    @property
    def acquired(self) -> bool:
        """Whether this object acquired the lock (and, for a session lock, still holds it)."""
        return self._core.acquired

    @property
    def backend_pid(self) -> int | None:
        """The backend pid the lock was taken on, as the connection announced it."""
        return self._core.backend_pid

    @property
    def token(self) -> int | None:
        """The fencing token of this acquisition (``fencing=True``): larger than any
        token issued for this key before. Downstream systems reject writes that carry a
        smaller token than one they have seen, so a holder that lost its lock cannot
        overwrite the work of the next one."""
        return self._core.token

    @property
    def lost(self) -> bool:
        """Whether the keeper (``keep=``) found the lock gone while it was held."""
        return self._core.lost is not None

    @property
    def loss(self) -> LockLostError | None:
        """What the keeper found (``reason`` says how the lock went), or None."""
        return self._core.lost

    def check(self) -> None:
        """Raise :class:`~pgsolo.LockLostError` if the keeper found the lock gone.

        Cheap (no round trip): call it between steps of long work."""
        if self._core.lost is not None:
            raise self._core.lost

    def _lost_instead(self, exc: BaseException) -> BaseException:
        """What a failed release means once the keeper has seen the lock go."""
        lost = self._core.lost
        if lost is not None and isinstance(exc, LockLostError | LockNotHeldError):
            return lost
        return exc

    def __repr__(self) -> str:
        state = "acquired" if self.acquired else "not acquired"
        if self.lost:
            state = "lost"
        return f"<{type(self).__name__} {self.lifetime} {self.key} {state}>"


class Lock(_LockView):
    """An advisory lock on a sync connection; see :func:`xact_lock` and :func:`session_lock`."""

    def __init__(self, core: _LockCore, driver: SyncDriver) -> None:
        self._core = core
        self._driver = driver
        self._keeper: Keeper | None = None

    def acquire(self) -> bool:
        """Try (or wait, if ``wait=`` was given) and return whether the lock was acquired.

        A wait that runs out raises :class:`~pgsolo.LockTimeoutError`.
        """
        acquired = drive(self._core.acquire(context=False), self._driver)
        self._start_keeper()
        return acquired

    def release(self) -> None:
        """Release a session lock on the connection it was taken on. Raises the
        :class:`~pgsolo.LockLostError` the keeper found, if it found one."""
        self._stop_keeper()
        try:
            drive(self._core.release(), self._driver)
        except (LockLostError, LockNotHeldError) as exc:
            if (instead := self._lost_instead(exc)) is not exc:
                raise instead from exc
            raise
        except BaseException:
            self._start_keeper()  # still held and on the books: still watched
            raise
        if self._core.lost is not None:  # a re-entrant hold released only its count
            raise self._core.lost

    def is_held(self) -> bool:
        return drive(self._core.is_held(), self._driver)

    def __enter__(self) -> Self:
        drive(self._core.acquire(context=True), self._driver)
        self._start_keeper()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_keeper()
        try:
            drive(self._core.exit(failed=exc_type is not None), self._driver)
        except (LockLostError, LockNotHeldError) as failure:
            if (instead := self._lost_instead(failure)) is not failure:
                raise instead from failure
            raise
        if exc_type is None and self._core.lost is not None:
            raise self._core.lost  # the block ran to its end, but not all of it under the lock

    def _start_keeper(self) -> None:
        if self._core.keep is not None and self._core.acquired and self._keeper is None:
            self._keeper = Keeper(self._core, self._driver, self._core.keep)
            self._keeper.start()

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()


class AsyncLock(_LockView):
    """An advisory lock on an async connection; the twin of :class:`Lock`."""

    def __init__(self, core: _LockCore, driver: AsyncDriver) -> None:
        self._core = core
        self._driver = driver
        self._keeper: AsyncKeeper | None = None

    async def acquire(self) -> bool:
        acquired = await adrive(self._core.acquire(context=False), self._driver)
        self._start_keeper()
        return acquired

    async def release(self) -> None:
        self._stop_keeper()
        try:
            await adrive(self._core.release(), self._driver)
        except (LockLostError, LockNotHeldError) as exc:
            if (instead := self._lost_instead(exc)) is not exc:
                raise instead from exc
            raise
        except BaseException:
            self._start_keeper()
            raise
        if self._core.lost is not None:
            raise self._core.lost

    async def is_held(self) -> bool:
        return await adrive(self._core.is_held(), self._driver)

    async def __aenter__(self) -> Self:
        await adrive(self._core.acquire(context=True), self._driver)
        self._start_keeper()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        keeper = self._keeper
        self._stop_keeper()
        loss_for_cancel = keeper.undo_cancel(exc) if keeper is not None else None
        try:
            await adrive(self._core.exit(failed=exc_type is not None), self._driver)
        except (LockLostError, LockNotHeldError) as failure:
            if (instead := self._lost_instead(failure)) is not failure:
                raise instead from failure
            raise
        if loss_for_cancel is not None:
            raise loss_for_cancel from exc  # Keep(cancel=True) ended the block
        if self._core.lost is not None and exc_type is None:
            raise self._core.lost

    def _start_keeper(self) -> None:
        if self._core.keep is not None and self._core.acquired and self._keeper is None:
            self._keeper = AsyncKeeper(self._core, self._driver, self._core.keep)
            self._keeper.start()

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()


def _make(
    conn: object,
    key: KeyLike,
    lifetime: sql.Lifetime,
    *,
    wait: float | None,
    shared: bool,
    reentrant: bool,
    namespace: int | None,
    registry: Registry | None,
    fencing: bool = False,
    keep: bool | Keep | None = None,
) -> Lock | AsyncLock:
    # Validate everything before touching the connection.
    resolved = as_key(key, namespace=namespace, registry=registry)
    wait_ms = _validate_wait(wait)
    for flag, label in ((shared, "shared"), (reentrant, "reentrant"), (fencing, "fencing")):
        if not isinstance(flag, bool):
            raise UsageError(f"{label} must be True or False, got {flag!r}")
    if fencing and (shared or reentrant):
        raise UsageError(
            "fencing tokens order exclusive holders one after another; a shared or"
            " re-entrant lock has several holders at once"
        )
    keeping = as_keep(keep)
    driver = adapt(conn)
    if keeping is not None and keeping.cancel and not is_async(driver):
        raise UsageError("Keep(cancel=True) cancels an asyncio task: it needs an async connection")
    core = _LockCore(
        driver,
        resolved,
        lifetime,
        wait_ms=wait_ms,
        shared=shared,
        reentrant=reentrant,
        fencing=fencing,
        keep=keeping,
    )
    if is_async(driver):
        return AsyncLock(core, driver)
    return Lock(core, as_sync(driver))


@overload
def xact_lock(
    conn: psycopg.AsyncConnection[Any],
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
    conn: psycopg.Connection[Any],
    key: KeyLike,
    *,
    wait: float | None = None,
    shared: bool = False,
    namespace: int | None = None,
    registry: Registry | None = None,
    fencing: bool = False,
) -> Lock: ...
def xact_lock(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
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
    answer); ``wait=S`` waits up to S seconds with a server-side ``lock_timeout`` and
    raises :class:`~pgsolo.LockTimeoutError` after that.

    ``fencing=True`` issues a fencing token (``lock.token``) in the same transaction as the
    lock; it needs ``pgsolo migrate``.
    """
    return _make(
        conn,
        key,
        "xact",
        wait=wait,
        shared=shared,
        reentrant=False,
        namespace=namespace,
        registry=registry,
        fencing=fencing,
    )


@overload
def session_lock(
    conn: psycopg.AsyncConnection[Any],
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
    conn: psycopg.Connection[Any],
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
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
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
    unless ``reentrant=True``, in which case holds are counted.

    Before the first session lock on a connection pgsolo checks that the connection
    reaches one server session for good: behind a transaction-pooling proxy it raises
    :class:`~pgsolo.UnsafeConnectionError` and takes nothing (see :mod:`pgsolo.proxy`).

    ``keep=True`` (or a :class:`~pgsolo.Keep`) watches the lock while it is held
    (``lock.lost``, ``lock.check()``, ``on_lost``); ``fencing=True`` issues a fencing
    token (``lock.token``) in the same round trip as the lock; it needs ``pgsolo migrate``.
    """
    return _make(
        conn,
        key,
        "session",
        wait=wait,
        shared=shared,
        reentrant=reentrant,
        namespace=namespace,
        registry=registry,
        fencing=fencing,
        keep=keep,
    )


def _reset_plan(driver: DriverBase) -> Plan[None]:
    for key in _forget_all(driver.connection):
        logger.warning(
            "pgsolo: session lock %s was still held when its connection went back to the"
            " pool; releasing it",
            key,
        )
    status = driver.transaction_status()
    statements = [sql.UNLOCK_ALL]
    if status in (TxStatus.INTRANS, TxStatus.INERROR):
        statements = [sql.ROLLBACK, *statements]
    yield outside_transaction(driver, statements)


def pool_reset(conn: psycopg.Connection[Any]) -> None:
    """A ``psycopg_pool.ConnectionPool(reset=...)`` hook: no connection goes back to the
    pool holding a session lock, whether pgsolo or plain SQL took it."""
    driver = adapt_sync(conn)
    drive(_reset_plan(driver), driver)


async def async_pool_reset(conn: psycopg.AsyncConnection[Any]) -> None:
    """The :func:`pool_reset` hook for ``psycopg_pool.AsyncConnectionPool``."""
    driver = adapt_async(conn)
    await adrive(_reset_plan(driver), driver)
