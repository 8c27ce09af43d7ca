"""What both Lockers (``_async/locker.py`` and its generated twin) share: the checks of
their arguments, which of their connections a lock goes to, how a wait polls, and the
keeper's view of one connection that holds many locks (:class:`GroupWatch`).

Why a wait polls. PostgreSQL runs one statement at a time per session, so a lock that
waited on the server would stop every other lock of its connection from being taken or
released until it was granted. A Locker's wait is a series of tries instead, each one
round trip that holds nothing, at pauses that start at 1 ms and double up to
:data:`LONGEST_PAUSE`: a release is never stuck behind a waiter, and no waiter holds a
transaction or a snapshot between tries. The cost is the hand-off: a freed key is taken
by the next try of a waiter, on average half a pause later (docs/benchmarks.md measures
it next to a waiter on the server).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias, TypeVar

from .. import sql
from .._types import DAY, check_seconds
from ..drivers import BeatFailed, DriverBase
from ..errors import InvalidArgumentError, LockLostError, LockTimeoutError, UsageError
from ..keys import Key
from .placement import outside_transaction
from .plans import Plan
from .spec import Keep, LockSpec
from .watch import Diagnosis, Watch, crash_diagnosis, failure_diagnosis

if TYPE_CHECKING:
    from .core import LockCore

__all__ = [
    "CANCEL_NEEDS_TASKS",
    "LONGEST_PAUSE",
    "AsyncPoolLike",
    "GroupWatch",
    "LockerOptions",
    "LockerRequest",
    "SyncPoolLike",
    "Tenant",
    "fewest_held",
    "let_go_all",
    "poll_pauses",
    "refuse_in_child",
]

# Written here, not in the async source: its generated twin would say "a sync Locker".
CANCEL_NEEDS_TASKS = (
    "Keep(cancel=True) cancels an asyncio task: it needs an AsyncLocker (a Locker's locks"
    " are held by threads, which cannot be cancelled)"
)

JANITOR_MIN_PERIOD = 0.05  # how often, at most, a Locker looks for idle connections

FIRST_PAUSE = 0.001
LONGEST_PAUSE = 0.05


class _GetconnPool(Protocol):
    def getconn(self) -> Any: ...
    def putconn(self, conn: Any, /) -> Any: ...


class _Engine(Protocol):
    def raw_connection(self) -> Any: ...


# A pool a Locker borrows its connections from: ``psycopg_pool.ConnectionPool``, one of
# ``psycopg2.pool``'s, or a SQLAlchemy ``Engine`` (pgsolo.drivers.lenders).
SyncPoolLike: TypeAlias = _GetconnPool | _Engine


class _AsyncGetconnPool(Protocol):
    def getconn(self) -> Awaitable[Any]: ...
    def putconn(self, conn: Any, /) -> Awaitable[Any]: ...


class _AsyncAcquirePool(Protocol):
    def acquire(self) -> Awaitable[Any]: ...
    def release(self, conn: Any, /) -> Awaitable[Any]: ...


class _AsyncEngine(Protocol):
    def raw_connection(self) -> Awaitable[Any]: ...


# The same for an async Locker: ``psycopg_pool.AsyncConnectionPool``, asyncpg's pool, or a
# SQLAlchemy ``AsyncEngine``.
AsyncPoolLike: TypeAlias = _AsyncGetconnPool | _AsyncAcquirePool | _AsyncEngine


@dataclass(frozen=True, slots=True)
class LockerOptions:
    """What a Locker was asked for, checked before any connection is opened."""

    max_connections: int
    idle_timeout: float
    application_name: str

    def __post_init__(self) -> None:
        limit = self.max_connections
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidArgumentError(
                f"max_connections must be an int from 1 to 10000, got {limit!r}"
            )
        check_seconds("idle_timeout", self.idle_timeout, 0, DAY)
        name = self.application_name
        if not isinstance(name, str) or not name or "\0" in name:
            raise InvalidArgumentError(
                f"application_name must be a non-empty str without NUL, got {name!r}"
            )


class LockerRequest(NamedTuple):
    """One lock asked of a Locker: ``spec`` is a try (each try of a wait is one), ``wait``
    the seconds to keep trying (None: once; ``math.inf``: for as long as it takes). A
    named tuple, as :class:`~pgsolo.locking.spec.LockSpec` is: one is made for every lock
    a Locker hands out, and a frozen dataclass costs twice as much to make."""

    spec: LockSpec
    wait: float | None
    keep: Keep | None

    def timeout_error(self) -> LockTimeoutError:
        return LockTimeoutError(
            f"timed out after {self.wait:g}s waiting for session lock {self.spec.key}"
            " through a Locker",
            key=self.spec.key,
            timeout=self.wait or 0.0,
        )


def poll_pauses() -> Iterator[float]:
    """The pauses between the tries of a wait: 1 ms, doubling up to :data:`LONGEST_PAUSE`."""
    pause = FIRST_PAUSE
    while pause < LONGEST_PAUSE:
        yield pause
        pause *= 2
    yield from itertools.repeat(LONGEST_PAUSE)


class Tenant(Protocol):
    """What the choice of a connection reads of one: the keys of the locks it holds or
    is taking, and whether it is out of use."""

    keys: set[int | tuple[int, int]]

    def broken(self) -> bool: ...


T = TypeVar("T", bound=Tenant)


def fewest_held(tenants: Sequence[T], key: Key, limit: int) -> tuple[T | None, bool]:
    """Where a lock on ``key`` goes: the usable connection with the fewest locks that
    does not hold ``key`` already (PostgreSQL would grant it to that session again), and
    whether a new connection should be opened instead (the best one is busy and there is
    room for another)."""
    best: T | None = None
    value = key.value
    live = 0
    for tenant in tenants:
        if tenant.broken():  # gone: it counts no more, and goes once its locks are let go
            continue
        live += 1
        if value not in tenant.keys and (best is None or len(tenant.keys) < len(best.keys)):
            best = tenant
    open_new = (best is None or bool(best.keys)) and live < limit
    return best, open_new


def let_go_all(driver: DriverBase) -> Plan[None]:
    """Release every session lock on a Locker's connection as it closes, outside any
    transaction (a pooled connection goes back holding nothing, and as it came)."""
    yield outside_transaction(driver, [sql.UNLOCK_ALL])


def refuse_in_child(created_in: int) -> None:
    """A Locker's connections are its process's own: a child of ``fork()`` that used them
    would interleave its statements with the parent's on one session."""
    if os.getpid() != created_in:
        raise UsageError(
            f"this Locker was created in process {created_in}; a forked child must not use"
            " its connections (they are the parent's sessions): create a Locker in the child"
        )


