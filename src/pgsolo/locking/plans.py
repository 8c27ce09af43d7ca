"""The sans-I/O plans: what a plan yields and receives. The loops that drive one are
:func:`~pgsolo.locking._async.drive.adrive` and its generated twin
:func:`~pgsolo.locking._sync.drive.drive`.

A plan is a generator that yields statements to send in one round trip (:class:`Wait`
for those that may wait for a lock), statements to send on a second connection to the
same place (:class:`Elsewhere`), or :data:`WORK`, the
caller's own function, and receives what came back; exceptions are thrown into it so its
``except`` and ``finally`` blocks run exactly as written.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from ..drivers import Edge

__all__ = ["ROLLBACK", "WORK", "Elsewhere", "Own", "Plan", "Quick", "Step", "Wait", "Work"]

T = TypeVar("T")


class Work:
    def __repr__(self) -> str:
        return "WORK"


WORK: Final = Work()
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


@dataclass(frozen=True, slots=True)
class Own:
    """Yielded by a plan for statements at an edge of the transaction pgsolo opens for a
    transaction lock (``with xact_lock(...)`` on a connection with none open, a job):
    ``begin`` opens it before ``statements``, ``commit`` or ``rollback`` ends it after
    them. The driver does that its own way: BEGIN and COMMIT in the same message on a
    bare connection, through the framework's own API on Django or SQLAlchemy, whose idea
    of the transaction must stay true. ``seconds`` as for :class:`Wait`."""

    statements: Sequence[str]
    edge: Edge
    seconds: float = 0.0


ROLLBACK: Final = Own([], "rollback")
"""Roll back the transaction pgsolo opened."""

Step = Sequence[str] | Work | Elsewhere | Wait | Own
Plan = Generator[Step, object, T]

Quick = tuple[Sequence[str], Edge | None, float]
"""A round trip of a lock's common case, which the shell sends itself, without a plan:
its statements, the edge of pgsolo's own transaction they are at, if any, and the seconds
they may wait for a lock on the server (as for :class:`Own`). A tuple, not a class of
pgsolo's: building one costs no call."""
