"""``pgsolo.apscheduler.OnceExecutor``: three real APScheduler 3 schedulers, each a process
of its own with the same job and trigger, run each scheduled occurrence once between them;
a replica killed with SIGKILL in the middle of an occurrence leaves it to another, which
runs it once; bad arguments are refused before anything connects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from apscheduler.executors.pool import ThreadPoolExecutor

import pgsolo
from _support import eventually
from pgsolo.apscheduler import OnceExecutor, occurrence, occurrence_key

REPLICA = Path(__file__).with_name("_replica.py")


@pytest.fixture
def table(db: str) -> Iterator[str]:
    """A table of the test's own for the occurrences' rows (and one for their attempts)."""
    name = f"ticks_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (op_key text NOT NULL, pid int NOT NULL)")
        conn.execute(f"CREATE TABLE {name}_attempts (op_key text NOT NULL, pid int NOT NULL)")
    yield name
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {name}, {name}_attempts")


def start_replicas(
    db: str, table: str, start: datetime, *, seconds: float, wait: str = "", slow: str = ""
) -> list[subprocess.Popen[str]]:
    args = [db, table, start.isoformat(), str(seconds), wait, slow]
    return [
        subprocess.Popen(
            [sys.executable, str(REPLICA), *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": "src"},
        )
        for _ in range(3)
    ]


def rows(db: str, table: str) -> list[tuple[str, int]]:
    with psycopg.connect(db) as conn:
        return conn.execute(f"SELECT op_key, pid FROM {table} ORDER BY op_key").fetchall()


def next_second(after: float) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=after)).replace(microsecond=0)


def test_three_replicas_run_each_occurrence_once(db: str, table: str) -> None:
    # The same start in every replica, after all three are up even on a loaded machine: a
    # scheduler that starts after it never fires the first occurrence.
    start = next_second(5)
    replicas = start_replicas(db, table, start, seconds=9.5)
    outputs = [json.loads(replica.communicate(timeout=60)[0]) for replica in replicas]
    assert [replica.returncode for replica in replicas] == [0, 0, 0]

    done = rows(db, table)
    per_occurrence = Counter(op_key for op_key, _ in done)
    assert per_occurrence, "no occurrence ran"
    assert set(per_occurrence.values()) == {1}
    # the occurrences are the trigger's, one a second from the shared start, none skipped
    times = sorted(datetime.fromisoformat(k.split("@", 1)[1]) for k in per_occurrence)
    assert times[0] == start
    assert times == [start + timedelta(seconds=n) for n in range(len(times))]
    assert len(times) >= 2
    # each replica reported as run exactly the occurrences it ran, and as skipped the rest
    pids = [replica.pid for replica in replicas]
    for pid, seen in zip(pids, outputs, strict=True):
        ran = {occurrence_key("tick", datetime.fromisoformat(t)) for t in seen["executed"]}
        assert ran == {op_key for op_key, by in done if by == pid}
        assert not ran & {
            occurrence_key("tick", datetime.fromisoformat(t)) for t in seen["skipped"]
        }
        assert seen["error"] == []
    skipped = [t for seen in outputs for t in seen["skipped"]]
    assert skipped, "no replica skipped an occurrence another ran"
    with psycopg.connect(db) as conn:
        states = conn.execute(
            "SELECT state FROM pgsolo.operations WHERE op_key = ANY(%s)", (list(per_occurrence),)
        ).fetchall()
    assert states == [("succeeded",)] * len(per_occurrence)


def test_a_replica_killed_mid_occurrence_leaves_it_to_another_which_runs_it_once(
    db: str, table: str
) -> None:
    """Guards the promise of ``wait=``: the replicas standing by for an occurrence take it
    over when its runner dies, and its work, in the occurrence's transaction, is done once."""
    # Every replica's scheduler must be up before the slow occurrence: one that starts after
    # it never fires it (an interval trigger starts from its next time), and then no
    # survivor would be there to take it over (it happened with the machine loaded by three
    # suites at once).
    start = next_second(6)
    slow = (start + timedelta(seconds=1)).astimezone(UTC).isoformat()
    replicas = start_replicas(db, table, start, seconds=12, wait="15", slow=slow)
    slow_key = occurrence_key("tick", datetime.fromisoformat(slow))
    by_pid = {replica.pid: replica for replica in replicas}

    def first_runner() -> int:
        with psycopg.connect(db) as conn:
            found = conn.execute(
                f"SELECT pid FROM {table}_attempts WHERE op_key = %s", (slow_key,)
            ).fetchall()
        return int(found[0][0]) if found else 0

    victim = eventually(first_runner, "a replica running the slow occurrence", timeout=30)
    os.kill(victim, signal.SIGKILL)
    survivors = [replica for pid, replica in by_pid.items() if pid != victim]
    for replica in survivors:
        replica.communicate(timeout=60)
        assert replica.returncode == 0
    by_pid[victim].wait(timeout=10)

    done = rows(db, table)
    per_occurrence = Counter(op_key for op_key, _ in done)
    assert set(per_occurrence.values()) == {1}
    assert [pid for op_key, pid in done if op_key == slow_key] not in ([], [victim])
    with psycopg.connect(db) as conn:
        attempts, state = conn.execute(
            "SELECT attempts, state FROM pgsolo.operations WHERE op_key = %s", (slow_key,)
        ).fetchone() or (None, None)
    assert (attempts, state) == (2, "succeeded")


def test_bad_arguments_are_refused_before_anything_connects() -> None:
    with pytest.raises(pgsolo.InvalidArgumentError, match="connection string"):
        OnceExecutor(psycopg)  # type: ignore[arg-type]
    with pytest.raises(pgsolo.InvalidDsnError):
        OnceExecutor("not a connection string")
    with pytest.raises(pgsolo.InvalidArgumentError, match="executor"):
        OnceExecutor("host=nowhere.invalid", executor="threadpool")
    with pytest.raises(pgsolo.InvalidArgumentError, match="executor"):
        OnceExecutor("host=nowhere.invalid", executor=OnceExecutor("host=nowhere.invalid"))
    with pytest.raises(pgsolo.InvalidArgumentError, match="wait"):
        OnceExecutor("host=nowhere.invalid", executor=ThreadPoolExecutor(), wait=-1)
    with pytest.raises(pgsolo.UsageError, match="inside a job"):
        occurrence()


def test_the_key_of_an_occurrence_is_its_time_in_utc() -> None:
    """Guards replicas in different time zones: the same instant, one key."""
    paris = datetime.fromisoformat("2026-03-01T10:00:00+01:00")
    utc = datetime.fromisoformat("2026-03-01T09:00:00+00:00")
    assert occurrence_key("report", paris) == occurrence_key("report", utc)
    assert occurrence_key("report", utc) == "apscheduler:report@2026-03-01T09:00:00+00:00"
