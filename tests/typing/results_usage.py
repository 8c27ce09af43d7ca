"""A job's result narrows by its outcome, and an operation's context needs no type
argument, as ``mypy --strict`` sees them (``.ci/run`` checks this directory).

Before: ``JobResult.value`` stayed ``T | None`` after ``if result.completed:``, so
``n: int = result.value`` was an error, and a bare ``OperationContext`` was one too
("Missing type parameters"). Only type-checked, never run: no test collects this module.
"""

from __future__ import annotations

from typing import Any, assert_type

import psycopg

import pgsolo
from pgsolo import (
    JobCompleted,
    JobFailed,
    JobLost,
    JobResult,
    JobSkipped,
    OperationContext,
    Reason,
)
from pgsolo.reasons import FailReason, LostReason, SkipReason

DSN = "postgresql://localhost/app"


def count(conn: psycopg.Connection[Any]) -> int:
    return 1


def completed_narrows(result: JobResult[int]) -> int:
    if result.completed:
        assert_type(result, JobCompleted[int])
        n: int = result.value  # the old trap: `int | None` before
        return n
    # A lost run may carry what its work returned (before: typed None, while it did).
    assert_type(result.value, int | None)
    return 0


def outcome_narrows(result: JobResult[int]) -> int:
    if result.outcome == "completed":
        return result.value
    if result.outcome == "skipped":
        assert_type(result, JobSkipped[int])
        reason: Reason = result.reason  # a skip always says why
        return len(reason)
    assert_type(result, JobFailed[int] | JobLost[int])
    return -1


def match_narrows(result: JobResult[str]) -> str:
    match result:
        case JobCompleted(value=value):
            assert_type(value, str)
            return value
        case JobSkipped() | JobFailed() | JobLost():
            return result.outcome


def run_job_narrows() -> int:
    result = pgsolo.run_job(DSN, "count", count)
    assert_type(result, JobResult[int])
    if not result.completed:
        return -1
    return result.value + 1


def any_result(result: object) -> bool:
    # At run time JobResult is the common class of the four.
    return isinstance(result, JobResult)


def bare_context(ctx: OperationContext) -> str:
    # OperationContext's type argument defaults to Any: no "Missing type parameters".
    assert_type(ctx.conn, Any)
    return ctx.idempotency_key


def typed_context(ctx: OperationContext[psycopg.Connection[Any]]) -> None:
    assert_type(ctx.conn, psycopg.Connection[Any])


def reasons_by_outcome(result: JobResult[int]) -> None:
    # Each outcome's reason is of its own family: a skip's is never a loss's.
    match result:
        case JobSkipped():
            assert_type(result.reason, SkipReason)
        case JobLost():
            assert_type(result.reason, LostReason)
            assert_type(result.value, int | None)
        case JobFailed():
            assert_type(result.reason, FailReason | None)
        case _:
            pass
