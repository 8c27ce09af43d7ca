"""Jobs on Django's connections: ``@singleton(key, using=alias)``, and
``pgsolo.django.singleton_command`` on management commands, in a real project
(``tests/django_project``) run by ``python manage.py`` processes and by ``call_command()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections

import pgsolo
from _drivers import django_settings
from _support import WORK, Boom, Connect, eventually, hold, new_job, terminate, unhold, work_rows
from pgsolo.cli.exit_codes import EXIT_LOST, EXIT_SKIPPED, EXIT_USAGE
from pgsolo.django import command_key, singleton_command

PROJECT = Path(__file__).parents[1] / "django_project"
NIGHTLY = "django:jobsapp:nightly"  # the default key of the project's nightly command
LIBPQ_WHERE = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


@pytest.fixture(scope="module")
def dj(db: str) -> Iterator[Any]:
    django_settings(db)
    yield connections
    connections.close_all()


@pytest.fixture
def conn(dj: Any) -> Iterator[Any]:
    yield connection
    assert not connection.in_atomic_block
    connection.close()


def insert(note: str, job: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", [job, note])


# -- @singleton(using=) --------------------------------------------------------------------


def test_singleton_runs_on_the_connection_of_the_alias(conn: Any, observer: Any) -> None:
    job = new_job()

    @pgsolo.singleton(job, using="default")
    def settle(db: Any, region: str) -> tuple[bool, bool]:
        insert(region, job)
        return db is connections["default"], db.in_atomic_block

    result = settle("eu")

    assert (result.outcome, result.value) == ("completed", (True, True))
    assert work_rows(observer, job) == ["eu"]


def test_singleton_on_an_alias_skips_a_busy_key(conn: Any, connect: Connect) -> None:
    job = new_job()
    ran = []

    @pgsolo.singleton(job, using="closing", lifetime="session")
    def settle(db: Any) -> None:
        ran.append(db)

    holder = hold(connect, job)
    result = settle()
    unhold(holder, job)

    assert (result.outcome, result.reason, ran) == ("skipped", "busy", [])


def test_singleton_refuses_an_alias_django_lacks_before_any_sql(conn: Any) -> None:
    def settle(db: Any) -> None:
        raise AssertionError("not run")

    with pytest.raises(pgsolo.UsageError, match=r"using='nope'.*'default', 'closing', 'lite'"):
        pgsolo.singleton(new_job(), using="nope")(settle)()
    with pytest.raises(pgsolo.UnsupportedConnectionError, match="sqlite"):
        pgsolo.singleton(new_job(), using="lite")(settle)()
    assert connection.connection is None  # nothing connected


def test_singleton_takes_dsn_or_using_and_a_sync_function(db: str) -> None:
    with pytest.raises(pgsolo.UsageError, match="not both"):
        pgsolo.singleton(new_job(), dsn=db, using="default")  # type: ignore[call-overload]

    async def settle(db: Any) -> None:
        return None

    with pytest.raises(pgsolo.UsageError, match="sync"):
        pgsolo.singleton(new_job(), using="default")(settle)


def test_without_a_database_the_error_says_how_to_name_one(
    conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PGSOLO_DSN", "DATABASE_URL", *LIBPQ_WHERE):
        monkeypatch.delenv(name, raising=False)

    @pgsolo.singleton(new_job())
    def settle(db: Any) -> None:
        raise AssertionError("not run")

    with pytest.raises(pgsolo.UsageError) as raised:
        settle()
    for named in ("dsn=", "using='default'", "PGSOLO_DSN", "DATABASE_URL"):
        assert named in str(raised.value)


# -- singleton_command, in this process ----------------------------------------------------


def command(key: str | None, work: Any = None, **options: Any) -> BaseCommand:
    """A command whose handle runs ``work()`` under ``@singleton_command(key, **options)``."""

    class Command(BaseCommand):
        @singleton_command(key, **options)
        def handle(self, *args: Any, **kwargs: Any) -> str:
            insert("ran", str(key))
            if work is not None:
                work()
            return "done"

    return Command()


def test_call_command_runs_the_body_and_returns_its_output(conn: Any, observer: Any) -> None:
    job = new_job()

    assert call_command(command(job)) == "done"
    assert work_rows(observer, job) == ["ran"]
    assert not connection.in_atomic_block  # a session lock: the body commits as it goes


def test_call_command_raises_a_skip_with_the_skipped_code(
    conn: Any, connect: Connect, observer: Any
) -> None:
    job = new_job()
    holder = hold(connect, job)
    with pytest.raises(CommandError, match=r"skipped: .* is busy") as raised:
        call_command(command(job))
    unhold(holder, job)

    assert raised.value.returncode == EXIT_SKIPPED
    assert work_rows(observer, job) == []


def test_a_lock_lost_while_the_command_ran_exits_with_the_lost_code(
    conn: Any, observer: Any
) -> None:
    job = new_job()

    def killed() -> None:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            terminate(observer, cur.fetchone()[0])

    with pytest.raises(CommandError, match="lost its lock") as raised:
        call_command(command(job, killed))
    assert raised.value.returncode == EXIT_LOST
    connection.close()  # dead: as Django closes an unusable one before the next request
    with pytest.raises(CommandError, match="was lost while the command ran") as raised:
        call_command(command(job, killed, raise_errors=False))  # a result, not an error
    assert raised.value.returncode == EXIT_LOST

    assert work_rows(observer, job) == ["ran", "ran"]


def test_the_commands_own_errors_are_raised_as_they_are(conn: Any) -> None:
    def fail() -> None:
        raise Boom("x")

    with pytest.raises(Boom):
        call_command(command(new_job(), fail))
    with pytest.raises(CommandError, match="failed: Boom") as raised:
        call_command(command(new_job(), fail, raise_errors=False))
    assert raised.value.returncode == 1


def test_a_bad_alias_is_a_usage_error_before_any_sql(conn: Any, observer: Any) -> None:
    job = new_job()
    with pytest.raises(CommandError, match="using='nope'") as raised:
        call_command(command(job, using="nope"))

    assert raised.value.returncode == EXIT_USAGE
    assert isinstance(raised.value.__cause__, pgsolo.UsageError)
    assert work_rows(observer, job) == []
    assert connection.connection is None


def test_options_are_checked_when_it_decorates() -> None:
    with pytest.raises(pgsolo.UsageError):
        singleton_command(lifetime="forever")  # type: ignore[typeddict-item]
    with pytest.raises(pgsolo.UsageError):
        singleton_command(wiat=5)  # type: ignore[call-arg]
    with pytest.raises(pgsolo.UsageError):
        singleton_command(using="")


def test_the_default_key_is_the_commands_app_and_name(conn: Any) -> None:
    billing = type("Command", (), {"__module__": "billing.management.commands.send_invoices"})
    assert command_key(billing) == "django:billing:send_invoices"
    with pytest.raises(CommandError, match="give one") as raised:
        call_command(command(None))  # defined in this module: no command name
    assert raised.value.returncode == EXIT_USAGE


# -- singleton_command, in a Django project ------------------------------------------------


def manage(db: str, *args: str) -> subprocess.Popen[str]:
    src = Path(pgsolo.__file__).parents[1]
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env={**os.environ, "PGSOLO_TEST_DSN": db, "PYTHONPATH": str(src)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(processes: list[subprocess.Popen[str]], count: int) -> None:
    """Wait for ``count`` of ``processes`` to end (the test's ``finally`` kills the rest)."""
    eventually(
        lambda: sum(p.poll() is not None for p in processes) >= count,
        f"{count} of the commands to end",
        timeout=90,
    )


def test_three_manage_py_runs_at_once_do_the_work_once(
    db: str, observer: Any, tmp_path: Path
) -> None:
    note = uuid.uuid4().hex
    gate = tmp_path / "gate"
    runs = [manage(db, "nightly", "--note", note, "--gate", str(gate)) for _ in range(3)]
    try:
        ended(runs, 2)  # the one that holds the key waits for the gate
        skipped = [run for run in runs if run.poll() is not None]
        gate.touch()
        ended(runs, 3)
        outputs = {run: run.communicate() for run in runs}
    finally:
        for run in runs:
            run.kill()

    (winner,) = set(runs) - set(skipped)
    assert winner.returncode == 0, outputs[winner][1]
    assert outputs[winner][0].strip() == f"nightly done: {note}"
    for run in skipped:
        out, err = outputs[run]
        assert run.returncode == EXIT_SKIPPED, err
        assert err.splitlines() == [
            f"CommandError: skipped: {pgsolo.as_key(NIGHTLY)} is busy: another run holds its lock"
        ]
        assert out == ""
    assert observer.conn.execute(
        f"SELECT count(*) FROM {WORK} WHERE job = %s AND note = %s", (NIGHTLY, note)
    ).fetchone() == (1,)
