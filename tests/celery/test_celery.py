"""``pgsolo.celery`` with real Celery processes (``_app.py``, kombu's filesystem transport
as the broker): a ``Singleton`` task sent many times to two workers never runs twice at
once and says each duplicate; a retry is not refused by its own run's lock; a worker killed
with SIGKILL mid-task lets the key go at once. Revokes and ``acks_late`` on a prefork
worker. Two ``celery beat -S pgsolo.celery:LeaderScheduler`` send from one of them, and from
the other once the first is killed or its term is lost; two beats that both send run each
scheduled occurrence once. Bad options are refused where the task is defined."""

from __future__ import annotations

import collections
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery.exceptions import TimeLimitExceeded
from celery.schedules import BaseSchedule, crontab, schedule

import pgsolo
from _support import eventually
from celery import Celery
from pgsolo.celery import (
    OCCURRENCE_HEADER,
    DuplicateTaskError,
    Singleton,
    beat_leader_name,
    occurrence_key,
    scheduled_time,
    task_key,
)

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"


@contextlib.contextmanager
def own_table(db: str) -> Iterator[str]:
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


def environment(db: str, table: str, folder: Path) -> dict[str, str]:
    """The environment of the Celery processes whose broker and results are in ``folder``."""
    for part in ("broker", "processed", "results"):
        (folder / part).mkdir()
    return {
        **os.environ,
        "PGSOLO_DSN": db,
        "PGSOLO_CELERY_DIR": str(folder),
        "PGSOLO_CELERY_TABLE": table,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)]),
    }


@contextlib.contextmanager
def imported_app(env: dict[str, str]) -> Iterator[Celery]:
    """The test app, in this process, to send its tasks and read their results."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in ("PGSOLO_DSN", "PGSOLO_CELERY_DIR", "PGSOLO_CELERY_TABLE"):
            monkeypatch.setenv(name, env[name])
        monkeypatch.syspath_prepend(str(HERE))
        sys.modules.pop("_app", None)
        yield importlib.import_module("_app").app
        sys.modules.pop("_app", None)


@pytest.fixture
def table(db: str) -> Iterator[str]:
    with own_table(db) as name:
        yield name


@pytest.fixture
def celery_env(db: str, table: str, tmp_path: Path) -> dict[str, str]:
    return environment(db, table, tmp_path)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The Celery processes a test starts, killed at its end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    stop(started)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill ``processes``, and print the end of what each wrote: pytest shows it when the
    test failed (a worker that never became ready said why only there)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        command, log = OUTPUTS.pop(process.pid, ("", None))
        if log is not None and log.exists():
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print(f"--- celery {command[:100]} (pid {process.pid}, exit {process.returncode})")
            print("\n".join(tail))


# What each Celery process of a test runs, and where it writes its output, by pid.
OUTPUTS: dict[int, tuple[str, Path]] = {}


def celery(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    folder = Path(env["PGSOLO_CELERY_DIR"])
    log = folder / f"{args[0]}-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "_app", *args, "--loglevel", "info"],
            cwd=folder,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    OUTPUTS[process.pid] = (" ".join(args), log)
    return process


def start_workers(
    env: dict[str, str], processes: list[subprocess.Popen[bytes]], count: int, pool: str = "solo"
) -> list[int]:
    """``count`` workers, each running one task at a time: in its own process (``solo``),
    or in a child process (``prefork``, which can terminate a task)."""
    folder = Path(env["PGSOLO_CELERY_DIR"])
    for _ in range(count):
        processes.append(
            celery(
                env,
                "worker",
                "--pool",
                pool,
                "--concurrency",
                "1",
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


def start_beat(
    env: dict[str, str], processes: list[subprocess.Popen[bytes]], task: str, app: str
) -> int:
    """A ``LeaderScheduler`` beat sending ``task`` every half second, standing for the
    leadership of the app name ``app`` (a test's own, so that no other test's beat leads)."""
    schedule_file = Path(env["PGSOLO_CELERY_DIR"]) / f"schedule-{uuid.uuid4().hex[:6]}"
    beat_env = {**env, "PGSOLO_CELERY_BEAT": task, "PGSOLO_CELERY_APP": app}
    processes.append(
        celery(beat_env, "beat", "-S", "pgsolo.celery:LeaderScheduler", "-s", str(schedule_file))
    )
    return processes[-1].pid


@pytest.fixture
def app(celery_env: dict[str, str]) -> Iterator[Celery]:
    with imported_app(celery_env) as imported:
        yield imported


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


def parent_of(pid: int) -> int:
    """The parent process of ``pid`` (Linux's ``/proc``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def test_a_worker_killed_mid_task_lets_its_key_go_at_once(
    db: str, table: str, celery_env: dict[str, str], app: Celery, processes: list[Any]
) -> None:
    """Prefork workers, Celery's default pool: the task runs in a child process, which dies
    with the worker's own (Celery sets it to, by the kernel's parent-death signal).
    ``export`` is ``acks_late``: kombu's filesystem transport takes the message's file off
    the broker as it delivers it, so the killed run's message is gone, never redelivered."""
    workers = start_workers(celery_env, processes, 2, pool="prefork")
    export = app.tasks["export"]
    killed = export.delay(3, 60)
    started = eventually(
        lambda: [row for row in runs(db, table) if row[1] == "start 3"], "the run to start"
    )
    worker = parent_of(started[0][2])
    assert worker in workers
    key = task_key("export", export.run, [3, 60], {}, ["tenant"])
    with psycopg.connect(db, autocommit=True) as conn:
        assert pgsolo.is_locked(conn, key)
        os.kill(worker, signal.SIGKILL)
        eventually(lambda: not pgsolo.is_locked(conn, key), "the server to let the key go")
    assert not list((Path(celery_env["PGSOLO_CELERY_DIR"]) / "broker").glob("*.msg"))
    assert export.delay(3, 0.1).get(timeout=60) == "exported 3"  # the other worker runs it
    starts = [task_id for task_id, what, _, _ in runs(db, table) if what == "start 3"]
    assert len(starts) == 2
    assert starts[0] == killed.id != starts[1]
    assert killed.state == "PENDING"  # no worker ever took it again, nor said how it ended


