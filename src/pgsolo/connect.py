"""Connections that pgsolo opens itself: autocommit, named in ``pg_stat_activity``.

Which connection string to use, and how to show one without its password, is
:mod:`pgsolo.dsn`'s business; this module only opens what it is given.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo

from .drivers import bound_answers
from .dsn import DsnChoice, parse_dsn, redact_dsn, resolved_dsn, scrub_secrets
from .errors import DatabaseUnavailableError, InvalidDsnError, PgsoloError

__all__ = [
    "DEFAULT_APP_PREFIX",
    "aopen_connection",
    "application_name_for",
    "connection_settings",
    "conninfo_for",
    "open_connection",
]

DEFAULT_APP_PREFIX = "pgsolo:"
MAX_APPLICATION_NAME = 63  # PostgreSQL truncates longer names (NAMEDATALEN - 1)
DEFAULT_CONNECT_TIMEOUT = 5  # seconds to open a connection, each host of a multi-host DSN
DEFAULT_ANSWER_TIMEOUT = 30.0  # seconds the server has to answer each of pgsolo's statements
KEEPALIVE_BASIS = 10.0  # seconds; what TCP keepalives are sized from by default
_KEEPALIVE_PROBES = 3


def application_name_for(dsn: str, default: str, explicit: str | None = None) -> str:
    """The name a connection shows in ``pg_stat_activity``: an explicit one, else one
    already in the DSN or in ``PGAPPNAME``, else pgsolo's default."""
    if explicit:
        return explicit
    try:
        given = conninfo_to_dict(dsn).get("application_name") if dsn else None
    except psycopg.Error:
        given = None
    return str(given or os.environ.get("PGAPPNAME") or default)[:MAX_APPLICATION_NAME]


def connection_settings(
    check_timeout: float = KEEPALIVE_BASIS, *, connect_timeout: float | None = None
) -> dict[str, str]:
    """libpq parameters for pgsolo's own connections: TCP keepalives sized from how long
    the server may take to answer (``pgsolo run --check-timeout``) notice a dead peer on
    an idle connection, ``tcp_user_timeout`` one that stops acknowledging what pgsolo
    sends (both ignored on a unix socket), and ``connect_timeout`` bounds each attempt
    to connect. What the connection string sets itself wins, and so does
    ``PGCONNECT_TIMEOUT`` over pgsolo's default (not over an explicit ``connect_timeout``).
    """
    settings = {
        "keepalives": "1",
        "keepalives_idle": str(max(1, math.ceil(check_timeout / 2))),
        "keepalives_interval": str(max(1, math.ceil(check_timeout / (2 * _KEEPALIVE_PROBES)))),
        "keepalives_count": str(_KEEPALIVE_PROBES),
        "tcp_user_timeout": str(max(1, math.ceil(check_timeout * 1000))),
    }
    if connect_timeout is not None:
        settings["connect_timeout"] = str(max(1, math.ceil(connect_timeout)))
    elif not os.environ.get("PGCONNECT_TIMEOUT"):
        settings["connect_timeout"] = str(DEFAULT_CONNECT_TIMEOUT)
    return settings


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


def conninfo_for(dsn: str, application_name: str, defaults: Mapping[str, str] | None = None) -> str:
    """``dsn`` with pgsolo's name for the connection and the ``defaults`` it leaves
    unset (what it says itself wins)."""
    given = parse_dsn(dsn)
    if defaults is None:
        defaults = connection_settings()
    extra = {k: v for k, v in defaults.items() if given.get(k) in (None, "")}
    extra["application_name"] = application_name[:MAX_APPLICATION_NAME]
    return make_conninfo(dsn, **extra)


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
