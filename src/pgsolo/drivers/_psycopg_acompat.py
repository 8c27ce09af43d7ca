"""What the two psycopg adapters differ by, as pairs of helpers in the manner of
:mod:`pgsolo._acompat`: one name for async code, the same without its leading ``a`` for
sync code, which ``scripts/unasync.py`` maps. Here: one round trip, within its deadline on
a connection pgsolo opened, and, for a task, safe from the caller's cancellation (a thread
is never cancelled halfway through one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from .._acompat import aundisturbed
from .._logging import drivers_logger as logger
from ._psycopg import finish_interrupted, start_deadline

__all__ = ["around_trip", "round_trip"]


T = TypeVar("T")

_SETTLE_SECONDS = 5.0
# psycopg's own handling of a cancelled round trip: a cancel request, then a wait for the
# answer, 5 s each; from 3.3.6 it then closes the connection, before it waits unbounded.
_PSYCOPG_OWN_SETTLING = 2 * _SETTLE_SECONDS + 1.0


def round_trip(
    conn: psycopg.Connection[Any], wait: float, fetch: Callable[..., T], *args: Any
) -> T:
    """``fetch(*args)``, a round trip on ``conn`` that may wait ``wait`` seconds for a
    lock, within its deadline on a connection pgsolo opened (:func:`start_deadline`)."""
    deadline = start_deadline(conn, wait)
    try:
        value = fetch(*args)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            finish_interrupted(conn)
        if deadline is not None:
            deadline.end(exc)
        raise
    if deadline is not None:
        deadline.end()
    return value


async def around_trip(
    conn: psycopg.AsyncConnection[Any],
    wait: float,
    fetch: Callable[..., Awaitable[T]],
    *args: Any,
) -> T:
    """``await fetch(*args)``, the same round trip, safe to cancel.

    psycopg's own handling of a cancelled task is not safe enough for a lock: a cancel
    request that reaches the server just before the statement starts is ignored, so
    psycopg waits 5s and then closes the connection, and a lock wait would go on
    meanwhile. So the round trip runs shielded in a task of its own; if the caller is
    cancelled, :func:`_settle` cancels the statement on the server (repeating the request
    until it takes), lets the round trip finish, and only then does the cancellation go on.
    """
    deadline = start_deadline(conn, wait)
    call = _Call()
    block = asyncio.ensure_future(_owning(conn, call, fetch, args))
    try:
        value = await asyncio.shield(block)
    except asyncio.CancelledError:
        await _settle(conn, block, call)
        if deadline is not None:
            deadline.end()
        raise
    except BaseException as exc:
        if deadline is not None:
            deadline.end(exc)
        raise
    if deadline is not None:
        deadline.end()
    return value


class _Call:
    owns_connection = False


async def _owning(
    conn: psycopg.AsyncConnection[Any],
    call: _Call,
    fetch: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
) -> T:
    # psycopg takes the connection's lock at once when it is free: then the statements
    # on the server are ours, and cancelling them hits nobody else. (fetch is called
    # here, not by the caller: a task cancelled before it starts leaves no coroutine
    # behind that was never awaited.)
    call.owns_connection = not conn.lock.locked()
    return await fetch(*args)


async def _settle(
    conn: psycopg.AsyncConnection[Any], block: asyncio.Future[Any], call: _Call
) -> None:
    """Bring an interrupted round trip to its end, bounded.

    Cancel its statement on the server, again every quarter of a second (a request
    that arrives before the statement starts, or between two statements of a
    pipeline, is ignored by the server). If another task was using the connection
    when the round trip started, its statement could be the one running: cancel only
    our task then, as psycopg would. After a few seconds, give up the same way. If
    psycopg's own cancellation has not ended the round trip either (before 3.3.6 it waits
    for the server's answer without a bound), close the connection: its state is unknown.
    Further cancellations of the caller are absorbed: it is already on its way out
    with one.
    """
    loop = asyncio.get_running_loop()
    give_up = loop.time() + _SETTLE_SECONDS
    close_at = give_up + _PSYCOPG_OWN_SETTLING
    handed_over = False
    while not block.done():
        try:
            if call.owns_connection and loop.time() < give_up:
                # To the end, though cancelled again: a request still on its way when the
                # round trip ends would cancel the caller's next statement instead.
                await aundisturbed(conn.cancel_safe(timeout=_SETTLE_SECONDS), _SETTLE_SECONDS)
            elif not handed_over:  # once: a second interruption makes psycopg close it
                handed_over = True
                block.cancel()
            elif loop.time() >= close_at:
                if not conn.closed:
                    logger.warning("pgsolo: closing a connection whose statement never ended")
                    conn.pgconn.finish()
                block.cancel()  # its wait is on a socket that is gone
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            logger.warning("pgsolo: cancelling an interrupted statement failed: %r", exc)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({block}, timeout=0.25)
    if not block.cancelled():
        block.exception()  # retrieved: the caller's cancellation is what propagates
