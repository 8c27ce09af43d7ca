"""Prometheus metrics of jobs: labels stay bounded when locks are lost. Skips counted apart
from successes, in both flavours, are written once, async, in ``_async/test_metrics.py``;
scripts/unasync.py generates ``_sync/test_metrics.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from prometheus_client import REGISTRY

import pgsolo
from _support import (
    new_job,
    sample,
    terminate,
)
from pgsolo.jobs import run_job


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
