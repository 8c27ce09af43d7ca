"""Advisory locks: transaction or session lifetime, try or wait, exclusive or shared, and
the keeper that watches a held session lock.

Modules, one idea each: :mod:`.factory` (``xact_lock``, ``session_lock``, and
``lock_core``, which picks the core for a lifetime), ``_async/lock.py`` (the
``AsyncLock`` object, and its generated twin ``Lock``) and :mod:`.view` (what they show);
:mod:`.spec` (what a lock is: ``LockSpec``, ``Keep``), :mod:`.core` (what both lifetimes
share), :mod:`.session` and :mod:`.transaction` (one core per lifetime, owning its
state), :mod:`.events` (a lock's log and metrics); the functions they call, which change
no state: :mod:`.placement` (which statements, where), :mod:`.failures` (what a failure
means), :mod:`.recovery` (putting the connection right), :mod:`.waits` (the slices of a
wait), :mod:`.slots` (which slot of a limit to try next) and :mod:`.routing` (proxies
and standbys); :mod:`.holdings` (what each connection holds), ``_async/keeper.py``
(the keeper, and its twin) and :mod:`.watch` (what a beat means), :mod:`.pools` (what
a pool reset does), :mod:`.handbacks` (a framework taking a connection back:
SQLAlchemy's pool, the end of a Django request) and :mod:`.plans` (what a plan yields).

The shells that exist in both flavours (the lock objects, the keeper, the plan loop, the
pool hooks) are written once, async, in ``_async/``; ``scripts/unasync.py`` generates
their sync twins in ``_sync/``.

This package is the one way in from above (jobs, once, monitor, schema, the CLI): what
``__all__`` lists is public, the other names below are for pgsolo's own features, and
:mod:`.plans` is the one module they may import besides (an import-linter contract says
so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import on_first_use

# With the package: the hook a Django request's end calls (pgsolo.drivers.REQUEST_END_HOOKS)
# is registered before any lock can be taken.
from .handbacks import install as install
from .handbacks import release_at_request_end as _release_at_request_end  # noqa: F401 - registers it

if TYPE_CHECKING:  # the same names as _ON_FIRST_USE, for type checkers
    from ._async.drive import adrive as adrive
    from ._async.keeper import AsyncKeeper as AsyncKeeper
    from ._async.lock import AsyncLock
    from ._async.locker import AsyncLocker, AsyncLockerLock
    from ._async.locker import alend_session as alend_session
    from ._async.pools import async_pool_reset
    from ._sync.drive import drive as drive
    from ._sync.keeper import Keeper as Keeper
    from ._sync.lock import Lock
    from ._sync.locker import Locker, LockerLock
    from ._sync.locker import lend_session as lend_session
    from ._sync.pools import pool_reset
    from .core import LockCore as LockCore
    from .core import require_no_transaction as require_no_transaction
    from .factory import lock_core as lock_core
    from .factory import session_lock, xact_lock
    from .failures import unavailable as unavailable
    from .failures import unresponsive as unresponsive
    from .holdings import held_session_locks
    from .holdings import is_claimed as is_claimed
    from .multiplex import poll_pauses as poll_pauses
    from .placement import outside_transaction as outside_transaction
    from .recovery import connection_gone as connection_gone
    from .recovery import quietly as quietly
    from .routing import check_route as check_route
    from .slots import TURN_SECONDS as TURN_SECONDS
    from .slots import slot_attempts as slot_attempts
    from .spec import MAX_WAIT_SECONDS as MAX_WAIT_SECONDS
    from .spec import Keep
    from .spec import LockSpec as LockSpec
    from .spec import as_keep as as_keep
    from .spec import keepalive_basis as keepalive_basis
    from .spec import refuse_keeper as refuse_keeper
    from .spec import wait_ms_of as wait_ms_of
    from .view import InnerLockView as InnerLockView
    from .watch import Watch as Watch

__all__ = [
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
]

# The rest on first use (pgsolo._lazy says why): where each name lives.
_ON_FIRST_USE = {
    "adrive": "._async.drive",
    "AsyncKeeper": "._async.keeper",
    "AsyncLock": "._async.lock",
    **dict.fromkeys(("AsyncLocker", "AsyncLockerLock", "alend_session"), "._async.locker"),
    "async_pool_reset": "._async.pools",
    "drive": "._sync.drive",
    "Keeper": "._sync.keeper",
    "Lock": "._sync.lock",
    **dict.fromkeys(("Locker", "LockerLock", "lend_session"), "._sync.locker"),
    "pool_reset": "._sync.pools",
    **dict.fromkeys(("LockCore", "require_no_transaction"), ".core"),
    **dict.fromkeys(("lock_core", "session_lock", "xact_lock"), ".factory"),
    **dict.fromkeys(("unavailable", "unresponsive"), ".failures"),
    **dict.fromkeys(("held_session_locks", "is_claimed"), ".holdings"),
    "poll_pauses": ".multiplex",
    "outside_transaction": ".placement",
    **dict.fromkeys(("connection_gone", "quietly"), ".recovery"),
    "check_route": ".routing",
    **dict.fromkeys(("TURN_SECONDS", "slot_attempts"), ".slots"),
    **dict.fromkeys(
        (
            "MAX_WAIT_SECONDS",
            "Keep",
            "LockSpec",
            "as_keep",
            "keepalive_basis",
            "refuse_keeper",
            "wait_ms_of",
        ),
        ".spec",
    ),
    "InnerLockView": ".view",
    "Watch": ".watch",
}

if not TYPE_CHECKING:  # a type checker sees the imports above, and no name besides
    __getattr__, __dir__ = on_first_use(globals(), _ON_FIRST_USE)
