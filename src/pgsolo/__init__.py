"""pgsolo: run a piece of work at most once at a time, with PostgreSQL advisory locks.

The public API is what this module re-exports; each name lives in the module of its layer
(``locking``, ``jobs``, ``once``, ``monitor``, ``schema``; see DESIGN.md §3).

The pure parts (errors, keys, reasons, outcomes) are imported with the package; the rest,
and the driver under it, on first use (PEP 562), so that ``import pgsolo`` and a command
such as ``pgsolo key`` load no database driver and only what they use.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from ._types import OnceOutcome, Outcome
from .errors import (
    ConnectionStateError,
    DatabaseUnavailableError,
    InsufficientPrivilegeError,
    InvalidArgumentError,
    InvalidDsnError,
    InvalidKeyError,
    InvalidOperationError,
    InvalidOperationKeyError,
    KeyCollisionError,
    LockDeadlockError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
    NotMigratedError,
    PgsoloError,
    ResultNotStorableError,
    TransactionFailedError,
    UnsafeConnectionError,
    UnsupportedConnectionError,
    UsageError,
)
from .keys import Key, KeyLike, Registry, as_key, decode_pg_lock
from .reasons import LostReason, Reason

if TYPE_CHECKING:  # the same names as _ON_FIRST_USE, for type checkers
    from .jobs import (
        Job,
        JobCompleted,
        JobFailed,
        JobLost,
        JobOptions,
        JobResult,
        JobSkipped,
        history,
        run_job,
        run_job_async,
        singleton,
    )
    from .leadership import (
        AsyncTerm,
        Standing,
        Term,
        campaign,
        campaign_async,
        lead_in_background,
        leader,
        leader_async,
    )
    from .locking import (
        AsyncLock,
        AsyncLocker,
        AsyncLockerLock,
        Keep,
        Lock,
        Locker,
        LockerLock,
        async_pool_reset,
        held_session_locks,
        pool_reset,
        session_lock,
        xact_lock,
    )
    from .monitor import (
        AdvisoryLock,
        Check,
        SemaphoreSlot,
        SemaphoreUse,
        advisory_locks,
        advisory_locks_async,
        doctor,
        is_locked,
        is_locked_async,
        lock_holders,
        lock_holders_async,
        semaphore_uses,
        terminate_backend,
        wait_chains,
    )
    from .once import OnceResult, OperationContext, idempotency_key_for, run_once, run_once_async
    from .schema import Pruned, migrate, prune
    from .semaphores import AsyncSemaphore, Semaphore, semaphore

__version__ = "0.1.0"

__all__ = [
    "AdvisoryLock",
    "AsyncLock",
    "AsyncLocker",
    "AsyncLockerLock",
    "AsyncSemaphore",
    "AsyncTerm",
    "Check",
    "ConnectionStateError",
    "DatabaseUnavailableError",
    "InsufficientPrivilegeError",
    "InvalidArgumentError",
    "InvalidDsnError",
    "InvalidKeyError",
    "InvalidOperationError",
    "InvalidOperationKeyError",
    "Job",
    "JobCompleted",
    "JobFailed",
    "JobLost",
    "JobOptions",
    "JobResult",
    "JobSkipped",
    "Keep",
    "Key",
    "KeyCollisionError",
    "KeyLike",
    "Lock",
    "LockDeadlockError",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "LockUnavailableError",
    "Locker",
    "LockerLock",
    "LostReason",
    "NotMigratedError",
    "OnceOutcome",
    "OnceResult",
    "OperationContext",
    "Outcome",
    "PgsoloError",
    "Pruned",
    "Reason",
    "Registry",
    "ResultNotStorableError",
    "Semaphore",
    "SemaphoreSlot",
    "SemaphoreUse",
    "Standing",
    "Term",
    "TransactionFailedError",
    "UnsafeConnectionError",
    "UnsupportedConnectionError",
    "UsageError",
    "__version__",
    "advisory_locks",
    "advisory_locks_async",
    "as_key",
    "async_pool_reset",
    "campaign",
    "campaign_async",
    "decode_pg_lock",
    "doctor",
    "held_session_locks",
    "history",
    "idempotency_key_for",
    "is_locked",
    "is_locked_async",
    "lead_in_background",
    "leader",
    "leader_async",
    "lock_holders",
    "lock_holders_async",
    "migrate",
    "pool_reset",
    "prune",
    "run_job",
    "run_job_async",
    "run_once",
    "run_once_async",
    "semaphore",
    "semaphore_uses",
    "session_lock",
    "singleton",
    "terminate_backend",
    "wait_chains",
    "xact_lock",
]

# Where each name that is imported on first use lives (tests/test_api.py checks that this,
# the imports above and __all__ agree).
_ON_FIRST_USE = {
    **dict.fromkeys(
        (
            "Job",
            "JobCompleted",
            "JobFailed",
            "JobLost",
            "JobOptions",
            "JobResult",
            "JobSkipped",
            "history",
            "run_job",
            "run_job_async",
            "singleton",
        ),
        ".jobs",
    ),
    **dict.fromkeys(
        (
            "AsyncLock",
            "AsyncLocker",
            "AsyncLockerLock",
            "Keep",
            "Lock",
            "Locker",
            "LockerLock",
            "async_pool_reset",
            "held_session_locks",
            "pool_reset",
            "session_lock",
            "xact_lock",
        ),
        ".locking",
    ),
    **dict.fromkeys(
        (
            "AsyncTerm",
            "Standing",
            "Term",
            "campaign",
            "campaign_async",
            "lead_in_background",
            "leader",
            "leader_async",
        ),
        ".leadership",
    ),
    **dict.fromkeys(("AsyncSemaphore", "Semaphore", "semaphore"), ".semaphores"),
    **dict.fromkeys(
        (
            "AdvisoryLock",
            "Check",
            "SemaphoreSlot",
            "SemaphoreUse",
            "advisory_locks",
            "advisory_locks_async",
            "doctor",
            "is_locked",
            "is_locked_async",
            "lock_holders",
            "lock_holders_async",
            "semaphore_uses",
            "terminate_backend",
            "wait_chains",
        ),
        ".monitor",
    ),
    **dict.fromkeys(
        ("OnceResult", "OperationContext", "idempotency_key_for", "run_once", "run_once_async"),
        ".once",
    ),
    **dict.fromkeys(("Pruned", "migrate", "prune"), ".schema"),
}


def __getattr__(name: str) -> object:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # once: the next access does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
