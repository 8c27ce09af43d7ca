"""The loop that drives a plan with an async driver (its sync twin is generated): each
step the plan yields becomes a round trip, a round trip on a second connection, or the
caller's work; what came back is sent in, and an exception thrown in, so the plan's
``except`` and ``finally`` blocks run exactly as written."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..._acompat import ainterrupts_deferred, aundisturbed
from ...drivers import AsyncDriver
from ..plans import Elsewhere, Own, Plan, Wait, Work

__all__ = ["adrive"]

T = TypeVar("T")

# How long clean-up after an interruption may go on under further cancellations before it
# is cancelled too: a few round trips, on a connection that answers.
CLEAN_UP_SECONDS = 5.0
# How long one round trip of the clean-up may take at all: a connection that has answered
# nothing for this long is not answering (the chaos suite's faults last up to 4 s), and a
# cancelled task must end in bounded time.
CLEAN_UP_WITHIN = 15.0


async def _no_work() -> object:
    raise TypeError("this plan yields WORK, but no work was given")


async def adrive(
    plan: Plan[T],
    driver: AsyncDriver,
    work: Callable[[], Awaitable[object]] | None = None,
    *,
    cleaning_up: bool = False,
) -> T:
    """Drive ``plan`` to its end. Once an interruption (a cancellation, Ctrl-C) reached
    the plan, or from the start with ``cleaning_up=True``, its round trips are clean-up
    and run to their end under further cancellations: a second cancellation must not cut
    short the release the first one began."""
    interrupted: BaseException | None = None
    while True:
        try:
            return await _steps(plan, driver, work, interrupted, cleaning_up)
        except BaseException as exc:
            if inspect.getgeneratorstate(plan) == inspect.GEN_CLOSED:  # the plan raised it
                raise
            # Raised in this loop between two steps (a Ctrl-C lands at any line): the plan
            # hears of it where it stands, so that its clean-up runs as written.
            interrupted = exc
            cleaning_up = True


async def _steps(
    plan: Plan[T],
    driver: AsyncDriver,
    work: Callable[[], Awaitable[object]] | None,
    interrupted: BaseException | None,
    cleaning_up: bool,
) -> T:
    # From the interruption on, a further Ctrl-C waits for the clean-up to end.
    deferred = ainterrupts_deferred(CLEAN_UP_SECONDS) if cleaning_up else None
    try:
        step = next(plan) if interrupted is None else plan.throw(interrupted)
        while True:
            try:
                if type(step) is list and not cleaning_up:  # most steps: one round trip
                    value = await driver.fetch_value(step)
                elif isinstance(step, Work):
                    value = await (work or _no_work)()
                elif cleaning_up:
                    clean_up = _round_trip(step, driver)
                    value = await aundisturbed(clean_up, CLEAN_UP_SECONDS, CLEAN_UP_WITHIN)
                else:
                    value = await _round_trip(step, driver)
            except BaseException as exc:
                if not cleaning_up and not isinstance(exc, Exception):
                    cleaning_up = True
                    deferred = ainterrupts_deferred(CLEAN_UP_SECONDS)
                step = plan.throw(exc)
            else:
                step = plan.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        if deferred is not None:
            deferred.release()


async def _round_trip(step: Sequence[str] | Elsewhere | Wait | Own, driver: AsyncDriver) -> object:
    if isinstance(step, Elsewhere):
        return await driver.fetch_value_elsewhere(step.statements)
    if isinstance(step, Own):
        return await driver.fetch_value(step.statements, step.seconds, step.edge)
    if isinstance(step, Wait):
        return await driver.fetch_value(step.statements, step.seconds)
    return await driver.fetch_value(step)
