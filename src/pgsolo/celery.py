"""pgsolo with Celery: task singletons, and a beat that runs in one of its replicas
(docs/schedulers.md).

:class:`Singleton` is a task base class (``@app.task(base=Singleton)``): at most one run
of a task per key at a time, across every worker, the key made of the task's name and its
arguments (:func:`task_key`). The run holds a pgsolo session lock for as long as its body
runs, on a connection of its own watched by the keeper; a worker killed with ``kill -9``
or by a hard time limit loses its session, and the server lets the key go at once. A run
that finds the key held is a duplicate, never silent: :class:`DuplicateTaskError` (the
task's FAILURE), or a retry with ``on_duplicate = "retry"``.

:class:`LeaderScheduler` is a beat scheduler (``celery beat -S
pgsolo.celery:LeaderScheduler``): every beat replica keeps the schedule, and only the
leader (:func:`pgsolo.campaign` on ``celery-beat:<app name>``) sends.

Both find the database in the app's configuration (``pgsolo_dsn``), else in
``PGSOLO_DSN``. Importing this module imports Celery; ``import pgsolo`` never does.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar, Literal

from celery.beat import PersistentScheduler  # type: ignore[import-untyped]
from celery.exceptions import Reject  # type: ignore[import-untyped]

from celery import Task  # type: ignore[import-untyped]

from .errors import InvalidArgumentError, LockUnavailableError, UsageError
from .jobs import run_job
from .leadership import Term, campaign

__all__ = ["DuplicateTaskError", "LeaderScheduler", "Singleton", "beat_leader_name", "task_key"]

logger = logging.getLogger("pgsolo.celery")

_DSN_SETTING = "pgsolo_dsn"


class DuplicateTaskError(LockUnavailableError):
    """A run of a :class:`Singleton` task found its key held by another run, and did not
    run: the task's FAILURE (or the exception of the retry that ``on_duplicate =
    "retry"`` asks for). ``key`` is the key's name (:func:`task_key`)."""

    def __init__(self, message: str, *, key: object = None) -> None:
        # key has a default: a result backend rebuilds the error from its message alone.
        super().__init__(message, key=key)


def dsn_of(app: Any) -> str:
    """The connection string of the app's configuration (``pgsolo_dsn``), else
    ``PGSOLO_DSN``; :class:`~pgsolo.UsageError` when neither says it."""
    dsn = app.conf.get(_DSN_SETTING) or os.environ.get("PGSOLO_DSN")
    if not dsn:
        raise UsageError(
            f"pgsolo.celery needs the database: set {_DSN_SETTING} in the Celery app's"
            " configuration, or PGSOLO_DSN in the environment"
        )
    if not isinstance(dsn, str):
        raise InvalidArgumentError(
            f"{_DSN_SETTING} is a connection string, got {type(dsn).__name__}"
        )
    return dsn


def task_key(
    name: str,
    run: Callable[..., object],
    args: Sequence[object],
    kwargs: dict[str, object],
    unique_on: Sequence[str] | None,
) -> str:
    """The key name of a run of the task ``name`` whose body is ``run``, called with
    ``args`` and ``kwargs``: ``celery:<name>`` with ``unique_on=[]``; else
    ``celery:<name>:<the arguments named in unique_on, as JSON>``, all of them (defaults
    included) with ``unique_on=None``, as celery-singleton does. Keyword and positional
    spellings of one call give one key. :class:`~pgsolo.InvalidArgumentError` for a name
    ``run`` has no parameter of, or an argument JSON cannot say."""
    if unique_on is not None and not unique_on:
        return f"celery:{name}"
    try:
        bound = inspect.signature(run).bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentError(
            f"task {name} called with arguments it does not take: {exc}"
        ) from None
    bound.apply_defaults()
    chosen = bound.arguments if unique_on is None else {n: bound.arguments[n] for n in unique_on}
    try:
        text = json.dumps(chosen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"task {name}'s key is made of its arguments {sorted(chosen)}, as JSON: {exc}"
        ) from None
    return f"celery:{name}:{text}"


# While a Singleton's body holds its lock: the sends of the retries it asked for, held
# back until the lock is let go (a retry sent at once could reach a worker while the lock
# is still held, and be refused as a duplicate of the run that sent it).
_held_back: ContextVar[list[Callable[[], object]] | None] = ContextVar(
    "pgsolo_celery_held_back", default=None
)
_retrying: ContextVar[list[Callable[[], object]] | None] = ContextVar(
    "pgsolo_celery_retrying", default=None
)


