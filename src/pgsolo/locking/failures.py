"""What a failed acquisition means: pgsolo's error for the driver's, logged once.

A key this connection already holds through pgsolo is busy for a try, and a
:class:`~pgsolo.LockUnavailableError` for a wait (PostgreSQL would grant it again). A wait
that ran out is a :class:`~pgsolo.LockTimeoutError`, and so is one the connection's own
``statement_timeout``, shorter than the wait, cut short (:func:`cut_short`: the error
names that limit); a standby, a :class:`~pgsolo.UnsafeConnectionError`; a
deadlock between advisory waits, a :class:`~pgsolo.LockDeadlockError` naming the keys of
the cycle; fencing on a database without pgsolo's tables, a
:class:`~pgsolo.NotMigratedError`; a privilege the role lacks, a
:class:`~pgsolo.InsufficientPrivilegeError`; a connection that failed under the
statement, a :class:`~pgsolo.DatabaseUnavailableError` (:func:`unavailable`, for any of
pgsolo's statements before the caller's work runs). Each has the driver's error (on a
framework's connection, the framework's) as its cause. Anything else is the driver's own
error, raised as it is.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from .. import sql
from .._logging import locks_logger as logger
from ..drivers import DriverBase, TxStatus
from ..errors import (
    DatabaseUnavailableError,
    LockDeadlockError,
    LockTimeoutError,
    LockUnavailableError,
    NotMigratedError,
    PgsoloError,
    UnsafeConnectionError,
)
from ..keys import advisory_keys_in
from . import placement
from .routing import in_recovery_error

if TYPE_CHECKING:
    from .events import LockEvents
    from .plans import Plan

__all__ = [
    "acquisition_error",
    "busy_here",
    "connection_failed",
    "cut_short",
    "standby_refused",
    "timed_out",
    "unavailable",
]


def busy_here(events: LockEvents, pid: int) -> bool:
    """Refuse the lock's key, which this connection (backend ``pid``) already holds
    through pgsolo: False (busy) for a try."""
    spec = events.spec
    events.log(logging.DEBUG, "busy", None, {"reason": "held-by-this-connection"})
    if spec.wait_ms is None:
        return False
    hint = "" if spec.lifetime == "xact" else ", or reentrant=True if that is on purpose"
    raise LockUnavailableError(
        f"{spec.lifetime} lock {spec.key} is already held on this connection (backend pid"
        f" {pid}); PostgreSQL would grant it again, so two holders sharing one connection"
        f" would both run. Use another connection{hint}.",
        key=spec.key,
    )


def acquisition_error(
    events: LockEvents, exc: BaseException, started: float
) -> BaseException | None:
    """Log a failed acquisition of the lock (begun at ``started``); return the
    pgsolo error to raise instead of ``exc``, or None when it means none of them (or, for
    a wait the server cancelled, when :func:`cut_short` must tell why, once the connection
    is put right)."""
    spec = events.spec
    meaning = sql.meaning(events.driver.sqlstate(exc))
    if spec.wait_ms is not None and meaning is sql.Meaning.LOCK_TIMEOUT:
        events.log(logging.DEBUG, "timeout", started)
        return _timeout_error(events)
    if spec.wait_ms is not None and meaning is sql.Meaning.CANCELED:
        return None
    # An interruption (a task cancelled as a campaign or a service shuts down, Ctrl-C)
    # is no failure of the lock's: raised as it is, and said quietly.
    level = logging.WARNING if isinstance(exc, Exception) else logging.DEBUG
    events.log(level, "error", started, {"error": repr(exc)})
    return _refusal(events, exc, meaning) or connection_failed(events, exc)


def _refusal(
    events: LockEvents, exc: BaseException, meaning: sql.Meaning | None
) -> PgsoloError | None:
    """The server refused the acquisition for a reason pgsolo has words for."""
    spec = events.spec
    if meaning is sql.Meaning.DEADLOCK:
        keys = advisory_keys_in(events.driver.error_detail(exc) or "") or (spec.key,)
        return LockDeadlockError(
            f"deadlock: waiting for {spec.lifetime} lock {spec.key} would never end, so"
            f" PostgreSQL cancelled the wait; the sessions involved were waiting for"
            f" advisory locks {', '.join(str(k) for k in keys)}. Take several keys in"
            " one fixed order everywhere (for example sorted), or one key for the group.",
            key=spec.key,
            keys=keys,
        )
    if meaning is sql.Meaning.NO_PRIVILEGE:
        # EXECUTE on the lock function (revoked from PUBLIC, as `pgsolo doctor` advises,
        # and not granted back), or the fencing sequence: the server says which in its
        # own words (and language), so both are named.
        function = sql.lock_function(
            spec.lifetime, wait=spec.wait_ms is not None, shared=spec.shared
        )
        args = "integer, integer" if spec.key.is_pair else "bigint"
        return sql.privilege_error(
            f"{spec.lifetime} lock {spec.key}",
            events.driver.server_info().user,
            functions=(f"{function}({args})",),
            features=("fencing",) if spec.fencing else (),
        )
    if spec.fencing and meaning is sql.Meaning.NOT_MIGRATED:
        return NotMigratedError(
            "fencing tokens are kept in pgsolo's tables, which this database does not"
            " have: run `pgsolo migrate` first (nothing is held)"
        )
    return None


def unresponsive(error: BaseException | None) -> bool:
    """Whether ``error``, or one of its causes, says that a deadline shut the connection
    down (:class:`~pgsolo.DatabaseUnavailableError` with ``unresponsive``)."""
    while error is not None:
        if isinstance(error, DatabaseUnavailableError) and error.unresponsive:
            return True
        error = error.__cause__
    return False


def connection_failed(events: LockEvents, exc: BaseException) -> DatabaseUnavailableError | None:
    """The error for a connection that ``exc`` found dead under one of pgsolo's
    statements for the lock (see :func:`unavailable`)."""
    spec = events.spec
    return unavailable(events.driver, exc, f"taking {spec.lifetime} lock {spec.key}")


def unavailable(
    driver: DriverBase, exc: BaseException, doing: str, *, dead: bool | None = None
) -> DatabaseUnavailableError | None:
    """The error for a connection that ``exc`` (an error, not an interruption) found
    dead under one of pgsolo's own statements while pgsolo was ``doing`` something,
    before the caller's work ran; None if it lives, or if ``exc`` is pgsolo's already (a
    deadline that shut the connection down says so). ``dead`` says whether it died when
    the caller knows better than :meth:`is_closed` (a framework that reconnected as it
    closed its books). A dead session holds no advisory lock: nothing is held. The caller
    raises it ``from exc``."""
    if isinstance(exc, PgsoloError) or not isinstance(exc, Exception):
        return None
    if not (driver.is_closed() if dead is None else dead):
        return None
    said = " ".join(str(exc).split()) or type(exc).__name__
    info = driver.server_info()  # what it said while open ("?" if never asked)
    where = "" if info.host == "?" else f" to database {info.database!r} at {info.address}"
    return DatabaseUnavailableError(
        f"the connection{where} failed while pgsolo was {doing} ({said}); nothing is held"
    )


def standby_refused(events: LockEvents, started: float | None = None) -> UnsafeConnectionError:
    """Log that the server is a standby, where no lock is taken; the error to raise."""
    events.log(logging.WARNING, "refused", started, {"reason": "server-in-recovery"})
    return in_recovery_error(events.driver.server_info().address)


def timed_out(driver: DriverBase, exc: BaseException) -> bool:
    """Whether ``exc`` is the server's ``lock_timeout``."""
    return sql.meaning(driver.sqlstate(exc)) is sql.Meaning.LOCK_TIMEOUT


