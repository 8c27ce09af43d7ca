"""What jobs log: one record per attempt with the incident fields, a lost run at the
levels production logs keep, and never a password from the DSN.
"""

from __future__ import annotations

import logging
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
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
    # a loss is INFO here: the lock's own WARNING has said it
    assert [r.levelno for r in records] == [logging.INFO] * 2 + [logging.WARNING, logging.INFO]
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
def test_a_lost_run_is_logged_with_its_server(
    db: str, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: Lifetime
) -> None:
    """The outcome line of a run whose connection died still says which server it was on
    (asked before the run: a dead connection no longer knows), at INFO: the lock's own
    WARNING has said the loss."""
    job = new_job()
    caplog.set_level(logging.INFO, logger="pgsolo")

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    result = run_job(db, job, kill, lifetime=lifetime, raise_errors=False)

    assert result.outcome == "lost"
    (record,) = job_log_records(caplog, job)
    assert record.levelno == logging.INFO
    fields = record.pgsolo  # type: ignore[attr-defined]
    assert fields["database"] == observer.conn.info.dbname
    assert fields["server"] == f"{observer.conn.info.host}:{observer.conn.info.port}"
    assert fields["application_name"] == f"pgsolo:{job}"
    assert fields["backend_pid"] == result.backend_pid


@pytest.fixture(params=["plain", "special"])
def password_dsn(
    request: pytest.FixtureRequest, db: str, observer: Any
) -> Iterator[tuple[str, str]]:
    """A DSN of a role of its own, with a password of letters, or of every character a
    URI encodes and a conninfo string quotes or escapes; and that password."""
    role = f"pgsolo_pw_{uuid.uuid4().hex[:10]}"
    tail = uuid.uuid4().hex
    password = f"Secret-{tail}" if request.param == "plain" else f"Se@c:r/e?t#%'q\"u \\{tail}"
    observer.conn.execute(
        pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    try:
        with psycopg.connect(db, autocommit=True) as owner:
            pgsolo.migrate(owner, grant_to=[role])  # record=True writes the ledger as it
        yield make_conninfo(db, user=role, password=password), password
    finally:
        observer.conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s",
            (role,),
        )
        with psycopg.connect(db, autocommit=True) as owner:  # its grants on pgsolo's tables
            owner.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
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


def test_a_password_the_work_quotes_never_reaches_the_logs_or_the_ledger(
    password_dsn: tuple[str, str], observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards the forms a work's error quotes a connection string in: percent-encoded in a
    URI (blanked only as the password itself), and quoted in a conninfo string, whose
    escapes the log line's repr() escaped again into a form nothing blanked."""
    dsn, password = password_dsn
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    quoted = make_conninfo("", host="billing.internal", password=password)
    encoded = f"postgresql://billing:{urllib.parse.quote(password, safe='')}@billing.internal/db"
    forms = {password, urllib.parse.quote(password, safe=""), repr(password)[1:-1]}
    for said in (quoted, encoded):
        job = new_job()

        def fn(conn: psycopg.Connection, said: str = said) -> None:
            raise RuntimeError(f"the billing database refused us: {said}")

        result = run_job(dsn, job, fn, raise_errors=False, record=True)
        assert result.outcome == "failed"
        (record,) = job_log_records(caplog, job)
        logged = record.getMessage() + repr(record.pgsolo)  # type: ignore[attr-defined]
        assert "billing.internal" in logged  # the message is there, blanked
        (ledger,) = observer.conn.execute(
            "SELECT error FROM pgsolo.job_runs WHERE job = %s", (job,)
        ).fetchone()
        assert "billing.internal" in ledger
        for form in forms:
            assert form not in logged
            assert form not in ledger


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

    # INFO off: the loss is said once, by the lock, with where it happened
    assert job_log_records(caplog, job) == []
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.name == "pgsolo.locks"
    assert record.getMessage().startswith("advisory lock lost: ")
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
