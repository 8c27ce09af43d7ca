"""One APScheduler 3 scheduler among replicas, by leadership (docs/schedulers.md, "One
scheduler: leadership"): three real processes each campaign and run their scheduler only
while they lead (``_leading_replica.py``), so only the leader's job fires; the leader killed
with SIGKILL, another replica leads, with a larger token, and its scheduler fires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from itertools import groupby
from pathlib import Path

import psycopg
import pytest

from _support import eventually, sleep, unique_name

REPLICA = Path(__file__).with_name("_leading_replica.py")
DEADLINE = 30.0  # generous: three processes start, import APScheduler and connect


@pytest.fixture
def table(db: str) -> Iterator[str]:
    """A table of the test's own for the rows the schedulers' job writes."""
    name = f"fired_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (pid int NOT NULL, token bigint, at timestamptz)")
    yield name
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {name}")


def fired(db: str, table: str) -> list[tuple[int, int, datetime]]:
    with psycopg.connect(db) as conn:
        return conn.execute(f"SELECT pid, token, at FROM {table} ORDER BY at").fetchall()


def fired_by(db: str, table: str, pid: int) -> int:
    return sum(1 for by, _, _ in fired(db, table) if by == pid)


def test_only_the_leaders_scheduler_fires_and_a_successor_takes_over(db: str, table: str) -> None:
    name = unique_name("scheduler")
    replicas = [
        subprocess.Popen(
            [sys.executable, str(REPLICA), db, table, name],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for _ in range(3)
    ]
    by_pid = {replica.pid: replica for replica in replicas}
    try:
        leader = eventually(
            lambda: next(iter({pid for pid, _, _ in fired(db, table)}), 0),
            "a leader's scheduler firing",
            timeout=DEADLINE,
        )
        eventually(lambda: fired_by(db, table, leader) >= 5, "five ticks of the leader's job")
        assert {pid for pid, _, _ in fired(db, table)} == {leader}  # the others stand by

        os.kill(leader, signal.SIGKILL)
        by_pid[leader].wait(DEADLINE)
        with psycopg.connect(db) as conn:
            killed = conn.execute("SELECT clock_timestamp()").fetchone()
        assert killed is not None
        successor = eventually(
            lambda: next(iter({pid for pid, _, _ in fired(db, table)} - {leader}), 0),
            "another replica's scheduler firing",
            timeout=DEADLINE,
        )
        eventually(lambda: fired_by(db, table, successor) >= 5, "five ticks of the successor")
        sleep(0.5)  # the third replica stands by still, and fires nothing
        for pid, replica in by_pid.items():
            if pid != leader:
                replica.send_signal(signal.SIGTERM)
        for pid, replica in by_pid.items():
            if pid != leader:
                _, stderr = replica.communicate(timeout=DEADLINE)
                assert replica.returncode == 0, stderr
    finally:
        for replica in replicas:
            if replica.poll() is None:
                replica.kill()
                replica.wait(DEADLINE)

    rows = fired(db, table)
    # One scheduler at a time: the leader's rows, then the successor's, never interleaved,
    # and none of the killed leader's after its death.
    assert [pid for pid, _ in groupby(pid for pid, _, _ in rows)] == [leader, successor]
    assert max(at for pid, _, at in rows if pid == leader) < killed[0]
    tokens = {pid: {token for by, token, _ in rows if by == pid} for pid in (leader, successor)}
    (first,), (second,) = tokens[leader], tokens[successor]
    assert second > first
