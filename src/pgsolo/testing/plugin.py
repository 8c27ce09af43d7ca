"""The pytest plugin of ``pgsolo[testing]`` (entry point ``pytest11``): fixtures only.

It defines no hook and no autouse fixture: a suite that asks for none of its fixtures runs
exactly as without it (no server starts). Every fixture's name starts with ``pgsolo_``, so
that none shadows one of yours (and yours of the same name win anyway).

A fixture that finds no PgBouncer or no server binaries skips the test that asked, with
the reason; one told where to find them (``PGSOLO_PGBOUNCER_BIN``, ``PGSOLO_PG_BIN``) that
does not work fails it.

Every pytest run of whoever installed ``pgsolo[testing]`` loads it (the entry point): so it
imports pytest and nothing heavy, and a fixture's helpers (psycopg, the embedded server,
the library) load when a test first asks for it, through :mod:`pgsolo.testing`'s names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import TypeVar

import pytest

from pgsolo import testing

from .errors import Unavailable

__all__ = [
    "DSN_ENV",
    "STANDBY_ENV",
    "pgsolo_bouncer",
    "pgsolo_dsn",
    "pgsolo_relay",
    "pgsolo_replica_pair",
    "pgsolo_replicas",
    "pgsolo_server",
    "pgsolo_session_bouncer",
]

DSN_ENV = "PGSOLO_TEST_DSN"  # the server to test against, instead of a throwaway one
STANDBY_ENV = "PGSOLO_TEST_STANDBY_DSN"  # a hot standby streaming from DSN_ENV's server

T = TypeVar("T")


def _entered(manager: AbstractContextManager[T]) -> Iterator[T]:
    """What ``manager`` gives, for the length of a fixture; a skip when it is
    :class:`~pgsolo.testing.Unavailable`."""
    with ExitStack() as stack:
        try:
            value = stack.enter_context(manager)
        except Unavailable as exc:
            pytest.skip(str(exc))
        yield value


@pytest.fixture(scope="session")
def pgsolo_dsn() -> Iterator[str]:
    """A real PostgreSQL for the whole session: ``$PGSOLO_TEST_DSN`` when it is set, else a
    throwaway embedded server (``pgsolo[embedded]``), deleted at the end."""
    configured = os.environ.get(DSN_ENV)
    if configured:
        yield configured
        return
    with testing.throwaway_server() as server:
        yield server.dsn


@pytest.fixture
def pgsolo_server() -> Iterator[testing.Server]:
    """A throwaway embedded server of this test's own, to restart, pause or shut down."""
    with testing.throwaway_server() as server:
        yield server


@pytest.fixture
def pgsolo_relay(pgsolo_dsn: str) -> Iterator[testing.Relay]:
    """A TCP relay in front of ``pgsolo_dsn``: connect to ``pgsolo_relay.dsn``, then cut
    the network with ``blackhole()``, ``freeze()`` or ``reset()``."""
    with testing.Relay(pgsolo_dsn) as relay:
        yield relay


@pytest.fixture(scope="session")
def pgsolo_bouncer(pgsolo_dsn: str) -> Iterator[testing.Bouncer]:
    """A real PgBouncer in transaction pooling mode in front of ``pgsolo_dsn``."""
    yield from _entered(testing.running_bouncer(pgsolo_dsn, "transaction"))


@pytest.fixture(scope="session")
def pgsolo_session_bouncer(pgsolo_dsn: str) -> Iterator[testing.Bouncer]:
    """A real PgBouncer in session pooling mode (a client keeps its server connection)."""
    yield from _entered(testing.running_bouncer(pgsolo_dsn, "session"))


@pytest.fixture(scope="session")
def pgsolo_replicas() -> Iterator[testing.Replicas]:
    """A primary and a hot standby streaming from it, shared by the session: never stop or
    promote them. ``$PGSOLO_TEST_DSN`` with ``$PGSOLO_TEST_STANDBY_DSN`` when both are
    set (checked), else a private pair."""
    primary, standby = os.environ.get(DSN_ENV), os.environ.get(STANDBY_ENV)
    if primary and standby:
        given = testing.Replicas(primary, standby)
        given.check()
        yield given
        return
    yield from _entered(testing.replica_pair())


@pytest.fixture
def pgsolo_replica_pair() -> Iterator[testing.ReplicaPair]:
    """A private primary and standby for one test, which may stop and promote them."""
    yield from _entered(testing.replica_pair())
