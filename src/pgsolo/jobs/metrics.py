"""Prometheus metrics for jobs, with the ``pgsolo[prometheus]`` extra.

Counted from the application, as the article advises: nothing here polls ``pg_locks``.
Without ``prometheus_client`` installed every call is a no-op.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .definition import JobResult

__all__ = ["observe"]

_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
_lock = threading.Lock()
_metrics: tuple[Any, Any, Any] | None = None
_unavailable = False


def _instruments() -> tuple[Any, Any, Any] | None:
    global _metrics, _unavailable  # noqa: PLW0603 - created once, on first use
    if _metrics is not None or _unavailable:
        return _metrics
    with _lock:
        if _metrics is None and not _unavailable:
            try:
                from prometheus_client import Counter, Histogram  # noqa: PLC0415
            except ImportError:
                _unavailable = True
                return None
            _metrics = (
                Counter(
                    "pgsolo_job_attempts",
                    "Attempts at a pgsolo job, by outcome (a skip is not a success).",
                    ["job", "outcome", "reason"],
                ),
                Histogram(
                    "pgsolo_job_lock_wait_seconds",
                    "Time spent getting, or failing to get, a job's lock.",
                    ["job"],
                    buckets=_BUCKETS,
                ),
                Histogram(
                    "pgsolo_job_duration_seconds",
                    "Time a job's work ran.",
                    ["job", "outcome"],
                    buckets=_BUCKETS,
                ),
            )
    return _metrics


def observe(result: JobResult[Any]) -> None:
    instruments = _instruments()
    if instruments is None:
        return
    attempts, lock_wait, duration = instruments
    # A reason is a code from the fixed vocabulary of pgsolo.reasons (never a message),
    # so as a label it makes a bounded number of series.
    attempts.labels(result.job, result.outcome, result.reason or "").inc()
    lock_wait.labels(result.job).observe(result.lock_wait)
    if result.outcome != "skipped":
        duration.labels(result.job, result.outcome).observe(result.duration)
