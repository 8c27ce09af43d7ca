"""The connections a job opens: TCP keepalives unless the DSN says otherwise, and its name in
``pg_stat_activity`` (``application_name``) cut to what PostgreSQL keeps, unless the
caller, the DSN or the environment names it. The name test alike in both flavours is
written once, async, in ``_async/test_connections.py``; scripts/unasync.py generates
``_sync/test_connections.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from _support import (
    app_name_of,
    new_job,
)
from pgsolo.jobs import run_job


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
