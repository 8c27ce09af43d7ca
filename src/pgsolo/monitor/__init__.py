"""Who holds which advisory lock, who waits behind it, and what looks wrong.

:func:`advisory_locks` is ``pg_locks`` joined with ``pg_stat_activity`` in one round trip,
keys decoded per DESIGN §2 and named from a registry or from names the caller gives.
:func:`is_locked` and :func:`lock_holders` are the same read for one key;
:func:`wait_chains` and :func:`semaphore_uses` read its rows (who waits on whom, each
semaphore's slots as one :class:`SemaphoreUse`).
:func:`doctor` checks the article's production checklist against a live database.
They only read; ``pgsolo terminate`` (in :mod:`pgsolo.cli`) is the one that acts.

PostgreSQL does not record whether an advisory lock was taken at session or transaction
level, so :attr:`AdvisoryLock.lifetime` says only what the server proves (see there),
and is ``None`` otherwise.
"""

from __future__ import annotations

from ._async.holders import advisory_locks_async, is_locked_async, lock_holders_async
from ._sync.holders import advisory_locks, is_locked, lock_holders
from .checks import Check, doctor
from .locks import AdvisoryLock, SemaphoreSlot, SemaphoreUse, semaphore_uses, wait_chains
from .snapshot import format_seconds
from .terminate import terminate_backend

__all__ = [
    "AdvisoryLock",
    "Check",
    "SemaphoreSlot",
    "SemaphoreUse",
    "advisory_locks",
    "advisory_locks_async",
    "doctor",
    "format_seconds",
    "is_locked",
    "is_locked_async",
    "lock_holders",
    "lock_holders_async",
    "semaphore_uses",
    "terminate_backend",
    "wait_chains",
]
