"""A semaphore as ``mypy --strict`` sees it (``.ci/run`` checks this directory): a
``Semaphore`` on a sync connection, an ``AsyncSemaphore`` on an async one.

Only type-checked, never run: no test collects this module.
"""

from __future__ import annotations

from typing import Any, assert_type

import psycopg

import pgsolo
from pgsolo import AsyncSemaphore, Semaphore


def sync_slots(conn: psycopg.Connection[Any]) -> None:
    held = pgsolo.semaphore(conn, "exports", limit=3)
    assert_type(held, Semaphore)
    with held as slot:
        assert_type(slot.acquired, bool)
        assert_type(slot.slot, int | None)


async def async_slots(conn: psycopg.AsyncConnection[Any]) -> None:
    async with pgsolo.semaphore(conn, "exports", limit=3, wait=5.0) as slot:
        assert_type(slot, AsyncSemaphore)
        assert_type(slot.token, int | None)
