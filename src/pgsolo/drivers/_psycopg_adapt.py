"""Which adapter a psycopg 3 connection gets (see :func:`pgsolo.drivers.adapt`): apart
from the adapters, which import their shared base, so that nothing imports in a circle."""

from __future__ import annotations

import psycopg

from . import AsyncDriver, SyncDriver
from ._async.psycopg_driver import AsyncPsycopgDriver
from ._sync.psycopg_driver import PsycopgDriver

__all__ = ["adapt"]


def adapt(connection: object) -> SyncDriver | AsyncDriver | None:
    if isinstance(connection, psycopg.Connection):
        return PsycopgDriver(connection)
    if isinstance(connection, psycopg.AsyncConnection):
        return AsyncPsycopgDriver(connection)
    return None
