"""Prometheus metrics of jobs: skips counted apart from successes, and labels that stay
bounded when locks are lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from prometheus_client import REGISTRY

import pgsolo
from _support import (
    hold,
    terminate,
    unhold,
)
from pgsolo.jobs import run_job, run_job_async

# -- sync jobs -----------------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]


class Boom(Exception):
    """The callable's own failure."""


def new_job() -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return f"jobs-test:{uuid.uuid4().hex[:16]}"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_skips_apart_from_successes(db: str, connect: Connect, observer: Any) -> None:
    job = new_job()
    attempts = "pgsolo_job_attempts_total"

    for _ in range(2):
        run_job(db, job, lambda c: None)
    completed_before_skips = sample(attempts, job=job, outcome="completed", reason="")
    holder = hold(connect, job)
    for _ in range(3):
        run_job(db, job, lambda c: None)
    unhold(holder, job)

    def fn(conn: psycopg.Connection) -> None:
        raise Boom("x")

    run_job(db, job, fn, raise_errors=False)

    assert completed_before_skips == 2
    assert sample(attempts, job=job, outcome="completed", reason="") == 2  # skips add nothing
    assert sample(attempts, job=job, outcome="skipped", reason="busy") == 3
    assert sample(attempts, job=job, outcome="failed", reason="") == 1
    assert sample("pgsolo_job_lock_wait_seconds_count", job=job) == 6
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="completed") == 2
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="failed") == 1
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="skipped") == 0
    assert sample("pgsolo_job_duration_seconds_sum", job=job, outcome="completed") >= 0


def test_metric_labels_stay_bounded_when_locks_are_lost(db: str, observer: Any) -> None:
    """A reason is a code of pgsolo.reasons, never a message: labels stay bounded."""
    job = new_job()

    def kill(conn: psycopg.Connection) -> None:
        terminate(observer, conn.info.backend_pid)

    assert run_job(db, job, kill, lifetime="session", raise_errors=False).outcome == "lost"
    assert run_job(db, job, kill, raise_errors=False).outcome == "lost"
    run_job(db, job, lambda c: None, period="day")
    run_job(db, job, lambda c: None, period="day")

    reasons = {
        s.labels["reason"]
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == "pgsolo_job_attempts_total" and s.labels.get("job") == job
    }
    assert reasons <= {"", *pgsolo.reasons.REASONS}
    lost = "connection-lost"
    assert sample("pgsolo_job_attempts_total", job=job, outcome="lost", reason=lost) == 2
    assert (
        sample(
            "pgsolo_job_attempts_total",
            job=job,
            outcome="skipped",
            reason="already-done-this-period",
        )
        == 1
    )


# -- async jobs ----------------------------------------------------------------------------


def new_async_job() -> str:
    return f"jobs-async-test:{uuid.uuid4().hex[:16]}"


async def returns(conn: psycopg.AsyncConnection[Any], value: Any) -> Any:
    return value


async def test_metrics_count_skips_apart_from_successes_async(
    db: str, connect: Connect, observer: Any
) -> None:
    job = new_async_job()
    attempts = "pgsolo_job_attempts_total"

    await run_job_async(db, job, returns, None)
    holder = hold(connect, job)
    await run_job_async(db, job, returns, None)
    await run_job_async(db, job, returns, None)
    unhold(holder, job)

    assert sample(attempts, job=job, outcome="completed", reason="") == 1
    assert sample(attempts, job=job, outcome="skipped", reason="busy") == 2
    assert sample("pgsolo_job_lock_wait_seconds_count", job=job) == 3
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="completed") == 1
