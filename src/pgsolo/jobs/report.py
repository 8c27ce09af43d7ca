"""One log line and the metrics for every attempt at a job."""

from __future__ import annotations

import logging
from typing import (
    Any,
)

from .. import metrics
from .._logging import jobs_logger as logger
from .._logging import log_event
from ..drivers import DriverBase, ServerInfo
from .definition import Job, JobResult

__all__ = ["report", "scrubbed"]


def report(
    job: Job, result: JobResult[Any], driver: DriverBase, info: ServerInfo | None = None
) -> None:
    """Log the outcome (one line per attempt, with everything an incident needs) and
    count it in the metrics. ``info`` is the server as seen before the run: a lost
    connection no longer knows its database, server or application_name."""
    metrics.observe_job(
        result.job, result.outcome, result.reason, result.lock_wait, result.duration
    )
    # Not ERROR: a failed or lost run's exception is re-raised to the caller (or returned,
    # with raise_errors=False), whose own error report would say it a second time. A loss
    # is INFO here: the lock has said it at WARNING already, with the driver's words.
    level = logging.WARNING if result.outcome == "failed" else logging.INFO
    if not logger.isEnabledFor(level):
        return
    if info is None:
        info = driver.server_info()
    fields: dict[str, object] = {
        "job": job.name,
        "reason": result.reason,
        "key": result.key.text,  # with limit=, the slot held
        "name": result.key.name,
        "database": info.database,
        "server": info.address,
        "application_name": info.application_name,
        "backend_pid": result.backend_pid,
        "lock_wait_ms": round(result.lock_wait * 1000, 3),
        "duration_ms": round(result.duration * 1000, 3),
        "error": described(result.error, driver) if result.error is not None else None,
    }
    log_event(logger, level, "job", "outcome", result.outcome, fields)


def described(error: BaseException, driver: DriverBase) -> str:
    """``error`` as its repr shows it, made of its message with the connection's own
    password blanked out: the repr of a message escapes a password's quotes and
    backslashes again, into a form the password no longer matches."""
    try:
        message = driver.scrub(str(error))
    except Exception:
        return _unshown(error)
    return f"{type(error).__name__}({message!r})"


def scrubbed(text: str, error: BaseException, driver: DriverBase) -> str:
    """``text`` (about ``error``) with the connection's own password blanked out: the
    work's exception may quote the connection string it was given. A closed connection
    no longer says its password; the message is then left out rather than risked."""
    try:
        return driver.scrub(text)
    except Exception:
        return _unshown(error)


def _unshown(error: BaseException) -> str:
    return f"{type(error).__name__} (its message is not shown: the connection is closed)"
