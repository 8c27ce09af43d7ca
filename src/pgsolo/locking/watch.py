"""What a keeper's beat means (:class:`Watch`, for one lock), and what a loss sets off:
what both keepers (``_async/keeper.py`` and its generated twin) share. A keeper watches
anything shaped as :class:`Watching`: one lock's :class:`Watch`, or a Locker connection's
group of them (:class:`~pgsolo.locking.multiplex.GroupWatch`). How a lock is watched,
:class:`~pgsolo.locking.spec.Keep`, is part of its spec."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from .. import sql
from .._logging import keeper_logger as logger
from ..drivers import BeatFailed, DriverBase
from ..errors import LockLostError
from ..reasons import LostReason

if TYPE_CHECKING:
    from .core import LockCore
    from .spec import Keep

__all__ = ["Watch", "Watching"]

Diagnosis = tuple[LostReason, str]  # why a lock is lost, and the detail that says how


class Watching(Protocol):
    """What a keeper watches: the statement of each beat, what its answer means, and
    whom a loss is declared to."""

    @property
    def label(self) -> str:
        """What the keeper's thread or task is named after."""

    @property
    def keep(self) -> Keep:
        """The beats' interval and deadline, and whether a loss cancels the holder."""

    @property
    def loss(self) -> LockLostError | None:
        """The loss declared, if any."""

    def beat_statement(self) -> str:
        """The statement of the next beat."""

    def verdict(
        self, row: Sequence[str | None] | None, failure: Exception | None, driver: DriverBase
    ) -> LockLostError | None:
        """The loss a beat found that ends the watch, if any."""

    def declare(self, error: LockLostError) -> None:
        """Record, log and report the loss the verdict found."""


class Watch:
    """What a beat's answer means, and what a loss sets off; shared by both keepers."""

    def __init__(self, core: LockCore, keep: Keep) -> None:
        self.core = core
        self.keep = keep
        self.key = core.spec.key
        self.label = str(self.key)
        self.statement = sql.keeper_beat(self.key, shared=core.spec.shared)
        # Remembered now: a report of the loss comes after the connection is gone.
        core.driver.server_info()

    @property
    def loss(self) -> LockLostError | None:
        return self.core.lost

    def beat_statement(self) -> str:
        return self.statement

    def crashed(self, failure: Exception) -> LockLostError:
        return self.lost(*crash_diagnosis(self.label, failure))

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
            return self.lost(
                "connection-moved",
                f"the connection now reaches backend pid {pid}, not {expected} that holds"
                " the lock (a transaction-pooling proxy moved it)",
            )
        if in_recovery == "t":
            return self.lost(
                "server-in-recovery",
                "the server answering the lock's connection is in recovery (a standby),"
                " where an advisory lock coordinates nothing",
            )
        if held != "t":
            return self.lost(
                "lock-released", "pg_locks no longer shows it on the lock's connection"
            )
        return None

    def failed(self, exc: BeatFailed, driver: DriverBase) -> LockLostError | None:
        found = failure_diagnosis(self.label, exc, driver, self.keep.timeout)
        return None if found is None else self.lost(*found)

    def lost(self, reason: LostReason, detail: str) -> LockLostError:
        return LockLostError(
            f"session lock {self.key} was lost while held ({reason}): {detail}",
            key=self.key,
            reason=reason,
        )

    def declare(self, error: LockLostError) -> None:
        self.core.lost = error
        self.core.log_lost(error)
        if self.keep.on_lost is not None:
            try:
                self.keep.on_lost(error)
            except Exception:
                logger.exception("pgsolo keeper: the on_lost callback of %s failed", self.key)


def crash_diagnosis(label: str, failure: Exception) -> Diagnosis:
    """A keeper's beat failed in a way no beat should (a bug): logged with its traceback."""
    logger.error("pgsolo keeper: watching %s failed", label, exc_info=failure)
    return "keeper-failed", "the keeper failed, so nothing vouches for the lock"


def failure_diagnosis(
    label: str, exc: BeatFailed, driver: DriverBase, timeout: float
) -> Diagnosis | None:
    """What a beat that failed says of the locks on its connection: lost with the
    connection, or nothing (the session is alive)."""
    if exc.unresponsive:
        return (
            "connection-unresponsive",
            f"the server did not answer within {timeout:g}s, so pgsolo shut the connection down",
        )
    if driver.is_closed():
        return "connection-lost", str(exc)
    # A live session keeps its session locks: a failed statement on it says nothing
    # about the lock. Try again next beat.
    logger.warning("pgsolo keeper: checking lock %s failed: %s", label, exc)
    return None