def cut_short(events: LockEvents, exc: BaseException, started: float) -> Plan[BaseException | None]:
    """After a wait for the lock that the server cancelled (``exc``, SQLSTATE
    57014), with the connection put right: a :class:`~pgsolo.LockTimeoutError` if the
    connection's own ``statement_timeout``, shorter than the wait, ended it (the caller's
    limit wins, and is named); None for a cancel request (``pg_cancel_backend``, or
    Ctrl-C that psycopg2's ``wait_select`` turns into one), raised as it is."""
    spec = events.spec
    driver = events.driver
    if (
        spec.wait_ms is None
        or not isinstance(exc, Exception)
        or sql.meaning(driver.sqlstate(exc)) is not sql.Meaning.CANCELED
        or driver.transaction_status() not in (TxStatus.IDLE, TxStatus.INTRANS)
    ):
        return None
    waited = time.perf_counter() - started
    try:
        limit_ms = yield placement.outside_transaction(driver, [sql.STATEMENT_TIMEOUT_MS])
    except Exception as failure:
        logger.debug("pgsolo: reading statement_timeout failed: %r", failure)
        limit_ms = None
    # The server cancels at statement_timeout, never sooner: a wait that lasted less
    # was cancelled by request.
    if not isinstance(limit_ms, int) or not 0 < limit_ms <= waited * 1000:
        events.log(logging.WARNING, "error", started, {"error": repr(exc)})
        return None
    events.log(logging.DEBUG, "timeout", started, {"limit": "statement_timeout"})
    limit = limit_ms / 1000
    info = driver.server_info()
    its_wait = "with no end" if math.isinf(spec.wait_seconds) else f"of {spec.wait_seconds:g}s"
    return LockTimeoutError(
        f"the connection's statement_timeout ({limit:g}s) ended the wait for"
        f" {spec.lifetime} lock {spec.key} on database {info.database!r} at"
        f" {info.address} before its wait {its_wait} ran out: the shorter limit wins (raise"
        " statement_timeout, or wait less)",
        key=spec.key,
        timeout=limit,
    )


def _timeout_error(events: LockEvents) -> LockTimeoutError:
    spec = events.spec
    info = events.driver.server_info()
    return LockTimeoutError(
        f"timed out after {spec.wait_seconds:g}s waiting for {spec.lifetime} lock"
        f" {spec.key} on database {info.database!r} at {info.address}",
        key=spec.key,
        timeout=spec.wait_seconds,
    )
