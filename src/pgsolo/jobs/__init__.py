"""Singleton jobs: run a callable under a lock and say what happened.

Every attempt ends as exactly one outcome: ``completed`` (with the callable's return
value), ``skipped`` (``busy``, or ``already-done-this-period``), ``failed`` (the callable
raised) or ``lost`` (the lock vanished while the work ran). A skip is never a success: it
is logged, counted and recorded as a skip.
"""

from __future__ import annotations

from .definition import Job, JobResult
from .record import history
from .run import run_job, run_job_async
from .singleton import singleton

__all__ = ["Job", "JobResult", "history", "run_job", "run_job_async", "singleton"]
