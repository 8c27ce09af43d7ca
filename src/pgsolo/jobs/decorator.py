"""``@singleton``: a function whose every call runs it as a singleton job."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    Protocol,
    TypeVar,
    Unpack,
    overload,
)

from ..drivers import django_configured, django_connection
from ..dsn import LIBPQ_DEFAULTS, choose_dsn, libpq_environment
from ..errors import UsageError
from ..keys import KeyLike
from ._async.run import run_job_async
from ._sync.run import run_job
from .definition import (
    Job,
    JobOptions,
    JobResult,
    refuse_unknown_options,
    refuse_unrunnable_work,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["singleton"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
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

    # using= passes Django's connection, which is Any to a type checker (Django ships no
    # types), so this overload takes its function too. An overload of its own, for
    # django-stubs' classes, would have to take Any or Never first, which every psycopg
    # function matches as well: mypy then made an async one's result Any.


def singleton(
    key: KeyLike,
    *,
    dsn: str | None = None,
    using: str | None = None,
    **options: Unpack[JobOptions],
) -> _SingletonDecorator:
    """Decorate ``fn(conn, ...)`` so that each call runs it as a singleton job.

    pgsolo's options are given here, once, and only here: ``dsn=`` (or ``PGSOLO_DSN`` /
    ``DATABASE_URL``, read at each call) says where pgsolo connects, or ``using=`` names a
    database of Django's ``settings.DATABASES`` whose connection, ``connections[using]``
    of the calling thread, runs the job (a sync function only); every other option is
    :func:`run_job`'s (:class:`JobOptions`), and they are checked now. The decorated
    function keeps its own signature: every argument of a call, keyword ones included
    (``greet(name="bob")``), goes to ``fn`` and none is read as an option. It returns a
    :class:`JobResult`; an ``async def`` function gives an async one.
    """
    refuse_unknown_options("singleton", options, decorator=True)
    Job.define(key, **options)
    if using is not None and dsn is not None:
        raise UsageError("singleton() takes dsn= or using= (a Django database alias), not both")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        refuse_unrunnable_work(fn, awaits=True)  # each flavour gets the runner it needs
        if using is not None:
            return _on_django(fn, using, key, options)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
                # The call's keywords are bound to fn here, so none reaches run_job_async.
                work = functools.partial(fn, **kwargs)
                return await run_job_async(_dsn_of(dsn), key, work, *args, **options)

            return _for_callers(async_wrapper, fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
            work = functools.partial(fn, **kwargs)
            return run_job(_dsn_of(dsn), key, work, *args, **options)

        return _for_callers(wrapper, fn)

    return decorate


def _for_callers(wrapper: F, fn: Callable[..., Any]) -> F:
    """``wrapper`` with the signature its callers call it by (``inspect.signature``, help,
    IDEs): ``fn``'s without its first parameter, the connection pgsolo passes, and a
    :class:`JobResult` for its return."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or a callable without one: as wrapped
        return wrapper
    parameters = list(signature.parameters.values())[1:]
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=JobResult
    )
    return wrapper


def _on_django(
    fn: Callable[..., Any], using: str, key: KeyLike, options: JobOptions
) -> Callable[..., JobResult[Any]]:
    """``fn`` run as the job on Django's connection ``using``, looked up at each call:
    Django's connections belong to the thread that uses them."""
    if inspect.iscoroutinefunction(fn):
        raise UsageError(
            f"singleton(using={using!r}) runs the job on a Django connection, which is sync:"
            f" decorate a def function, not async def {fn.__qualname__}"
        )

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> JobResult[Any]:
        work = functools.partial(fn, **kwargs)
        return run_job(django_connection(using), key, work, *args, **options)

    return _for_callers(wrapper, fn)


def _dsn_of(dsn: str | None) -> str:
    """The connection string of a call: ``dsn=``, else the environment's. With neither,
    nor a libpq variable that says where (``PGHOST``...), a :class:`UsageError` that says
    how to name the database, rather than a failed connect to wherever libpq guesses."""
    choice = choose_dsn(dsn)
    if choice.source == LIBPQ_DEFAULTS and not libpq_environment():
        django = (
            ", using='default' (an alias of Django's settings.DATABASES)"
            if django_configured()
            else ""
        )
        raise UsageError(
            "singleton() has no database to connect to: pass dsn='postgresql://...'"
            f"{django}, or set PGSOLO_DSN (or DATABASE_URL, or libpq's PGHOST, PGSERVICE...)"
            " in the environment"
        )
    return choice.dsn
