"""The one place pgsolo reads asyncpg's private attributes: what asyncpg offers no public
API for. Checked on asyncpg 0.29.0 to 0.32.0, the range pyproject.toml allows; `nox -s
lowest` runs the driver tests on the lowest, CI's suite on the newest. A new asyncpg
release is checked against this module before the upper bound moves.

- :func:`copy_out`: the COPY-out exchange of ``copy_from_query()``, which takes a whole
  simple-query script here; ``copy_from_query()`` itself wraps its query in ``COPY (...)``
  and so takes one SELECT. The one-round-trip design of the asyncpg adapter rests on it
  (its module docstring); the public calls cost a round trip per statement.
- :func:`address`, :func:`parameters`, :func:`client_socket`: where the connection goes
  and how it logged in (the database, user, password and TLS a probe connection needs to
  go to the same place), and its local address. ``get_settings()`` has none of them.
- :func:`queries_sent`: asyncpg's count of the statements it sent (what tells whether
  anything ran since pgsolo's last round trip); asyncpg keeps the server's transaction
  status to itself.
- :func:`releases`: how many times a pool took the connection back (a checkout's
  identity: ``Pool.release()`` unlocks every advisory lock).
- :func:`connection_behind`: the connection a pool's proxy stands for, ``None`` once it
  was released.
- :func:`caches_statements`: whether the caller left asyncpg's statement cache on (off,
  ``statement_cache_size=0``, says prepared statements would not survive the way to the
  server: a transaction-pooling proxy), which pgsolo's own prepared lock calls follow.
- :func:`open_protocol`: the connection's protocol while it is open, which answers what
  ``is_closed()`` and ``is_in_transaction()`` answer, read as they read it: each of them is
  a call of Python, asked a few times by every lock (six calls less per lock and unlock).
- :func:`kept_statement`: the state of a ``PreparedStatement`` (the statement's name on
  the session, and its types), kept for the session's life without the
  ``PreparedStatement``, which refers to its connection: pgsolo's books of what each
  session has prepared would keep a dropped connection alive.
- :func:`ready_run`: a prepared statement's run by the protocol, made ready to be called
  again and again, which works in every checkout of a pooled connection
  (``PreparedStatement`` refuses one made in an earlier checkout) and costs a lock and
  unlock 4 µs less.
- :func:`cancel_statement`: asyncpg's own cancel request, with a future that says when it
  was delivered (the public way, ``asyncio`` cancellation, may close the connection).
- :func:`transport_closing`: whether the socket has ended before asyncpg's protocol heard
  of it (a turn of the loop later), when a statement sent meanwhile fails as an internal
  error instead of a closed connection.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = [
    "address",
    "caches_statements",
    "cancel_statement",
    "client_socket",
    "connection_behind",
    "copy_out",
    "kept_statement",
    "open_protocol",
    "parameters",
    "queries_sent",
    "ready_run",
    "releases",
    "transport_closing",
]


async def copy_out(conn: Any, script: str, sink: Callable[[bytes], Awaitable[None]]) -> str:
    """Send ``script`` (whose one COPY ... TO STDOUT sends data) as one simple-query
    message; ``sink`` gets the data; the status of the last statement comes back."""
    conn._check_open()  # what copy_from_query() checks first
    return str(await conn._copy_out(script, sink, None) or "")


def address(conn: Any) -> object:
    """The server's address: (host, port), or a unix socket's path."""
    return conn._addr


def parameters(conn: Any) -> Any:
    """asyncpg's ``ConnectionParameters``: user, password, database, ssl, sslmode."""
    return conn._params


def client_socket(conn: Any) -> object:
    """The local address of the connection's socket; None if it has no transport."""
    transport = conn._transport
    return transport.get_extra_info("sockname") if transport is not None else None


def queries_sent(conn: Any) -> int:
    return int(conn._protocol.queries_count)


# A getter written in C, not a function: every lock asks it a few times.
releases: Callable[[Any], int] = operator.attrgetter("_pool_release_ctr")


def transport_closing(conn: Any) -> bool:
    """Whether the connection's socket has ended (the server closed it, say) though asyncpg
    has yet to learn it: its protocol hears of the end a turn of the loop later, and until
    then ``is_closed()`` says False."""
    transport = conn._transport
    return transport is None or bool(transport.is_closing())


def connection_behind(proxy: Any) -> Any:
    return proxy._con


def cancel_statement(conn: Any, delivered: asyncio.Future[None]) -> None:
    """Ask the server to cancel the running statement; ``delivered`` is done once the
    request has been sent."""
    conn._cancel_current_command(delivered)


def open_protocol(conn: Any) -> Any:
    """``conn``'s protocol if the connection is open, else None: ``conn.is_closed()`` is
    False exactly when this is not None (a connection that closes drops its protocol, in
    ``Connection._abort()``). Its ``is_in_transaction()`` is ``conn``'s."""
    protocol = conn._protocol
    return protocol if protocol is not None and protocol.is_connected() else None


def kept_statement(statement: Any) -> Any:
    """The state of ``statement`` (a ``PreparedStatement``), counted as one more holder
    of it, as a ``PreparedStatement`` counts itself: when ``statement`` goes, asyncpg
    closes the statement on the server only once no holder is left, and this one stays
    for the session's life."""
    state = statement._state
    state.attach()
    return state


def ready_run(protocol: Any, state: Any, args: Sequence[object]) -> Callable[[], Awaitable[Any]]:
    """The run of the prepared statement of ``state`` (:func:`kept_statement`) with
    ``args`` by ``protocol`` (the open one of its connection, :func:`open_protocol`), ready
    to be called, in C, with nothing to look up: what a lone lock call runs
    (``_asyncpg.Checkout``). Called, the awaitable of its rows.

    The protocol's own call, as ``fetchval()`` makes it under three coroutines of its
    own, less what pgsolo must not inherit: ``fetchval()`` refuses a statement prepared
    before the pool last took the connection back, while the server session, which has
    the statement, is the same (pgsolo's lock calls are prepared once per session). A
    connection talks through one protocol for its life, which refers to the connection
    weakly: kept, the run keeps nothing alive."""
    return functools.partial(protocol.bind_execute, state, args, "", 1, False, None)


def caches_statements(conn: Any) -> bool:
    return int(conn._stmt_cache.get_max_size()) > 0
