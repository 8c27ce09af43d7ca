"""What pgsolo reads back does not depend on the caller's ``client_encoding``.

psycopg returns ``bytes`` for text under ``SQL_ASCII``, and under ``LATIN1`` (or
``WIN1252``) the server refuses to send a character that encoding lacks, and psycopg
reads JSON as UTF-8 whatever the encoding. So every text or JSON value pgsolo reads
travels as the UTF-8 bytes of a ``bytea`` and is decoded in Python; the lock paths return
booleans and integers only. Each test runs on a real server, on connections set to these
encodings. What pgsolo writes reaches the database as written, whatever the session's
settings (SJIS, ``standard_conforming_strings = off``): see the last section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgsolo
from _support import WORK, Connect, aeventually, eventually, new_job, terminate, work_rows
from pgsolo import Keep, Key
from pgsolo.jobs import run_job

RESULT = {"city": "€ 東京", "note": "Grüße"}  # neither LATIN1 nor WIN1252 has 東京
BYTES_FOR_TEXT = ["SQL_ASCII"]
LACKING = ["LATIN1", "WIN1252"]


def new_name(prefix: str) -> str:
    return f"{prefix}:{uuid.uuid4().hex[:12]}"


def in_encoding(conn: psycopg.Connection[Any], encoding: str) -> psycopg.Connection[Any]:
    conn.execute(f"SET client_encoding = {encoding}")
    return conn


# -- SQL_ASCII: text comes back as bytes --------------------------------------------------


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
def test_session_locks_work_whatever_the_client_encoding(
    connect: Connect, observer: Any, key: Key, encoding: str
) -> None:
    """Guards: under SQL_ASCII ``session_lock(...).acquire()`` failed with
    ``ValueError: invalid literal for int() with base 10: "b'9831"`` (the proxy check
    read its text answer as bytes)."""
    conn = in_encoding(connect(), encoding)
    pid = conn.info.backend_pid
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire()
    assert observer.holders(key) == {pid}
    assert not pgsolo.session_lock(connect(), key).acquire()  # busy elsewhere
    lock.release()
    with pgsolo.session_lock(conn, key, wait=5) as waited:
        assert waited.acquired
    assert observer.holders(key) == set()


@pytest.mark.usefixtures("db")
@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
def test_fencing_and_the_keeper_work_whatever_the_client_encoding(
    connect: Connect, observer: Any, key: Key, encoding: str
) -> None:
    conn = in_encoding(connect(), encoding)
    first = pgsolo.session_lock(conn, key, fencing=True)
    assert first.acquire()
    assert isinstance(first.token, int)
    token = first.token
    first.release()
    lock = pgsolo.session_lock(conn, key, wait=5, fencing=True, keep=Keep(interval=0.05))
    assert lock.acquire()
    assert isinstance(lock.token, int)
    assert lock.token > token
    terminate(observer, conn.info.backend_pid)
    eventually(lambda: lock.lost, "the keeper to see the loss")
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"


@pytest.mark.usefixtures("db")
@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
async def test_async_session_locks_and_the_keeper_work_whatever_the_client_encoding(
    aconnect: Any, observer: Any, key: Key, encoding: str
) -> None:
    conn = await aconnect()
    await conn.execute(f"SET client_encoding = {encoding}")
    async with pgsolo.session_lock(conn, key, fencing=True) as lock:
        assert lock.acquired
        assert isinstance(lock.token, int)
    lock = pgsolo.session_lock(conn, key, wait=5, keep=Keep(interval=0.05))
    assert await lock.acquire()
    terminate(observer, conn.info.backend_pid)
    await aeventually(lambda: lock.lost, "the keeper to see the loss")
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_jobs_work_and_record_whatever_the_client_encoding(
    db: str, connect: Connect, observer: Any, encoding: str, lifetime: Any
) -> None:
    job = new_name("encodings-job-東京")
    conn = in_encoding(connect(), encoding)
    result = pgsolo.run_job(
        conn, job, lambda c: c.info.backend_pid, lifetime=lifetime, period="day", record=True
    )
    again = pgsolo.run_job(conn, job, lambda c: 0, lifetime=lifetime, period="day", record=True)
    assert (result.outcome, result.value) == ("completed", conn.info.backend_pid)
    assert (again.outcome, again.reason) == ("skipped", "already-done-this-period")
    rows = pgsolo.history(conn, job=job)  # read back on the same connection
    assert [(r["job"], r["outcome"]) for r in rows] == [(job, "skipped"), (job, "completed")]


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
async def test_async_jobs_work_whatever_the_client_encoding(
    db: str, aconnect: Any, encoding: str
) -> None:
    job = new_name("encodings-async-job-東京")
    conn = await aconnect()
    await conn.execute(f"SET client_encoding = {encoding}")

    async def work(c: psycopg.AsyncConnection[Any]) -> str:
        return "done"

    for lifetime in ("xact", "session"):
        result = await pgsolo.run_job_async(conn, job, work, lifetime=lifetime, record=True)
        assert (result.outcome, result.value) == ("completed", "done")


# -- run_once: a result the encoding lacks is stored, and the side effect runs once -------


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
def test_run_once_stores_any_result_whatever_the_client_encoding(
    db: str, connect: Connect, observer: Any, encoding: str
) -> None:
    """Guards: on a LATIN1 connection a result with "€ 東京" was recorded ``failed``
    with a raw UntranslatableCharacter and the side effect ran again on every call;
    under SQL_ASCII run_once failed before running at all."""
    op = new_name("encodings-once")
    conn = in_encoding(connect(), encoding)
    side_effects: list[str] = []

    def charge(ctx: pgsolo.OperationContext[psycopg.Connection[Any]]) -> object:
        side_effects.append(ctx.idempotency_key)
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'charged')", (op,))
        return RESULT

    results = [pgsolo.run_once(conn, op, charge) for _ in range(3)]

    assert len(side_effects) == 1
    assert [r.outcome for r in results] == ["ran", "already-succeeded", "already-succeeded"]
    assert all(r.result == RESULT for r in results)
    assert work_rows(observer, op) == ["charged"]
    stored = observer.conn.execute(
        "SELECT state, result FROM pgsolo.operations WHERE op_key = %s", (op,)
    ).fetchone()
    assert stored == ("succeeded", RESULT)
    # Another connection, in another encoding, reads the same stored result.
    other = in_encoding(connect(), "SQL_ASCII" if encoding != "SQL_ASCII" else "LATIN1")
    assert pgsolo.run_once(other, op, charge).result == RESULT
    assert len(side_effects) == 1


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
async def test_async_run_once_stores_any_result_whatever_the_client_encoding(
    db: str, aconnect: Any, encoding: str
) -> None:
    op = new_name("encodings-once-async")
    conn = await aconnect()
    await conn.execute(f"SET client_encoding = {encoding}")
    side_effects: list[int] = []

    async def charge(ctx: Any) -> object:
        side_effects.append(ctx.attempt)
        return RESULT

    results = [await pgsolo.run_once_async(conn, op, charge) for _ in range(3)]
    assert side_effects == [1]
    assert [r.outcome for r in results] == ["ran", "already-succeeded", "already-succeeded"]
    assert all(r.result == RESULT for r in results)


@pytest.mark.parametrize("encoding", LACKING)
def test_a_failure_text_the_encoding_lacks_is_recorded_and_retried_with_the_same_key(
    db: str, connect: Connect, observer: Any, encoding: str
) -> None:
    op = new_name("encodings-once-fails")
    conn = in_encoding(connect(), encoding)
    keys: list[str] = []

    def fails(ctx: Any) -> object:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            raise RuntimeError("provider said: 東京 € down")
        return "ok"

    with pytest.raises(RuntimeError):
        pgsolo.run_once(conn, op, fails)
    row = observer.conn.execute(
        "SELECT state, error FROM pgsolo.operations WHERE op_key = %s", (op,)
    ).fetchone()
    assert row == ("failed", "RuntimeError: provider said: 東京 € down")
    assert pgsolo.run_once(conn, op, fails).outcome == "ran"
    assert keys[0] == keys[1]


# -- history and the monitor: other people's text ---------------------------------------


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
def test_history_reads_any_job_name_and_error_whatever_the_client_encoding(
    db: str, connect: Connect, encoding: str
) -> None:
    job = new_name("encodings-history-東京")

    def fails(c: psycopg.Connection[Any]) -> None:
        raise ValueError("€ 東京 — broke")

    pgsolo.run_job(db, job, fails, record=True, raise_errors=False)  # written in UTF-8
    conn = in_encoding(connect(), encoding)
    [row] = pgsolo.history(conn, job=job)
    assert (row["job"], row["outcome"], row["error"]) == (
        job,
        "failed",
        "ValueError: € 東京 — broke",
    )


def _holder_with_a_query(connect: Connect, key: Key) -> psycopg.Connection[Any]:
    """A session that holds ``key`` and whose last query (pg_stat_activity.query) has
    characters LATIN1 lacks, and an application_name that is not ASCII."""
    holder = connect(application_name="worker-東京")
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args}) /* 東京 € */")
    return holder


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
def test_advisory_locks_and_doctor_read_other_sessions_text_whatever_the_client_encoding(
    connect: Connect, key: Key, encoding: str
) -> None:
    """Guards: another session's query or application_name must not break the monitor
    on a LATIN1 connection (UntranslatableCharacter, or a UTF-8 decode error)."""
    holder = _holder_with_a_query(connect, key)
    conn = in_encoding(connect(), encoding)

    [lock] = pgsolo.advisory_locks(conn, key=key)
    assert lock.pid == holder.info.backend_pid
    assert lock.query is not None
    assert "東京 €" in lock.query
    assert lock.application_name is not None
    assert lock.application_name.startswith("worker-")
    checks = {check.name: check for check in pgsolo.doctor(conn)}
    assert "application-name" in checks


def test_pgsolo_locks_reads_other_sessions_text_on_a_latin1_connection(
    dsn: str, connect: Connect, key: Key
) -> None:
    holder = _holder_with_a_query(connect, key)
    done = subprocess.run(
        [sys.executable, "-m", "pgsolo", "locks", "--key", key.text, "--json", "--dsn", dsn],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**os.environ, "PGCLIENTENCODING": "LATIN1", "PYTHONIOENCODING": "utf-8"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [lock] = json.loads(done.stdout)["locks"]
    assert lock["pid"] == holder.info.backend_pid
    assert "東京 €" in lock["query"]


# -- names and passwords that are not ASCII ------------------------------------------------


@pytest.fixture
def non_ascii_place(dsn: str, observer: Any) -> Iterator[str]:
    """A database and a role whose names and password are not ASCII (the role owns the
    database), as a connection string; dropped afterwards."""
    suffix = uuid.uuid4().hex[:8]
    database, role, password = f"pgsolo_grüße_{suffix}", f"pgsolo_rôle_{suffix}", f"pä-{suffix}"
    admin = observer.conn
    try:
        admin.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(role), pgsql.Literal(password)
            )
        )
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test role cannot create roles")
    try:
        admin.execute(
            pgsql.SQL("CREATE DATABASE {} OWNER {}").format(
                pgsql.Identifier(database), pgsql.Identifier(role)
            )
        )
        yield make_conninfo(dsn, dbname=database, user=role, password=password)
    finally:
        admin.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(database))
        )
        admin.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


@pytest.mark.parametrize("encoding", BYTES_FOR_TEXT + LACKING)
def test_a_database_role_and_password_that_are_not_ascii_work_whatever_the_client_encoding(
    non_ascii_place: str, key: Key, encoding: str
) -> None:
    """psycopg decodes ``conn.info``'s names and password with the client_encoding, which
    fails under SQL_ASCII: pgsolo reads them from libpq as the UTF-8 they were given."""
    password = str(conninfo_to_dict(non_ascii_place)["password"])
    with psycopg.connect(non_ascii_place, autocommit=True, client_encoding=encoding) as conn:
        pgsolo.migrate(conn)
        lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.05))
        assert lock.acquire()
        assert [found.pid for found in pgsolo.advisory_locks(conn)] == [conn.info.backend_pid]
        lock.release()

        op = new_name("encodings-password")

        def leaks(ctx: Any) -> object:
            raise RuntimeError(f"the provider refused {password}")

        with pytest.raises(RuntimeError):
            pgsolo.run_once(conn, op, leaks)
        error = conn.execute(
            "SELECT convert_to(error, 'UTF8') FROM pgsolo.operations WHERE op_key = %s", (op,)
        ).fetchone()
        assert error is not None
        assert password not in bytes(error[0]).decode()  # blanked out before it was stored

        job = new_name("encodings-place")
        assert pgsolo.run_job(conn, job, lambda c: 1, record=True).completed
        assert [row["outcome"] for row in pgsolo.history(conn, job=job)] == ["completed"]


# -- text reaches the database as written, whatever the session's settings -----------------


def test_hostile_error_text_is_recorded_verbatim_under_any_client_encoding(
    db: str, connect: Connect, observer: Any
) -> None:
    """In SJIS, 0x5C can end a two-byte character; text quoted for UTF-8 would let a
    backslash escape the closing quote. pgsolo writes text as hex digits instead."""
    job = new_job()
    payload = "\u00c1\\'); CREATE TABLE pgsolo_pwned(); --"
    conn = connect()
    conn.execute("SET client_encoding TO 'SJIS'")
    conn.execute("SET backslash_quote = on")
    conn.execute("SET standard_conforming_strings = off")

    def bad(c: psycopg.Connection) -> None:
        raise ValueError(payload)

    result = run_job(conn, job, bad, record=True, raise_errors=False)
    assert result.outcome == "failed"
    assert observer.conn.execute("SELECT to_regclass('pgsolo_pwned')").fetchone() == (None,)
    [row] = pgsolo.history(observer.conn, job=job)
    assert row["error"] == f"ValueError: {payload}"


def test_a_period_is_one_period_whatever_the_client_encoding(
    db: str, connect: Connect, observer: Any
) -> None:
    job = f"Grüße-{uuid.uuid4().hex[:8]}"
    utf8, latin1 = connect(), connect()
    latin1.execute("SET client_encoding TO 'LATIN1'")
    assert run_job(utf8, job, lambda c: 1, period="day").completed
    again = run_job(latin1, job, lambda c: 1, period="day")
    assert (again.outcome, again.reason) == ("skipped", "already-done-this-period")
    rows = observer.conn.execute(
        "SELECT job FROM pgsolo.job_periods WHERE job LIKE 'Gr%%' AND job = %s", (job,)
    ).fetchall()
    assert rows == [(job,)]


def test_an_error_message_that_is_not_valid_unicode_is_still_recorded(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_job()
    undecodable = b"/tmp/\xff".decode("utf-8", "surrogateescape")

    def missing(c: psycopg.Connection) -> None:
        raise FileNotFoundError(2, "No such file", undecodable)

    result = run_job(connect(), job, missing, record=True, raise_errors=False)
    assert result.outcome == "failed"
    assert isinstance(result.error, FileNotFoundError)
    [row] = pgsolo.history(observer.conn, job=job)
    assert row["outcome"] == "failed"
    assert "No such file" in row["error"]
    assert "\\udcff" in row["error"]  # the undecodable byte, escaped rather than lost


@pytest.fixture
def sql_ascii_db(dsn: str, observer: Any) -> Iterator[str]:
    """A database whose server encoding is SQL_ASCII, migrated: its text may hold any bytes."""
    name = f"pgsolo_ascii_{uuid.uuid4().hex[:8]}"
    observer.conn.execute(
        pgsql.SQL(
            "CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ).format(pgsql.Identifier(name))
    )
    try:
        place = make_conninfo(dsn, dbname=name)
        with psycopg.connect(place, autocommit=True) as conn:
            pgsolo.migrate(conn)
        yield place
    finally:
        observer.conn.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )


def test_another_sessions_bytes_that_are_not_utf8_are_shown_not_fatal(sql_ascii_db: str) -> None:
    """Guards `pgsolo locks`, `doctor` and the dashboard on a SQL_ASCII database: one
    session whose query held a byte that is not UTF-8 made every snapshot fail ("invalid
    byte sequence for encoding UTF8"), called "database unavailable". The bytes are shown,
    each that is not UTF-8 replaced."""
    with (
        psycopg.connect(sql_ascii_db, autocommit=True) as holder,
        psycopg.connect(sql_ascii_db, autocommit=True) as looker,
    ):
        holder.execute("SET client_encoding TO SQL_ASCII")
        holder.execute(b"SELECT pg_advisory_lock(91), '\xff\xfe caf\xc3\xa9' AS junk")
        (row,) = pgsolo.advisory_locks(looker)
        assert row.pid == holder.info.backend_pid
        assert row.query is not None
        assert "\ufffd\ufffd caf\u00e9" in row.query  # replaced; the UTF-8 kept
        assert {check.name for check in pgsolo.doctor(looker)}  # it answers
        done = subprocess.run(
            [sys.executable, "-m", "pgsolo", "locks", "--dsn", sql_ascii_db, "--json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["locks"][0]["pid"] == holder.info.backend_pid
