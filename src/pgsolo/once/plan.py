"""The one definition of a call of ``run_once``, as a plan both shells drive."""

from __future__ import annotations

import inspect
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import sql
from .._logging import log_event
from .._logging import once_logger as logger
from .._types import OnceOutcome
from ..drivers import DriverBase, TxStatus
from ..errors import (
    InsufficientPrivilegeError,
    InvalidOperationError,
    InvalidOperationKeyError,
    LockLostError,
    LockTimeoutError,
    NotMigratedError,
    PgsoloError,
    TransactionFailedError,
    UnsupportedConnectionError,
)
from ..keys import Key
from ..locking import (
    LockCore,
    LockSpec,
    connection_gone,
    lock_core,
    outside_transaction,
    quietly,
    require_no_transaction,
    unavailable,
    wait_ms_of,
)
from ..locking.plans import ROLLBACK, WORK, Own, Plan
from .operation import (
    OnceResult,
    idempotency_key_for,
    lock_key_for,
    storable_result,
    validate_op_key,
)

__all__ = ["Attempt", "Operation", "core_for", "once_plan", "report_outcome"]

MAX_ERROR_CHARS = 4000


@dataclass(frozen=True, slots=True)
class Operation:
    op_key: str
    lock_key: Key
    wait_ms: float | None

    @classmethod
    def define(
        cls, op_key: object, operation: object, wait: float | None, *, sync: bool
    ) -> Operation:
        key = validate_op_key(op_key)
        wait_ms = wait_ms_of(wait)
        if not callable(operation):
            raise InvalidOperationError(
                f"the operation must be a callable taking a context, got {operation!r}"
            )
        if sync and inspect.iscoroutinefunction(operation):
            raise InvalidOperationError(
                "run_once() cannot run an async function (it would never be awaited);"
                " use run_once_async()"
            )
        return cls(key, lock_key_for(key), wait_ms)


@dataclass(slots=True)
class Attempt:
    """Filled in by the plan before the operation runs; read by the shell's work."""

    number: int = 0
    idempotency_key: str = ""


def once_plan(
    op: Operation, core: LockCore, attempt: Attempt, scrub: Callable[[str], str]
) -> Plan[OnceResult]:
    """The one definition of a call, for both shells."""
    if refusal := core.driver.session_locks_refused:  # refused alike in or out of a transaction
        raise UnsupportedConnectionError(refusal)
    require_no_transaction(
        core.driver,
        f"operation {op.op_key!r}",
        "pgsolo commits its state before the operation runs",
    )
    found = yield from _read(op, core)
    if found is not None and found["state"] == "succeeded":
        return _from_row("already-succeeded", op, found)
    try:
        try:
            acquired = yield from core.acquire(context=True)
        except LockTimeoutError:
            acquired = False
        if not acquired:
            derived = idempotency_key_for(op.op_key)
            return OnceResult(
                "skipped-busy",
                op.op_key,
                found["idempotency_key"] if found else derived,
                attempts=found["attempts"] if found else 0,
            )
    except BaseException:
        yield from core.let_go()  # a Ctrl-C as the lock came: nothing stays held
        raise
    try:
        return (yield from _run_attempt(op, core, attempt, scrub))
    except BaseException as exc:
        # Interrupted (Ctrl-C) at a line where the operation's transaction is open: the
        # connection was idle when the call began, and goes back so.
        if not isinstance(exc, Exception) and core.driver.transaction_status() in (
            TxStatus.INTRANS,
            TxStatus.INERROR,
        ):
            yield from quietly(core.driver, [sql.ROLLBACK])
        raise
    finally:
        # The outcome is already recorded (or deliberately not): a lock that cannot be
        # released cleanly is logged, never allowed to turn a success into an error. Written
        # here, not in a function of its own: a Ctrl-C lands at a function's first
        # instruction, before any try of that function could catch it (the Ctrl-C campaign
        # caught one there, lock left held, once in 746 interruptions of run_once).
        try:
            yield from core.exit(failed=False)
        except Exception as exc:
            logger.warning("pgsolo: operation %s: releasing its lock: %r", op.op_key, exc)
        except BaseException:
            yield from core.let_go()  # a Ctrl-C as it let go: let go all the same
            raise


