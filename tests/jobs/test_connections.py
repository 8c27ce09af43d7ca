"""The connections a job opens: its name in ``pg_stat_activity`` (``application_name``,
cut to what PostgreSQL keeps, unless the caller, the DSN or the environment names it),
and TCP keepalives unless the DSN says otherwise.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from _support import (
    app_name_of,
)
from pgsolo.jobs import run_job, run_job_async

# -- sync jobs -----------------------------------------------------------------------------


def new_job() -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return f"jobs-test:{uuid.uuid4().hex[:16]}"


def test_a_job_shows_its_name_in_pg_stat_activity(db: str, observer: Any) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert run_job(db, job, fn).value == f"pgsolo:{job}"
    assert run_job(db, job, fn, lifetime="session").value == f"pgsolo:{job}"
    named = run_job(db, (7_100_001, 5), fn, name="nightly-settlement")
    assert named.job == "nightly-settlement"
    assert named.value == "pgsolo:nightly-settlement"


def test_connections_a_job_opens_use_tcp_keepalives_unless_the_dsn_says_otherwise(
    db: str,
) -> None:
    """A half-open connection under a held lock must be noticed by the client too."""

    def fn(conn: psycopg.Connection) -> dict[str, str]:
        return conn.info.get_parameters()

    params = run_job(db, new_job(), fn).value
    assert params is not None
    assert params["keepalives"] == "1"
    assert int(params["keepalives_idle"]) >= 1
    assert int(params["tcp_user_timeout"]) >= 1000
    own = run_job(make_conninfo(db, keepalives_idle="77"), new_job(), fn).value
    assert own is not None
    assert own["keepalives_idle"] == "77"


def test_a_long_job_name_is_cut_to_what_postgres_keeps(db: str, observer: Any) -> None:
    job = new_job() + ":" + "x" * 80

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert run_job(db, job, fn).value == f"pgsolo:{job}"[:63]


def test_application_name_given_by_caller_dsn_or_environment_wins(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    named_dsn = make_conninfo(db, application_name="from-dsn")
    assert run_job(named_dsn, job, fn).value == "from-dsn"
    assert run_job(db, job, fn, application_name="billing-worker").value == "billing-worker"
    assert run_job(named_dsn, job, fn, application_name="billing-worker").value == "billing-worker"
    monkeypatch.setenv("PGAPPNAME", "from-env")
    assert run_job(db, job, fn).value == "from-env"
    assert run_job(named_dsn, job, fn).value == "from-dsn"


# -- async jobs ----------------------------------------------------------------------------


def new_async_job() -> str:
    return f"jobs-async-test:{uuid.uuid4().hex[:16]}"


async def test_an_async_job_shows_its_name_in_pg_stat_activity(db: str, observer: Any) -> None:
    job = new_async_job()

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert (await run_job_async(db, job, fn)).value == f"pgsolo:{job}"
    assert (await run_job_async(db, job, fn, application_name="worker-7")).value == "worker-7"
    named_dsn = make_conninfo(db, application_name="from-dsn")
    assert (await run_job_async(named_dsn, job, fn)).value == "from-dsn"
