"""One advisory lock on one connection: what both lifetimes share, and the plans both
shells drive.

The logic lives once, as generators that yield the statements to send and receive what
the server answered (a "sans-I/O" core, driven by :mod:`pgsolo.locking.plans`):
:class:`~pgsolo.locking._async.lock.AsyncLock` drives them with an async driver and its
generated twin ``Lock`` with a sync one, so the two cannot drift.

Each piece of a lock's state has one owner. What was asked for is a frozen
:class:`~pgsolo.locking.spec.LockSpec`; its log and metrics are
:class:`~pgsolo.locking.events.LockEvents`', a base of the core (one object less to build
per lock); what a holder reads (acquired, backend pid, token, loss) is
:class:`LockCore`'s; what only one lifetime has is its subclass's:
:class:`~pgsolo.locking.session.SessionLockCore` (the route, the hold in the caller's
transaction) and :class:`~pgsolo.locking.transaction.XactLockCore` (pgsolo's own
transaction). The modules they call (:mod:`~pgsolo.locking.placement`,
:mod:`~pgsolo.locking.failures`, :mod:`~pgsolo.locking.recovery`) are functions of what
they are given, and change no state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from .. import metrics, sql
from .._logging import locks_logger as logger
from ..drivers import DriverBase, TxStatus
from ..errors import ConnectionStateError, LockLostError, UsageError
from . import holdings
from .events import LockEvents
from .placement import outside_transaction
from .plans import Own, Plan, Quick, Wait
from .spec import LockSpec

__all__ = ["LockCore", "is_token", "require_no_transaction"]


def is_token(value: object) -> bool:
    """A fencing token came back (a positive int; 0 is a busy try, a bool a plain one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def require_no_transaction(driver: DriverBase, subject: str, reason: str) -> None:
    """Refuse a connection with a transaction open, for calls that must own it."""
    status = driver.transaction_status()
    if status is not TxStatus.IDLE:
        raise ConnectionStateError(
            f"{subject} needs a connection with no transaction open, and on this one"
            f" {status.words}: {reason}; {driver.ending_advice}"
        )


class LockCore(LockEvents, ABC):
    """One lock (``spec``) on one connection (``driver``): what a holder reads of it, and
    the plans both shells drive. A subclass per lifetime takes, gives back and owns the
    rest (see :func:`pgsolo.locking.factory.lock_core`)."""

    def __init__(self, driver: DriverBase, spec: LockSpec) -> None:
        self.driver = driver
        self.spec = spec
        self.acquired = False
        self.backend_pid: int | None = None
        self.token: int | None = None  # the fencing token of this acquisition
        self.lost: LockLostError | None = None  # set by the keeper
        self.held: holdings.Held | None = None  # the key on the books, once claimed
        self.started = 0.0  # when the quick acquisition (or a session lock's release) began
        self.claimed_on = 0  # the backend pid the quick acquisition claimed the key on

    @property
    def server_pid(self) -> int | None:
        """The pid of the backend holding a session lock, as the server says (behind a
        proxy, ``backend_pid`` is the proxy's own); None for a transaction lock."""
        return None

    @property
    @abstractmethod
    def holds_anything(self) -> bool:
        """Whether letting go has anything to give back (the lock, or pgsolo's own
        transaction)."""

    def begin(self) -> None:
        """An acquisition begins, before anything is sent (refused on a lock this object
        holds already)."""
        if self.acquired:
            raise UsageError(f"lock {self.spec.key} is already acquired by this Lock object")
        self.token = None
        self.held = None  # until this acquisition claims the key
        self._outcome_counted = False  # LockEvents': this acquisition's outcome is to count
        metrics.prepare()

    def aim(self, spec: LockSpec) -> None:
        """Make this core the one of another lock (a job's next slot of its ``limit=``),
        between acquisitions: never while it holds anything."""
        if self.holds_anything:
            raise UsageError(f"lock {self.spec.key} is held: it cannot be aimed at another key")
        self.spec = spec
        self.count_anew()

    def acquire(self, *, context: bool) -> Plan[bool]:
        """Take the lock within a plan of the caller's (a job's, a call of ``once``'s):
        the common case by :meth:`quick_acquisition`'s round trip, yielded as one step, and
        put right as a shell puts it right (:meth:`quick_failed`, then :meth:`let_go` for
        whatever cut it short); anything else by the plan that takes it."""
        quick = self.quick_acquisition(context)
        if not isinstance(quick, tuple):
            return (yield from quick)
        statements, edge, seconds = quick
        try:
            try:
                if edge is not None:
                    value = yield Own(statements, edge, seconds)
                else:
                    value = yield statements if not seconds else Wait(statements, seconds)
            except BaseException as exc:
                return (yield from self.quick_failed(exc))
            return self.quick_answer(value)
        except BaseException:
            yield from self.let_go()
            raise

    @abstractmethod
    def _acquire(self, *, context: bool) -> Plan[bool]: ...

    @abstractmethod
    def release(self) -> Plan[None]: ...

    @abstractmethod
    def exit(self, *, failed: bool) -> Plan[None]:
        """Leave the ``with`` block: release the session lock, or end the transaction
        pgsolo opened. A failure of the block itself is never masked."""

    # - the common case, without a plan: the shells send its round trips themselves -

    @abstractmethod
    def quick_acquisition(self, context: bool, /) -> Quick | Plan[bool]:
        """The round trip that takes the lock in the common case, for the shell to send
        itself: most locks are taken so, and a plan there costs more of pgsolo's own time
        than the rest of the lock (docs/benchmarks.md). The shell hands the answer to
        :meth:`quick_answer` and a failure to :meth:`quick_failed`; whatever cuts it short
        between them goes to :meth:`let_go`. Anything else: the plan that takes it."""

    @abstractmethod
    def quick_answer(self, value: object) -> bool:
        """What the server answered the quick acquisition: whether the lock is held."""

    @abstractmethod
    def quick_failed(self, exc: BaseException) -> Plan[bool]:
        """The quick acquisition's round trip failed or was interrupted (``exc``): put
        right as the plan's slice would be, and the error raised; or, for the first slice
        of a wait that ran out, the rest of the wait, and whether it took the lock."""

    @abstractmethod
    def quick_release(self, exiting: bool, /) -> Quick | Plan[None]:
        """The round trip that gives the lock back in the common case (``exiting``: as
        the block ends without an error), for the shell to send itself. Once the server
        answered, the shell calls :meth:`forget` at once, then hands the answer to
        :meth:`quick_released`, or a failure to :meth:`quick_release_failed`. Anything
        else: the plan that releases it, or leaves the block."""

    @abstractmethod
    def forget(self) -> None:
        """The lock is no longer held here: off the books."""

    @abstractmethod
    def quick_released(self, value: object) -> Plan[None] | None:
        """What the server answered the quick release (the lock is off the books): None,
        or the plan that ends the release (the shell drives it)."""

    @abstractmethod
    def quick_release_failed(self, exc: BaseException) -> Plan[None]:
        """The quick release failed or was interrupted (``exc``): put right as the plan's
        would be; raises what ``exc`` means, or returns for the shell to raise ``exc``."""

    def let_go(self) -> Plan[None]:
        """An interruption (Ctrl-C) after the lock was taken and before the code that
        releases it took over: release it, or end pgsolo's own transaction, so that
        nothing is left behind; the interruption goes on."""
        if self.holds_anything:
            try:
                yield from self.exit(failed=True)
            except Exception as exc:
                logger.debug("pgsolo clean-up after an interruption failed: %r", exc)

    def is_held(self) -> Plan[bool]:
        """Ask the server (``pg_locks``) whether this backend holds the key right now."""
        if self.driver.is_closed() or holdings.let_go_elsewhere(self.held):
            return False  # the session this lock was taken on let it go
        if self.driver.transaction_status() is TxStatus.INERROR:
            raise ConnectionStateError("the connection's transaction has failed; roll back first")
        held_here = sql.held_here(self.spec.key, shared=self.spec.shared)
        return (yield outside_transaction(self.driver, [held_here])) is True

    def _usable_status(self, status: TxStatus | None = None) -> TxStatus:
        if status is None:
            status = self.driver.transaction_status()
        if status is TxStatus.INERROR:
            raise ConnectionStateError(
                "the connection's transaction has failed; roll it back before taking a lock"
            )
        if status in (TxStatus.ACTIVE, TxStatus.UNKNOWN):
            raise ConnectionStateError(f"the connection cannot take a lock now: {status.words}")
        return status

    @staticmethod
    def _waiting(statements: list[str], lock_timeout_ms: int | None) -> list[str] | Wait:
        """A slice's statements, marked as waiting for the lock when they may."""
        return statements if lock_timeout_ms is None else Wait(statements, lock_timeout_ms / 1000)
