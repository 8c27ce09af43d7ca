"""``run_once`` and ``run_once_async``."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._logging import log_event
from ..drivers import adapt_async, adapt_sync
from ..locking.plans import adrive, drive

if TYPE_CHECKING:
    import psycopg
from .operation import OnceResult, OperationContext
from .plan import Attempt, Operation, core_for, once_plan

__all__ = ["run_once", "run_once_async"]


def _report(result: OnceResult) -> OnceResult:
    fields = {"op_key": result.op_key, "attempts": result.attempts}
    log_event(logging.INFO, "operation", "outcome", result.outcome, fields)
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
    op = Operation.define(op_key, operation, wait, sync=True)
    driver = adapt_sync(conn)
    attempt = Attempt()

    def work() -> object:
        return operation(OperationContext(op.op_key, attempt.idempotency_key, attempt.number, conn))

    plan = once_plan(op, core_for(op, driver), attempt, driver.scrub)
    return _report(drive(plan, driver, work))


async def run_once_async(
    conn: psycopg.AsyncConnection[Any],
    op_key: str,
    operation: Callable[[OperationContext[psycopg.AsyncConnection[Any]]], Awaitable[object]],
    *,
    wait: float | None = None,
) -> OnceResult:
    """The async twin of :func:`run_once`: ``await operation(ctx)``."""
    op = Operation.define(op_key, operation, wait, sync=False)
    driver = adapt_async(conn)
    attempt = Attempt()

    async def work() -> object:
        ctx = OperationContext(op.op_key, attempt.idempotency_key, attempt.number, conn)
        value = operation(ctx)
        return await value if inspect.isawaitable(value) else value

    plan = once_plan(op, core_for(op, driver), attempt, driver.scrub)
    return _report(await adrive(plan, driver, work))
