"""The lock a connection of each library gives, as ``mypy --strict`` sees it (``.ci/run``
checks this directory): sync connections give a ``Lock``, async ones an ``AsyncLock``.
SQLAlchemy is typed; asyncpg, psycopg2 and Django ship no types, so their connections are
``Any`` and the call is too.

Only type-checked, never run: no test collects this module.
"""

from __future__ import annotations

from typing import Any, assert_type

import psycopg
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

import pgsolo
from pgsolo import AsyncLock, Lock


def sync_kinds(conn: psycopg.Connection[Any], sa: Connection, session: Session) -> None:
    assert_type(pgsolo.xact_lock(conn, "k"), Lock)
    assert_type(pgsolo.xact_lock(sa, "k"), Lock)
    assert_type(pgsolo.session_lock(session, "k"), Lock)


def async_kinds(
    conn: psycopg.AsyncConnection[Any], sa: AsyncConnection, session: AsyncSession
) -> None:
    assert_type(pgsolo.xact_lock(conn, "k"), AsyncLock)
    assert_type(pgsolo.xact_lock(sa, "k"), AsyncLock)
    assert_type(pgsolo.session_lock(session, "k"), AsyncLock)
