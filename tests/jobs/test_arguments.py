"""pgsolo's options never share a namespace with the job function's own arguments.

``@singleton`` takes pgsolo's options on the decorator only; every argument of a call of
the decorated function goes to the function. ``run_job`` / ``run_job_async`` take pgsolo's
options as keywords and the function's arguments positionally; anything else is a
:class:`UsageError` before a connection is opened. (``tests/typing`` checks the types.)

Below them, the job options themselves: bad keys, lifetimes, waits, periods and names are
refused before connecting.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgsolo
from pgsolo import InvalidKeyError, UsageError
from pgsolo.jobs import JobResult, run_job, run_job_async

Connect = Callable[..., psycopg.Connection[Any]]

CLOSED_PORT_DSN = "postgresql://u:p@127.0.0.1:1/db"  # nothing listens: connecting fails


def new_job() -> str:
    return f"job-arguments:{uuid.uuid4().hex[:16]}"


def test_singleton_passes_every_keyword_of_a_call_to_the_function(db: str, observer: Any) -> None:
    """Guards: ``greet(name="bob")`` renamed the job to ``bob`` and failed with a
    TypeError; ``greet("x", record=True)`` called the function with ``record=False`` and
    wrote a ledger row. The call's keywords are the function's, whatever their names."""
    job = new_job()
    received: list[tuple[str, bool, int]] = []

    @pgsolo.singleton(job, dsn=db)
    def greet(conn: psycopg.Connection[Any], name: str, record: bool = False) -> str:
        received.append((name, record, conn.info.backend_pid))
        return f"hello {name}"

    first = greet(name="bob")
    second = greet("x", record=True)

    assert [(name, record) for name, record, _ in received] == [("bob", False), ("x", True)]
    assert isinstance(first, JobResult)
    assert (first.outcome, first.job, first.value) == ("completed", job, "hello bob")
    assert (second.outcome, second.job, second.value) == ("completed", job, "hello x")
    assert first.key == second.key == pgsolo.as_key(job)
    assert pgsolo.history(observer.conn, job=job) == []  # record=True was greet's, not ours
    assert pgsolo.history(observer.conn, job="bob") == []


async def test_async_singleton_passes_every_keyword_of_a_call_to_the_function(
    db: str, observer: Any
) -> None:
    job = new_job()
    received: list[tuple[str, bool]] = []

    @pgsolo.singleton(job, dsn=db)
    async def greet(conn: psycopg.AsyncConnection[Any], name: str, record: bool = False) -> str:
        received.append((name, record))
        return name

    first = await greet(name="bob")
    second = await greet("x", record=True)

    assert received == [("bob", False), ("x", True)]
    assert (first.outcome, first.job, first.value) == ("completed", job, "bob")
    assert (second.outcome, second.job, second.value) == ("completed", job, "x")
    assert pgsolo.history(observer.conn, job=job) == []


def test_run_job_positional_arguments_and_bound_keywords_reach_the_function(db: str) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection[Any], a: int, *, name: str, wait: int) -> tuple[Any, ...]:
        return (a, name, wait)

    result = pgsolo.run_job(db, job, functools.partial(fn, name="bob", wait=7), 1, wait=5)

    assert (result.outcome, result.job, result.value) == ("completed", job, (1, "bob", 7))


@pytest.mark.parametrize("target", ["dsn", "connection"])
def test_run_job_refuses_a_keyword_that_is_no_option_before_connecting(
    connect: Connect, target: str
) -> None:
    """Guards: a keyword that is not one of pgsolo's options used to be passed on to the
    function (and one that is, such as ``name``, silently became an option)."""
    conn = connect()
    conn.close()  # any SQL would fail with a driver error, not a UsageError
    calls: list[object] = []

    def fn(c: object, *, greeting: str) -> None:
        calls.append(greeting)

    with pytest.raises(UsageError, match=r"functools\.partial\(fn, greeting=\.\.\.\)"):
        pgsolo.run_job(
            CLOSED_PORT_DSN if target == "dsn" else conn,
            new_job(),
            fn,
            greeting="hi",  # type: ignore[arg-type]
        )
    assert calls == []


async def test_run_job_async_refuses_a_keyword_that_is_no_option_before_connecting() -> None:
    calls: list[object] = []

    async def fn(c: object, *, greeting: str) -> None:
        calls.append(greeting)

    with pytest.raises(UsageError, match=r"functools\.partial\(fn, greeting=\.\.\.\)"):
        await pgsolo.run_job_async(
            CLOSED_PORT_DSN,
            new_job(),
            fn,
            greeting="hi",  # type: ignore[arg-type]
        )
    assert calls == []


def test_singleton_refuses_a_keyword_that_is_no_option_when_it_decorates() -> None:
    with pytest.raises(UsageError, match="lifetim"):
        pgsolo.singleton(new_job(), dsn=CLOSED_PORT_DSN, lifetim="session")  # type: ignore[arg-type]


# -- sync jobs -----------------------------------------------------------------------------


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
    ],
)
def test_bad_arguments_fail_before_connecting(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    key = options.pop("key", "jobs-test:valid")
    calls: list[int] = []

    with pytest.raises(error, match=match) as raised:
        run_job(CLOSED_PORT_DSN, key, lambda c: calls.append(1), **options)

    assert not isinstance(raised.value, psycopg.Error)
    assert calls == []


@pytest.mark.parametrize("name", ["", "a\0b", "\ud800"])
def test_job_names_must_be_text_the_database_can_store(name: str) -> None:
    with pytest.raises(pgsolo.UsageError):
        run_job(CLOSED_PORT_DSN, 1, lambda c: None, name=name)


# -- async jobs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"key": 2**63}, InvalidKeyError),
        ({"key": ""}, InvalidKeyError),
        ({"lifetime": "forever"}, UsageError),
        ({"wait": -1}, UsageError),
        ({"period": "fortnight"}, UsageError),
    ],
)
async def test_bad_arguments_fail_before_connecting_async(
    options: dict[str, Any], error: type[Exception]
) -> None:
    key = options.pop("key", "jobs-async-test:valid")
    calls: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    with pytest.raises(error) as raised:
        await run_job_async(CLOSED_PORT_DSN, key, fn, **options)

    assert not isinstance(raised.value, psycopg.Error)
    assert calls == []