def _read(op: Operation, core: LockCore) -> Plan[dict[str, Any] | None]:
    driver = core.driver
    try:
        text = yield outside_transaction(driver, [sql.once_read(op.op_key)])
    except Exception as exc:
        if driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
            yield from quietly(core.driver, [sql.ROLLBACK])
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NOT_MIGRATED:
            raise NotMigratedError(
                "operation keys need pgsolo's tables: run `pgsolo migrate` first"
            ) from exc
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NO_PRIVILEGE:
            raise _no_privilege(op, driver) from exc
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.UNTRANSLATABLE:
            raise InvalidOperationKeyError(
                f"this database's encoding cannot hold the operation key {op.op_key!r}"
            ) from exc
        if (failed := unavailable(driver, exc, f"reading operation {op.op_key!r}")) is not None:
            raise failed from exc
        raise
    row = sql.read_json(text)
    return None if row is None else dict(row)


def _no_privilege(op: Operation, driver: DriverBase) -> InsufficientPrivilegeError:
    return sql.privilege_error(
        f"operation {op.op_key!r}", driver.server_info().user, features=("once",)
    )


def _from_row(outcome: OnceOutcome, op: Operation, row: dict[str, Any]) -> OnceResult:
    return OnceResult(
        outcome, op.op_key, row["idempotency_key"], result=row["result"], attempts=row["attempts"]
    )


def _run_attempt(
    op: Operation, core: LockCore, attempt: Attempt, scrub: Callable[[str], str]
) -> Plan[OnceResult]:
    """With the lock held: begin an attempt, run the operation, record how it ended."""
    driver = core.driver
    start = sql.once_start(
        op.op_key, idempotency_key_for(op.op_key), host=socket.gethostname(), pid=os.getpid()
    )
    try:
        began = yield _committed(driver, [start])  # 'started' commits before the operation
    except Exception as exc:
        if sql.meaning(driver.sqlstate(exc)) is not sql.Meaning.NO_PRIVILEGE:
            if (failed := _not_begun(op, driver, exc)) is not None:
                raise failed from exc
            raise
        # A role that may read operations but not write them: nothing ran.
        if driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
            yield from quietly(core.driver, [sql.ROLLBACK])
        raise _no_privilege(op, driver) from exc
    if began is None:  # another attempt succeeded between the first look and the lock
        found = yield from _read(op, core)
        assert found is not None  # noqa: S101 - a succeeded row is never deleted
        return _from_row("already-succeeded", op, found)
    started = sql.read_json(began)
    attempt.number, attempt.idempotency_key = started["attempts"], started["idempotency_key"]
    # The operation's transaction is pgsolo's own, opened and ended the way the
    # connection's library or framework does it (Own), so that its books stay true.
    try:
        yield Own([], "begin")
    except BaseException as exc:
        yield from _roll_back(core)
        if (failed := _not_begun(op, driver, exc)) is not None:
            raise failed from exc
        raise
    try:
        value = yield WORK
        stored = storable_result(value)
        # What the server stores (jsonb normalises numbers) is what every call returns.
        stored = str(sql.read_text((yield from _record_success(op, core, attempt, stored))))
    except BaseException as exc:
        superseded = sql.meaning(driver.sqlstate(exc)) is sql.Meaning.SUPERSEDED
        # The operation's work is undone whatever happened: failed, interrupted, or taken
        # over (the row is then left to whoever runs the operation next).
        yield from _roll_back(core)
        if isinstance(exc, Exception) and not superseded:
            error = scrub(_describe(exc))[:MAX_ERROR_CHARS]
            yield from quietly(
                driver, _committed(driver, [sql.once_fail(op.op_key, attempt.number, error)])
            )
            # WARNING, not ERROR, and no traceback: the exception goes back to the caller,
            # whose own report shows it (a traceback would repeat the unscrubbed message).
            fields = {"op_key": op.op_key, "attempt": attempt.number, "error": error}
            log_event(logger, logging.WARNING, "operation", "event", "failed", fields)
        if superseded:
            raise LockLostError(
                f"operation {op.op_key!r}: attempt {attempt.number} lost its lock and another"
                " caller took the operation over before it could record success; this"
                " attempt's database work was rolled back (the other attempt used the same"
                " idempotency key)",
                key=op.lock_key,
                reason="lock-released",
            ) from exc
        raise
    return OnceResult("ran", op.op_key, attempt.idempotency_key, json.loads(stored), attempt.number)


