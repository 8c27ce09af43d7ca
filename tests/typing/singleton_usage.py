"""Correct uses of ``@singleton`` and ``run_job`` that ``mypy --strict`` must accept
(``.ci/run`` checks this directory): the decorated function keeps its own signature,
keyword arguments included, and the result type follows the function's return type.

Only type-checked, never run: no test collects this module.
"""

from __future__ import annotations

import functools
from typing import Any, assert_type

import psycopg

import pgsolo
from pgsolo import JobResult

DSN = "postgresql://localhost/app"


@pgsolo.singleton("greet", dsn=DSN, period="day", record=True)
def greet(conn: psycopg.Connection[Any], name: str, record: bool = False) -> str:
    return f"hello {name}" if not record else name


@pgsolo.singleton("greet-async", dsn=DSN, lifetime="session", keep=pgsolo.Keep(cancel=True))
async def greet_async(conn: psycopg.AsyncConnection[Any], name: str, *, loud: bool) -> int:
    return len(name) if loud else 0


def greet_plain(conn: psycopg.Connection[Any], name: str, *, times: int = 1) -> list[str]:
    return [name] * times


async def greet_plain_async(conn: psycopg.AsyncConnection[Any], name: str) -> bytes:
    return name.encode()


def sync_calls() -> None:
    # Every argument of a call goes to the function; `name` and `record` are its own.
    assert_type(greet(name="bob"), JobResult[str])
    assert_type(greet("x", record=True), JobResult[str])
    assert_type(greet("x", True), JobResult[str])
    # run_job: positional arguments go to fn; its keyword arguments are bound first.
    assert_type(pgsolo.run_job(DSN, "greet", greet_plain, "bob"), JobResult[list[str]])
    bound = functools.partial(greet_plain, name="bob", times=2)
    assert_type(pgsolo.run_job(DSN, "greet", bound, wait=5, record=True), JobResult[list[str]])


async def async_calls() -> None:
    assert_type(await greet_async(name="bob", loud=True), JobResult[int])
    assert_type(await greet_async("bob", loud=False), JobResult[int])
    result = await pgsolo.run_job_async(
        DSN, "greet", functools.partial(greet_plain_async, name="bob"), lifetime="session"
    )
    assert_type(result, JobResult[bytes])


def misspelt_options() -> None:
    # An option that is not one is mypy's "unexpected keyword argument" (call-arg),
    # naming it, and each option keeps its type (arg-type): the ignores below are
    # checked as used, so the error codes are held too.
    pgsolo.run_job(DSN, "greet", greet_plain, "bob", wiat=5)  # type: ignore[call-arg]
    pgsolo.singleton("greet", dsn=DSN, wiat=5)  # type: ignore[call-arg]
    pgsolo.run_job(DSN, "greet", greet_plain, "bob", wait="5")  # type: ignore[arg-type]
