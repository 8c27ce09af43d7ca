"""The connections pgsolo opens itself: autocommit, named in ``pg_stat_activity``, with a
connect timeout, and a deadline on every round trip pgsolo makes on them.

Which server (``--dsn``, the environment, ``embedded``) is :mod:`pgsolo.dsn`'s business;
the parameters are :mod:`pgsolo.drivers.conninfo`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, timeout_from_conninfo

from ..dsn import DsnChoice, resolved_dsn
from ..errors import DatabaseUnavailableError, InvalidDsnError, PgsoloError
from . import bound_answers
from .conninfo import DEFAULT_ANSWER_TIMEOUT, conninfo_for, redact_dsn, scrub_secrets

__all__ = ["aopen_connection", "open_connection"]


@contextmanager
def open_connection(
    dsn: str,
    *,
    application_name: str,
    defaults: Mapping[str, str] | None = None,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection named ``application_name``, on which each of pgsolo's
    round trips must be answered within ``answer_timeout`` seconds (plus any lock wait).

    ``defaults`` are libpq parameters used where the connection string does not set them
    itself; by default :func:`connection_settings`. A connection string that cannot be
    parsed raises :class:`~pgsolo.InvalidDsnError`; a server that cannot be reached in
    time, :class:`~pgsolo.DatabaseUnavailableError`.
    """
    with resolved_dsn(DsnChoice(dsn, "caller")) as resolved:
        conninfo = conninfo_for(resolved, application_name, defaults)
        try:
            conn = psycopg.connect(conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise _connect_error(exc, resolved, conninfo) from _cause(exc)
        with conn:
            bound_answers(conn, answer_timeout)
            yield conn


@asynccontextmanager
async def aopen_connection(
    dsn: str,
    *,
    application_name: str,
    defaults: Mapping[str, str] | None = None,
    answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The async twin of :func:`open_connection`."""
    with resolved_dsn(DsnChoice(dsn, "caller")) as resolved:
        conninfo = conninfo_for(resolved, application_name, defaults)
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise _connect_error(exc, resolved, conninfo) from _cause(exc)
        async with conn:
            bound_answers(conn, answer_timeout)
            yield conn


def _connect_error(exc: psycopg.Error, dsn: str, conninfo: str) -> PgsoloError:
    if isinstance(exc, psycopg.ProgrammingError):  # a parameter libpq does not take
        # libpq's message may quote a password: the cause is not chained either.
        return InvalidDsnError(
            "the connection string cannot be used (libpq's message is not shown: it may"
            " contain a password)"
        )
    message = scrub_secrets(" ".join(str(exc).split()), dsn)
    if isinstance(exc, psycopg.errors.ConnectionTimeout):
        message += f" (connect_timeout {timeout_from_conninfo(conninfo_to_dict(conninfo))}s)"
    return DatabaseUnavailableError(
        f"cannot connect to {redact_dsn(dsn) or 'the libpq defaults'}: {message}"
    )


def _cause(exc: psycopg.Error) -> psycopg.Error | None:
    return None if isinstance(exc, psycopg.ProgrammingError) else exc
