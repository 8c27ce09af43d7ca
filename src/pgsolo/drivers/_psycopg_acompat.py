"""What the two psycopg adapters differ by, as pairs of helpers in the manner of
:mod:`pgsolo._acompat`: one name for async code, the same without its leading ``a`` for
sync code, which ``scripts/unasync.py`` maps. Here: one round trip, within its deadline on
a connection pgsolo opened, and, for a task, safe from the caller's cancellation (a thread
is never cancelled halfway through one)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg import generators, pq

from .._acompat import aundisturbed
from .._logging import drivers_logger as logger
from ..sql import LockCall, WaitCall
from . import prepared
from ._psycopg import (
    Bound,
    Sending,
    by_name,
    dropped,
    executed,
    executed_again,
    executing,
    finish_interrupted,
    first_value,
    message,
    opens_first,
    past_deadline,
    preparable,
    sends_directly,
)
from .deadlines import DEADLINES

__all__ = ["around_trip", "round_trip"]


_SETTLE_SECONDS = 5.0
# psycopg's own handling of a cancelled round trip: a cancel request, then a wait for the
# answer, 5 s each; from 3.3.6 it then closes the connection, before it waits unbounded.
_PSYCOPG_OWN_SETTLING = 2 * _SETTLE_SECONDS + 1.0
_CANCEL_EVERY_SECONDS = 0.25


def round_trip(
    conn: psycopg.Connection[Any],
    wait: float,
    statements: Sequence[str],
    by_cursor: Callable[[Sequence[str]], object],
    bound: Bound | None,
) -> object:
    """The value ``statements`` answer on ``conn``, in one round trip that may wait
    ``wait`` seconds for a lock, within its deadline on a connection pgsolo opened
    (``bound``: its own, of ``ANSWER_WITHIN``; None on the caller's connections, which
    pgsolo never cuts). The driver's lowest-cost path where the connection allows
    it (:func:`sends_directly`): libpq's own message, read by psycopg's own generator under
    psycopg's lock, as a cursor would, without a cursor's bookkeeping; ``by_cursor``
    otherwise."""
    deadline = 0 if bound is None else DEADLINES.arm(bound.seconds + wait, bound.shut_down)
    try:
        with conn.lock:
            direct = sends_directly(conn)
            if (
                direct
                and len(statements) == 1
                and type(call := statements[0]) is LockCall
                and (form := preparable(conn, call))
            ):
                how, _ = prepared.how(conn, form.name, conn.prepare_threshold or 0)
                if how is prepared.BY_NAME:  # the common case: sent here (by_name)
                    pgconn = conn.pgconn
                    pgconn.send_query_prepared(form.name, list(form.params))
                    results = conn.wait(generators.execute(pgconn))
                    if dropped(conn, results):  # then as written
                        pgconn.send_query(message(statements))
                        results = conn.wait(generators.execute(pgconn))
                else:
                    results = _sent(conn, by_name(conn, form, statements, how))
                value = first_value(conn, results)
            elif (
                direct
                and type(waiting := statements[-1]) is WaitCall
                and (form := preparable(conn, waiting))
            ):
                how, _ = prepared.how(conn, form.name, conn.prepare_threshold or 0)
                if how is prepared.BY_NAME:  # the common case: sent here (executing)
                    pgconn = conn.pgconn
                    pgconn.send_query(executed(statements, waiting))
                    results = conn.wait(generators.execute(pgconn))
                    if dropped(conn, results):  # then as written
                        results = _sent(conn, executed_again(conn, statements))
                else:
                    results = _sent(conn, executing(conn, waiting, statements, how))
                value = first_value(conn, results)
            elif direct:
                conn.pgconn.send_query(message(statements))
                value = first_value(conn, conn.wait(generators.execute(conn.pgconn)))
            elif (opening := opens_first(conn)) is not None:
                # psycopg's BEGIN goes with the statements (see opens_first).
                direct = True
                conn.pgconn.send_query(message([opening, *statements]))
                value = first_value(conn, conn.wait(generators.execute(conn.pgconn)))
        if not direct:  # a cursor takes the connection's lock itself
            value = by_cursor(statements)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            finish_interrupted(conn)
        if bound is not None:
            past_deadline(bound, deadline, wait, exc)
        raise
    if bound is not None:
        DEADLINES.disarm(deadline)
    return value


def _sent(conn: psycopg.Connection[Any], sending: Sending) -> list[pq.abc.PGresult]:
    """What the last of the messages ``sending`` sends (:func:`by_name`) answered."""
    send = next(sending)
    while True:
        send()
        results = conn.wait(generators.execute(conn.pgconn))
        try:
            send = sending.send(results)
        except StopIteration as done:
            last: list[pq.abc.PGresult] = done.value
            return last


async def around_trip(
    conn: psycopg.AsyncConnection[Any],
    wait: float,
    statements: Sequence[str],
    by_cursor: Callable[[Sequence[str]], Awaitable[object]],
    bound: Bound | None,
) -> object:
    """The same round trip, safe to cancel.

    psycopg's own handling of a cancelled task is not safe enough for a lock: a cancel
    request that reaches the server just before the statement starts is ignored, so
    psycopg waits 5s and then closes the connection, and a lock wait would go on
    meanwhile. So pgsolo waits for the answer itself (:func:`_arrival`), and a cancellation
    of the caller lands there: :func:`_settle` cancels the statement on the server
    (repeating the request until it takes), lets the round trip finish, and only then
    does the cancellation go on. A round trip by cursor, or one that must first wait for
    the connection, runs shielded in a task of its own instead (:func:`_shielded`)."""
    deadline = 0 if bound is None else DEADLINES.arm(bound.seconds + wait, bound.shut_down)
    try:
        direct = sends_directly(conn)
        opening = None if direct else opens_first(conn)  # psycopg's BEGIN, with them
        if conn.lock.locked() or (not direct and opening is None):
            value = await _shielded(conn, by_cursor, statements)
        else:
            async with conn.lock:  # free, so taken without a pause: nothing came between
                if opening is not None:
                    send = functools.partial(
                        conn.pgconn.send_query, message([opening, *statements])
                    )
                    value = first_value(conn, await _adirect(conn, send))
                elif (
                    len(statements) == 1
                    and type(call := statements[0]) is LockCall
                    and (form := preparable(conn, call))
                ):
                    how, _ = prepared.how(conn, form.name, conn.prepare_threshold or 0)
                    if how is prepared.BY_NAME:  # the common case: sent here (by_name)
                        send = functools.partial(
                            conn.pgconn.send_query_prepared, form.name, list(form.params)
                        )
                        results = await _adirect(conn, send)
                        if dropped(conn, results):  # then as written
                            send = functools.partial(conn.pgconn.send_query, message(statements))
                            results = await _adirect(conn, send)
                    else:
                        results = await _asent(conn, by_name(conn, form, statements, how))
                    value = first_value(conn, results)
                elif type(waiting := statements[-1]) is WaitCall and (
                    form := preparable(conn, waiting)
                ):
                    how, _ = prepared.how(conn, form.name, conn.prepare_threshold or 0)
                    if how is prepared.BY_NAME:  # the common case: sent here (executing)
                        send = functools.partial(
                            conn.pgconn.send_query, executed(statements, waiting)
                        )
                        results = await _adirect(conn, send)
                        if dropped(conn, results):  # then as written
                            results = await _asent(conn, executed_again(conn, statements))
                    else:
                        results = await _asent(conn, executing(conn, waiting, statements, how))
                    value = first_value(conn, results)
                else:
                    send = functools.partial(conn.pgconn.send_query, message(statements))
                    value = first_value(conn, await _adirect(conn, send))
    except asyncio.CancelledError:
        if bound is not None:
            DEADLINES.disarm(deadline)
        raise
    except BaseException as exc:
        if bound is not None:
            past_deadline(bound, deadline, wait, exc)
        raise
    if bound is not None:
        DEADLINES.disarm(deadline)
    return value


async def _asent(conn: psycopg.AsyncConnection[Any], sending: Sending) -> list[pq.abc.PGresult]:
    """:func:`_sent` for a task."""
    send = next(sending)
    while True:
        results = await _adirect(conn, send)
        try:
            send = sending.send(results)
        except StopIteration as done:
            last: list[pq.abc.PGresult] = done.value
            return last


async def _adirect(
    conn: psycopg.AsyncConnection[Any], send: Callable[[], object]
) -> list[pq.abc.PGresult]:
    """One message sent straight to libpq, under the connection's lock the caller holds,
    and its results; a cancellation of the caller is settled first (:func:`_settle`)."""
    send()
    try:
        await _arrival(conn.pgconn)
    except asyncio.CancelledError:
        await _settle_direct(conn)
        raise
    # All there: read as psycopg's own generator reads it (notifications to the
    # connection's handler, then every result), without its wait, which would cost more
    # than the reading.
    pgconn = conn.pgconn
    while notification := pgconn.notifies():
        if pgconn.notify_handler:
            pgconn.notify_handler(notification)
    results = []
    while (result := pgconn.get_result()) is not None:
        results.append(result)
    return results


async def _arrival(pgconn: pq.abc.PGconn, within: float | None = None) -> bool:
    """Wait until the message sent on ``pgconn`` has gone and its whole answer is in,
    for at most ``within`` seconds if given; whether it is. pgsolo's own wait, not
    psycopg's, so that a cancellation of the caller lands where pgsolo handles it."""
    loop = asyncio.get_running_loop()
    give_up = None if within is None else loop.time() + within
    # A full socket buffer (never for a message of pgsolo's size) is waited on as well.
    while (writing := pgconn.flush()) or pgconn.is_busy():
        ready: asyncio.Future[bool] = loop.create_future()
        timer = None if give_up is None else loop.call_at(give_up, _set, ready, False)
        fd = pgconn.socket
        if writing:
            loop.add_writer(fd, _set, ready, True)
        else:
            loop.add_reader(fd, _set, ready, True)
        try:
            arrived = await ready
        finally:
            if writing:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)
            if timer is not None:
                timer.cancel()
        if not arrived:
            return False
        if not writing:
            pgconn.consume_input()
    return True


