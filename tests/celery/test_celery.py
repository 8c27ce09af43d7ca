"""``pgsolo.celery`` with real Celery processes (``_app.py``, kombu's filesystem transport
as the broker): a ``Singleton`` task sent many times to two workers never runs twice at
once and says each duplicate; a retry is not refused by its own run's lock; a worker
killed with SIGKILL mid-task lets the key go at once. Two ``celery beat -S
pgsolo.celery:LeaderScheduler`` send from one of them, and from the other once the first
is killed or its term is lost. Bad options are refused where the task is defined."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import eventually
from celery import Celery
from pgsolo.celery import (
    DuplicateTaskError,
    Singleton,
    beat_leader_name,
    task_key,
)

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"


@pytest.fixture
def table(db: str) -> Iterator[str]:
    """A table of the test's own: one row per start and end of a run."""
    name = f"celery_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {name} (task_id text, what text, pid int, retries int,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    yield name
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {name}")


@pytest.fixture
def celery_env(db: str, table: str, tmp_path: Path) -> dict[str, str]:
    for folder in ("broker", "results"):
        (tmp_path / folder).mkdir()
    return {
        **os.environ,
        "PGSOLO_DSN": db,
        "PGSOLO_CELERY_DIR": str(tmp_path),
        "PGSOLO_CELERY_TABLE": table,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
    }


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The Celery processes a test starts, killed at its end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def celery(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "_app", *args, "--loglevel", "info"],
        cwd=env["PGSOLO_CELERY_DIR"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_workers(
    env: dict[str, str], processes: list[subprocess.Popen[bytes]], count: int
) -> list[int]:
    folder = Path(env["PGSOLO_CELERY_DIR"])
    for _ in range(count):
        processes.append(
            celery(
                env,
                "worker",
                "--pool",
                "solo",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
            )
        )
    pids = [process.pid for process in processes[-count:]]
    eventually(
        lambda: all((folder / f"ready-{pid}").exists() for pid in pids),
        "the workers to be ready",
        timeout=60,
    )
    return pids


@pytest.fixture
def app(celery_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """The test app, in this process, to send its tasks and read their results."""
    for name in ("PGSOLO_DSN", "PGSOLO_CELERY_DIR", "PGSOLO_CELERY_TABLE"):
        monkeypatch.setenv(name, celery_env[name])
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("_app", None)
    yield importlib.import_module("_app").app
    sys.modules.pop("_app", None)


def runs(db: str, table: str) -> list[tuple[str, str, int, int]]:
    with psycopg.connect(db) as conn:
        return conn.execute(
            f"SELECT task_id, what, pid, retries FROM {table} ORDER BY at"
        ).fetchall()


def test_a_singleton_sent_many_times_never_runs_twice_at_once(
    db: str, table: str, celery_env: dict[str, str], app: Celery, processes: list[Any]
) -> None:
    start_workers(celery_env, processes, 2)
    export = app.tasks["export"]
    sent = [export.delay(1, 1.0) for _ in range(6)]
    other_tenant = export.delay(2, 0.1)
    outcomes: list[str] = []
    for result in sent:
        result.get(timeout=60, propagate=False)
        if result.successful():
            assert result.result == "exported 1"
            outcomes.append("ran")
        else:
            assert isinstance(result.result, DuplicateTaskError)
            assert 'celery:export:{"tenant":1} holds its lock' in str(result.result)
            outcomes.append("duplicate")
    assert other_tenant.get(timeout=60) == "exported 2"  # another key: not a duplicate

    assert outcomes.count("ran") >= 1
    assert outcomes.count("duplicate") >= 1, "two workers, and no run found the key held"
    # The runs of tenant 1, in the database's order: each ends before the next starts.
    notes = [what for _, what, _, _ in runs(db, table) if what.endswith(" 1")]
    assert notes == ["start 1", "end 1"] * outcomes.count("ran")
    states = [result.state for result in sent]
    assert sorted(states) == sorted(
        "SUCCESS" if outcome == "ran" else "FAILURE" for outcome in outcomes
    )


def test_a_retry_is_not_refused_by_the_lock_of_the_run_that_asked_for_it(
    db: str, table: str, celery_env: dict[str, str], app: Celery, processes: list[Any]
) -> None:
    """Guards the retry held back until the lock is let go: the first run asks for a
    retry at once, then holds its lock for a second, while the other worker is idle."""
    start_workers(celery_env, processes, 2)
    result = app.tasks["retried"].delay()
    retried = eventually(
        lambda: [row for row in runs(db, table) if row[3] == 1], "the retry to run", timeout=60
    )
    # A duplicate's body never runs: this row is the retry's run, not refused.
    assert [(task_id, what) for task_id, what, _, _ in retried] == [(result.id, "ran")]


def test_a_worker_killed_mid_task_lets_its_key_go_at_once(
    db: str, table: str, celery_env: dict[str, str], app: Celery, processes: list[Any]
) -> None:
    start_workers(celery_env, processes, 2)
    export = app.tasks["export"]
    export.delay(3, 60)
    started = eventually(
        lambda: [row for row in runs(db, table) if row[1] == "start 3"], "the run to start"
    )
    key = task_key("export", export.run, [3, 60], {}, ["tenant"])
    with psycopg.connect(db, autocommit=True) as conn:
        assert pgsolo.is_locked(conn, key)
        os.kill(started[0][2], signal.SIGKILL)
        eventually(lambda: not pgsolo.is_locked(conn, key), "the server to let the key go")
    assert export.delay(3, 0.1).get(timeout=60) == "exported 3"  # the other worker runs it


def sends(celery_env: dict[str, str]) -> list[int]:
    """The pid of the beat that sent each message in the broker, in the order sent."""
    broker = Path(celery_env["PGSOLO_CELERY_DIR"]) / "broker"
    origins = []
    for message in sorted(broker.glob("*.msg"), key=lambda path: int(path.name.split("_")[0])):
        try:
            origin = json.loads(message.read_text())["headers"]["origin"]  # gen<pid>@<host>
        except ValueError:  # kombu writes the file in place: this one is being written
            continue
        origins.append(int(origin.removeprefix("gen").split("@")[0]))
    return origins


def senders(origins: list[int]) -> list[int]:
    """The beats that sent, one entry per turn: [a, b] for a, a, b, b, b."""
    return [pid for n, pid in enumerate(origins) if n == 0 or origins[n - 1] != pid]


def test_two_beats_send_from_the_leader_and_the_other_takes_over(
    db: str, celery_env: dict[str, str], processes: list[Any], tmp_path: Path
) -> None:
    """No worker runs: the broker's messages, and their origin, say which beat sent what."""
    env = {**celery_env, "PGSOLO_CELERY_BEAT": "1"}
    for n in range(2):
        schedule = str(tmp_path / f"schedule-{n}")
        processes.append(celery(env, "beat", "-S", "pgsolo.celery:LeaderScheduler", "-s", schedule))
    beats = {process.pid for process in processes}

    eventually(lambda: len(sends(celery_env)) >= 3, "the leader to send", timeout=60)
    (first,) = senders(sends(celery_env))
    assert first in beats

    # A leader that lost its term stops sending, and the one that waited sends instead.
    name = "pgsolo:leader:" + beat_leader_name(Celery("pgsolo-tests"))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_stat_activity a"
            " USING (pid) WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s",
            (name,),
        )
    eventually(lambda: len(senders(sends(celery_env))) == 2, "the other beat to send", timeout=60)
    (second,) = beats - {first}
    before = len(sends(celery_env))
    eventually(lambda: len(sends(celery_env)) >= before + 2, "a few more sends", timeout=60)
    assert senders(sends(celery_env)) == [first, second]

    # A leader killed with SIGKILL: the first one, standing again, takes over.
    os.kill(second, signal.SIGKILL)
    eventually(
        lambda: len(senders(sends(celery_env))) == 3, "the first beat to send again", timeout=60
    )
    before = len(sends(celery_env))
    eventually(lambda: len(sends(celery_env)) >= before + 2, "a few more sends", timeout=60)
    assert senders(sends(celery_env)) == [first, second, first]


def test_bad_options_are_refused_where_the_task_is_defined() -> None:
    app = Celery("bad-options")

    def work() -> None:
        pass

    with pytest.raises(pgsolo.InvalidArgumentError, match="unique_on"):
        app.task(base=Singleton, unique_on=5, lazy=False)(work)
    with pytest.raises(pgsolo.InvalidArgumentError, match="on_duplicate"):
        app.task(base=Singleton, on_duplicate="later", lazy=False)(work)


def test_eager_runs_take_the_lock_and_need_a_database(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGSOLO_DSN", raising=False)
    app = Celery("eager")

    @app.task(base=Singleton, unique_on="tenant", lazy=False)
    def report(tenant: int, detail: str = "full") -> str:
        return f"report {tenant} {detail}"

    with pytest.raises(pgsolo.UsageError, match="pgsolo_dsn"):
        report.apply(args=(1,), throw=True)
    app.conf.pgsolo_dsn = db
    assert report.apply(args=(1,)).get() == "report 1 full"
    key = task_key(report.name, report.run, [1], {"detail": "short"}, ["tenant"])
    assert key == task_key(report.name, report.run, [], {"tenant": 1}, ["tenant"])
    with psycopg.connect(db, autocommit=True) as holder, pgsolo.session_lock(holder, key):
        with pytest.raises(DuplicateTaskError, match="holds its lock"):
            report.apply(args=(1,), throw=True)
        assert report.apply(args=(2,)).get() == "report 2 full"
    with pytest.raises(pgsolo.InvalidArgumentError, match="JSON"):
        task_key("t", report.run, [object()], {}, None)
    assert task_key("t", report.run, [1], {}, []) == "celery:t"
    assert task_key("t", report.run, [1], {}, None) == 'celery:t:{"detail":"full","tenant":1}'
