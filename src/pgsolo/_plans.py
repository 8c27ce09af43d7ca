"""Driving the sans-I/O plans: one loop for sync drivers, its twin for async ones.

A plan is a generator that yields either statements to send in one round trip or
:data:`WORK`, the caller's own function, and receives what came back; exceptions are
thrown into it so its ``except`` and ``finally`` blocks run exactly as written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Final, TypeVar

from .drivers import AsyncDriver, SyncDriver

T = TypeVar("T")


class _Work:
    def __repr__(self) -> str:
        return "WORK"


WORK: Final = _Work()
"""Yielded by a plan where the caller's work runs; the shell calls it."""

Step = Sequence[str] | _Work
Plan = Generator[Step, object, T]


def drive(plan: Plan[T], driver: SyncDriver, work: Callable[[], object] | None = None) -> T:
    try:
        step = next(plan)
        while True:
            try:
                if isinstance(step, _Work):
                    assert work is not None, "this plan runs no work"  # noqa: S101
                    value = work()
                else:
                    value = driver.fetch_value(step)
            except BaseException as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def adrive(
    plan: Plan[T], driver: AsyncDriver, work: Callable[[], Awaitable[object]] | None = None
) -> T:
    try:
        step = next(plan)
        while True:
            try:
                if isinstance(step, _Work):
                    assert work is not None, "this plan runs no work"  # noqa: S101
                    value = await work()
                else:
                    value = await driver.fetch_value(step)
            except BaseException as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
