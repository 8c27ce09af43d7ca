"""What a failed acquisition means: pgsolo's error for the driver's, logged once.

A key this connection already holds through pgsolo is busy for a try, and a
:class:`~pgsolo.LockUnavailableError` for a wait (PostgreSQL would grant it again). A wait
that ran out is a :class:`~pgsolo.LockTimeoutError`, and so is one the server cut short
first (the connection's ``statement_timeout``, shorter than the wait: the error names it
and how long the wait lasted); a standby, a :class:`~pgsolo.UnsafeConnectionError`; a
deadlock between advisory waits, a :class:`~pgsolo.LockDeadlockError` naming the keys of
the cycle; fencing on a database without pgsolo's tables, a
:class:`~pgsolo.NotMigratedError`; a privilege the role lacks, a
:class:`~pgsolo.InsufficientPrivilegeError`; a connection that failed under the
statement, a :class:`~pgsolo.DatabaseUnavailableError`. Each has the driver's error (on a
framework's connection, the framework's) as its cause. Anything else is the driver's own
error, raised as it is.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .. import sql
from ..errors import (
    DatabaseUnavailableError,
    LockDeadlockError,
    LockTimeoutError,
    LockUnavailableError,
    NotMigratedError,
    UnsafeConnectionError,
)
from ..keys import advisory_keys_in
from .routing import in_recovery_error

if TYPE_CHECKING:
    from .core import LockCore

__all__ = ["acquisition_error", "busy_here", "connection_failed", "standby_refused", "timed_out"]


def busy_here(core: LockCore, pid: int) -> bool:
    """Refuse ``core``'s key, which this connection (backend ``pid``) already holds
    through pgsolo: False (busy) for a try."""
    core.log(logging.DEBUG, "busy", reason="held-by-this-connection")
    if core.wait_ms is None:
        return False
    hint = "" if core.lifetime == "xact" else ", or reentrant=True if that is on purpose"
    raise LockUnavailableError(
        f"{core.lifetime} lock {core.key} is already held on this connection (backend pid"
        f" {pid}); PostgreSQL would grant it again, so two holders sharing one connection"
        f" would both run. Use another connection{hint}.",
        key=core.key,
    )


def acquisition_error(core: LockCore, exc: BaseException, started: float) -> BaseException | None:
    """Log a failed acquisition of ``core``'s lock (begun at ``started``); return the
    pgsolo error to raise instead of ``exc``, or None when it means none of them."""
    if core.wait_ms is not None and timed_out(core, exc):
        core.log(logging.DEBUG, "timeout", started)
        return _timeout_error(core, exc, started)
    meaning = sql.meaning(core.driver.sqlstate(exc))
    if meaning is sql.Meaning.IN_RECOVERY:
        return standby_refused(core, started)
    core.log(logging.WARNING, "error", started, error=repr(exc))
    if meaning is sql.Meaning.DEADLOCK:
        keys = advisory_keys_in(core.driver.error_detail(exc) or "") or (core.key,)
        return LockDeadlockError(
            f"deadlock: waiting for {core.lifetime} lock {core.key} would never end, so"
            f" PostgreSQL cancelled the wait; the sessions involved were waiting for"
            f" advisory locks {', '.join(str(k) for k in keys)}. Take several keys in"
            " one fixed order everywhere (for example sorted), or one key for the group.",
            key=core.key,
            keys=keys,
        )
    if meaning is sql.Meaning.NO_PRIVILEGE:
        # EXECUTE on the lock function (revoked from PUBLIC, as `pgsolo doctor` advises,
        # and not granted back), or the fencing sequence: the server says which in its
        # own words (and language), so both are named.
        function = sql.lock_function(
            core.lifetime, wait=core.wait_ms is not None, shared=core.shared
        )
        args = "integer, integer" if core.key.is_pair else "bigint"
        return sql.privilege_error(
            f"{core.lifetime} lock {core.key}",
            core.driver.server_info().user,
            functions=(f"{function}({args})",),
            features=("fencing",) if core.fencing else (),
        )
    if core.fencing and meaning is sql.Meaning.NOT_MIGRATED:
        return NotMigratedError(
            "fencing tokens are kept in pgsolo's tables, which this database does not"
            " have: run `pgsolo migrate` first (nothing is held)"
        )
    return connection_failed(core, exc)


def connection_failed(core: LockCore, exc: BaseException) -> DatabaseUnavailableError | None:
    """The error for a connection that ``exc`` (an error, not an interruption) found
    dead under one of pgsolo's statements for ``core``'s lock; None if it lives. A dead
    session holds no advisory lock: nothing is held."""
    if not isinstance(exc, Exception) or not core.driver.is_closed():
        return None
    said = " ".join(str(exc).split()) or type(exc).__name__
    return DatabaseUnavailableError(
        f"the connection failed while pgsolo was taking {core.lifetime} lock {core.key}"
        f" ({said}); nothing is held"
    )


def standby_refused(core: LockCore, started: float | None = None) -> UnsafeConnectionError:
    """Log that the server is a standby, where no lock is taken; the error to raise."""
    core.log(logging.WARNING, "refused", started, reason="server-in-recovery")
    return in_recovery_error(core.driver.server_info().address)


def timed_out(core: LockCore, exc: BaseException) -> bool:
    """Whether ``exc`` is the server ending the wait: pgsolo's ``lock_timeout``, or the
    connection's own ``statement_timeout`` when it is the shorter (or an operator's
    ``pg_cancel_backend``, which the server reports the same way)."""
    meaning = sql.meaning(core.driver.sqlstate(exc))
    return meaning is sql.Meaning.LOCK_TIMEOUT or meaning is sql.Meaning.CANCELED


def _timeout_error(core: LockCore, exc: BaseException, started: float) -> LockTimeoutError:
    info = core.driver.server_info()
    where = f"{core.lifetime} lock {core.key} on database {info.database!r} at {info.address}"
    if sql.meaning(core.driver.sqlstate(exc)) is sql.Meaning.LOCK_TIMEOUT:
        return LockTimeoutError(
            f"timed out after {core.wait_seconds:g}s waiting for {where}",
            key=core.key,
            timeout=core.wait_seconds,
        )
    # The server cancelled the wait before pgsolo's bound: a limit of the caller's.
    waited = round(time.perf_counter() - started, 3)
    said = " ".join(str(exc).split())
    return LockTimeoutError(
        f"the server cancelled the wait for {where} after {waited:g}s, before its wait"
        f" of {core.wait_seconds:g}s ran out ({said}): the connection's statement_timeout"
        " is shorter than the wait (raise it, or wait less), or someone cancelled the"
        " statement (pg_cancel_backend)",
        key=core.key,
        timeout=waited,
    )
