"""What each connection holds, and which lock holds it.

PostgreSQL lets one session take the same key any number of times, so two threads or
tasks sharing a connection would both "get" a lock. pgsolo keeps its own books per
connection object (and the backend pid it counted on): the locks that hold each key, each
of which drops only its own hold. A second holder is refused unless re-entrancy was asked
for. A transaction pgsolo opened for an xact lock is tracked here
too, so that another thread or task cannot join it, and so is what answers the connection
(the route of :mod:`pgsolo.locking.routing`), found before its first session lock.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .._types import Lifetime
from .._weakmap import IdentityWeakMap
from ..drivers import adapt
from ..errors import ConnectionStateError
from ..keys import Key
from .routing import Route

if TYPE_CHECKING:
    from ..drivers.kinds import AsyncConnectionLike, SyncConnectionLike

__all__ = [
    "Claim",
    "Held",
    "claim",
    "confirm",
    "context_token",
    "drop",
    "drop_all",
    "end_transaction",
    "forget_all",
    "held_session_locks",
    "is_claimed",
    "kept",
    "last_hold_else_drop",
    "let_go_elsewhere",
    "owned_elsewhere",
    "session_keys",
    "set_route",
    "set_transaction_owner",
    "shared_transaction_error",
    "transaction_owner",
    "withdraw",
]


@dataclass(eq=False, slots=True)
class Held:
    """One key on the books of one connection. A lock that claimed it keeps it, and
    confirms and drops it here without looking its connection up again (every lock
    does both)."""

    key: Key
    shared: bool
    # Who holds it (their LockCores, the first claimant first): each hold is its holder's,
    # so the one an interrupted acquisition or release made is the one it drops (a count
    # could not tell whose hold a re-entrant claim cut short had added). Weakly: a lock
    # refers to its connection, and the books must not keep alive a connection its
    # caller dropped with a key held (its session, and the key, end when it goes).
    holders: list[weakref.ref[object]] = field(repr=False)
    pending: bool  # the first acquisition is still on its way to the server
    books: _Holdings = field(repr=False)  # whose keys it is among, while it is
    lifetime: Lifetime = "session"
    # The hold (pgsolo.sql.hold_savepoint) of a session lock taken in a transaction, for
    # whichever Lock lets go of the key last.
    hold: str | None = None
    # The session let the key go for its holders (drop_all, forget_all): see let_go_elsewhere.
    let_go: bool = False


@dataclass
class _Holdings:
    pid: int
    # By the key's value, which is what tells keys apart, and which hashes without a call
    # of Python (every lock looks its key up here a few times).
    keys: dict[int | tuple[int, int], Held]
    # The thread or task whose pgsolo-opened transaction is open on this connection:
    # another one must not join it (it would get the keys of that transaction too).
    transaction_owner: tuple[int, int] | None = None
    # What answers this connection (pgsolo.locking.routing), found before its first session lock.
    route: Route | None = None
    # The books were closed (forget_all): the connection went back to its pool, whose
    # reset let go of everything its session held and rolled back its transaction.
    closed: bool = False


_HOLDINGS: IdentityWeakMap[object, _Holdings] = IdentityWeakMap()


_HOLDINGS_LOCK = threading.Lock()


Claim = Literal["new", "reentered", "busy"]


def claim(  # positional: keywords bind at twice the cost, and every lock comes here
    conn: object,
    pid: int,
    key: Key,
    shared: bool,
    reentrant: bool,
    claimant: object,
    lifetime: Lifetime = "session",
    owner: tuple[int, int] | None = None,
    /,
) -> tuple[Claim, Route | None, Held | None]:
    """Claim ``key`` on ``conn`` (as it is on backend ``pid``) for ``claimant``, ``shared``
    or not, joining a hold of the same kind if ``reentrant``; with the claim, what
    answers the connection, if that was found before (:func:`set_route`), and the key's
    :class:`Held` unless it is busy. A new claim with an ``owner`` (:func:`context_token`)
    makes it the owner of the transaction pgsolo opens on ``conn`` too, in the same step
    (:func:`set_transaction_owner`)."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is None or holdings.pid != pid:
            holdings = _HOLDINGS[conn] = _Holdings(pid, {})
        # Refused: a claim that would share pgsolo's own transaction with another thread
        # or task. One for a transaction pgsolo opens (``owner``) while another's is open
        # or opening, or while another lock is on its way to the server (its statements
        # would land in the new transaction, or the new one's in its wait); any other
        # while another's transaction is open (its waits and unlocks would end that
        # transaction, or fail in it). The status each read before claiming may be
        # another's. Written out here, without a call: every lock comes here.
        current = holdings.transaction_owner
        if owner is not None:
            if current is not None and current != owner:
                raise shared_transaction_error(pid)
            for other in holdings.keys.values():
                if other.pending:
                    raise shared_transaction_error(pid)
        elif current is not None and current != context_token():
            raise shared_transaction_error(pid)
        held = holdings.keys.get(key.value)
        if held is None:
            held = Held(key, shared, [weakref.ref(claimant)], True, holdings, lifetime)
            holdings.keys[key.value] = held
            if owner is not None:
                holdings.transaction_owner = owner
            return "new", holdings.route, held
        if reentrant and (held.lifetime, held.shared) == (lifetime, shared) and not held.pending:
            held.holders.append(weakref.ref(claimant))  # one step: the claimant's, or not
            return "reentered", holdings.route, held
        return "busy", holdings.route, None


