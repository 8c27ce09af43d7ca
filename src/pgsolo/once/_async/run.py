"""``run_once_async``: an operation run to success at most once, from async code, on an
async connection the caller gives or one pgsolo opens from a connection string."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..._acompat import AIS_ASYNC, aresult_of
from ...drivers import adapt_async
from ...drivers._async.connect import aopen_connection
from ...drivers.conninfo import DEFAULT_APP_PREFIX, application_name_for
from ...locking import adrive
from ..operation import OnceResult, OperationContext
from ..plan import Attempt, Operation, core_for, once_plan, report_outcome

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["run_once_async"]


async def run_once_async(
    target: AsyncConnectionLike | str,
    op_key: str,
    operation: Callable[[OperationContext[Any]], Awaitable[object]],
    *,
    wait: float | None = None,
) -> OnceResult:
    """Run ``operation(ctx)`` to success at most once per ``op_key``, across crashes.

    ``target`` is a connection of any supported library (docs/connections.md) with no
    transaction open, which stays the caller's, or a connection string from which pgsolo
    opens (and closes) a connection named ``pgsolo:once:<op_key>`` in
    ``pg_stat_activity``, as :func:`run_job` does. ``pgsolo migrate`` must have run. A
    succeeded key returns its stored result without running anything. A key that a live
    caller is running is skipped (``skipped-busy``), or waited for up to ``wait`` seconds.
    A key whose last attempt died or failed is run again with the same idempotency key.
    The return value must be JSON of at most 1 MiB; it is stored in the transaction that
    holds the operation's work on ``ctx.conn``. If ``operation`` raises, the attempt is
    recorded as failed and the exception re-raised.
    """
    op = Operation.define(op_key, operation, wait, sync=not AIS_ASYNC)
    if isinstance(target, str):
        name = application_name_for(target, f"{DEFAULT_APP_PREFIX}once:{op.op_key}")
        async with aopen_connection(target, application_name=name) as conn:
            return await _run_async(op, conn, operation)
    return await _run_async(op, target, operation)


async def _run_async(
    op: Operation,
    conn: AsyncConnectionLike,
    operation: Callable[[OperationContext[Any]], Awaitable[object]],
) -> OnceResult:
    driver = adapt_async(conn)
    attempt = Attempt()

    async def work() -> object:
        ctx = OperationContext(op.op_key, attempt.idempotency_key, attempt.number, conn)
        return await aresult_of(operation(ctx))

    plan = once_plan(op, core_for(op, driver), attempt, driver.scrub)
    return report_outcome(await adrive(plan, driver, work))
