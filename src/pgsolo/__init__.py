"""pgsolo: run a piece of work at most once at a time, with PostgreSQL advisory locks."""

from .errors import (
    ConnectionStateError,
    InvalidArgumentError,
    InvalidKeyError,
    KeyCollisionError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
    PgsoloError,
    TransactionFailedError,
    UnsafeConnectionError,
    UsageError,
)
from .jobs import Job, JobResult, Outcome, run_job, run_job_async, singleton
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
from .monitor import (
    AdvisoryLock,
    Check,
    advisory_locks,
    doctor,
    terminate_backend,
    wait_chains,
)

__version__ = "0.1.0"

__all__ = [
    "AdvisoryLock",
    "AsyncLock",
    "Check",
    "ConnectionStateError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "Job",
    "JobResult",
    "Key",
    "KeyCollisionError",
    "KeyLike",
    "Lock",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "LockUnavailableError",
    "Outcome",
    "PgsoloError",
    "Registry",
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
    "migrate",
    "pool_reset",
    "run_job",
    "run_job_async",
    "session_lock",
    "singleton",
    "terminate_backend",
    "wait_chains",
    "xact_lock",
]
