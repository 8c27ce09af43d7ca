"""``run_once_async``: an operation run to success at most once, from async code."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..._acompat import AIS_ASYNC, aresult_of
from ...drivers import adapt_async
from ...locking import adrive
from ..operation import OnceResult, OperationContext
from ..plan import Attempt, Operation, core_for, once_plan, report_outcome

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["run_once_async"]


async def run_once_async(
    conn: AsyncConnectionLike,
    op_key: str,
    operation: Callable[[OperationContext[Any]], Awaitable[object]],
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
    op = Operation.define(op_key, operation, wait, sync=not AIS_ASYNC)
    driver = adapt_async(conn)
    attempt = Attempt()

    async def work() -> object:
        ctx = OperationContext(op.op_key, attempt.idempotency_key, attempt.number, conn)
        return await aresult_of(operation(ctx))

    plan = once_plan(op, core_for(op, driver), attempt, driver.scrub)
    return report_outcome(await adrive(plan, driver, work))