def shared_transaction_error(pid: int) -> ConnectionStateError:
    return ConnectionStateError(
        f"this connection (backend pid {pid}) is in use by pgsolo for another thread or"
        " task: the transaction pgsolo opened for that one is open, or one of its locks is"
        " on its way to the server, and a lock taken now would share its statements and"
        " its COMMIT. Use a connection per thread or task."
    )


def owned_elsewhere(conn: object, pid: int) -> bool:
    """Whether the transaction open on ``conn`` is one pgsolo opened for another thread
    or task (which ends when that one's lock does, at any moment)."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        current = holdings.transaction_owner if holdings and holdings.pid == pid else None
    return current is not None and current != context_token()


def set_route(conn: object, pid: int, route: Route) -> None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is not None and holdings.pid == pid:
            holdings.route = route


def context_token() -> tuple[int, int]:
    """Who is running: this thread, and this asyncio task if there is one."""
    # Exported by asyncio (its __all__) for code that runs with or without a loop: None
    # without one, where current_task() raises: an exception raised and caught on every
    # sync lock's path.
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return threading.get_ident(), id(task) if task is not None else 0


def set_transaction_owner(conn: object, pid: int, owner: tuple[int, int] | None) -> None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is None or holdings.pid != pid:
            holdings = _HOLDINGS[conn] = _Holdings(pid, {})
        holdings.transaction_owner = owner


def transaction_owner(conn: object, pid: int) -> tuple[int, int] | None:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        return holdings.transaction_owner if holdings and holdings.pid == pid else None


def last_hold_else_drop(held: Held, holder: object) -> bool:
    """Whether ``holder``'s is the only hold of ``held``'s key, its release the one that
    unlocks it. If so, the key is on its way to the server again (``pending``) until it
    goes off the books or the unlock failed (:func:`kept`): a re-entrant claim that came
    meanwhile would share a hold whose unlock is in flight, and believe it held a key
    the server let go, so it is refused as busy, as during the first acquisition. If
    not, ``holder``'s hold is dropped in the same step: two holders letting go at once
    (two threads) must not each find the other's hold still there, and both leave the
    key held by the session with no one on the books to unlock it."""
    with _HOLDINGS_LOCK:
        if len(held.holders) == 1 and held.holders[0]() is holder:
            held.pending = True
            return True
        _drop(held, holder)
        return False


def kept(held: Held) -> None:
    """The unlock of the last hold failed, and the key stays held on the books: a
    re-entrant claim may join it again."""
    with _HOLDINGS_LOCK:
        held.pending = False


def is_claimed(conn: object, pid: int, key: Key) -> bool:
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        return holdings is not None and holdings.pid == pid and key.value in holdings.keys


def confirm(held: Held, hold: str | None = None) -> None:
    """The server granted the key ``held`` claims (``hold``: the savepoint that holds its
    session-lock block, if any)."""
    if hold is None:
        # One store, which no other step of the books can split: no mutex (every lock
        # confirms). A new claim's hold is None until confirmed, and only its claimant
        # confirms it, before any other hold can join.
        held.pending = False
        return
    with _HOLDINGS_LOCK:
        held.pending = False
        held.hold = hold


def withdraw(conn: object, key: Key, claimant: object) -> None:
    """Drop the hold of ``key`` that ``claimant``'s acquisition made, if it is on the
    books: after an acquisition that failed or was interrupted at any line (a Ctrl-C
    between the claim and the code that would drop it, or just after the confirmation),
    nothing stays claimed, and a claim that is another's is never dropped."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        held = holdings.keys.get(key.value) if holdings else None
        if held is not None:
            _drop(held, claimant)


