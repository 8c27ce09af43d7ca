"""An async job's arguments: the function's own apart from pgsolo's options, and bad options
refused before connecting. Written once, under ``_async/``: scripts/unasync.py writes the
twin under ``_sync/``. Tests of one flavour only: ``tests/jobs/test_arguments.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgsolo
from _support import CLOSED_PORT_DSN, AConnect, new_job
from pgsolo import InvalidKeyError, UsageError
from pgsolo.jobs import JobResult, run_job_async


async def test_singleton_passes_every_keyword_of_a_call_to_the_function(
    db: str, observer: Any
) -> None:
    """Guards: ``greet(name="bob")`` renamed the job to ``bob`` and failed with a
    TypeError; ``greet("x", record=True)`` called the function with ``record=False`` and
    wrote a ledger row. The call's keywords are the function's, whatever their names."""
    job = new_job("job-arguments")
    received: list[tuple[str, bool, int]] = []

    @pgsolo.singleton(job, dsn=db)
    async def greet(conn: psycopg.AsyncConnection[Any], name: str, record: bool = False) -> str:
        received.append((name, record, conn.info.backend_pid))
        return f"hello {name}"

    first = await greet(name="bob")
    second = await greet("x", record=True)

    assert [(name, record) for name, record, _ in received] == [("bob", False), ("x", True)]
    assert isinstance(first, JobResult)
    assert (first.outcome, first.job, first.value) == ("completed", job, "hello bob")
    assert (second.outcome, second.job, second.value) == ("completed", job, "hello x")
    assert first.key == second.key == pgsolo.as_key(job)
    assert pgsolo.history(observer.conn, job=job) == []  # record=True was greet's, not ours
    assert pgsolo.history(observer.conn, job="bob") == []


@pytest.mark.parametrize("target", ["dsn", "connection"])
async def test_run_job_refuses_a_keyword_that_is_no_option_before_connecting(
    aconnect: AConnect, target: str
) -> None:
    """Guards: a keyword that is not one of pgsolo's options used to be passed on to the
    function (and one that is, such as ``name``, silently became an option)."""
    conn = await aconnect()
    await conn.close()  # any SQL would fail with a driver error, not a UsageError
    calls: list[object] = []

    async def fn(c: object, *, greeting: str) -> None:
        calls.append(greeting)

    with pytest.raises(UsageError, match=r"functools\.partial\(fn, greeting=\.\.\.\)"):
        await pgsolo.run_job_async(
            CLOSED_PORT_DSN if target == "dsn" else conn,
            new_job("job-arguments"),
            fn,
            greeting="hi",  # type: ignore[call-arg]
        )
    assert calls == []


@pytest.mark.parametrize("target", ["dsn", "connection"])
async def test_a_misspelt_option_names_the_option_it_was_meant_to_be(
    aconnect: AConnect, target: str
) -> None:
    """Guards: ``wait=`` misspelt ``wiat=`` was answered with advice to bind it with
    ``functools.partial``, as if it were the function's; it is now a :class:`UsageError`
    that asks "did you mean wait=", before any SQL."""
    conn = await aconnect()
    await conn.close()  # any SQL would fail with a driver error, not a UsageError

    async def fn(c: object) -> None:
        raise AssertionError("never called")

    with pytest.raises(UsageError, match=r"did you mean wait= for wiat=") as raised:
        await pgsolo.run_job_async(
            CLOSED_PORT_DSN if target == "dsn" else conn,
            new_job("job-arguments"),
            fn,
            wiat=5,  # type: ignore[call-arg]
        )
    assert "partial" not in str(raised.value)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"key": 2**63}, InvalidKeyError, "int64"),
        ({"key": (1, 2**31)}, InvalidKeyError, "pair key"),
        ({"key": ""}, InvalidKeyError, "empty"),
        ({"key": 1.5}, InvalidKeyError, "float"),
        ({"lifetime": "forever"}, UsageError, "lifetime"),
        ({"wait": -1}, UsageError, "wait"),
        ({"wait": 0}, UsageError, "wait"),
        ({"wait": "5"}, UsageError, "wait"),
        ({"period": "fortnight"}, UsageError, "period"),
        ({"period": "0 seconds"}, UsageError, "period"),
        ({"record": "yes"}, UsageError, "record"),
        ({"raise_errors": "no"}, UsageError, "raise_errors"),
        ({"application_name": 5}, UsageError, "application_name"),  # was an AttributeError
        ({"application_name": b"worker"}, UsageError, "application_name"),
    ],
)
async def test_bad_arguments_fail_before_connecting(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    key = options.pop("key", "jobs-async-test:valid")
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    with pytest.raises(error, match=match) as raised:
        await run_job_async(CLOSED_PORT_DSN, key, fn, **options)

    assert not isinstance(raised.value, psycopg.Error)
    assert calls == []


@pytest.mark.parametrize("work", [None, "settle", 42], ids=["None", "str", "int"])
async def test_work_that_is_not_callable_is_refused_before_connecting(
    work: Any, observer: Any, db: str
) -> None:
    """Guards the ledger: the lock was taken and a `failed` row written before the call
    of a work that is not callable raised a bare TypeError."""
    job = new_job("not-callable")
    with pytest.raises(UsageError, match="must be a callable"):
        await run_job_async(db, job, work, record=True)
    assert observer.conn.execute(
        "SELECT count(*) FROM pgsolo.job_runs WHERE job = %s", (job,)
    ).fetchone() == (0,)
