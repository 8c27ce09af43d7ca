"""The logging policy (DESIGN.md, "Logging"), from real runs: which logger each event is on
and at which level, no ERROR for an exception re-raised to the caller, and the command
line's ``--log-format json`` (its worker processes' lines included).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    INTERVAL,
    Boom,
    Connect,
    Ctx,
    hold,
    new_job,
    new_op,
    pgsolo_cli,
    terminate,
    unhold,
    wait_until_lost,
)
from pgsolo import Keep, Key, LockLostError, run_job, run_once

PY = sys.executable
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} pgsolo[.\w]* [A-Z]+: ")


def events(caplog: pytest.LogCaptureFixture, field: str) -> list[tuple[str, str, int]]:
    """(logger, what, level) of each record that carries ``field`` in ``record.pgsolo``."""
    return [
        (r.name, r.pgsolo[field], r.levelno)  # type: ignore[attr-defined]
        for r in caplog.records
        if field in getattr(r, "pgsolo", {})
    ]


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_each_acquisition_is_one_debug_line_on_pgsolo_locks(
    connect: Connect, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgsolo")  # the parent: its children follow
    conn, other = connect(), connect()
    with pgsolo.session_lock(conn, key) as lock:
        assert lock.acquired
        assert pgsolo.session_lock(other, key).acquire() is False
    with pgsolo.session_lock(conn, key), pytest.raises(pgsolo.LockTimeoutError):
        pgsolo.session_lock(other, key, wait=0.05).acquire()

    assert events(caplog, "event") == [
        ("pgsolo.locks", "acquired", logging.DEBUG),
        ("pgsolo.locks", "busy", logging.DEBUG),
        ("pgsolo.locks", "released", logging.DEBUG),
        ("pgsolo.locks", "acquired", logging.DEBUG),
        ("pgsolo.locks", "timeout", logging.DEBUG),
        ("pgsolo.locks", "released", logging.DEBUG),
    ]

    caplog.clear()
    caplog.set_level(logging.INFO, logger="pgsolo")
    with pgsolo.session_lock(conn, key), pgsolo.xact_lock(other, key):
        pass
    assert caplog.records == []  # at INFO, lock traffic says nothing


def test_job_outcomes_are_info_and_a_failure_re_raised_is_a_warning_not_an_error(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job("logging")
    caplog.set_level(logging.INFO, logger="pgsolo")
    run_job(db, job, lambda c: None)
    holder = hold(connect, job)
    run_job(db, job, lambda c: None)
    unhold(holder, job)

    def fails(conn: psycopg.Connection) -> None:
        raise Boom("the work broke")

    with pytest.raises(Boom):
        run_job(db, job, fails)

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    with pytest.raises(LockLostError):
        run_job(db, job, kill, lifetime="session")

    assert events(caplog, "outcome") == [
        ("pgsolo.jobs", "completed", logging.INFO),
        ("pgsolo.jobs", "skipped", logging.INFO),
        ("pgsolo.jobs", "failed", logging.WARNING),
        ("pgsolo.jobs", "lost", logging.INFO),  # the lock's WARNING said it
    ]
    assert errors(caplog) == []  # the caller got both exceptions: no second report


def test_an_operation_that_fails_is_a_warning_on_pgsolo_once(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgsolo")
    conn = connect()
    op_key = new_op("logging")

    def broken(ctx: Ctx) -> None:
        raise Boom("the side effect broke")

    with pytest.raises(Boom):
        run_once(conn, op_key, broken)
    run_once(conn, op_key, lambda ctx: "sent")

    failed = [r for r in caplog.records if r.getMessage().startswith("operation failed")]
    assert [(r.name, r.levelno) for r in failed] == [("pgsolo.once", logging.WARNING)]
    # With its fields, for --log-format json; an attempt's event, not a call's outcome.
    assert failed[0].pgsolo["event"] == "failed"  # type: ignore[attr-defined]
    assert failed[0].pgsolo["op_key"] == op_key  # type: ignore[attr-defined]
    assert events(caplog, "outcome") == [("pgsolo.once", "ran", logging.INFO)]
    assert errors(caplog) == []


def test_a_lock_the_keeper_finds_lost_is_one_warning(
    connect: Connect, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgsolo")
    lock = pgsolo.session_lock(connect(), key, keep=Keep(interval=INTERVAL))

    def held_while_lost() -> None:
        with lock:
            assert lock.backend_pid is not None
            terminate(observer, lock.backend_pid)
            wait_until_lost(lock)

    with pytest.raises(LockLostError):
        held_while_lost()

    lost = [e for e in events(caplog, "event") if e[1] == "lost"]
    assert lost == [("pgsolo.locks", "lost", logging.WARNING)]
    assert errors(caplog) == []


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every log line of ``stderr``, parsed; no line may be in the text format."""
    assert not [line for line in stderr.splitlines() if TEXT_LINE.match(line)], stderr
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_cli_log_format_json_is_one_object_per_line_with_the_fields(
    db: str, connect: Connect
) -> None:
    job = new_job("logging-cli")
    run = ["run", "--key", job, "--dsn", db]
    done = pgsolo_cli("-vv", "--log-format", "json", *run, "--", PY, "-c", "pass")
    holder = hold(connect, job)
    busy = pgsolo_cli(*run, "-v", "--log-format", "json", "--", PY, "-c", "pass")
    unhold(holder, job)

    assert done.returncode == 0, done.stderr
    records = json_lines(done.stderr)
    assert records, done.stderr
    for record in records:
        assert list(record)[:4] == ["time", "level", "logger", "message"]
        assert record["time"].endswith("+00:00")
    by_what = {(r["logger"], r.get("event") or r.get("outcome")): r for r in records}
    acquired = by_what["pgsolo.locks", "acquired"]
    assert acquired["level"] == "DEBUG"
    assert acquired["message"].startswith("advisory lock acquired: ")
    assert acquired["name"] == job
    assert isinstance(acquired["backend_pid"], int)
    assert "released" in {r.get("event") for r in records}
    completed = by_what["pgsolo.jobs", "completed"]
    assert (completed["level"], completed["job"]) == ("INFO", job)
    assert isinstance(completed["duration_ms"], float)

    assert busy.returncode == 75, busy.stderr
    (skipped,) = [r for r in json_lines(busy.stderr) if r.get("outcome")]
    assert (skipped["logger"], skipped["level"], skipped["outcome"]) == (
        "pgsolo.jobs",
        "INFO",
        "skipped",
    )
    assert not [r for r in json_lines(busy.stderr) if r["logger"] == "pgsolo.locks"]  # -v


def test_cli_log_format_text_is_the_default_and_others_are_refused(db: str) -> None:
    job = new_job("logging-cli")
    done = pgsolo_cli("-vv", "run", "--key", job, "--dsn", db, "--", PY, "-c", "pass")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if TEXT_LINE.match(line)]
    assert any(" pgsolo.locks DEBUG: advisory lock acquired: " in line for line in lines)
    assert any(" pgsolo.jobs INFO: job completed: " in line for line in lines)

    refused = pgsolo_cli("--log-format", "xml", "run", "--key", job, "--", "true")
    assert refused.returncode == 2
    assert "--log-format" in refused.stderr


def test_demo_worker_processes_log_json_too(dsn: str) -> None:
    done = pgsolo_cli(
        "demo", "--dsn", dsn, "--workers", "2", "--work-seconds", "0.5", "-vv",
        "--log-format", "json",
        within=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    records = json_lines(done.stderr)
    first: dict[str, str] = {}  # each worker's first event
    for record in records:
        if str(record.get("application_name")).startswith("pgsolo-demo:worker-"):
            first.setdefault(record["application_name"], record["event"])
    # Each worker process logged its own attempt, in JSON: one won, the other found it busy.
    assert sorted(first.values()) == ["acquired", "busy"], records
