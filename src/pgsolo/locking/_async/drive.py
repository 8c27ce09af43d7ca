"""The loop that drives a plan with an async driver (its sync twin is generated): each
step the plan yields becomes a round trip, a round trip on a second connection, or the
caller's work; what came back is sent in, and an exception thrown in, so the plan's
``except`` and ``finally`` blocks run exactly as written."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...drivers import AsyncDriver
from ..plans import Elsewhere, Own, Plan, Wait, Work

__all__ = ["adrive"]

T = TypeVar("T")


async def _no_work() -> object:
    raise TypeError("this plan yields WORK, but no work was given")


async def adrive(
    plan: Plan[T], driver: AsyncDriver, work: Callable[[], Awaitable[object]] | None = None
) -> T:
    interrupted: BaseException | None = None
    while True:
        try:
            return await _steps(plan, driver, work, interrupted)
        except BaseException as exc:
            if inspect.getgeneratorstate(plan) == inspect.GEN_CLOSED:  # the plan raised it
                raise
            # Raised in this loop between two steps (a Ctrl-C lands at any line): the plan
            # hears of it where it stands, so that its clean-up runs as written.
            interrupted = exc


async def _steps(
    plan: Plan[T],
    driver: AsyncDriver,
    work: Callable[[], Awaitable[object]] | None,
    interrupted: BaseException | None,
) -> T:
    try:
        step = next(plan) if interrupted is None else plan.throw(interrupted)
        while True:
            try:
                if isinstance(step, Work):
                    value = await (work or _no_work)()
                elif isinstance(step, Elsewhere):
                    value = await driver.fetch_value_elsewhere(step.statements)
                elif isinstance(step, Own):
                    value = await driver.fetch_value(step.statements, step.seconds, step.edge)
                elif isinstance(step, Wait):
                    value = await driver.fetch_value(step.statements, step.seconds)
                else:
                    value = await driver.fetch_value(step)
            except BaseException as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
