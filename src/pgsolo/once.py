"""Operation keys: run a side effect at most once to completion, even across crashes.

A lock stops two workers from running at the same time; it does not stop a retry from
charging a card twice after a crash. For that the article asks for a durable operation
key and an idempotent side effect, and this module gives both halves:

- ``pgsolo.operations`` (migration 3 of ``pgsolo migrate``) holds one row per operation
  key, whose state goes ``started`` -> ``succeeded`` or ``failed``. ``started`` is
  committed before the operation runs, so a crash always leaves a trace.
- Every attempt holds a session advisory lock on its connection while it runs, keyed by
  ``"pgsolo:once:" + op_key`` (key spec v1 name derivation). A caller that finds the lock
  busy knows the holder is alive; one that gets it and finds ``started`` knows the
  holder died (its session, and so its lock, is gone) and takes over.
- The operation gets an idempotency key derived from the operation key alone (see
  :func:`idempotency_key_for`), the same on every attempt and every host, to hand to the
  external service, which then deduplicates what a crash made pgsolo repeat.
- Success and the result are recorded in the transaction in which the operation's own
  database work ran, so both commit or neither does.

A ``failed`` operation is run again by the next call, with the same idempotency key: a
failure can come after the side effect happened (a timeout reading the answer), and the
key is what makes the retry safe.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from psycopg.conninfo import make_conninfo

from . import sql
from ._plans import WORK, Plan, adrive, drive, outside_transaction
from .drivers import DriverBase, TxStatus, adapt_async, adapt_sync
from .drivers._psycopg import password_of
from .dsn import scrub_secrets
from .errors import (
    InvalidOperationError,
    InvalidOperationKeyError,
    LockLostError,
    LockTimeoutError,
    ResultNotStorableError,
    TransactionFailedError,
    UsageError,
)
from .keys import Key, from_name
from .locks import _LockCore, _require_no_transaction, _validate_wait

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "MAX_OP_KEY_BYTES",
    "MAX_RESULT_BYTES",
    "OnceOutcome",
    "OnceResult",
    "OperationContext",
    "idempotency_key_for",
    "run_once",
    "run_once_async",
]

logger = logging.getLogger("pgsolo")

MAX_OP_KEY_BYTES = 512
MAX_RESULT_BYTES = 1024 * 1024  # of compact UTF-8 JSON
MAX_ERROR_CHARS = 4000
LOCK_PREFIX = "pgsolo:once:"
IDEMPOTENCY_PREFIX = "pgsolo-"
# Versioned, so that a future derivation can never hand out a key of this one.
_IDEMPOTENCY_DOMAIN = b"pgsolo idempotency key v1\0"
SQLSTATE_UNDEFINED_TABLE = "42P01"

OnceOutcome = Literal["ran", "already-succeeded", "skipped-busy"]
C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class OnceResult:
    """What one call of :func:`run_once` found or did."""

    outcome: OnceOutcome
    """``ran``: this call ran the operation to success. ``already-succeeded``: an earlier
    attempt did, nothing ran. ``skipped-busy``: another caller is running it right now
    (and did not finish within ``wait``); nothing ran and nothing is known to succeed."""
    op_key: str
    idempotency_key: str
    result: Any = None
    """The stored result (the operation's return value as it reads back from JSON)."""
    attempts: int = 0
    """Attempts recorded for this operation so far (0: none known)."""

    @property
    def succeeded(self) -> bool:
        """True when the operation has succeeded (by this call or an earlier one)."""
        return self.outcome != "skipped-busy"


@dataclass(frozen=True, slots=True)
class OperationContext(Generic[C]):
    """What the operation is given: who it is, and the connection to do its work on.

    Statements run on ``conn`` belong to the transaction in which success and the result
    are recorded: they commit with them, or not at all.
    """

    op_key: str
    idempotency_key: str
    """Pass this to the external service (an ``Idempotency-Key`` header, a request id)."""
    attempt: int
    """1 for the first attempt; more when an earlier one failed or died."""
    conn: C


def validate_op_key(op_key: object) -> str:
    """``op_key`` if it is a valid operation key, else :class:`InvalidOperationKeyError`."""
    if not isinstance(op_key, str):
        raise InvalidOperationKeyError(
            f"an operation key must be a str, got {type(op_key).__name__} {op_key!r}"
        )
    if not op_key:
        raise InvalidOperationKeyError("an operation key must not be empty")
    if "\0" in op_key:
        raise InvalidOperationKeyError("an operation key must not contain a NUL character")
    try:
        size = len(op_key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidOperationKeyError(
            f"an operation key must be valid Unicode text: {exc}"
        ) from None
    if size > MAX_OP_KEY_BYTES:
        raise InvalidOperationKeyError(
            f"an operation key must be at most {MAX_OP_KEY_BYTES} UTF-8 bytes, got {size}"
        )
    return op_key


def idempotency_key_for(op_key: str) -> str:
    """The idempotency key of ``op_key``: ``"pgsolo-"`` + the 64 hex digits of
    SHA-256(``b"pgsolo idempotency key v1\\0"`` + UTF-8 of ``op_key``).

    71 characters of ``[a-z0-9-]``, accepted by payment and storage APIs (Stripe allows
    255), the same on every host and in every version, and revealing nothing of the key.
    """
    digest = hashlib.sha256(_IDEMPOTENCY_DOMAIN + validate_op_key(op_key).encode("utf-8"))
    return IDEMPOTENCY_PREFIX + digest.hexdigest()


def lock_key_for(op_key: str) -> Key:
    """The advisory-lock key that a live attempt at ``op_key`` holds."""
    return from_name(LOCK_PREFIX + validate_op_key(op_key))


def storable_result(value: object) -> str:
    """``value`` as the compact JSON text that is stored, or :class:`ResultNotStorableError`.

    PostgreSQL's ``jsonb`` refuses what JSON cannot say (NaN, infinity) and text with a
    NUL or an unpaired surrogate, so those are refused here, before anything is recorded.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultNotStorableError(
            f"the operation's result is not JSON-serialisable ({type(value).__name__}): {exc}"
        ) from None
    _check_text(json.loads(text))
    size = len(text.encode("utf-8"))
    if size > MAX_RESULT_BYTES:
        raise ResultNotStorableError(
            f"the operation's result is {size} bytes of JSON; at most {MAX_RESULT_BYTES}"
            " can be stored (store a reference to large data, not the data)"
        )
    return text


def _check_text(value: object) -> None:
    items: list[object] = []
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        items = value
    elif isinstance(value, str):
        if "\0" in value:
            raise ResultNotStorableError("the operation's result contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ResultNotStorableError(
                f"the operation's result contains text that is not valid Unicode: {exc}"
            ) from None
    for item in items:
        _check_text(item)


@dataclass(frozen=True, slots=True)
class _Operation:
    op_key: str
    lock_key: Key
    wait_ms: int | None

    @classmethod
    def define(
        cls, op_key: object, operation: object, wait: float | None, *, sync: bool
    ) -> _Operation:
        key = validate_op_key(op_key)
        wait_ms = _validate_wait(wait)
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
class _Attempt:
    """Filled in by the plan before the operation runs; read by the shell's work."""

    number: int = 0
    idempotency_key: str = ""


def _plan(
    op: _Operation, core: _LockCore, attempt: _Attempt, scrub: Callable[[str], str]
) -> Plan[OnceResult]:
    """The one definition of a call, for both shells."""
    _require_no_transaction(
        core.driver,
        f"operation {op.op_key!r}",
        "pgsolo commits its state before the operation runs",
    )
    found = yield from _read(op, core)
    if found is not None and found["state"] == "succeeded":
        return _from_row("already-succeeded", op, found)
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
    try:
        return (yield from _run_attempt(op, core, attempt, scrub))
    finally:
        yield from _release(op, core)


def _read(op: _Operation, core: _LockCore) -> Plan[dict[str, Any] | None]:
    driver = core.driver
    try:
        text = yield outside_transaction(driver, [sql.once_read(op.op_key)])
    except Exception as exc:
        if driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
            yield from core._quietly([sql.ROLLBACK])
        if driver.sqlstate(exc) == SQLSTATE_UNDEFINED_TABLE:
            raise UsageError(
                "operation keys need pgsolo's tables: run `pgsolo migrate` first"
            ) from exc
        raise
    row = sql.read_json(text)
    return None if row is None else dict(row)


def _from_row(outcome: OnceOutcome, op: _Operation, row: dict[str, Any]) -> OnceResult:
    return OnceResult(
        outcome, op.op_key, row["idempotency_key"], result=row["result"], attempts=row["attempts"]
    )


def _run_attempt(
    op: _Operation, core: _LockCore, attempt: _Attempt, scrub: Callable[[str], str]
) -> Plan[OnceResult]:
    """With the lock held: begin an attempt, run the operation, record how it ended."""
    driver = core.driver
    start = sql.once_start(
        op.op_key, idempotency_key_for(op.op_key), host=socket.gethostname(), pid=os.getpid()
    )
    # 'started' commits before the operation runs; on an autocommit connection the
    # operation's own transaction opens in the same round trip.
    opening = [] if driver.begins_implicitly else [sql.BEGIN]
    began = yield [*_committed(driver, [start]), *opening]
    if began is None:  # another attempt succeeded between the first look and the lock
        if opening:  # the operation's transaction, opened in that round trip for nothing
            yield [sql.ROLLBACK]
        found = yield from _read(op, core)
        assert found is not None  # noqa: S101 - a succeeded row is never deleted
        return _from_row("already-succeeded", op, found)
    started = sql.read_json(began)
    attempt.number, attempt.idempotency_key = started["attempts"], started["idempotency_key"]
    try:
        value = yield WORK
        stored = storable_result(value)
        # What the server stores (jsonb normalises numbers) is what every call returns.
        stored = str(sql.read_text((yield _success_statements(op, driver, attempt, stored))))
    except BaseException as exc:
        superseded = driver.sqlstate(exc) == sql.SQLSTATE_ATTEMPT_SUPERSEDED
        if isinstance(exc, Exception) and not superseded:
            error = scrub(_describe(exc))[:MAX_ERROR_CHARS]
            yield from core._quietly(
                _committed(driver, [sql.once_fail(op.op_key, attempt.number, error)])
            )
            # Not logger.exception: the traceback would repeat the unscrubbed message, and
            # the exception goes back to the caller, whose logging shows it anyway.
            logger.error(  # noqa: TRY400
                "operation failed: op_key=%s attempt=%s error=%s",
                op.op_key,
                attempt.number,
                error,
            )
        elif driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
            # Interrupted, or taken over: this attempt's work is undone, and the row is
            # left to whoever runs the operation next.
            yield from core._quietly([sql.ROLLBACK])
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


def _describe(exc: BaseException) -> str:
    """``Type: message``, even for an exception whose message cannot be built."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message could not be shown)"


def _success_statements(
    op: _Operation, driver: DriverBase, attempt: _Attempt, stored: str
) -> list[str]:
    """Record success and read the result back as stored, in one round trip."""
    succeed = [sql.once_succeed(op.op_key, attempt.number, stored), sql.once_result(op.op_key)]
    status = driver.transaction_status()
    if status is TxStatus.INERROR:
        raise TransactionFailedError(
            f"operation {op.op_key!r}: its transaction failed inside the operation (a database"
            " error was caught there and not re-raised); its database work was rolled back"
            " and the attempt recorded as failed"
        )
    if status is TxStatus.IDLE:
        # With a driver that begins by itself, idle may just mean no database work.
        if not driver.begins_implicitly:
            logger.warning(
                "operation %s ended its own transaction: its database work committed apart"
                " from the record of its success",
                op.op_key,
            )
        return _committed(driver, succeed)
    return [*succeed, sql.COMMIT]


def _committed(driver: DriverBase, statements: list[str]) -> list[str]:
    """``statements`` in a transaction of their own, committed in the same round trip.
    A transaction left open (the operation's, failed or not) is rolled back first."""
    if driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
        return [sql.ROLLBACK, sql.BEGIN, *statements, sql.COMMIT]
    if driver.begins_implicitly:
        return [*statements, sql.COMMIT]
    return [sql.BEGIN, *statements, sql.COMMIT]


def _release(op: _Operation, core: _LockCore) -> Plan[None]:
    # The outcome is already recorded (or deliberately not): a lock that cannot be
    # released cleanly is logged, never allowed to turn a success into an error.
    try:
        yield from core.exit(failed=False)
    except Exception as exc:
        logger.warning("pgsolo: operation %s: releasing its lock: %r", op.op_key, exc)


def _core_for(op: _Operation, driver: DriverBase) -> _LockCore:
    return _LockCore(
        driver, op.lock_key, "session", wait_ms=op.wait_ms, shared=False, reentrant=False
    )


def _scrubber(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Callable[[str], str]:
    """Blank the connection's own password out of error texts before they are stored."""
    password = password_of(conn)
    secrets = make_conninfo("", password=password) if password else ""
    return lambda text: scrub_secrets(text, secrets)


def _report(result: OnceResult) -> OnceResult:
    logger.info(
        "operation %s: op_key=%s attempts=%s",
        result.outcome,
        result.op_key,
        result.attempts,
        extra={
            "pgsolo": {
                "outcome": result.outcome,
                "op_key": result.op_key,
                "attempts": result.attempts,
            }
        },
    )
    return result


def run_once(
    conn: psycopg.Connection[Any],
    op_key: str,
    operation: Callable[[OperationContext[psycopg.Connection[Any]]], object],
    *,
    wait: float | None = None,
) -> OnceResult:
    """Run ``operation(ctx)`` to success at most once per ``op_key``, across crashes.

    ``conn`` needs ``pgsolo migrate`` to have run and no transaction open. A succeeded
    key returns its stored result without running anything. A key that a live caller is
    running is skipped (``skipped-busy``), or waited for up to ``wait`` seconds. A key
    whose last attempt died or failed is run again with the same idempotency key. The
    return value must be JSON of at most 1 MiB; it is stored in the transaction that
    holds the operation's work on ``ctx.conn``. If ``operation`` raises, the attempt is
    recorded as failed and the exception re-raised.
    """
    op = _Operation.define(op_key, operation, wait, sync=True)
    driver = adapt_sync(conn)
    attempt = _Attempt()

    def work() -> object:
        return operation(OperationContext(op.op_key, attempt.idempotency_key, attempt.number, conn))

    plan = _plan(op, _core_for(op, driver), attempt, _scrubber(conn))
    return _report(drive(plan, driver, work))


async def run_once_async(
    conn: psycopg.AsyncConnection[Any],
    op_key: str,
    operation: Callable[[OperationContext[psycopg.AsyncConnection[Any]]], Awaitable[object]],
    *,
    wait: float | None = None,
) -> OnceResult:
    """The async twin of :func:`run_once`: ``await operation(ctx)``."""
    op = _Operation.define(op_key, operation, wait, sync=False)
    driver = adapt_async(conn)
    attempt = _Attempt()

    async def work() -> object:
        ctx = OperationContext(op.op_key, attempt.idempotency_key, attempt.number, conn)
        value = operation(ctx)
        return await value if inspect.isawaitable(value) else value

    plan = _plan(op, _core_for(op, driver), attempt, _scrubber(conn))
    return _report(await adrive(plan, driver, work))
