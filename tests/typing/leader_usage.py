"""A leader's term as ``mypy --strict`` sees it (``.ci/run`` checks this directory): a
``Term`` from ``leader()``, an ``AsyncTerm`` from ``leader_async()``, on a connection
string or a connection of the matching flavour.

Only type-checked, never run: no test collects this module.
"""

from __future__ import annotations

from typing import Any, assert_type

import psycopg

import pgsolo
from pgsolo import AsyncTerm, Term


def sync_terms(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgsolo.leader(dsn, "scheduler") as term:
        assert_type(term, Term)
        assert_type(term.token, int | None)
        assert_type(term.wait_lost(1.0), bool)
    with pgsolo.leader(conn, "scheduler", wait=5, keep=pgsolo.Keep(interval=0.5)) as term:
        assert_type(term.lost, bool)
        assert_type(term.loss, pgsolo.LockLostError | None)


async def async_terms(dsn: str, conn: psycopg.AsyncConnection[Any]) -> None:
    async with pgsolo.leader_async(dsn, "scheduler") as term:
        assert_type(term, AsyncTerm)
        assert_type(await term.wait_lost(), bool)
    async with pgsolo.leader_async(conn, "scheduler", fencing=False) as term:
        assert_type(term.since, float)


def campaigns(dsn: str) -> None:
    def lead(term: Term) -> None:
        assert_type(term.token, int | None)

    assert_type(pgsolo.campaign(dsn, "scheduler", lead), None)


async def async_campaigns(dsn: str) -> None:
    async def lead(term: AsyncTerm) -> None:
        assert_type(await term.wait_lost(1.0), bool)

    assert_type(await pgsolo.campaign_async(dsn, "scheduler", lead), None)
