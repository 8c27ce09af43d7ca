"""pgsolo: run a piece of work at most once at a time, with PostgreSQL advisory locks."""

from .errors import (
    ConnectionStateError,
    InvalidKeyError,
    InvalidOperationError,
    InvalidOperationKeyError,
    KeyCollisionError,
    LockDeadlockError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
    PgsoloError,
    ResultNotStorableError,
    TransactionFailedError,
    UnsafeConnectionError,
    UsageError,
)
from .jobs import Job, JobResult, Outcome, run_job, run_job_async, singleton
from .keeper import Keep
from .keys import Key, KeyLike, Registry, as_key, decode_pg_lock
from .ledger import history, migrate
from .locks import (
    AsyncLock,
    Lock,
    async_pool_reset,
    held_session_locks,
    pool_reset,
    session_lock,
    xact_lock,
)
from .once import (
    OnceOutcome,
    OnceResult,
    OperationContext,
    idempotency_key_for,
    run_once,
    run_once_async,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncLock",
    "ConnectionStateError",
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
    "OnceOutcome",
    "OnceResult",
    "OperationContext",
    "Outcome",
    "PgsoloError",
    "Registry",
    "ResultNotStorableError",
    "TransactionFailedError",
    "UnsafeConnectionError",
    "UsageError",
    "__version__",
    "as_key",
    "async_pool_reset",
    "decode_pg_lock",
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
    "xact_lock",
]
