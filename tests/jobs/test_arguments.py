"""pgsolo's options never share a namespace with the job function's own arguments.

``@singleton`` takes pgsolo's options on the decorator only; every argument of a call of
the decorated function goes to the function. ``run_job`` / ``run_job_async`` take pgsolo's
options as keywords and the function's arguments positionally; anything else is a
:class:`UsageError` before a connection is opened. (``tests/typing`` checks the types.)

Here the tests only one flavour has; those alike in both (every keyword of a call goes to
the function, a keyword that is no option is refused, bad options fail before connecting)
are written once, async, in ``_async/test_arguments.py``; scripts/unasync.py generates
``_sync/test_arguments.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import CLOSED_PORT_DSN, new_job
from pgsolo import UsageError
from pgsolo.jobs import run_job


def test_run_job_positional_arguments_and_bound_keywords_reach_the_function(db: str) -> None:
    job = new_job("job-arguments")

    def fn(conn: psycopg.Connection[Any], a: int, *, name: str, wait: int) -> tuple[Any, ...]:
        return (a, name, wait)

    result = pgsolo.run_job(db, job, functools.partial(fn, name="bob", wait=7), 1, wait=5)

    assert (result.outcome, result.job, result.value) == ("completed", job, (1, "bob", 7))


def test_singleton_refuses_a_keyword_that_is_no_option_when_it_decorates() -> None:
    with pytest.raises(UsageError, match="did you mean lifetime= for lifetim="):
        pgsolo.singleton(new_job("job-arguments"), dsn=CLOSED_PORT_DSN, lifetim="session")  # type: ignore[call-arg]
    with pytest.raises(UsageError, match=r"given when it is called \(greeting=\.\.\. there\)"):
        pgsolo.singleton(new_job("job-arguments"), dsn=CLOSED_PORT_DSN, greeting="hi")  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["", "a\0b", "\ud800"])
def test_job_names_must_be_text_the_database_can_store(name: str) -> None:
    with pytest.raises(pgsolo.UsageError):
        run_job(CLOSED_PORT_DSN, 1, lambda c: None, name=name)


def test_run_job_refuses_an_async_function_before_connecting(db: str, observer: Any) -> None:
    """Guards a job that never ran: run_job() called an `async def` work, got a coroutine
    it never awaited, and reported `completed`, its period used up for the day."""
    job = new_job("async-work")
    ran: list[int] = []

    async def work(conn: Any) -> None:
        ran.append(1)

    for fn in (work, functools.partial(work)):
        with pytest.raises(UsageError, match="run_job_async"):
            run_job(db, job, fn, record=True, period="day")
    assert ran == []
    assert observer.conn.execute(
        "SELECT count(*) FROM pgsolo.job_runs WHERE job = %s", (job,)
    ).fetchone() == (0,)
    with pytest.raises(UsageError, match="must be a callable"):
        pgsolo.singleton(job, dsn=db)(None)  # type: ignore[call-overload]


class _AsyncCall:
    async def __call__(self, conn: Any) -> None:
        raise AssertionError("never awaited by run_job")


def _generator(conn: Any) -> Any:
    yield "never iterated"


async def _async_generator(conn: Any) -> Any:
    yield "never iterated"


async def _coroutine(conn: Any) -> None:
    raise AssertionError("never awaited by run_job")


@pytest.mark.parametrize(
    "fn",
    [_AsyncCall(), _generator, _async_generator, lambda conn: _coroutine(conn)],  # noqa: PLW0108
    ids=["async __call__", "generator", "async generator", "lambda of a coroutine"],
)
def test_work_whose_body_never_ran_is_a_failure_and_uses_up_no_period(
    db: str, observer: Any, fn: Any, recwarn: pytest.WarningsRecorder
) -> None:
    """Regression: work that returned a generator or a coroutine run_job() cannot await
    (its body never ran) was reported `completed`, its value the generator, and its period
    recorded: the next run of the day was skipped, and the work never ran at all."""
    job = new_job("unrun-work")
    with pytest.raises(UsageError, match="its body never ran"):
        run_job(db, job, fn, period="day", record=True)
    done = run_job(db, job, lambda conn: "ran", period="day")
    assert (done.outcome, done.value) == ("completed", "ran")
    (outcome,) = observer.conn.execute(
        "SELECT outcome FROM pgsolo.job_runs WHERE job = %s", (job,)
    ).fetchone()
    assert outcome == "failed"
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_run_job_async_says_its_work_was_a_plain_function(db: str) -> None:
    """Regression: a plain function ran under the lock, then the job failed with Python's
    own TypeError from awaiting its value; the error is pgsolo's, saying what to pass."""
    ran: list[int] = []

    def plain(conn: Any) -> str:
        ran.append(1)
        return "ran"

    with pytest.raises(UsageError, match="not an awaitable"):
        await pgsolo.run_job_async(db, new_job("plain-work"), plain)
    assert ran == [1]
