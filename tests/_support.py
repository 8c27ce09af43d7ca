"""Helpers shared by the test modules (imported as ``_support``: pyproject's ``pythonpath``
puts this directory on ``sys.path`` for the test modules in every folder below it)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

import pgsolo
from pgsolo import Key

T = TypeVar("T")

DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


def eventually(predicate: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


async def aeventually(predicate: Callable[[], T], what: str) -> T:
    """:func:`eventually` for a test running in an event loop: it yields to the loop
    (where the keeper's task runs) between polls."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {DEADLINE}s waiting for {what}")
        await asyncio.sleep(0.02)


async def asleep(seconds: float) -> None:
    """``asyncio.sleep``, under a name that a generated sync twin turns into :func:`sleep`."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """``time.sleep``: what :func:`asleep` is in a generated sync twin."""
    time.sleep(seconds)


# -- jobs: the table their callables write to, and other sessions' view of them ----------

WORK = "pgsolo_test_job_work"  # rows written by the jobs' callables
Connect = Callable[..., psycopg.Connection]


def key_of(job: str) -> Key:
    return pgsolo.as_key(job)


def work_rows(observer: Any, job: str) -> list[str]:
    rows = observer.conn.execute(
        f"SELECT note FROM {WORK} WHERE job = %s ORDER BY note", (job,)
    ).fetchall()
    return [str(note) for (note,) in rows]


def period_rows(observer: Any, job: str) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = observer.conn.execute(
        "SELECT period, host, pid, period_start = date_trunc('day', completed_at, 'UTC')"
        " FROM pgsolo.job_periods WHERE job = %s ORDER BY completed_at",
        (job,),
    ).fetchall()
    return rows


def hold(connect: Connect, job: str) -> psycopg.Connection:
    """Another session holding the job's key, the way any other client would (raw SQL)."""
    holder = connect()
    holder.execute(f"SELECT pg_advisory_lock({key_of(job).sql_args})")
    return holder


def unhold(holder: psycopg.Connection, job: str) -> None:
    row = holder.execute(f"SELECT pg_advisory_unlock({key_of(job).sql_args})").fetchone()
    assert row == (True,)


def terminate(observer: Any, pid: int) -> None:
    """Kill a backend and wait (up to 5s, server side) until it is really gone."""
    row = observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    assert row == (True,)


def app_name_of(observer: Any, pid: int) -> str | None:
    row = observer.conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return None if row is None else str(row[0])


# -- the command line, run for real -------------------------------------------------------

# What the caller's environment must not decide for a command under test: which database,
# and how libpq connects to it (a DSN on the command line says it all).
CLI_ENV_DROP = (
    "PGSOLO_DSN",
    "DATABASE_URL",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
    "PGTARGETSESSIONATTRS",
    "PGSERVICE",
)


@dataclass(frozen=True)
class CliRun:
    """How a ``pgsolo`` command ended, and how long it took (wall clock)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def stdout_json(self) -> dict[str, Any]:
        """What ``--json`` printed on stdout (``doctor``, ``locks``...)."""
        data = json.loads(self.stdout)
        assert isinstance(data, dict), self.stdout
        return data

    def stderr_json(self) -> dict[str, Any]:
        """The JSON object ``pgsolo run --json`` prints as the last line of stderr."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert lines, "no output on stderr"
        data = json.loads(lines[-1])
        assert isinstance(data, dict), lines[-1]
        return data


def cli_env() -> dict[str, str]:
    """The environment for a ``pgsolo`` command under test: ours, without CLI_ENV_DROP."""
    env = {k: v for k, v in os.environ.items() if k not in CLI_ENV_DROP}
    return {**env, "PYTHONIOENCODING": "utf-8"}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pgsolo ARGS``; the caller's DSN variables are not inherited."""
    base = {k: v for k, v in os.environ.items() if k not in ("PGSOLO_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "pgsolo", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**base, "PYTHONIOENCODING": "utf-8", **(env or {})},
        timeout=120,
        check=False,
    )


def touching(marker: Path) -> list[str]:
    """A COMMAND for ``pgsolo run`` that creates ``marker``: whether the file exists says
    whether COMMAND ran."""
    source = "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()"
    return [sys.executable, "-c", source, str(marker)]


def pgsolo_cli(*args: str, within: float = 60.0) -> CliRun:
    """Run ``python -m pgsolo ARGS`` with stdin closed and without the caller's DSN
    variables; fail the test if it has not ended after ``within`` seconds (it is killed)."""
    started = time.monotonic()
    try:  # no traceback on a timeout: its command line can carry a DSN's password
        done = subprocess.run(
            [sys.executable, "-m", "pgsolo", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=cli_env(),
            timeout=within,
            check=False,
        )
    except subprocess.TimeoutExpired:
        done = None
    if done is None:
        pytest.fail(f"pgsolo {' '.join(args[:1])} had not ended after {within}s", pytrace=False)
    return CliRun(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
