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
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .dsn import DsnChoice, resolved_dsn

__all__ = [
    "DEFAULT_APP_PREFIX",
    "aopen_connection",
    "application_name_for",
    "connection_settings",
    "open_connection",
]

DEFAULT_APP_PREFIX = "pgsolo:"
MAX_APPLICATION_NAME = 63  # PostgreSQL truncates longer names (NAMEDATALEN - 1)
DEFAULT_ANSWER_TIMEOUT = 10.0  # seconds; what keepalives are sized from by default
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


def connection_settings(check_timeout: float, *, connect: bool = False) -> dict[str, str]:
    """libpq parameters for pgsolo's own connections, sized from how long the server may
    take to answer (``pgsolo run --check-timeout``): TCP keepalives notice a dead peer on
    an idle connection, ``tcp_user_timeout`` one that stops acknowledging what pgsolo
    sends (both ignored on a unix socket); with ``connect``, a ``connect_timeout`` too.
    A DSN that sets any of them keeps its value."""
    settings = {
        "keepalives": "1",
        "keepalives_idle": str(max(1, math.ceil(check_timeout / 2))),
        "keepalives_interval": str(max(1, math.ceil(check_timeout / (2 * _KEEPALIVE_PROBES)))),
        "keepalives_count": str(_KEEPALIVE_PROBES),
        "tcp_user_timeout": str(max(1, math.ceil(check_timeout * 1000))),
    }
    if connect:
        settings["connect_timeout"] = str(max(2, math.ceil(check_timeout)))  # libpq's minimum
    return settings


@contextmanager
def open_connection(
    dsn: str, *, application_name: str, defaults: Mapping[str, str] | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection named ``application_name``.

    ``defaults`` are libpq parameters (``keepalives_idle``, ``connect_timeout``...) used
    where the connection string does not set them itself; by default TCP keepalives
    sized for a dead peer to be noticed within about ten seconds.
    """
    if defaults is None:
        defaults = connection_settings(DEFAULT_ANSWER_TIMEOUT)
    with resolved_dsn(DsnChoice(dsn, "caller")) as resolved:
        name = application_name[:MAX_APPLICATION_NAME]
        conninfo = _with_defaults(resolved, defaults)
        with psycopg.connect(conninfo, autocommit=True, application_name=name) as conn:
            yield conn


def _with_defaults(conninfo: str, defaults: Mapping[str, str] | None) -> str:
    """``conninfo`` plus the ``defaults`` it leaves unset (what it says itself wins)."""
    if not defaults:
        return conninfo
    try:
        given = conninfo_to_dict(conninfo) if conninfo else {}
    except psycopg.Error:
        return conninfo  # psycopg.connect reports the bad string itself
    extra = {k: v for k, v in defaults.items() if given.get(k) in (None, "")}
    return make_conninfo(conninfo, **extra) if extra else conninfo


@asynccontextmanager
async def aopen_connection(
    dsn: str, *, application_name: str
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    with resolved_dsn(DsnChoice(dsn, "caller")) as resolved:
        name = application_name[:MAX_APPLICATION_NAME]
        conninfo = _with_defaults(resolved, connection_settings(DEFAULT_ANSWER_TIMEOUT))
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, application_name=name
        )
        async with conn:
            yield conn
