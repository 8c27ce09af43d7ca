"""Item 5: how long after ``pg_terminate_backend`` kills the backend that holds a
session lock does pgsolo act on the loss?

Measured end to end on ``pgsolo run``, which checks its lock every ``--check-interval``
(and, with the keeper, heartbeats it): from the moment the benchmark sends
``pg_terminate_backend`` for pgsolo's backend to the moment ``pgsolo run`` has stopped
its command and exited with 70 (lock lost). The termination comes at a random point of
the check period. The ratio is that time ÷ the check interval; the goal is under two.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg

from benchmarks.commands import pgsolo_command
from benchmarks.registry import Context, Goal, Ratio, Row, quantile, scenario

APPLICATION_NAME = "pgsolo-bench-lock-loss"
KEY = "pgsolo-bench:lock-loss"
EXIT_LOST = 70
HELD_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 60.0
HOLDER = """
SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s"""


def _holder_pid(observer: psycopg.Connection[Any], proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + HELD_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        row = observer.execute(HOLDER, (APPLICATION_NAME,)).fetchone()
        if row:
            return int(row[0])
        time.sleep(0.01)
    raise RuntimeError(f"pgsolo run never held its lock (exit code {proc.poll()})")


def _one_loss(
    conninfo: str, observer: psycopg.Connection[Any], interval: float, rng: random.Random
) -> float:
    """Seconds from pg_terminate_backend to pgsolo run's exit."""
    argv = [
        *pgsolo_command(),
        "run",
        "--key",
        KEY,
        "--check-interval",
        f"{interval:g}",
        "--application-name",
        APPLICATION_NAME,
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(600)",
    ]
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(  # noqa: S603 - our own script, no shell
            argv,
            env={**os.environ, "PGSOLO_DSN": conninfo},  # never a DSN in argv
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            pid = _holder_pid(observer, proc)
            time.sleep(rng.uniform(0, interval))
            terminated = time.perf_counter()
            observer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            code = proc.wait(EXIT_TIMEOUT_S)
            exited = time.perf_counter()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(EXIT_TIMEOUT_S)
        if code != EXIT_LOST:
            stderr.seek(0)
            raise RuntimeError(f"pgsolo run exited {code}, not {EXIT_LOST}: {stderr.read()!r}")
    return exited - terminated


@scenario("5", "lock loss: pg_terminate_backend to pgsolo run's exit")
def lock_loss(ctx: Context) -> list[Row]:
    interval = 0.2 if ctx.quick else 1.0  # 1 s is pgsolo run's default
    per_round = 2
    rng = random.Random(5)
    conninfo = ctx.target.conninfo()
    rounds: list[list[float]] = []
    with psycopg.connect(conninfo, autocommit=True) as observer:
        for _ in range(ctx.rounds):
            rounds.append([_one_loss(conninfo, observer, interval, rng) for _ in range(per_round)])
    pooled = [s for r in rounds for s in r]
    return [
        Row(
            scenario="5",
            title=f"pgsolo run: terminated backend to exit 70 ÷ --check-interval {interval:g} s",
            ratio=Ratio.of([statistics.median(r) / interval for r in rounds]),
            goal=Goal("<", 2.0),
            detail=f"median {statistics.median(pooled) * 1000:.0f} ms,"
            f" slowest {max(pooled) * 1000:.0f} ms, p90 {quantile(pooled, 0.9) * 1000:.0f} ms"
            f" ({len(pooled)} terminations at random points of the period)",
            data={"seconds": rounds, "check_interval_s": interval},
        )
    ]
