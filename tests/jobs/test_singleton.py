"""The ``@singleton`` decorator on sync and async functions: it validates when it decorates,
its options reach the run, and it falls back on ``PGSOLO_DSN``.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from _support import (
    CLOSED_PORT_DSN,
    IDLE,
    INTRANS,
    Boom,
    Connect,
    app_name_of,
    hold,
    new_job,
    unhold,
)
from pgsolo import DatabaseUnavailableError, InvalidKeyError, UsageError
from pgsolo.jobs import JobResult, singleton

# -- sync jobs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "options", "error"),
    [
        (-(2**63) - 1, {}, InvalidKeyError),
        ("jobs-test:valid", {"lifetime": "forever"}, UsageError),
        ("jobs-test:valid", {"wait": -1}, UsageError),
        ("jobs-test:valid", {"period": "fortnight"}, UsageError),
        ("jobs-test:valid", {"lifetim": "session"}, UsageError),  # a typo is not a kwarg
    ],
)
def test_singleton_validates_when_it_decorates(
    key: Any, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        singleton(key, dsn=CLOSED_PORT_DSN, **options)


def test_singleton_decorates_a_sync_function(db: str, connect: Connect, observer: Any) -> None:
    job = new_job()

    @singleton(job, dsn=db, period="day")
    def settle(conn: psycopg.Connection, region: str, *, dry_run: bool) -> tuple[Any, ...]:
        """Settle one region."""
        return (
            conn.info.transaction_status,
            region,
            dry_run,
            app_name_of(observer, conn.info.backend_pid),
        )

    assert settle.__name__ == "settle"
    assert settle.__doc__ == "Settle one region."
    first = settle("eu", dry_run=False)
    second = settle("eu", dry_run=False)

    assert isinstance(first, JobResult)
    assert first.outcome == "completed"
    assert first.value == (INTRANS, "eu", False, f"pgsolo:{job}")
    assert (second.outcome, second.reason) == ("skipped", "already-done-this-period")


def test_singleton_options_reach_the_run(db: str, connect: Connect) -> None:
    job = new_job()

    @singleton(job, dsn=db, lifetime="session", raise_errors=False, wait=0.2)
    def flaky(conn: psycopg.Connection) -> None:
        assert conn.info.transaction_status == IDLE
        raise Boom("x")

    result = flaky()
    assert result.outcome == "failed"
    assert isinstance(result.error, Boom)
    holder = hold(connect, job)
    assert (flaky().outcome, flaky().reason) == ("skipped", "busy")
    unhold(holder, job)


def test_singleton_uses_pgsolo_dsn_when_no_dsn_is_given(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job()
    monkeypatch.delenv("PGSOLO_DSN", raising=False)

    @singleton(job)
    def report(conn: psycopg.Connection, n: int) -> tuple[str, int]:
        return conn.info.dbname, n

    monkeypatch.setenv("PGSOLO_DSN", db)  # read when the job runs, not when it is defined
    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_DSN)  # PGSOLO_DSN comes first
    result = report(3)

    assert result.outcome == "completed"
    assert result.value == (observer.conn.info.dbname, 3)


# Where libpq looks when a connection string names nothing (pgsolo.dsn).
LIBPQ_WHERE = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def test_without_a_database_the_error_says_how_to_name_one_before_connecting() -> None:
    # In a process of its own: this one may have configured Django, which adds using=.
    source = (
        "import pgsolo\n"
        "@pgsolo.singleton('jobs-test:nowhere')\n"
        "def report(conn): raise AssertionError('not run')\n"
        "try: report()\n"
        "except pgsolo.UsageError as exc: print(exc)\n"
    )
    unset = ("PGSOLO_DSN", "DATABASE_URL", *LIBPQ_WHERE)
    env = {name: value for name, value in os.environ.items() if name not in unset}
    done = subprocess.run(
        [sys.executable, "-c", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert "dsn='postgresql://...'" in done.stdout
    assert "PGSOLO_DSN" in done.stdout
    assert "PGHOST" in done.stdout
    assert "using=" not in done.stdout  # no Django here


def test_a_libpq_variable_still_says_where_to_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGSOLO_DSN", "DATABASE_URL", *LIBPQ_WHERE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")  # nothing listens: the connect is tried, and fails

    @singleton("jobs-test:libpq")
    def report(conn: psycopg.Connection) -> None:
        raise AssertionError("not run")

    with pytest.raises(DatabaseUnavailableError, match="the libpq defaults"):
        report()


# -- async jobs ----------------------------------------------------------------------------


async def test_singleton_decorates_an_async_function(db: str, observer: Any) -> None:
    job = new_job("jobs-async-test")

    @singleton(job, dsn=db, period="day")
    async def settle(
        conn: psycopg.AsyncConnection[Any], region: str, *, dry_run: bool
    ) -> tuple[Any, ...]:
        """Settle one region."""
        return conn.info.transaction_status, region, dry_run

    assert settle.__name__ == "settle"
    assert settle.__doc__ == "Settle one region."
    first = await settle("eu", dry_run=True)
    second = await settle("eu", dry_run=True)

    assert isinstance(first, JobResult)
    assert (first.outcome, first.value) == ("completed", (INTRANS, "eu", True))
    assert (second.outcome, second.reason) == ("skipped", "already-done-this-period")


async def test_singleton_uses_pgsolo_dsn_when_no_dsn_is_given_async(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job("jobs-async-test")
    monkeypatch.delenv("PGSOLO_DSN", raising=False)

    @singleton(job, lifetime="session")
    async def report(conn: psycopg.AsyncConnection[Any], n: int) -> tuple[str, int, Any]:
        return conn.info.dbname, n, conn.info.transaction_status

    monkeypatch.setenv("PGSOLO_DSN", db)
    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_DSN)
    result = await report(3)

    assert result.outcome == "completed"
    assert result.value == (observer.conn.info.dbname, 3, IDLE)


def test_singleton_validates_an_async_definition_when_it_decorates() -> None:
    with pytest.raises(UsageError):
        singleton("jobs-async-test:valid", dsn=CLOSED_PORT_DSN, lifetime="forever")


def test_the_decorated_function_shows_its_callers_signature(db: str) -> None:
    """Regression: ``inspect.signature`` (and so help() and IDEs) showed the wrapped
    function's ``conn`` first, which callers must not pass: the docs say the decorated
    function keeps its own signature for callers."""

    @singleton("jobs-test:signature", dsn=db)
    def settle(conn: object, day: str, *, dry_run: bool = False) -> int:
        return 1

    @singleton("jobs-test:signature-async", dsn=db)
    async def asettle(conn: object, day: str) -> int:
        return 1

    shown = inspect.signature(settle)
    assert list(shown.parameters) == ["day", "dry_run"]
    assert shown.return_annotation is JobResult
    assert list(inspect.signature(asettle).parameters) == ["day"]
    assert settle("2026-12-06").value == 1
