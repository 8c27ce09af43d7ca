"""What jobs log: one record per attempt with the incident fields, a lost run at the
levels production logs keep, and never a password from the DSN.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from _support import (
    Boom,
    Connect,
    hold,
    job_log_records,
    key_of,
    new_job,
    terminate,
    unhold,
)
from pgsolo import LockLostError
from pgsolo._types import Lifetime
from pgsolo.jobs import run_job, run_job_async

# -- sync jobs -----------------------------------------------------------------------------


def test_one_log_record_per_attempt_with_the_incident_fields(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    database = observer.conn.info.dbname

    completed = run_job(db, job, lambda c: None)
    holder = hold(connect, job)
    skipped = run_job(db, job, lambda c: None)
    unhold(holder, job)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("x")

    failed = run_job(db, job, fn, raise_errors=False)

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    lost = run_job(db, job, kill, lifetime="session", raise_errors=False)
    results = [completed, skipped, failed, lost]
    server = f"{observer.conn.info.host}:{observer.conn.info.port}"

    records = job_log_records(caplog, job)
    assert [r.pgsolo["outcome"] for r in records] == [r.outcome for r in results]  # type: ignore[attr-defined]
    assert [r.levelno for r in records] == [logging.INFO] * 2 + [logging.WARNING] * 2
    for record, result in zip(records, results, strict=True):
        fields = record.pgsolo  # type: ignore[attr-defined]
        message = record.getMessage()
        assert message.startswith(f"job {result.outcome}: ")
        assert fields["job"] == job
        assert fields["key"] == key_of(job).text
        assert fields["name"] == job
        # Even for the lost run, whose connection no longer knows where it was.
        assert fields["database"] == database
        assert fields["server"] == server
        assert fields["application_name"] == f"pgsolo:{job}"
        assert fields["backend_pid"] == result.backend_pid
        assert fields["lock_wait_ms"] >= 0
        assert fields["duration_ms"] >= 0
        for name in ("job", "key", "database", "server", "backend_pid", "lock_wait_ms"):
            assert f"{name}={fields[name]}" in message
        assert "duration_ms=" in message
    assert records[1].pgsolo["reason"] == "busy"  # type: ignore[attr-defined]
    assert "reason=busy" in records[1].getMessage()
    assert "Boom" in records[2].pgsolo["error"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_a_lost_run_is_logged_with_its_server_at_production_log_levels(
    db: str, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: Lifetime
) -> None:
    """With INFO off, nothing else asked the connection where it was before it died."""
    job = new_job()
    caplog.set_level(logging.WARNING, logger="pgsolo")

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    result = run_job(db, job, kill, lifetime=lifetime, raise_errors=False)

    assert result.outcome == "lost"
    (record,) = job_log_records(caplog, job)
    assert record.levelno == logging.WARNING
    fields = record.pgsolo  # type: ignore[attr-defined]
    assert fields["database"] == observer.conn.info.dbname
    assert fields["server"] == f"{observer.conn.info.host}:{observer.conn.info.port}"
    assert fields["application_name"] == f"pgsolo:{job}"
    assert fields["backend_pid"] == result.backend_pid


@pytest.fixture
def password_dsn(dsn: str, observer: Any) -> Iterator[tuple[str, str]]:
    role = f"pgsolo_pw_{uuid.uuid4().hex[:10]}"
    password = f"Secret-{uuid.uuid4().hex}"
    observer.conn.execute(
        pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    try:
        yield make_conninfo(dsn, user=role, password=password), password
    finally:
        observer.conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s",
            (role,),
        )
        observer.conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def test_a_password_in_the_dsn_never_reaches_the_logs(
    password_dsn: tuple[str, str],
    connect: Connect,
    observer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn, password = password_dsn
    job = new_job()
    caplog.set_level(logging.DEBUG, logger="pgsolo")

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("x")

    assert run_job(dsn, job, lambda c: None).outcome == "completed"
    holder = hold(connect, job)
    assert run_job(dsn, job, lambda c: None, wait=0.1).outcome == "skipped"
    unhold(holder, job)
    assert run_job(dsn, job, fn, raise_errors=False).outcome == "failed"
    assert run_job(dsn, job, kill, raise_errors=False).outcome == "lost"
    with pytest.raises(LockLostError) as raised:
        run_job(dsn, job, kill, lifetime="session")

    assert len(job_log_records(caplog, job)) == 5
    assert password not in str(raised.value)
    assert password not in caplog.text
    for record in caplog.records:
        assert password not in record.getMessage()
        assert password not in repr(getattr(record, "pgsolo", None))


# -- async jobs ----------------------------------------------------------------------------


async def returns(conn: psycopg.AsyncConnection[Any], value: Any) -> Any:
    return value


async def test_one_log_record_per_attempt_even_when_lost(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job("jobs-async-test")
    caplog.set_level(logging.WARNING, logger="pgsolo")  # INFO off, as in many deployments

    async def kill(conn: psycopg.AsyncConnection[Any]) -> None:
        terminate(observer, conn.info.backend_pid)

    await run_job_async(db, job, returns, None)
    lost = await run_job_async(db, job, kill, lifetime="session", raise_errors=False)

    (record,) = job_log_records(caplog, job)  # the completed run logs at INFO: filtered
    assert record.getMessage().startswith("job lost: ")
    fields = record.pgsolo  # type: ignore[attr-defined]
    assert fields["database"] == observer.conn.info.dbname
    assert fields["server"] == f"{observer.conn.info.host}:{observer.conn.info.port}"
    assert fields["application_name"] == f"pgsolo:{job}"
    assert fields["backend_pid"] == lost.backend_pid

    caplog.clear()
    caplog.set_level(logging.INFO, logger="pgsolo")
    await run_job_async(db, job, returns, None)
    holder = hold(connect, job)
    await run_job_async(db, job, returns, None)
    unhold(holder, job)
    records = job_log_records(caplog, job)
    assert [r.pgsolo["outcome"] for r in records] == ["completed", "skipped"]  # type: ignore[attr-defined]
    assert all(r.pgsolo["lock_wait_ms"] >= 0 for r in records)  # type: ignore[attr-defined]
