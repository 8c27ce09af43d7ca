"""pgsolo with Django: every lock API takes ``django.db.connection`` or
``connections[alias]`` directly, and ``@pgsolo.singleton(key, using=alias)`` runs a job on
one; this module has what a management command needs, :func:`singleton_command`. In
``INSTALLED_APPS``, ``"pgsolo.django"`` is also the app whose migrations make pgsolo's
tables (:mod:`pgsolo.django.schema`).

Importing it does not import Django: the decorated command does, when it runs (it runs
where Django is set up already), and Django imports the app's modules.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from ..cli.exit_codes import EXIT_FAILED, EXIT_LOST, EXIT_SKIPPED, exit_code_of
from ..drivers import django_command_error, django_connection
from ..errors import LockLostError, PgsoloError, UsageError
from ..jobs import JobOptions, JobResult, run_job
from ..jobs.definition import Job, refuse_unknown_options
from ..keys import KeyLike

__all__ = ["command_key", "singleton_command"]

C = TypeVar("C")
P = ParamSpec("P")
R = TypeVar("R")

_COMMANDS = ".management.commands."


def singleton_command(
    key: KeyLike | None = None,
    *,
    using: str = "default",
    **options: Unpack[JobOptions],
) -> Callable[[Callable[Concatenate[C, P], R]], Callable[Concatenate[C, P], R]]:
    """Decorate a management command's ``handle`` so that at most one run of the command
    does its work at a time, across every host that runs it.

    ``key`` defaults to :func:`command_key` of the command (``django:<app>:<command>``).
    The lock is taken on ``connections[using]``, the connection the command's own queries
    use, so no connection string is needed. ``options`` are :func:`~pgsolo.run_job`'s
    (:class:`~pgsolo.JobOptions`), checked now; ``lifetime`` defaults to ``"session"``,
    as ``pgsolo run`` holds its lock: the command commits as it pleases, and the lock
    lasts until ``handle`` returns.

    Each ending leaves ``manage.py`` with the exit code ``pgsolo run`` gives it (DESIGN
    §5), through Django's ``CommandError`` (one line on stderr): completed, 0 (``handle``'s
    return value is the command's output); skipped (busy, the wait ran out, or already
    done this period), 75; the lock lost while the command ran, 70; the database
    unavailable, 69; an unsafe connection (a standby, a transaction pooler), 78; a
    pgsolo usage error (``using=`` Django lacks), 2. An exception of ``handle`` is
    raised as it is (with ``raise_errors=False``, a failed run exits 1).
    ``call_command()`` raises that ``CommandError`` to its caller, whose ``returncode``
    says which (a pgsolo error is its ``__cause__``).
    """
    refuse_unknown_options("singleton_command", options, decorator=True)
    job_options: JobOptions = {"lifetime": "session", **options}
    # The default key, a name, is known when the command runs: one stands in for it now.
    Job.define("django:app:command" if key is None else key, **job_options)
    if not isinstance(using, str) or not using:
        raise UsageError(f"using= takes an alias of Django's settings.DATABASES, got {using!r}")

    def decorate(handle: Callable[Concatenate[C, P], R]) -> Callable[Concatenate[C, P], R]:
        if inspect.iscoroutinefunction(handle):
            raise UsageError(
                f"singleton_command decorates a command's handle, which Django calls as a"
                f" sync method, not async def {handle.__qualname__}"
            )

        return _run_as_job(handle, key, using, job_options)

    return decorate


def _run_as_job(
    handle: Callable[Concatenate[C, P], R], key: KeyLike | None, using: str, options: JobOptions
) -> Callable[Concatenate[C, P], R]:
    """``handle`` run as the job of ``key`` (the command's own by default) on
    ``connections[using]``; what did not complete is Django's ``CommandError``."""

    @functools.wraps(handle)
    def wrapper(command: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        raised: list[BaseException] = []  # handle's own error, to let it through

        def work(_connection: object) -> R:
            try:
                return handle(command, *args, **kwargs)
            except BaseException as exc:
                raised.append(exc)
                raise

        try:
            result = run_job(
                django_connection(using),
                command_key(type(command)) if key is None else key,
                work,
                **options,
            )
        except PgsoloError as exc:
            if exc in raised:
                raise
            code = EXIT_LOST if isinstance(exc, LockLostError) else exit_code_of(exc)
            raise django_command_error(f"pgsolo: {exc}", code) from exc
        if result.completed:
            return result.value
        raise django_command_error(*_ending(result)) from result.error

    return wrapper


def command_key(command: type) -> str:
    """The default key of a command's :func:`singleton_command`: ``django:<app>:<command>``,
    from the module Django loads it from (``<app>.management.commands.<command>``), so that
    every host and every way of running it (``manage.py``, ``django-admin``,
    ``call_command()``) shares it: ``django:billing:send_invoices``. A class defined
    elsewhere has no command name, and is a :class:`~pgsolo.UsageError`: give a key."""
    app, marker, name = command.__module__.rpartition(_COMMANDS)
    if not (app and marker and name) or "." in name:
        raise UsageError(
            f"{command.__module__}.{command.__qualname__} is not in a module of management"
            f" commands (<app>{_COMMANDS}<command>), so it has no command name for a key:"
            " give one, @singleton_command('my-key')"
        )
    return f"django:{app}:{name}"


def _ending(result: JobResult[Any]) -> tuple[str, int]:
    """What ``manage.py`` says and exits with when the job did not complete."""
    if result.outcome == "skipped":
        if result.reason == "already-done-this-period":
            return f"skipped: {result.job} already completed this period", EXIT_SKIPPED
        return f"skipped: {result.key} is busy: another run holds its lock", EXIT_SKIPPED
    if result.outcome == "lost":
        detail = f": {result.error}" if result.error is not None else ""
        return (
            f"lock {result.key} was lost while the command ran ({result.reason}){detail}",
            EXIT_LOST,
        )
    return f"{result.job} failed: {result.error!r}", EXIT_FAILED