Declared = Callable[[LockLostError], object]


class GroupWatch:
    """What a beat of a Locker's connection means for each lock held on it.

    One keeper per connection, not per lock: each beat lists every advisory lock the
    backend holds (:data:`~pgsolo.sql.KEEPER_BEAT_ALL`), and each watched lock's own
    :class:`~pgsolo.locking.watch.Watch` judges its key from that list. A lock whose key is
    gone is declared lost alone; a connection that is lost, moved or in recovery declares
    every lock on it lost, each with its own error and ``on_lost``, and ends the watch.

    Locks join and leave while beats are in flight: the members a beat judges are those
    that were members when it was sent and still are when it is judged, so that a lock
    taken or released meanwhile is never judged by an answer from before."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._mutex = threading.Lock()
        self._members: dict[int, tuple[Watch, Declared]] = {}
        self._beat_members: dict[int, tuple[Watch, Declared]] = {}
        self._keep = Keep()
        self._pending: list[tuple[Watch, Declared, LockLostError]] = []
        self._tickets = itertools.count()
        self.loss: LockLostError | None = None  # the connection's, once declared

    @property
    def keep(self) -> Keep:
        """The tightest interval and deadline its members asked for."""
        return self._keep

    @property
    def watching(self) -> bool:
        return bool(self._members)

    def join(self, core: LockCore, keep: Keep, declared: Declared) -> int:
        """Watch ``core`` (held on this connection); ``declared`` is called with its loss
        after ``keep.on_lost``. Returns the ticket that :meth:`leave` takes."""
        ticket = next(self._tickets)
        with self._mutex:
            self._members[ticket] = (Watch(core, keep), declared)
            self._tighten()
        return ticket

    def leave(self, ticket: int) -> None:
        with self._mutex:
            self._members.pop(ticket, None)
            self._tighten()

    def _tighten(self) -> None:
        keeps = [watch.keep for watch, _ in self._members.values()]
        if keeps:
            interval = min(keep.interval for keep in keeps)
            timeout = min(keep.timeout for keep in keeps)
            if (interval, timeout) != (self._keep.interval, self._keep.timeout):
                self._keep = Keep(interval=interval, timeout=timeout)

    def beat_statement(self) -> str:
        with self._mutex:
            self._beat_members = dict(self._members)
        return sql.KEEPER_BEAT_ALL

    def verdict(
        self, row: Sequence[str | None] | None, failure: Exception | None, driver: DriverBase
    ) -> LockLostError | None:
        if row is None and failure is None:
            return None  # the beat was skipped: the connection was in use
        with self._mutex:
            judged = [
                (ticket, member)
                for ticket, member in self._beat_members.items()
                if self._members.get(ticket) is member
            ]
        found: Diagnosis | None = None
        if isinstance(failure, BeatFailed):
            found = failure_diagnosis(self.label, failure, driver, self.keep.timeout)
        elif failure is not None:
            found = crash_diagnosis(self.label, failure)
        if found is not None:
            return self._lose_all({}, found)
        if row is None:
            return None
        pid, held_text, in_recovery = row
        held = set(held_text.split(",")) if held_text else set()
        losses: list[tuple[int, Watch, Declared, LockLostError]] = []
        for ticket, (watch, declared) in judged:
            spec = watch.core.spec
            key_held = sql.held_lock_text(spec.key, shared=spec.shared) in held
            error = watch.judge((pid, "t" if key_held else "f", in_recovery))
            if error is not None:
                losses.append((ticket, watch, declared, error))
        for *_, error in losses:
            if error.reason != "lock-released":
                errors = {ticket: error for ticket, _, _, error in losses}
                return self._lose_all(errors, (error.reason or "connection-lost", str(error)))
        for ticket, watch, declared, error in losses:
            with self._mutex:
                gone = self._members.pop(ticket, None) is not None
            if gone:
                self._report(watch, declared, error)
        return None

    def _lose_all(self, errors: dict[int, LockLostError], found: Diagnosis) -> LockLostError:
        """The connection is lost (``found`` says how; ``errors``: the members' own, by
        ticket, as the beat judged them): every lock on it is, declared when the keeper
        acts on the verdict (:meth:`declare`)."""
        with self._mutex:
            members = list(self._members.items())
        pending = []
        for ticket, (watch, declared) in members:
            error = errors.get(ticket) or watch.lost(*found)
            pending.append((watch, declared, error))
        self._pending = pending
        if pending:
            return pending[0][2]
        reason, detail = found
        return LockLostError(
            f"the Locker connection {self.label}: {detail}", key=None, reason=reason
        )

    def end(self, found: Diagnosis) -> None:
        """The connection ends while locks are on it (its Locker closed it): every lock
        watched on it is declared lost, with ``found`` (reason, detail)."""
        self.declare(self._lose_all({}, found))

    def declare(self, error: LockLostError) -> None:
        self.loss = error
        with self._mutex:
            pending, self._pending = self._pending, []
            lost = {id(watch) for watch, _, _ in pending}
            self._members = {
                ticket: member
                for ticket, member in self._members.items()
                if id(member[0]) not in lost
            }
        for watch, declared, member_error in pending:
            self._report(watch, declared, member_error)

    @staticmethod
    def _report(watch: Watch, declared: Declared, error: LockLostError) -> None:
        watch.declare(error)
        declared(error)
