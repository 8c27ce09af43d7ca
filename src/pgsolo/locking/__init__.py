"""Advisory locks: transaction or session lifetime, try or wait, exclusive or shared, and
the keeper that watches a held session lock.

Modules, one idea each: :mod:`.factory` (``xact_lock``, ``session_lock``), :mod:`.lock`
(the ``Lock``/``AsyncLock`` objects), :mod:`.core` (one lock's state and plans),
:mod:`.holdings` (what each connection holds), :mod:`.routing` (proxies and standbys),
:mod:`.keeper`, :mod:`.pools` (pool reset hooks) and :mod:`.plans` (driving a plan).
"""

from __future__ import annotations

from .factory import session_lock, xact_lock
from .holdings import held_session_locks
from .keeper import Keep
from .lock import AsyncLock, Lock
from .pools import async_pool_reset, pool_reset

__all__ = [
    "AsyncLock",
    "Keep",
    "Lock",
    "async_pool_reset",
    "held_session_locks",
    "pool_reset",
    "session_lock",
    "xact_lock",
]