class Singleton(Task):  # type: ignore[misc]
    """A Celery task base class: at most one run of the task at a time per key, across
    every worker on the database (``@app.task(base=Singleton, unique_on=["tenant_id"])``).

    ``unique_on``: the arguments the key is made of (:func:`task_key`): ``None`` (the
    default) all of them, ``[]`` none (one run of the task at a time, whatever its
    arguments). ``on_duplicate``: what a run that finds its key held does: ``"raise"``
    (the default), :class:`DuplicateTaskError`, the task's FAILURE; ``"retry"``,
    ``self.retry()`` with that error, after the task's ``default_retry_delay`` and up to
    its ``max_retries`` (then the FAILURE).

    Each run opens a connection from the app's ``pgsolo_dsn`` (or ``PGSOLO_DSN``), named
    ``pgsolo:celery:<task name>``, holds the key's session lock for as long as the body
    runs, with the keeper watching it, and closes it. A lock lost while the body ran
    fails the run with :class:`~pgsolo.LockLostError`. A retry the body asks for is sent
    once the lock is let go, so it is never refused as a duplicate of its own run.
    """

    unique_on: ClassVar[Sequence[str] | None] = None
    on_duplicate: ClassVar[Literal["raise", "retry"]] = "raise"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery's @app.task makes a subclass per task, with the decorator's options as
        # class attributes: a wrong one is said where the task is defined.
        super().__init_subclass__(**kwargs)
        unique_on = cls.unique_on
        if isinstance(unique_on, str):
            cls.unique_on = unique_on = (unique_on,)
        if unique_on is not None and (
            not isinstance(unique_on, Sequence) or not all(isinstance(n, str) for n in unique_on)
        ):
            raise InvalidArgumentError(
                f"unique_on takes the names of the task's arguments, got {unique_on!r}"
            )
        if cls.on_duplicate not in ("raise", "retry"):
            raise InvalidArgumentError(
                f"on_duplicate is 'raise' or 'retry', got {cls.on_duplicate!r}"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = task_key(self.name, self.run, args, kwargs, self.unique_on)
        dsn = dsn_of(self.app)
        held_back: list[Callable[[], object]] = []
        token = _held_back.set(held_back)
        try:
            result = run_job(
                dsn,
                key,
                lambda _conn: self._body(args, kwargs),
                name=f"celery:{self.name}",
                lifetime="session",
                keep=True,
            )
        finally:
            _held_back.reset(token)
            for send in held_back:
                try:
                    send()
                except Exception as exc:
                    raise Reject(exc, requeue=False) from exc  # as Task.retry does
        if result.completed:
            return result.value
        duplicate = DuplicateTaskError(
            f"task {self.name}[{self.request.id}] did not run: another run of {key} holds its lock",
            key=key,
        )
        if self.on_duplicate == "retry":
            return self.retry(exc=duplicate)
        raise duplicate

    def _body(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.request.called_directly:  # a plain call: Celery's __call__ sets up its request
            return super().__call__(*args, **kwargs)
        # A worker's run, or apply(): the request is set up already, and one set up again
        # would lose its id and make retry() take the run for a plain call.
        return self.run(*args, **kwargs)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        held_back = _held_back.get()
        token = _retrying.set(held_back)
        try:
            return super().retry(*args, **kwargs)
        finally:
            _retrying.reset(token)

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        held_back = _retrying.get()
        if held_back is None:
            return super().apply_async(args, kwargs, *rest, **options)
        # The retry of a run that holds its lock: sent once the lock is let go.
        held_back.append(functools.partial(super().apply_async, args, kwargs, *rest, **options))
        return self.AsyncResult(options.get("task_id"))


def beat_leader_name(app: Any) -> str:
    """The leader name of the app's beats, ``celery-beat:<app name>``: its beat replicas
    stand for the session lock of ``pgsolo:leader:celery-beat:<app name>``."""
    return f"celery-beat:{app.main or 'celery'}"


class LeaderScheduler(PersistentScheduler):  # type: ignore[misc]
    """A beat scheduler of which one replica sends, the leader: ``celery beat -S
    pgsolo.celery:LeaderScheduler``, in as many replicas as you like.

    Each replica stands for leadership (:func:`pgsolo.campaign`, name
    :func:`beat_leader_name`) in a thread of its own, on a connection opened from the
    app's ``pgsolo_dsn`` (or ``PGSOLO_DSN``), and keeps the schedule as Celery's own
    scheduler does (its schedule file, ``-s``): each entry falls due and is moved on to
    its next time in every replica, and is sent by the leader alone. A replica that is
    not leading, or whose term the keeper found lost, sends nothing, from the next entry
    on; one that stands by sends from the first entry that falls due after it leads.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._term: Term | None = None
        self._stopping = threading.Event()
        self._candidate: threading.Thread | None = None
        super().__init__(*args, **kwargs)
        if kwargs.get("lazy"):  # beat's introspection builds one that never runs
            return
        self._candidate = threading.Thread(
            target=campaign,
            args=(dsn_of(self.app), beat_leader_name(self.app), self._lead),
            kwargs={"stop": self._stopping, "fencing": False},
            name="pgsolo-beat-leader",
            daemon=True,
        )
        self._candidate.start()

    def _lead(self, term: Term) -> None:
        self._term = term
        try:
            while not (self._stopping.is_set() or term.wait_lost(1.0)):
                pass
        finally:
            self._term = None

    @property
    def leading(self) -> bool:
        """Whether this replica leads now, its term not found lost."""
        term = self._term
        return term is not None and not term.lost

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if self.leading:
            super().apply_entry(entry, producer=producer)
        else:
            logger.debug("beat: not leading, not sending %s (%s)", entry.name, entry.task)

    def close(self) -> None:
        self._stopping.set()
        if self._candidate is not None:
            self._candidate.join()  # the term ends with it, and another replica leads
        super().close()
