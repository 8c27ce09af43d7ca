"""Driving the sans-I/O plans: one loop for sync drivers, its twin for async ones.

A plan is a generator that yields statements to send in one round trip (:class:`Wait`
for those that may wait for a lock), statements to send on a second connection to the
same place (:class:`Elsewhere`), or :data:`WORK`, the
caller's own function, and receives what came back; exceptions are thrown into it so its
``except`` and ``finally`` blocks run exactly as written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from ..drivers import AsyncDriver, SyncDriver
from .placement import outside_transaction

__all__ = ["WORK", "Elsewhere", "Plan", "Step", "Wait", "adrive", "drive", "outside_transaction"]

# outside_transaction is .placement's (where statements go); still importable from here,
# for jobs/plan.py.

T = TypeVar("T")


class _Work:
    def __repr__(self) -> str:
        return "WORK"


WORK: Final = _Work()
"""Yielded by a plan where the caller's work runs; the shell calls it."""


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """Yielded by a plan to run ``statements`` on a new, short-lived connection to the
    same server, database and user (to see whether it lands on the same backend)."""

    statements: Sequence[str]


@dataclass(frozen=True, slots=True)
class Wait:
    """Yielded by a plan for statements that may wait up to ``seconds`` for a lock on the
    server (bounded there by ``lock_timeout``): the deadline of the round trip on a
    connection pgsolo opened allows for it."""

    statements: Sequence[str]
    seconds: float


Step = Sequence[str] | _Work | Elsewhere | Wait
Plan = Generator[Step, object, T]


def drive(plan: Plan[T], driver: SyncDriver, work: Callable[[], object] | None = None) -> T:
    try:
        step = next(plan)
        while True:
            try:
                if isinstance(step, _Work):
                    assert work is not None, "this plan runs no work"  # noqa: S101
                    value = work()
                elif isinstance(step, Elsewhere):
                    value = driver.fetch_value_elsewhere(step.statements)
                elif isinstance(step, Wait):
                    value = driver.fetch_value(step.statements, step.seconds)
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
                elif isinstance(step, Elsewhere):
                    value = await driver.fetch_value_elsewhere(step.statements)
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
