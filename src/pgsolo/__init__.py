"""pgsolo: run a piece of work at most once at a time, with PostgreSQL advisory locks.

The public API is what this module re-exports; each name lives in the module of its layer
(``locking``, ``jobs``, ``once``, ``monitor``, ``schema``; see DESIGN.md §3).
"""

from ._types import OnceOutcome, Outcome
from .errors import (
    ConnectionStateError,
    DatabaseUnavailableError,
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
    UsageError,
)
from .jobs import Job, JobResult, history, run_job, run_job_async, singleton
from .keys import Key, KeyLike, Registry, as_key, decode_pg_lock
from .locking import (
    AsyncLock,
    Keep,
    Lock,
    async_pool_reset,
    held_session_locks,
    pool_reset,
    session_lock,
    xact_lock,
)
from .monitor import (
    AdvisoryLock,
    Check,
    advisory_locks,
    doctor,
    terminate_backend,
    wait_chains,
)
from .once import (
    OnceResult,
    OperationContext,
    idempotency_key_for,
    run_once,
    run_once_async,
)
from .reasons import LostReason, Reason
from .schema import migrate

__version__ = "0.1.0"

__all__ = [
    "AdvisoryLock",
    "AsyncLock",
    "Check",
    "ConnectionStateError",
    "DatabaseUnavailableError",
    "InvalidArgumentError",
    "InvalidDsnError",
    "InvalidKeyError",
    "InvalidOperationError",
    "InvalidOperationKeyError",
    "Job",
    "JobResult",
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
    "LostReason",
    "NotMigratedError",
    "OnceOutcome",
    "OnceResult",
    "OperationContext",
    "Outcome",
    "PgsoloError",
    "Reason",
    "Registry",
    "ResultNotStorableError",
    "TransactionFailedError",
    "UnsafeConnectionError",
    "UsageError",
    "__version__",
    "advisory_locks",
    "as_key",
    "async_pool_reset",
    "decode_pg_lock",
    "doctor",
    "held_session_locks",
    "history",
    "idempotency_key_for",
    "migrate",
    "pool_reset",
    "run_job",
    "run_job_async",
    "run_once",
    "run_once_async",
    "session_lock",
    "singleton",
    "terminate_backend",
    "wait_chains",
    "xact_lock",
]
