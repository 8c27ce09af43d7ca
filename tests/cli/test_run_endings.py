"""Endings of ``pgsolo run`` that the job plan decides since ``pgsolo run`` drives it
(DESIGN §5 exit codes), and their job counterparts: a schema older than this pgsolo, a
period that cannot be recorded, a lock found gone when COMMAND ended, a database lost
before COMMAND started.

Each test has a database of its own (``fresh_db``): they lock or alter pgsolo's tables.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from _support import (
    READY_THEN_GO,
    CliRun,
    eventually,
    pgsolo_cli,
    pgsolo_in_background,
    touching,
)
from pgsolo import Key, NotMigratedError, migrate, run_job, sql
from pgsolo.schema import LATEST_VERSION, MIGRATIONS

# Run by COMMAND: end pgsolo's own session (found by its application_name), then exit
# with argv[3]. pgsolo notices only when it next uses the connection: at the release.
# The keeper sees the session end at once (the server closes the socket) and pgsolo run
# sends SIGTERM: ignored, so that the command still exits with the code under test.
END_PGSOLOS_SESSION = r"""
import signal, sys, psycopg
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (sys.argv[2],),
    )
sys.exit(int(sys.argv[3]))
"""


@pytest.fixture
def admin(fresh_db: str) -> Iterator[psycopg.Connection[Any]]:
    """An operator's session on the test's own database."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        yield conn


def ledger(conn: psycopg.Connection[Any], job: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT outcome, reason, exit_code FROM pgsolo.job_runs WHERE job = %s ORDER BY id",
        (job,),
    ).fetchall()


def advisory_locks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    assert row is not None
    return int(row[0])


def refuse_periods(conn: psycopg.Connection[Any]) -> None:
    """Make every insert into pgsolo.job_periods fail, the connection alive."""
    conn.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'periods refused by the test'; END $$"
    )
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON pgsolo.job_periods"
        " FOR EACH ROW EXECUTE FUNCTION refuse()"
    )


def test_a_schema_older_than_this_pgsolo_is_refused_before_the_lock(
    admin: psycopg.Connection[Any], fresh_db: str, key: Key, tmp_path: Path
) -> None:
    """pgsolo run compared the schema version before the job plan did; both do now."""
    older = LATEST_VERSION - 1
    admin.execute(sql.MIGRATIONS_TABLE)
    for version, body in MIGRATIONS[:older]:
        admin.execute(body)
        admin.execute(sql.record_migration(version))
    marker = tmp_path / "ran"
    for option in (["--record"], ["--once-per", "day"]):
        done = pgsolo_cli(
            "run", "--dsn", fresh_db, "--key", key.text, *option, "--json", "--", *touching(marker)
        )
        assert done.returncode == 2, done.stderr
        report = done.stderr_json()
        assert (report["outcome"], report["reason"]) == (None, "not-migrated")
        assert (
            f"has schema version {older} (this pgsolo needs {LATEST_VERSION})"
            in report["error"]["message"]
        )
        assert "run pgsolo migrate first" in report["error"]["message"]
    assert not marker.exists()
    calls: list[int] = []
    for options in ({"record": True}, {"period": "day"}):
        with pytest.raises(NotMigratedError, match="pgsolo migrate") as raised:
            run_job(fresh_db, key, lambda conn: calls.append(1), **options)
        assert raised.value.version == older
    assert calls == []
    assert advisory_locks(admin) == 0


