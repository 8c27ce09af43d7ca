"""What the lock calls log (the incident fields of each event), and that a password in the
connection string never reaches a log record or an error message.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import Connect, pid_of, terminate
from pgsolo import (
    Key,
    LockNotHeldError,
    LockTimeoutError,
)


def pgsolo_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pgsolo.locks"]


def test_acquisition_is_logged_with_context(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    conn, other = connect(), connect()
    name = f"nightly-report-{uuid.uuid4().hex[:8]}"
    with pgsolo.session_lock(conn, name) as lock:
        assert lock.acquired
        assert pgsolo.session_lock(other, name).acquire() is False
    records = pgsolo_records(caplog)
    by_event = {r.pgsolo["event"]: r for r in records}  # type: ignore[attr-defined]
    acquired = by_event["acquired"]
    fields = acquired.pgsolo  # type: ignore[attr-defined]
    assert fields["key"] == lock.key.text
    assert fields["name"] == name
    assert fields["database"] == conn.info.dbname
    assert str(conn.info.port) in fields["server"]
    assert fields["backend_pid"] == pid_of(conn)
    assert fields["lifetime"] == "session"
    assert isinstance(fields["duration_ms"], float)
    assert fields["duration_ms"] >= 0
    message = acquired.getMessage()
    assert message.startswith("advisory lock acquired:")
    for text in (
        f"key={lock.key.text}",
        f"name={name}",
        f"database={conn.info.dbname}",
        f"backend_pid={pid_of(conn)}",
        "duration_ms=",
        "server=",
    ):
        assert text in message
    assert acquired.levelno == logging.DEBUG  # one per acquisition: debug
    busy = by_event["busy"]
    assert busy.pgsolo["backend_pid"] == pid_of(other)  # type: ignore[attr-defined]
    assert busy.pgsolo["name"] == name  # type: ignore[attr-defined]


def test_a_connections_first_session_lock_that_fails_is_logged_and_counted(
    connect: Connect, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards the logging policy for `pgsolo run` and Django's commands, whose one session
    lock is their connection's first: its failure, in the check of the route, was raised
    without the WARNING `error` event every other failed acquisition logs."""
    caplog.set_level(logging.WARNING, logger="pgsolo")
    conn = connect()
    terminate(observer, pid_of(conn))
    with pytest.raises(pgsolo.DatabaseUnavailableError):
        pgsolo.session_lock(conn, key).acquire()
    (record,) = [r for r in pgsolo_records(caplog) if r.levelno == logging.WARNING]
    assert (record.pgsolo["event"], record.pgsolo["key"]) == ("error", key.text)  # type: ignore[attr-defined]


def test_password_never_logged_or_in_errors(
    connect: Connect, observer: Any, key: Key, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    password = "sekret-pw-123"  # noqa: S105 - a throwaway role's password, on purpose
    role = f"pgsolo_pw_{uuid.uuid4().hex[:10]}"
    observer.conn.execute(
        pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    secret_dsn = make_conninfo(dsn, user=role, password=password)
    assert password in secret_dsn
    conn: psycopg.Connection | None = None
    messages: list[str] = []
    try:
        conn = psycopg.connect(secret_dsn, autocommit=True)
        assert conn.info.user == role
        assert conn.info.password == password
        holder = connect()

        with pgsolo.session_lock(conn, key) as lock:  # acquired, released
            assert lock.acquired
            messages.append(repr(lock))
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
        assert pgsolo.session_lock(holder, key).acquire() is True
        assert pgsolo.session_lock(conn, key).acquire() is False  # busy
        with pytest.raises(LockTimeoutError) as timeout:
            pgsolo.session_lock(conn, key, wait=0.2).acquire()
        xact_wait = pgsolo.xact_lock(conn, key, wait=0.2)
        with pytest.raises(LockTimeoutError) as xact_timeout:
            xact_wait.__enter__()
        with pytest.raises(LockNotHeldError) as not_held:
            pgsolo.session_lock(conn, "never-taken").release()
        messages += [str(timeout.value), str(xact_timeout.value), str(not_held.value)]
        messages += [repr(timeout.value), repr(xact_timeout.value)]
    finally:
        if conn is not None:
            conn.close()
        observer.conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))

    records = pgsolo_records(caplog)
    events = {r.pgsolo.get("event") for r in records if hasattr(r, "pgsolo")}
    assert {"acquired", "busy", "timeout", "release-not-held"} <= events
    # The log does name the server and user-facing context, so the check below is not vacuous.
    assert any(role not in r.getMessage() and "database=" in r.getMessage() for r in records)
    for record in records:
        messages += [record.getMessage(), repr(record.__dict__)]
    for text in messages:
        assert password not in text
    assert "database" in str(timeout.value)


async def test_a_wait_cancelled_as_its_service_stops_is_no_warning(
    aconnect: Any, connect: Connect, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards every waiting candidate of a campaign, which logged WARNING "advisory lock
    error ... CancelledError()" as its service shut down normally (20 to 30 lines per
    replica): an interruption is raised as it is, and logged at DEBUG."""
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    holder = connect()
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    conn = await aconnect()
    waiting = asyncio.create_task(pgsolo.session_lock(conn, key, wait=30).acquire())
    await asyncio.sleep(0.3)  # in its first slice, waiting on the server
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    errors = [r for r in pgsolo_records(caplog) if r.pgsolo["event"] == "error"]  # type: ignore[attr-defined]
    assert errors, "the cancelled acquisition is still logged"
    assert {r.levelno for r in errors} == {logging.DEBUG}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
