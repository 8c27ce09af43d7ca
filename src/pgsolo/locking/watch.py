"""How a held session lock is watched (:class:`Keep`) and what a beat's answer means
(:class:`Watch`): what both keepers of :mod:`pgsolo.locking.keeper` share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import sql
from .._logging import keeper_logger as logger
from .._types import DAY, check_seconds
from ..drivers import BeatFailed, DriverBase, heartbeat_of
from ..errors import InvalidArgumentError, LockLostError
from ..reasons import LostReason

if TYPE_CHECKING:
    from .core import LockCore

__all__ = ["Keep", "Watch", "as_keep", "refuse_keeper"]


MIN_INTERVAL = 0.01
MAX_INTERVAL = DAY  # for interval and timeout alike: a longer one watches nothing


@dataclass(frozen=True, slots=True)
class Keep:
    """How a session lock is watched (``session_lock(..., keep=Keep(...))``;
    ``keep=True`` is ``Keep()``).

    ``interval``: seconds between beats. ``timeout``: seconds the server has to answer a
    beat before the connection is shut down and the lock counted as lost. Both are from
    0.01 to 86400 (one day); anything else raises :class:`~pgsolo.InvalidArgumentError`
    here, before any lock is taken. ``on_lost``:
    called with the :class:`~pgsolo.LockLostError` once, from the keeper's thread (sync)
    or task (async); what it raises is logged. ``cancel``: for an async lock, cancel the
    task that took the lock.
    """

    interval: float = 1.0
    timeout: float = 10.0
    on_lost: Callable[[LockLostError], object] | None = None
    cancel: bool = False

    def __post_init__(self) -> None:
        for label, value in (("interval", self.interval), ("timeout", self.timeout)):
            check_seconds(f"Keep {label}", value, MIN_INTERVAL, MAX_INTERVAL)
        if self.on_lost is not None and not callable(self.on_lost):
            raise InvalidArgumentError(f"on_lost must be callable, got {self.on_lost!r}")
        if not isinstance(self.cancel, bool):
            raise InvalidArgumentError(f"cancel must be True or False, got {self.cancel!r}")


def as_keep(keep: bool | Keep | None) -> Keep | None:
    if keep is None or keep is False:
        return None
    if keep is True:
        return Keep()
    if isinstance(keep, Keep):
        return keep
    raise InvalidArgumentError(f"keep must be True, False or a pgsolo.Keep, got {keep!r}")


def refuse_keeper(driver: DriverBase) -> None:
    """Refuse ``keep=`` before any SQL on a driver whose connection a heartbeat cannot share
    with the caller's statements (:class:`~pgsolo.drivers.Lacking` says why): the same
    :class:`~pgsolo.UsageError` on every driver."""
    heartbeat_of(driver.heartbeat())


class Watch:
    """What a beat's answer means, and what a loss sets off; shared by both keepers."""

    def __init__(self, core: LockCore, keep: Keep) -> None:
        self.core = core
        self.keep = keep
        self.statement = sql.keeper_beat(core.key, shared=core.shared)
        # Remembered now: a report of the loss comes after the connection is gone.
        core.driver.server_info()

    def crashed(self, failure: Exception) -> LockLostError:
        logger.error("pgsolo keeper: watching %s failed", self.core.key, exc_info=failure)
        return self._lost("keeper-failed", "the keeper failed, so nothing vouches for the lock")

    def verdict(
        self, row: Sequence[str | None] | None, failure: Exception | None, driver: DriverBase
    ) -> LockLostError | None:
        """The loss a beat found, if any. ``row`` None without a failure: the beat was
        skipped (the connection was in use)."""
        if isinstance(failure, BeatFailed):
            return self.failed(failure, driver)
        if failure is not None:
            return self.crashed(failure)
        return None if row is None else self.judge(row)

    def judge(self, row: Sequence[str | None]) -> LockLostError | None:
        pid, held, in_recovery = row  # keeper_beat's columns
        expected = self.core.server_pid
        if expected is not None and pid != str(expected):
            return self._lost(
                "connection-moved",
                f"the connection now reaches backend pid {pid}, not {expected} that holds"
                " the lock (a transaction-pooling proxy moved it)",
            )
        if in_recovery == "t":
            return self._lost(
                "server-in-recovery",
                "the server answering the lock's connection is in recovery (a standby),"
                " where an advisory lock coordinates nothing",
            )
        if held != "t":
            return self._lost(
                "lock-released", "pg_locks no longer shows it on the lock's connection"
            )
        return None

    def failed(self, exc: BeatFailed, driver: DriverBase) -> LockLostError | None:
        if exc.unresponsive:
            return self._lost(
                "connection-unresponsive",
                f"the server did not answer within {self.keep.timeout:g}s, so pgsolo shut"
                " the connection down",
            )
        if driver.is_closed():
            return self._lost("connection-lost", str(exc))
        # A live session keeps its session locks: a failed statement on it says nothing
        # about the lock. Try again next beat.
        logger.warning("pgsolo keeper: checking lock %s failed: %s", self.core.key, exc)
        return None

    def _lost(self, reason: LostReason, detail: str) -> LockLostError:
        return LockLostError(
            f"session lock {self.core.key} was lost while held ({reason}): {detail}",
            key=self.core.key,
            reason=reason,
        )

    def declare(self, error: LockLostError) -> None:
        self.core.lost = error
        self.core.log_lost(error)
        if self.keep.on_lost is not None:
            try:
                self.keep.on_lost(error)
            except Exception:
                logger.exception("pgsolo keeper: the on_lost callback of %s failed", self.core.key)
