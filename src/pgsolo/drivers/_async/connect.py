"""The async connections pgsolo opens itself; see :mod:`pgsolo.drivers.connect`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from ...dsn import DsnChoice, resolved_dsn
from .._psycopg import bound_answers
from ..conninfo import DEFAULT_ANSWER_TIMEOUT, connect_error, connect_error_cause, conninfo_for

__all__ = ["aopen_connection"]


@asynccontextmanager
async def aopen_connection(
    dsn: str,
    *,
    application_name: str,
    defaults: Mapping[str, str] | None = None,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection named ``application_name``, on which each of pgsolo's
    round trips must be answered within ``answer_timeout`` seconds (plus any lock wait).

    ``defaults`` are libpq parameters used where the connection string does not set them
    itself; by default :func:`~pgsolo.drivers.conninfo.connection_settings`. A connection
    string that cannot be parsed raises :class:`~pgsolo.InvalidDsnError`; a server that
    cannot be reached in time, :class:`~pgsolo.DatabaseUnavailableError`.
    """
    with resolved_dsn(DsnChoice(dsn, "caller")) as resolved:
        conninfo = conninfo_for(resolved, application_name, defaults)
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise connect_error(exc, resolved, conninfo) from connect_error_cause(exc)
        async with conn:
            bound_answers(conn, answer_timeout)
            yield conn