def _roll_back(core: LockCore) -> Plan[None]:
    """End the operation's transaction with a rollback, unless it is over already (the
    operation, or the failed commit edge, ended it): ended exactly once."""
    if core.driver.transaction_status() is not TxStatus.IDLE:
        yield from quietly(core.driver, ROLLBACK)


def _describe(exc: BaseException) -> str:
    """``Type: message``, even for an exception whose message cannot be built."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message could not be shown)"


def _record_success(op: Operation, core: LockCore, attempt: Attempt, stored: str) -> Plan[object]:
    """Record success and read the result back as stored, in one round trip: with the
    operation's work, as its transaction commits."""
    driver = core.driver
    succeed = [sql.once_succeed(op.op_key, attempt.number, stored), sql.once_result(op.op_key)]
    status = driver.transaction_status()
    if status is TxStatus.IDLE:
        # The operation ended its transaction itself (nothing of it is left to end), or,
        # with a driver that begins by itself, did no database work.
        if not driver.begins_implicitly:
            logger.warning(
                "operation %s ended its own transaction: its database work committed apart"
                " from the record of its success",
                op.op_key,
            )
        try:
            return (yield _committed(driver, succeed))
        except Exception as exc:
            if connection_gone(core.driver, exc, core.backend_pid):
                raise _lost_before_success(op, attempt, exc) from exc
            raise
    failed_inside = TransactionFailedError(
        f"operation {op.op_key!r}: its transaction failed inside the operation (a database"
        " error was caught there and not re-raised); its database work was rolled back"
        " and the attempt recorded as failed"
    )
    if status is TxStatus.INERROR:
        raise failed_inside
    try:
        return (yield Own(succeed, "commit"))
    except Exception as exc:
        # A failure the driver could not see before (asyncpg): found at the commit.
        if isinstance(exc, TransactionFailedError) or (
            sql.meaning(driver.sqlstate(exc)) is sql.Meaning.TRANSACTION_FAILED
        ):
            raise failed_inside from exc
        if connection_gone(core.driver, exc, core.backend_pid):
            raise _lost_before_success(op, attempt, exc) from exc
        raise


def _not_begun(op: Operation, driver: DriverBase, exc: BaseException) -> PgsoloError | None:
    """The error for a connection found dead as an attempt began, before the operation
    ran (its 'started' row, if written, is taken over by the next call)."""
    return unavailable(driver, exc, f"beginning an attempt of operation {op.op_key!r}")


def _lost_before_success(op: Operation, attempt: Attempt, exc: Exception) -> LockLostError:
    """The connection, and the operation's lock and transaction with it, went before its
    success was recorded: pgsolo's own statement failed, so the error is pgsolo's."""
    said = " ".join(str(exc).split()) or type(exc).__name__
    return LockLostError(
        f"operation {op.op_key!r}: attempt {attempt.number} lost its connection, and its"
        f" lock, before its success could be recorded ({said}); the next call runs the"
        " operation again (with the same idempotency key)",
        key=op.lock_key,
        reason="connection-lost",
    )


def _committed(driver: DriverBase, statements: list[str]) -> list[str]:
    """``statements`` in a transaction of their own, committed in the same round trip,
    on a connection with none open."""
    if driver.begins_implicitly:
        return [*statements, sql.COMMIT]
    return [sql.BEGIN, *statements, sql.COMMIT]


def core_for(op: Operation, driver: DriverBase) -> LockCore:
    return lock_core(driver, LockSpec(op.lock_key, "session", op.wait_ms))


def report_outcome(result: OnceResult) -> OnceResult:
    """Log what a call of ``run_once`` came to; ``result`` itself."""
    fields = {"op_key": result.op_key, "attempts": result.attempts}
    log_event(logger, logging.INFO, "operation", "outcome", result.outcome, fields)
    return result