@dataclass
class Prefork:
    """One prefork worker, running one task at a time in a child process, that the module's
    tests of revokes and ``acks_late`` share (each with keys of its own)."""

    app: Celery
    db: str
    table: str
    broker: Path

    def notes(self, task_id: str) -> list[tuple[str, int]]:
        """What the runs of the task ``task_id`` noted, in order, and the pid of each."""
        return [(what, pid) for ran, what, pid, _ in runs(self.db, self.table) if ran == task_id]


@contextlib.contextmanager
def prefork_worker(db: str, folder: Path) -> Iterator[Prefork]:
    """A prefork worker of one child, started in ``folder``, stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []
    with own_table(db) as name:
        env = environment(db, name, folder)
        try:
            start_workers(env, started, 1, pool="prefork")
            with imported_app(env) as app:
                yield Prefork(app, db, name, Path(env["PGSOLO_CELERY_DIR"]) / "broker")
        finally:
            stop(started)


@pytest.fixture(scope="module")
def prefork(db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prefork]:
    with prefork_worker(db, tmp_path_factory.mktemp("prefork")) as worker:
        yield worker


def test_a_task_revoked_before_it_starts_never_tries_its_key(prefork: Prefork) -> None:
    """The worker discards a revoked task before it calls it: no run, and no attempt at the
    key, which the test holds (an attempt would be a FAILURE, not REVOKED). Revoked before
    it is sent, once the worker answered that it has the id: a revoke sent while another
    task ran once reached a loaded worker after that task ended, too late."""
    hold = prefork.app.tasks["hold"]
    task_id = str(uuid.uuid4())
    assert prefork.app.control.revoke(task_id, reply=True, timeout=30, limit=1)
    key = task_key("hold", hold.run, [11, 0.1], {}, ["tenant"])
    with psycopg.connect(prefork.db, autocommit=True) as holder, pgsolo.session_lock(holder, key):
        revoked = hold.apply_async((11, 0.1), task_id=task_id)
        revoked.get(timeout=60, propagate=False)
    assert revoked.state == "REVOKED"
    assert prefork.notes(revoked.id) == []


def test_a_task_terminated_mid_run_lets_its_key_go_at_once(prefork: Prefork) -> None:
    """``revoke(terminate=True, signal="SIGKILL")`` kills the child process that runs the
    task: the server ends its session, a session of the test's takes the key, and the next
    run of it goes through, in the child that replaces the dead one."""
    hold = prefork.app.tasks["hold"]
    terminated = hold.delay(12, 60)
    eventually(lambda: prefork.notes(terminated.id), "the run to start")
    key = task_key("hold", hold.run, [12, 60], {}, ["tenant"])
    with psycopg.connect(prefork.db, autocommit=True) as conn:
        assert pgsolo.is_locked(conn, key)
        terminated.revoke(terminate=True, signal="SIGKILL")
        with pgsolo.session_lock(conn, key, wait=30) as lock:
            assert lock.acquired
    terminated.get(timeout=60, propagate=False)
    assert terminated.state == "REVOKED"
    assert hold.delay(12, 0.1).get(timeout=60) == "held 12"
    assert [what for what, _ in prefork.notes(terminated.id)] == ["start 12"]


def test_a_hard_time_limit_ends_the_run_and_its_key_goes_with_it(db: str, tmp_path: Path) -> None:
    """A hard time limit is the prefork pool's SIGKILL of the child that runs the task
    (celery-singleton's keys outlived it until their TTL): the server ends the child's
    session, and the key is free at once, with nothing left to expire. On a worker of its
    own: after a hard time limit, the shared one sometimes ran nothing more for a minute."""
    with prefork_worker(db, tmp_path) as prefork:
        hold = prefork.app.tasks["hold"]
        key = task_key("hold", hold.run, [13, 60], {}, ["tenant"])
        limited = hold.apply_async((13, 60), time_limit=2)
        eventually(lambda: prefork.notes(limited.id), "the run to start")
        with psycopg.connect(prefork.db, autocommit=True) as conn:
            assert pgsolo.is_locked(conn, key)
            with pytest.raises(TimeLimitExceeded):
                limited.get(timeout=60)
            with pgsolo.session_lock(conn, key, wait=10) as lock:
                assert lock.acquired
        assert [what for what, _ in prefork.notes(limited.id)] == ["start 13"]


def test_an_acks_late_duplicate_is_acknowledged_not_redelivered(prefork: Prefork) -> None:
    """Guards against a duplicate that goes back to the queue until the key is free: with
    ``acks_late``, the refused run is a FAILURE, and its message is acknowledged."""
    export = prefork.app.tasks["export"]
    key = task_key("export", export.run, [13, 0.1], {}, ["tenant"])
    with psycopg.connect(prefork.db, autocommit=True) as holder, pgsolo.session_lock(holder, key):
        duplicate = export.delay(13, 0.1)
        duplicate.get(timeout=60, propagate=False)
    assert isinstance(duplicate.result, DuplicateTaskError)
    # The key is free now: a duplicate put back on the broker would run, before this task
    # sent after it (one worker, one task at a time, the broker's files in order).
    assert export.delay(14, 0.1).get(timeout=60) == "exported 14"
    assert prefork.notes(duplicate.id) == []
    assert duplicate.state == "FAILURE"
    assert not list(prefork.broker.glob("*.msg"))


def test_a_task_requeued_when_its_process_dies_takes_its_key_again(prefork: Prefork) -> None:
    """``acks_late`` with ``reject_on_worker_lost``: the worker puts the message of a task
    whose child process died back on the broker (the worker is alive, so any transport
    does it, the filesystem's too); the run redelivered takes the key, which went with the
    dead child's session."""
    requeued = prefork.app.tasks["requeued"]
    result = requeued.delay(15, 1.0)
    ((_, child),) = eventually(lambda: prefork.notes(result.id), "the run to start")
    key = task_key("requeued", requeued.run, [15, 1.0], {}, ["tenant"])
    with psycopg.connect(prefork.db, autocommit=True) as conn:
        os.kill(child, signal.SIGKILL)
        eventually(lambda: not pgsolo.is_locked(conn, key), "the server to let the key go")
    assert result.get(timeout=60) == "requeued 15"
    notes = prefork.notes(result.id)
    assert [what for what, _ in notes] == ["start 15", "start 15", "end 15"]
    assert child != notes[1][1] == notes[2][1]


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
    db: str, celery_env: dict[str, str], processes: list[Any]
) -> None:
    """No worker runs: the broker's messages, and their origin, say which beat sent what."""
    app_name = celery_env["PGSOLO_CELERY_TABLE"]
    beats = {start_beat(celery_env, processes, "tick", app_name) for _ in range(2)}

    eventually(lambda: len(sends(celery_env)) >= 3, "the leader to send", timeout=60)
    (first,) = senders(sends(celery_env))
    assert first in beats

    # A leader that lost its term stops sending, and the one that waited sends instead.
    name = "pgsolo:leader:" + beat_leader_name(Celery(app_name))
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


@pytest.mark.parametrize("through", ["a mysql URI", "a transaction pooler"])
def test_a_beat_that_can_never_lead_stops_with_the_reason(
    celery_env: dict[str, str], processes: list[Any], bouncer: Any, through: str
) -> None:
    """Guards a beat whose candidate's thread died (a DSN of another database, a
    transaction-pooling PgBouncer, which refuses session locks): the beat ran on, and
    never sent anything, with one line of a thread's traceback as the only trace."""
    dsn = "mysql://user:secret@db/x" if through == "a mysql URI" else bouncer.dsn
    env = {**celery_env, "PGSOLO_DSN": dsn}
    start_beat(env, processes, "tick", celery_env["PGSOLO_CELERY_TABLE"])
    beat = processes[-1]
    assert beat.wait(timeout=60) != 0
    _, log = OUTPUTS[beat.pid]
    said = log.read_text(errors="replace")
    expected = "InvalidDsnError" if through == "a mysql URI" else "UnsafeConnectionError"
    assert expected in said
    assert "secret" not in said
    assert not sends(celery_env)


def results(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The results the workers stored, by task id."""
    found = {}
    for path in (Path(env["PGSOLO_CELERY_DIR"]) / "results").iterdir():
        try:
            meta = json.loads(path.read_text())
        except ValueError:  # being written
            continue
        found[meta["task_id"]] = meta
    return found


def delivered(env: dict[str, str], task: str) -> set[str]:
    """The ids of the messages of ``task`` that the broker delivered (``store_processed``)."""
    processed = Path(env["PGSOLO_CELERY_DIR"]) / "processed"
    headers = [json.loads(path.read_text())["headers"] for path in processed.glob("*.msg")]
    return {each["id"] for each in headers if each.get("task") == task}


def test_two_beats_that_both_send_run_each_occurrence_once(
    db: str, table: str, celery_env: dict[str, str], app: Celery, processes: list[Any]
) -> None:
    """Two beats that both lead (each its app name's leadership), as two beats send when a
    failover or a skewed clock makes them both send: every occurrence of ``every`` (each
    half second) is sent twice, and runs once. One worker takes the two sends one after
    the other, so that the second finds the occurrence done (sends that overlap are the
    Singleton lock's, tested above). A send by hand of an occurrence that ran is refused."""
    for app_name in (f"{table}-a", f"{table}-b"):
        start_beat(celery_env, processes, "every", app_name)
    start_workers(celery_env, processes, 1)
    eventually(lambda: len(runs(db, table)) >= 4, "four occurrences to run", timeout=60)
    stop(processes[:2])  # the beats

    broker = Path(celery_env["PGSOLO_CELERY_DIR"]) / "broker"
    eventually(lambda: not list(broker.glob("*.msg")), "the worker to take every send")
    found = eventually(
        lambda: (done := results(celery_env)).keys() >= delivered(celery_env, "every") and done,
        "every send to end",
    )
    occurrences = collections.Counter(what for _, what, _, _ in runs(db, table))
    assert len(occurrences) >= 4
    assert set(occurrences.values()) == {1}, occurrences
    statuses = collections.Counter(meta["status"] for meta in found.values())
    assert statuses["SUCCESS"] == len(occurrences)
    refused = [meta["result"] for meta in found.values() if meta["status"] != "SUCCESS"]
    assert refused, "two beats sent each occurrence, and none was refused"
    for each in refused:
        assert each["exc_type"] == "DuplicateTaskError"
        assert "already ran for its occurrence" in each["exc_message"][0]
    for each in occurrences:  # windows of half a second from the epoch, in UTC
        at = datetime.fromisoformat(each)
        assert at.utcoffset() == timedelta(0)
        assert at.microsecond in (0, 500_000)

    first = min(occurrences)
    again = app.tasks["every"].apply_async((table,), headers={OCCURRENCE_HEADER: first})
    again.get(timeout=60, propagate=False)
    assert isinstance(again.result, DuplicateTaskError)
    key = task_key("every", app.tasks["every"].run, [table], {}, None)
    assert f"already ran for its occurrence {key}@{first}" in str(again.result)


def test_the_occurrence_of_a_crontab_entry_is_its_time_in_every_beat() -> None:
    app = Celery("occurrences")
    every_15 = crontab(minute="*/15", app=app)
    due = datetime(2026, 12, 1, 0, 30, tzinfo=UTC)
    # Two beats, whose entries moved on at their own ticks, sending seconds apart.
    in_one = scheduled_time(every_15, due - timedelta(minutes=15, microseconds=-3000), due)
    in_other = scheduled_time(
        every_15, due - timedelta(minutes=15, seconds=2), due + timedelta(seconds=3)
    )
    assert in_one == in_other == due
    # A beat catching up after a day down sends its backlog once: for the latest time.
    assert scheduled_time(every_15, due - timedelta(days=1), due + timedelta(minutes=7)) == due
    # A crontab in the app's time zone: 00:05 in Paris is 23:05 UTC in winter.
    paris = Celery("paris")
    paris.conf.timezone = "Europe/Paris"
    nightly = crontab(hour=0, minute=5, app=paris)
    last = datetime(2026, 11, 29, 23, 5, tzinfo=UTC)
    assert scheduled_time(nightly, last, last + timedelta(days=1, seconds=1)) == last + timedelta(
        days=1
    )
    assert occurrence_key("celery:nightly", due.astimezone(nightly.tz)) == (
        "celery:nightly@2026-12-01T00:30:00+00:00"
    )


def test_the_occurrence_of_an_interval_entry_is_a_window_of_it_from_the_epoch() -> None:
    app = Celery("occurrences")
    every_10s = schedule(run_every=timedelta(seconds=10), app=app)
    window = datetime(2026, 12, 1, 0, 0, 10, tzinfo=UTC)
    # Two beats whose entries fall due within one window: one occurrence, named by its start.
    for last_run_at in (window - timedelta(seconds=9), window - timedelta(seconds=1)):
        assert scheduled_time(every_10s, last_run_at, last_run_at + timedelta(seconds=10)) == window
    # One beat's entry, due late in a window and sent in the next: each send a window of
    # its own (its next due time is a whole interval later).
    last = window - timedelta(milliseconds=100)
    assert scheduled_time(every_10s, last, last + timedelta(seconds=10.05)) == window
    last += timedelta(seconds=10.05)
    assert scheduled_time(every_10s, last, last + timedelta(seconds=10)) == window + timedelta(
        seconds=10
    )
    # A beat catching up: the window of the latest due time.
    last = window + timedelta(seconds=3)  # due at 00:00:23, 00:00:33... 00:59:53, 01:00:03
    late = datetime(2026, 12, 1, 1, 0, 1, tzinfo=UTC)
    assert scheduled_time(every_10s, last, late) == datetime(2026, 12, 1, 0, 59, 50, tzinfo=UTC)
    half_second = schedule(run_every=0.5, app=app)
    assert scheduled_time(half_second, window, window + timedelta(seconds=0.7)) == (
        window + timedelta(seconds=0.5)
    )

    class Custom(BaseSchedule):
        pass

    assert scheduled_time(Custom(app=app), window, window) is None


def test_an_occurrence_runs_once_to_success_and_a_plain_send_as_any_other(db: str) -> None:
    app = Celery("occurrences")
    app.conf.pgsolo_database_url = db
    calls: list[int] = []

    @app.task(
        base=Singleton, unique_on=[], once_per_occurrence=True, on_duplicate="retry", lazy=False
    )
    def report() -> str:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("the mail server is down")
        return "sent"

    at = datetime.now(UTC)  # an occurrence of this test's own
    paris_time = {OCCURRENCE_HEADER: at.astimezone(timezone(timedelta(hours=1))).isoformat()}
    failed = report.apply(headers=paris_time)
    assert failed.state == "FAILURE"
    assert str(failed.result) == "the mail server is down"
    # The next send of the same time, in UTC, runs it again.
    assert report.apply(headers={OCCURRENCE_HEADER: at.isoformat()}).get() == "sent"
    # Then each send of it is a duplicate, never retried: it could never run.
    duplicate = report.apply(headers=paris_time)
    assert duplicate.state == "FAILURE"
    assert isinstance(duplicate.result, DuplicateTaskError)
    op_key = occurrence_key(task_key(report.name, report.run, [], {}, []), at)
    assert op_key == f"celery:{report.name}@{at.isoformat()}"
    assert str(duplicate.result).endswith(f"already ran for its occurrence {op_key}")
    assert calls == [0, 1]
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT state, attempts FROM pgsolo.operations WHERE op_key = %s", (op_key,)
        ).fetchone()
    assert row == ("succeeded", 2)

    assert report.apply().get() == "sent"  # no header: a plain Singleton run
    assert calls == [0, 1, 2]
    for wrong in ("yesterday", "2026-12-01T00:05:00", 1764547500):
        with pytest.raises(pgsolo.InvalidArgumentError, match=OCCURRENCE_HEADER):
            report.apply(headers={OCCURRENCE_HEADER: wrong}, throw=True)
    assert calls == [0, 1, 2]


def test_bad_options_are_refused_where_the_task_is_defined() -> None:
    app = Celery("bad-options")

    def work() -> None:
        pass

    with pytest.raises(pgsolo.InvalidArgumentError, match="unique_on"):
        app.task(base=Singleton, unique_on=5, lazy=False)(work)
    with pytest.raises(pgsolo.InvalidArgumentError, match="on_duplicate"):
        app.task(base=Singleton, on_duplicate="later", lazy=False)(work)
    with pytest.raises(pgsolo.InvalidArgumentError, match="once_per_occurrence"):
        app.task(base=Singleton, once_per_occurrence="yes", lazy=False)(work)


def test_a_unique_on_name_the_task_has_no_parameter_of_is_refused_where_it_is_defined() -> None:
    """Guards against a typo in unique_on ("tenant" for "tenant_id") that every run of the
    task then failed with a bare KeyError."""
    app = Celery("unknown-names")

    def export(tenant_id: int, **options: object) -> None:
        pass

    def bound(self: object, tenant_id: int) -> None:
        pass

    with pytest.raises(pgsolo.InvalidArgumentError, match=r"'tenant'.*parameters: tenant_id$"):
        app.task(base=Singleton, unique_on=["tenant"], lazy=False)(export)
    with pytest.raises(pgsolo.InvalidArgumentError, match="'options'"):  # no single value
        app.task(base=Singleton, unique_on=["options"], lazy=False)(export)
    with pytest.raises(pgsolo.InvalidArgumentError, match="'self'"):  # the task, not an argument
        app.task(base=Singleton, unique_on=["self"], bind=True, lazy=False)(bound)
    task = app.task(base=Singleton, unique_on=["tenant_id"], bind=True, lazy=False)(bound)
    assert task_key("t", task.run, [7], {}, ["tenant_id"]) == 'celery:t:{"tenant_id":7}'
    with pytest.raises(pgsolo.InvalidArgumentError, match="'nope'"):
        task_key("t", task.run, [7], {}, ["nope"])

    class ClassTask(Singleton):  # type: ignore[misc]
        unique_on = ("tenant_id",)

        def run(self, tenant_id: int) -> None:
            pass

    with pytest.raises(pgsolo.InvalidArgumentError, match="'tenant'"):

        class Misnamed(Singleton):  # type: ignore[misc]
            unique_on = ("tenant",)

            def run(self, tenant_id: int) -> None:
                pass


def test_eager_runs_take_the_lock_and_need_a_database(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGSOLO_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    app = Celery("eager")

    @app.task(base=Singleton, unique_on="tenant", lazy=False)
    def report(tenant: int, detail: str = "full") -> str:
        return f"report {tenant} {detail}"

    with pytest.raises(pgsolo.UsageError, match="pgsolo_database_url"):
        report.apply(args=(1,), throw=True)
    monkeypatch.setenv("DATABASE_URL", db)  # as every pgsolo command reads it
    assert report.apply(args=(1,)).get() == "report 1 full"
    monkeypatch.setenv("DATABASE_URL", "host=/nonexistent dbname=not-this-one")
    app.conf.pgsolo_database_url = db  # the app's own setting first
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


def test_celerys_own_listings_mask_the_database_setting() -> None:
    """Guards the setting's name: as pgsolo_dsn, `celery report` and `celery inspect conf`
    printed its password, which they mask only in settings named like a secret."""
    app = Celery("listed")
    app.conf.pgsolo_database_url = "postgresql://app:Sentinel-Pw-93x@db.internal/app"
    listed = app.conf.humanize(with_defaults=False, censored=True)
    assert "pgsolo_database_url" in listed
    assert "Sentinel-Pw-93x" not in listed


def test_arguments_celery_carries_beyond_json_make_a_key(db: str) -> None:
    """Guards a Singleton task called with a UUID, a date or a Decimal (which Celery's
    JSON serializer carries to the worker): every run failed, its key refused."""
    app = Celery("beyond-json")
    app.conf.pgsolo_database_url = db

    @app.task(base=Singleton, lazy=False)
    def bill(order: uuid.UUID, due: date, amount: Decimal) -> str:
        return f"{order} {due} {amount}"

    order, due, amount = uuid.UUID(int=7), date(2026, 12, 5), Decimal("12.50")
    assert bill.apply(args=(order, due, amount)).get() == f"{order} {due} {amount}"
    key = task_key(bill.name, bill.run, [order, due, amount], {}, None)
    assert key == (f'celery:{bill.name}:{{"amount":"12.50","due":"2026-12-05","order":"{order}"}}')
    at = datetime(2026, 12, 5, 9, 30, tzinfo=UTC)
    assert (
        task_key("t", lambda at: at, [at], {}, None)
        == 'celery:t:{"at":"2026-12-05T09:30:00+00:00"}'
    )
