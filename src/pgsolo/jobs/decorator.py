"""``@singleton``: a function whose every call runs it as a singleton job."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Never,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from .._types import Lifetime
from ..dsn import choose_dsn
from ..keys import KeyLike, Registry
from ..locking import Keep
from ._async.run import run_job_async
from ._sync.run import run_job
from .definition import Job, JobResult, refuse_unknown_options

if TYPE_CHECKING:
    import psycopg

__all__ = ["singleton"]

T = TypeVar("T")
P = ParamSpec("P")


class _SingletonDecorator(Protocol):
    # The connection types tell the overloads apart: with ``Any`` there, a function
    # taking ``AsyncConnection[Any]`` matched both and mypy made the result ``Any``.
    @overload
    def __call__(
        self, fn: Callable[Concatenate[psycopg.AsyncConnection[Any], P], Awaitable[T]]
    ) -> Callable[P, Awaitable[JobResult[T]]]: ...
    @overload
    def __call__(
        self, fn: Callable[Concatenate[psycopg.Connection[Any], P], T]
    ) -> Callable[P, JobResult[T]]: ...


def singleton(
    key: KeyLike,
    *,
    dsn: str | None = None,
    name: str | None = None,
    lifetime: Lifetime = "xact",
    wait: float | None = None,
    period: str | None = None,
    record: bool = False,
    raise_errors: bool = True,
    application_name: str | None = None,
    namespace: int | None = None,
    registry: Registry | None = None,
    keep: bool | Keep = False,
    timezone: str | None = None,
    **not_options: Never,
) -> _SingletonDecorator:
    """Decorate ``fn(conn, ...)`` so that each call runs it as a singleton job.

    pgsolo's options are given here, once, and only here: ``dsn=`` (or ``PGSOLO_DSN`` /
    ``DATABASE_URL``) says where to connect, every other one is :func:`run_job`'s, and
    they are checked now. The decorated function keeps its own signature: every argument
    of a call, keyword ones included (``greet(name="bob")``), goes to ``fn`` and none is
    read as an option. It returns a :class:`JobResult`; an ``async def`` function gives
    an async one.
    """
    refuse_unknown_options(singleton, not_options, decorator=True)
    Job.define(
        key,
        name=name,
        lifetime=lifetime,
        wait=wait,
        period=period,
        record=record,
        application_name=application_name,
        namespace=namespace,
        registry=registry,
        keep=keep,
        timezone=timezone,
    )
    options: dict[str, Any] = {
        "name": name,
        "lifetime": lifetime,
        "wait": wait,
        "period": period,
        "record": record,
        "raise_errors": raise_errors,
        "application_name": application_name,
        "namespace": namespace,
        "registry": registry,
        "keep": keep,
        "timezone": timezone,
    }

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
                # The call's keywords are bound to fn here, so none reaches run_job_async.
                work = functools.partial(fn, **kwargs)
                return await run_job_async(choose_dsn(dsn).dsn, key, work, *args, **options)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
            work = functools.partial(fn, **kwargs)
            return run_job(choose_dsn(dsn).dsn, key, work, *args, **options)

        return wrapper

    return decorate
