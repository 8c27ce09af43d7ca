"""Correct uses of pgsolo with Django that ``mypy --strict`` must accept (``.ci/run`` checks
this directory): ``@singleton(key, using=alias)`` takes a function of Django's connection,
and ``@singleton_command`` keeps a command's ``handle`` as it is.

Only type-checked, never run: no test collects this module.
"""

from __future__ import annotations

from typing import Any, assert_type

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

import pgsolo
from pgsolo import JobResult
from pgsolo.django import singleton_command


@pgsolo.singleton("cleanup", using="default", wait=5)
def cleanup(conn: BaseDatabaseWrapper, days: int) -> int:
    return days


@pgsolo.singleton("cleanup-any", using="replica", lifetime="session")
def cleanup_typed(conn: Any, *, days: int) -> list[str]:
    return [str(days)]


# Without django-stubs BaseCommand is Any, and mypy --strict refuses a subclass of it
# (``misc``): the commands here are plain classes, as a typed BaseCommand is.
class Command:
    @singleton_command(using="default", wait=10)
    def handle(self, *args: Any, **options: Any) -> str:
        return "done"


class KeyedCommand:
    @singleton_command("nightly-report", period="day")
    def handle(self, *args: Any, **options: Any) -> None:
        return None


def vacuum(conn: BaseDatabaseWrapper, days: int) -> int:
    return days


def calls() -> None:
    assert_type(cleanup(30), JobResult[int])
    assert_type(cleanup_typed(days=3), JobResult[list[str]])
    assert_type(Command().handle(), str)
    assert_type(KeyedCommand().handle(verbosity=1), None)
    # A Django connection is a connection of run_job's: no using= needed there.
    assert_type(pgsolo.run_job(connections["default"], "cleanup", vacuum, 3), JobResult[int])


def misuses() -> None:
    pgsolo.singleton("cleanup", using="default", wiat=5)  # type: ignore[call-arg]
    singleton_command(wiat=5)  # type: ignore[call-arg]