def drop_all(conn: object, key: Key) -> None:
    """Drop every hold of ``key`` on ``conn``: the session that held it let it go."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        held = holdings.keys.get(key.value) if holdings else None
        if held is not None:
            held.holders.clear()
            held.let_go = True
            _drop(held, None)


def drop(held: Held, holder: object) -> None:
    """Drop ``holder``'s hold of ``held``'s key."""
    with _HOLDINGS_LOCK:
        _drop(held, holder)


def end_transaction(conn: object, pid: int, holder: object, taken: Held | None) -> None:
    """pgsolo's own transaction on ``conn`` (backend ``pid``) ended: the key it took for
    ``holder`` (``taken``; None if it took none) is let go, and nobody owns a transaction
    there any more. One step, as every transaction lock ends so."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if taken is not None:
            _drop(taken, holder)
        if holdings is None or holdings.pid != pid:
            holdings = _HOLDINGS[conn] = _Holdings(pid, {})
        holdings.transaction_owner = None


def _drop(held: Held, holder: object) -> None:
    """Drop ``holder``'s hold, if it has one. A drop that an interruption (a Ctrl-C lands
    at any line) cut short is finished by the holder's next, and once no one holds the key
    it goes off the books (whoever kept the Held is free to go: it no longer refers to
    them)."""
    holders = held.holders
    for hold in holders:
        if hold() is holder and holder is not None:
            holders.remove(hold)  # itself: the references of one live object are one
            break
    if not holders and held.books.keys.get(held.key.value) is held:
        del held.books.keys[held.key.value]


def forget_all(conn: object) -> list[Held]:
    """Close ``conn``'s books: its session lets go of everything (a pool's reset, a
    Locker's close). What was on them, each off the books."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.pop(conn)
        if holdings is None:
            return []
        holdings.closed = True
        for held in holdings.keys.values():
            held.holders.clear()  # off the books: a lock that kept it holds nothing here
            held.let_go = True
    return list(holdings.keys.values())


def let_go_elsewhere(held: Held | None) -> bool:
    """Whether the session let go of the key ``held`` claims for its holders, by a pool's
    reset, a request's end or a Locker's close, and not by one of them. Their lock must
    send nothing more on the connection, which may be another's by now: the next
    borrower's key or transaction would be the one it released or committed."""
    return held is not None and (held.let_go or held.books.closed)


def held_session_locks(conn: SyncConnectionLike | AsyncConnectionLike) -> list[Key]:
    """The session locks pgsolo took on ``conn`` (any connection pgsolo takes) and has
    not released."""
    return session_keys(adapt(conn).connection)


def session_keys(conn: object) -> list[Key]:
    """The session locks on the books of ``conn``, as a driver tracks it
    (``driver.connection``)."""
    with _HOLDINGS_LOCK:
        holdings = _HOLDINGS.get(conn)
        if holdings is None:
            return []
        return [
            held.key
            for held in holdings.keys.values()
            if held.lifetime == "session" and not held.pending
        ]
