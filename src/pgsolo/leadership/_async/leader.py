"""``leader_async``: lead while the other candidates wait, on an async connection the
caller gives or one pgsolo opens from a connection string, and the :class:`AsyncTerm`
of each term."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from ..._acompat import AIS_ASYNC, AEvent
from ...drivers import adapt_async
from ...drivers._async.connect import aopen_connection
from ...drivers.conninfo import application_name_for
from ...errors import LockLostError, UsageError
from ...keys import LEADER_PREFIX, Key
from ...locking import (
    AsyncLock,
    AsyncLocker,
    AsyncLockerLock,
    Keep,
    adrive,
    keepalive_basis,
    session_lock,
)
from ..candidacy import Candidacy
from ..terms import record_term_plan

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["AsyncTerm", "leader_async", "own_term"]

# A wait for the loss with no end is this many seconds at a time (a thread's Event takes
# no infinite timeout).
_LOOK_EVERY = 3600.0


class AsyncTerm:
    """One term as leader: it lasts while the leader's session lock is held, and ends
    with the block, or with the loss the keeper finds first (``lost``, ``wait_lost()``)."""

    def __init__(self, name: str, lock: AsyncLock | AsyncLockerLock, ended: AEvent | None) -> None:
        self._lock = lock
        self._ended = ended  # None: no keeper watches the term
        self.name = name
        #: When this term began (seconds since the epoch, as time.time()).
        self.since = time.time()
        #: This term's fencing token, larger than every earlier term's of this name (and
        #: any other acquisition of its key), across restarts and failovers; None with
        #: ``fencing=False``. Hand it to what the leader writes to, which refuses a
        #: smaller one: a leader that stalled and lost its term cannot overwrite its
        #: successor's work.
        self.token: int | None = lock.token
        #: The backend that holds the leader's lock.
        self.backend_pid: int | None = lock.backend_pid

    @property
    def key(self) -> Key:
        """The session advisory lock the leader holds (the name ``pgsolo:leader:<name>``)."""
        return self._lock.key

    @property
    def lost(self) -> bool:
        """Whether the keeper found the leader's lock gone: another candidate may lead now."""
        return self._lock.lost

    @property
    def loss(self) -> LockLostError | None:
        """What the keeper found (its ``reason`` says how the term ended), or None."""
        return self._lock.loss

    def check(self) -> None:
        """Raise the :class:`~pgsolo.LockLostError` of a lost term; nothing while it lasts."""
        self._lock.check()

    async def wait_lost(self, seconds: float | None = None) -> bool:
        """Wait until the term is lost, ``seconds`` at most (None: for as long as it
        takes); whether it was. A leader that runs its work elsewhere (a scheduler's own
        worker) waits here, then stops that work."""
        ended = self._ended
        if ended is None:
            raise UsageError("wait_lost() needs the keeper: this term has none (keep=False)")
        if seconds is not None:
            return self._lock.lost or await ended.wait(seconds)
        while not (self._lock.lost or await ended.wait(_LOOK_EVERY)):
            pass
        return True

    def __repr__(self) -> str:
        state = "lost" if self.lost else "leading"
        return f"<{type(self).__name__} {self.name!r} token={self.token} {state}>"


@asynccontextmanager
async def leader_async(
    target: AsyncConnectionLike | AsyncLocker | str,
    name: str,
    *,
    wait: float = math.inf,
    keep: bool | Keep = True,
    fencing: bool = True,
) -> AsyncIterator[AsyncTerm]:
    """Become the leader named ``name`` and stay it for the block: ``async with
    leader_async(dsn, "scheduler") as term:``. Every candidate runs the same line; one
    leads, the others wait, and one of them leads as soon as the leader's session ends
    (its block ends, its process or host dies, its backend is terminated).

    ``target`` is an async connection that can keep a session lock, which stays the
    caller's, or a connection string from which pgsolo opens (and closes) a connection
    named ``pgsolo:leader:<name>`` in ``pg_stat_activity``, or an
    :class:`~pgsolo.AsyncLocker` that takes the leader's lock beside its others (its wait
    tries, as a Locker's waits do, and the term is not recorded for ``pgsolo locks``: the
    connection is the Locker's). A candidate waits without a
    transaction or snapshot, in bounded slices, for ``wait`` seconds (``math.inf``, the
    default: for as long as it takes), then raises :class:`~pgsolo.LockTimeoutError`.

    ``keep``: the keeper that watches the term. ``True`` (the default) is
    :class:`~pgsolo.Keep`'s defaults, and where the leader is an asyncio task, a lost
    term cancels it, so that its block ends with the :class:`~pgsolo.LockLostError`; a
    :class:`~pgsolo.Keep` of your own is used as it is (its ``on_lost`` is called too);
    ``False`` leads unwatched, and a loss is found only when the block ends.
    ``fencing``: a fencing token for each term (``term.token``), which needs ``pgsolo
    migrate``. Everything is validated before anything connects.
    """
    candidacy, ended = _stand(name, wait, keep, fencing)
    if isinstance(target, str):
        named = application_name_for(target, LEADER_PREFIX + candidacy.name)
        async with (
            aopen_connection(
                target, application_name=named, check_timeout=keepalive_basis(candidacy.keep)
            ) as conn,
            _term(conn, candidacy, ended, own=True) as term,
        ):
            yield term
        return
    if isinstance(target, AsyncLocker):
        through = target.session_lock(
            candidacy.key,
            wait=candidacy.wait,
            fencing=candidacy.fencing,
            keep=candidacy.keep or False,
        )
        async with through:
            yield AsyncTerm(candidacy.name, through, ended if candidacy.keep is not None else None)
        return
    async with _term(target, candidacy, ended, own=False) as term:
        yield term


@asynccontextmanager
async def own_term(
    conn: AsyncConnectionLike, name: str, *, wait: float, keep: bool | Keep, fencing: bool
) -> AsyncIterator[AsyncTerm]:
    """A term of :func:`leader_async` on a connection pgsolo opened itself and keeps from
    one term to the next (a campaign's): its start is recorded, as on a connection
    string's."""
    candidacy, ended = _stand(name, wait, keep, fencing)
    async with _term(conn, candidacy, ended, own=True) as term:
        yield term


def _stand(name: str, wait: float, keep: bool | Keep, fencing: bool) -> tuple[Candidacy, AEvent]:
    """The candidacy, validated, and the event its keeper sets when the term is lost."""
    ended = AEvent()
    candidacy = Candidacy.define(
        name, wait=wait, keep=keep, fencing=fencing, cancel=AIS_ASYNC, lost=lambda _: ended.set()
    )
    return candidacy, ended


@asynccontextmanager
async def _term(
    conn: AsyncConnectionLike, candidacy: Candidacy, ended: AEvent, *, own: bool
) -> AsyncIterator[AsyncTerm]:
    driver = adapt_async(conn)
    candidacy.refuse_unwatchable(driver)
    lock = session_lock(
        conn,
        candidacy.key,
        wait=candidacy.wait,
        fencing=candidacy.fencing,
        keep=candidacy.keep or False,
    )
    async with lock:
        if own:  # a caller's connection goes back as it was found: nothing is written there
            await adrive(record_term_plan(driver, candidacy.name, lock.token), driver)
        yield AsyncTerm(candidacy.name, lock, ended if candidacy.keep is not None else None)