def test_a_period_that_cannot_be_recorded_after_the_work_fails_with_1(
    admin: psycopg.Connection[Any],
    fresh_db: str,
    key: Key,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """COMMAND succeeded but its period is not marked: the next run would do it again."""
    migrate(admin)
    refuse_periods(admin)
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        "run", "--dsn", fresh_db, "--key", key.text, "--name", "refused", "--once-per", "year",
        "--record", "--json", "--", *touching(marker),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = done.stderr_json()
    assert (report["outcome"], report["reason"], report["exit_code"]) == (
        "failed",
        "period-not-recorded",
        1,
    )
    assert report["command_exit_code"] == 0
    assert "the period could not be recorded" in report["error"]["message"]
    assert "periods refused by the test" in report["error"]["message"]
    assert marker.exists()
    assert ledger(admin, "refused") == [("failed", "period-not-recorded", 1)]
    assert advisory_locks(admin) == 0

    # A session job's work is done just the same: the same ending.
    done_work: list[int] = []
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        result = run_job(
            fresh_db,
            key,
            lambda conn: done_work.append(1),
            name="refused-job",
            lifetime="session",
            period="year",
            raise_errors=False,
        )
    assert (result.outcome, result.reason) == ("failed", "period-not-recorded")
    assert "periods refused by the test" in str(result.error)
    assert done_work == [1]
    said = [r for r in caplog.records if "could not be recorded" in r.getMessage()]
    # A warning, not an error: the failed result (or its exception) is the caller's report.
    assert [(r.name, r.levelno) for r in said] == [("pgsolo.jobs", logging.WARNING)]
    assert advisory_locks(admin) == 0


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_lock_gone_when_the_command_ended_is_lost_whatever_it_exited_with(
    admin: psycopg.Connection[Any], fresh_db: str, key: Key, exit_code: int
) -> None:
    """The command ends pgsolo's session, then exits (one beat an hour: the keeper's
    watch of the socket, or else the release, finds the session gone). Exit 3 is a
    failure without an exception (the job plan's Failure), judged like a success."""
    migrate(admin)
    command = [sys.executable, "-c", END_PGSOLOS_SESSION, fresh_db, "pgsolo:ended", str(exit_code)]
    done = pgsolo_cli(
        "run", "--dsn", fresh_db, "--key", key.text, "--name", "ended", "--check-interval",
        "3600", "--record", "--json", "--", *command,
    )  # fmt: skip
    assert done.returncode == 70, done.stderr
    report = done.stderr_json()
    assert (report["outcome"], report["reason"]) == ("lost", "connection-lost")
    assert report["command_exit_code"] == exit_code
    assert f"lock {key} was lost while the command ran" in report["error"]["message"]
    # One error line, as documented, though libpq's message spans several.
    *_, error_line, document = done.stderr.splitlines()
    assert error_line.startswith(f"pgsolo run: error: lock {key} was lost"), done.stderr
    assert json.loads(document) == report
    assert ledger(admin, "ended") == [("lost", "connection-lost", 70)]  # a fresh connection
    assert advisory_locks(admin) == 0


def test_a_database_lost_before_the_command_started_exits_69(
    admin: psycopg.Connection[Any], fresh_db: str, key: Key, tmp_path: Path
) -> None:
    """The lock is held and the period check waits (a table lock) when pgsolo's session
    is ended: COMMAND never starts, and nothing is recorded."""
    migrate(admin)
    blocker = psycopg.connect(fresh_db, autocommit=False)
    marker = tmp_path / "ran"
    try:
        blocker.execute("LOCK TABLE pgsolo.job_periods IN ACCESS EXCLUSIVE MODE")
        with pgsolo_in_background(
            "run", "--dsn", fresh_db, "--key", key.text, "--name", "cut", "--once-per", "year",
            "--record", "--json", "--check-timeout", "120", "--", *touching(marker),
        ) as running:  # fmt: skip
            backend = eventually(
                lambda: admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgsolo:cut'"
                    " AND wait_event_type = 'Lock'"
                ).fetchone(),
                "pgsolo's period check to wait for the table",
                timeout=30,
            )
            admin.execute("SELECT pg_terminate_backend(%s)", backend)
            _, stderr = running.communicate(timeout=60)
    finally:
        blocker.close()
    assert running.returncode == 69, stderr
    report = CliRun(running.returncode, "", stderr, 0.0).stderr_json()
    assert (report["outcome"], report["reason"]) == (None, "database-unavailable")
    assert "database unavailable" in report["error"]["message"]
    assert not marker.exists()
    assert ledger(admin, "cut") == []
    assert advisory_locks(admin) == 0


def test_a_period_write_that_gets_no_answer_may_have_been_recorded(
    admin: psycopg.Connection[Any], fresh_db: str, key: Key, tmp_path: Path
) -> None:
    """A backend frozen during the period write (here: waiting on a table lock) gets no
    answer within --check-timeout and pgsolo drops the connection (exit 70); the server
    writes the row once it resumes. pgsolo said "could not be recorded": it must say only
    what it knows, "may not have been recorded"."""
    migrate(admin)
    blocker = psycopg.connect(fresh_db, autocommit=False)
    try:
        with pgsolo_in_background(
            "run", "--dsn", fresh_db, "--key", key.text, "--name", "frozen", "--once-per",
            "year", "--check-timeout", "2", "--json", "--",
            sys.executable, "-c", READY_THEN_GO, str(tmp_path),
        ) as running:  # fmt: skip
            eventually((tmp_path / "ready").exists, "the command to start", timeout=30)
            blocker.execute("LOCK TABLE pgsolo.job_periods IN SHARE MODE")  # no writes
            (tmp_path / "go").touch()
            _, stderr = running.communicate(timeout=60)
        blocker.commit()  # the frozen write resumes, its client long gone
    finally:
        blocker.close()
    assert running.returncode == 70, stderr
    report = CliRun(running.returncode, "", stderr, 0.0).stderr_json()
    assert (report["outcome"], report["reason"]) == ("lost", "connection-unresponsive")
    message = report["error"]["message"]
    assert message.startswith("the period may not have been recorded: no answer within 2s")
    assert "could not be recorded" not in stderr
    eventually(
        lambda: (
            admin.execute("SELECT count(*) FROM pgsolo.job_periods WHERE job = 'frozen'").fetchone()
            == (1,)
        ),
        "the period row the server wrote after all",
        timeout=30,
    )
    again = pgsolo_cli(
        "run", "--dsn", fresh_db, "--key", key.text, "--name", "frozen", "--once-per", "year",
        "--wait", "30", "--json", "--", "true",
    )  # fmt: skip
    assert again.returncode == 75, again.stderr
    assert again.stderr_json()["reason"] == "already-done-this-period"
