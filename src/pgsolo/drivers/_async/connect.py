"""The async connections pgsolo opens itself; see :mod:`pgsolo.drivers.connect`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from ... import sql
from ..._logging import drivers_logger as logger
from ...dsn import DsnChoice, resolved_dsn
from ...errors import PgsoloError
from .._psycopg import bound_answers, over_unix_socket
from ..conninfo import (
    DEFAULT_ANSWER_TIMEOUT,
    KEEPALIVE_BASIS,
    connect_error,
    conninfo_for,
    scrub_secrets,
    server_keepalives,
)
from .psycopg_driver import AsyncPsycopgDriver

__all__ = ["aopen_connection"]


@asynccontextmanager
async def aopen_connection(
    dsn: str,
    *,
    application_name: str,
    defaults: Mapping[str, str] | None = None,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
    check_timeout: float = KEEPALIVE_BASIS,
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection named ``application_name``, on which each of pgsolo's
    round trips must be answered within ``answer_timeout`` seconds (plus any lock wait).

    ``defaults`` are libpq parameters used where the connection string does not set them
    itself; by default :func:`~pgsolo.drivers.conninfo.connection_settings`. The server
    gives the connection up once it has heard nothing of it for about 1.3 x
    ``check_timeout`` (:func:`~pgsolo.drivers.conninfo.server_keepalives`), so that the
    session locks of a host that was cut off do not outlive it by hours (over TCP: on a
    unix socket the server learns at once that a client died). A connection
    string that cannot be parsed raises :class:`~pgsolo.InvalidDsnError`; a server that
    cannot be reached in time, :class:`~pgsolo.DatabaseUnavailableError`.
    """
    with resolved_dsn(DsnChoice(dsn, "caller")) as resolved:
        conninfo = conninfo_for(resolved, application_name, defaults)
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        except psycopg.Error as exc:
            failure: PgsoloError | None = connect_error(exc, resolved, conninfo)
        else:
            failure = None
        if failure is not None:  # out of the except: psycopg's error is not its context
            raise failure
        opened_in = os.getpid()
        try:
            bound_answers(conn, answer_timeout)
            if not over_unix_socket(conn):  # on a unix socket, no TCP for them to watch
                await _watch_client(conn, check_timeout, dsn)
            yield conn
        finally:
            # In a child of fork() the connection is a copy of the parent's session:
            # closing it would tell the server to end that session, and the parent's locks
            # with it (a child's asyncio.run() closes the suspended generators it inherited).
            if os.getpid() == opened_in:
                await conn.close()


async def _watch_client(conn: psycopg.AsyncConnection[Any], check_timeout: float, dsn: str) -> None:
    """Size the server's keepalives for the session (:func:`server_keepalives`)."""
    failure: PgsoloError | None = None
    try:  # pgsolo's own round trip: bounded by answer_timeout like every other
        await AsyncPsycopgDriver(conn).fetch_value(
            [sql.watch_client(server_keepalives(check_timeout))]
        )
    except psycopg.Error as exc:
        if conn.closed:  # the server went, or never answered: not a mere refusal
            failure = connect_error(exc, dsn, dsn)
        else:  # a proxy that refuses it: the locks still work, watched by the keeper
            logger.debug(
                "pgsolo: the server's keepalives were not set: %s", scrub_secrets(str(exc), dsn)
            )
    if failure is not None:  # out of the except: psycopg's error is not its context
        raise failure
