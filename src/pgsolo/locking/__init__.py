"""Advisory locks: transaction or session lifetime, try or wait, exclusive or shared, and
the keeper that watches a held session lock.

Modules, one idea each: :mod:`.factory` (``xact_lock``, ``session_lock``), :mod:`.lock`
(the ``Lock``/``AsyncLock`` objects) and :mod:`.view` (what they show), :mod:`.core` (one
lock's state and plans) with :mod:`.placement`, :mod:`.transaction`, :mod:`.failures` and
:mod:`.recovery`, :mod:`.holdings` (what each connection holds), :mod:`.routing` (proxies
and standbys), :mod:`.keeper` (the keepers) and :mod:`.watch` (``Keep``, what a beat
means), :mod:`.pools` (what a pool reset does), :mod:`.handbacks` (a framework taking a
connection back: SQLAlchemy's pool, the end of a Django request) and :mod:`.plans` (what a
plan yields).

The shells that exist in both flavours (the lock objects, the keeper, the pool hooks)
are written once, async, in ``_async/``; ``scripts/unasync.py`` generates their sync twins
in ``_sync/``.
"""

from __future__ import annotations

from ._async.lock import AsyncLock
from ._async.pools import async_pool_reset
from ._sync.lock import Lock
from ._sync.pools import pool_reset
from .factory import session_lock, xact_lock
from .handbacks import release_at_request_end as _release_at_request_end  # noqa: F401 - registers it
from .holdings import held_session_locks
from .watch import Keep

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
