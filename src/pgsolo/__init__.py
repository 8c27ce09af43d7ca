"""pgsolo: run a piece of work at most once at a time, with PostgreSQL advisory locks."""

from .errors import (
    ConnectionStateError,
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
from .keys import Key, KeyLike, Registry, as_key, decode_pg_lock
from .locks import (
    AsyncLock,
    Lock,
    async_pool_reset,
    held_session_locks,
    pool_reset,
    session_lock,
    xact_lock,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncLock",
    "ConnectionStateError",
    "InvalidKeyError",
    "Key",
    "KeyCollisionError",
    "KeyLike",
    "Lock",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "LockUnavailableError",
    "PgsoloError",
    "Registry",
    "TransactionFailedError",
    "UnsafeConnectionError",
    "UsageError",
    "__version__",
    "as_key",
    "async_pool_reset",
    "decode_pg_lock",
    "held_session_locks",
    "pool_reset",
    "session_lock",
    "xact_lock",
]