def _set(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


async def _settle_direct(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`_settle` for a round trip pgsolo sent itself; then what the server answered
    is read and dropped: the caller's cancellation is what goes on."""

    async def ended() -> bool:
        try:
            return await _arrival(conn.pgconn, _CANCEL_EVERY_SECONDS)
        except psycopg.OperationalError:
            return True  # broken, or closed by _settle: psycopg says so when it reads

    await _settle(conn, ended, owns_connection=True, hand_over=None)
    with contextlib.suppress(Exception):
        await conn.wait(generators.execute(conn.pgconn))


async def _shielded(
    conn: psycopg.AsyncConnection[Any],
    by_cursor: Callable[[Sequence[str]], Awaitable[object]],
    statements: Sequence[str],
) -> object:
    call = _Call()
    block = asyncio.ensure_future(_owning(conn, call, by_cursor, statements))
    try:
        return await asyncio.shield(block)
    except asyncio.CancelledError:

        async def ended() -> bool:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({block}, timeout=_CANCEL_EVERY_SECONDS)
            return block.done()

        await _settle(conn, ended, call.owns_connection, hand_over=block.cancel)
        if not block.cancelled():
            block.exception()  # retrieved: the caller's cancellation is what goes on
        raise


class _Call:
    owns_connection = False


async def _owning(
    conn: psycopg.AsyncConnection[Any],
    call: _Call,
    by_cursor: Callable[[Sequence[str]], Awaitable[object]],
    statements: Sequence[str],
) -> object:
    # psycopg takes the connection's lock at once when it is free: then the statements
    # on the server are ours, and cancelling them hits nobody else. (by_cursor is called
    # here, not by the caller: a task cancelled before it starts leaves no coroutine
    # behind that was never awaited.)
    call.owns_connection = not conn.lock.locked()
    return await by_cursor(statements)


async def _settle(
    conn: psycopg.AsyncConnection[Any],
    ended: Callable[[], Awaitable[bool]],
    owns_connection: bool,
    hand_over: Callable[[], object] | None,
) -> None:
    """Bring a round trip the caller's cancellation interrupted to its end, bounded.

    Cancel its statement on the server, again every quarter of a second (a request that
    arrives before the statement starts, or between two statements of a message, is
    ignored by the server). If another task was using the connection when the round trip
    started, its statement could be the one running: cancel only the round trip's task
    then (``hand_over``), as psycopg would. After a few seconds, give up the same way. If
    the round trip has still not ended when psycopg's own cancellation would have ended
    it (before 3.3.6 psycopg waits for the server's answer without a bound), close the
    connection: its state is unknown. Further cancellations of the caller are absorbed:
    it is already on its way out with one."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + _SETTLE_SECONDS
    close_at = give_up + _PSYCOPG_OWN_SETTLING
    handed_over = False
    while True:
        try:
            if owns_connection and loop.time() < give_up:
                # To the end, though cancelled again: a request still on its way when the
                # round trip ends would cancel the caller's next statement instead.
                await aundisturbed(conn.cancel_safe(timeout=_SETTLE_SECONDS), _SETTLE_SECONDS)
            elif not handed_over:  # once: a second interruption makes psycopg close it
                handed_over = True
                if hand_over is not None:
                    hand_over()
            elif loop.time() >= close_at:
                if not conn.closed:
                    logger.warning("pgsolo: closing a connection whose statement never ended")
                    conn.pgconn.finish()
                if hand_over is not None:
                    hand_over()  # its wait is on a socket that is gone
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            logger.warning("pgsolo: cancelling an interrupted statement failed: %r", exc)
        try:
            if await ended():
                return
        except asyncio.CancelledError:
            pass
