"""pgsolo with Celery: task singletons, a beat that runs in one of its replicas, and each
scheduled occurrence run once (docs/schedulers.md).

:class:`Singleton` is a task base class (``@app.task(base=Singleton)``): at most one run
of a task per key at a time, across every worker, the key made of the task's name and its
arguments (:func:`task_key`). The run holds a pgsolo session lock for as long as its body
runs, on a connection of its own watched by the keeper; a worker killed with ``kill -9``
or by a hard time limit loses its session, and the server lets the key go at once. A run
that finds the key held is a duplicate, never silent: :class:`DuplicateTaskError` (the
task's FAILURE), or a retry with ``on_duplicate = "retry"``.

:class:`LeaderScheduler` is a beat scheduler (``celery beat -S
pgsolo.celery:LeaderScheduler``): every beat replica keeps the schedule, and only the
leader (:func:`pgsolo.campaign` on ``celery-beat:<app name>``) sends, and each message it
sends says which scheduled time it is for (:data:`OCCURRENCE_HEADER`,
:func:`scheduled_time`). A Singleton task with ``once_per_occurrence=True`` runs each such
time once through :func:`pgsolo.run_once`, however many sends of it arrive.

Both find the database in the app's configuration (``pgsolo_database_url``), else in
``PGSOLO_DSN`` or ``DATABASE_URL``. Importing this module imports Celery; ``import
pgsolo`` never does.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, ClassVar, Literal
from uuid import UUID

from celery.beat import PersistentScheduler  # type: ignore[import-untyped]
from celery.exceptions import Reject  # type: ignore[import-untyped]
from celery.schedules import crontab  # type: ignore[import-untyped]
from celery.schedules import schedule as interval

from celery import Task  # type: ignore[import-untyped]

from .dsn import choose_dsn, libpq_dsn
from .errors import InvalidArgumentError, LockUnavailableError, UsageError
from .jobs import run_job
from .leadership import Term, campaign
from .once import OnceResult, run_once
from .once.operation import validate_op_key

__all__ = [
    "OCCURRENCE_HEADER",
    "DuplicateTaskError",
    "LeaderScheduler",
    "Singleton",
    "beat_leader_name",
    "occurrence_key",
    "scheduled_time",
    "task_key",
]

logger = logging.getLogger("pgsolo.celery")

_DSN_SETTING = "pgsolo_database_url"


class DuplicateTaskError(LockUnavailableError):
    """A run of a :class:`Singleton` task found its key held by another run, and did not
    run: the task's FAILURE (or the exception of the retry that ``on_duplicate =
    "retry"`` asks for). ``key`` is the key's name (:func:`task_key`)."""

    def __init__(self, message: str, *, key: object = None) -> None:
        # key has a default: a result backend rebuilds the error from its message alone.
        super().__init__(message, key=key)


def dsn_of(app: Any) -> str:
    """The connection string of the app's configuration (``pgsolo_database_url``), else of the
    environment as every pgsolo command reads it (``PGSOLO_DSN``, then ``DATABASE_URL``);
    :class:`~pgsolo.UsageError` when none says it."""
    dsn = app.conf.get(_DSN_SETTING) or choose_dsn(None).dsn
    if not dsn:
        raise UsageError(
            f"pgsolo.celery needs the database: set {_DSN_SETTING} in the Celery app's"
            " configuration, or PGSOLO_DSN (or DATABASE_URL) in the environment"
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
    spellings of one call give one key. What Celery's JSON carries beyond JSON's own
    types is written as text: a UUID, a Decimal, and a date, time or datetime (in ISO
    8601). :class:`~pgsolo.InvalidArgumentError` for a name ``run`` has no parameter of,
    or an argument JSON cannot say."""
    if unique_on is not None and not unique_on:
        return f"celery:{name}"
    try:
        bound = inspect.signature(run).bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentError(
            f"task {name} called with arguments it does not take: {exc}"
        ) from None
    bound.apply_defaults()
    if unique_on is not None:
        _refuse_unknown_names(name, bound.signature, unique_on)
    chosen = bound.arguments if unique_on is None else {n: bound.arguments[n] for n in unique_on}
    try:
        text = json.dumps(
            chosen,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            default=_as_text,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"task {name}'s key is made of its arguments {sorted(chosen)}, as JSON: {exc}"
        ) from None
    return f"celery:{name}:{text}"


def _as_text(value: object) -> str:
    """An argument of a type Celery's JSON serializer carries and ``json`` does not."""
    if isinstance(value, date | time):  # a datetime is a date
        return value.isoformat()
    if isinstance(value, UUID | Decimal):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _refuse_unknown_names(
    name: str, signature: inspect.Signature, unique_on: Sequence[str]
) -> None:
    """:class:`~pgsolo.InvalidArgumentError` for a name of ``unique_on`` that is not a named
    parameter of the task's (``*args`` and ``**kwargs`` have no single value to key on)."""
    named = [
        p.name
        for p in signature.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    unknown = [n for n in unique_on if n not in named]
    if unknown:
        raise InvalidArgumentError(
            f"unique_on of task {name} names {', '.join(map(repr, unknown))}, which it has no"
            f" parameter of; its parameters: {', '.join(named) or 'none'}"
        )


def _body_signature(cls: type) -> inspect.Signature | None:
    """The signature of a task class's body as a run of it is called (``self.run``): a
    function task's (``@app.task``: a static method, or with ``bind=True`` a method that
    takes the task first) or a class task's ``run`` method, without the task itself.
    None for a body pgsolo cannot read without calling it."""
    body = inspect.getattr_static(cls, "run", None)
    if isinstance(body, staticmethod):
        function, takes_the_task = body.__func__, False
    elif inspect.isfunction(body):
        function, takes_the_task = body, True
    else:
        return None
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    if takes_the_task:
        parameters = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=parameters)
    return signature


OCCURRENCE_HEADER = "pgsolo_occurrence"
"""The message header in which :class:`LeaderScheduler` says which scheduled time a send
is for (:func:`scheduled_time`), in ISO 8601 with its UTC offset:
``2026-12-01T00:05:00+00:00``."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_MINUTE = 60.0  # seconds: a crontab's times are whole minutes


def scheduled_time(schedule: object, last_run_at: datetime, now: datetime) -> datetime | None:
    """The scheduled time (in UTC) that a beat entry falling due at ``now`` is sent for,
    given the entry's ``last_run_at``: the same in every beat replica that sends it, so
    that its sends are one occurrence (:func:`occurrence_key`).

    - A ``crontab``: the latest of its times at or before ``now``, from the schedule (the
      one that fell due, or the latest missed one for a beat catching up: Celery sends a
      backlog once). Every replica names it alike, whatever its clock says to the second.
    - An interval, ``schedule(run_every=...)`` (a number of seconds in ``beat_schedule``):
      the entry's latest due time at or before ``now``, floored to a window of
      ``run_every`` counted from the Unix epoch in UTC, as ``pgsolo run --once-per``
      counts windows. Replicas' entries fall due at their own moments; the window makes
      their sends within one window one occurrence.
    - Anything else (``solar``, a schedule class of your own): None, no occurrence; a
      Singleton task runs such a send as any other.
    """
    if isinstance(schedule, crontab):
        return _latest_crontab_time(schedule, last_run_at, now)
    if isinstance(schedule, interval) and schedule.run_every.total_seconds() > 0:
        step: timedelta = schedule.run_every
        due: datetime = schedule.maybe_make_aware(last_run_at) + step
        now = schedule.maybe_make_aware(now)
        latest = due + (now - due) // step * step if now > due else due
        return _EPOCH + (latest - _EPOCH) // step * step
    return None


def _latest_crontab_time(cron: Any, last_run_at: datetime, now: datetime) -> datetime:
    def following(at: datetime) -> datetime:
        """The crontab's first time after the minute of ``at``, by Celery's reckoning."""
        start, delta, _now = cron.remaining_delta(at)
        return start + delta  # type: ignore[no-any-return]

    # following() never decreases; the latest time at or before now is following(at) for
    # any ``at`` within the minute before it: bisect [last_run_at, now] down to a minute,
    # in a few steps however long the entry went unsent.
    now = cron.maybe_make_aware(now)
    low, high = cron.maybe_make_aware(last_run_at), now
    while (high - low).total_seconds() > _MINUTE:
        middle = low + (high - low) / 2
        if following(middle) <= now:
            low = middle
        else:
            high = middle
    return following(low).astimezone(UTC)


def occurrence_key(key: str, at: datetime) -> str:
    """The operation key of the run of the task whose key is ``key`` (:func:`task_key`)
    for the scheduled time ``at``: ``<key>@<at in UTC, ISO 8601>``, its row in
    ``pgsolo.operations``."""
    return f"{key}@{at.astimezone(UTC).isoformat()}"


def _occurrence_in(headers: dict[str, object] | None) -> datetime | None:
    """The scheduled time a message's headers name, if any;
    :class:`~pgsolo.InvalidArgumentError` for one that is not a time with its offset."""
    text = (headers or {}).get(OCCURRENCE_HEADER)
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidArgumentError(
            f"the {OCCURRENCE_HEADER} header is a time in ISO 8601 with its UTC offset"
            f" (2026-12-01T00:05:00+00:00), got {text!r}"
        )
    return at


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

    Each run opens a connection from the app's ``pgsolo_database_url`` (or the environment's), named
    ``pgsolo:celery:<task name>``, holds the key's session lock for as long as the body
    runs, with the keeper watching it, and closes it. A lock lost while the body ran
    fails the run with :class:`~pgsolo.LockLostError`. A retry the body asks for is sent
    once the lock is let go, so it is never refused as a duplicate of its own run.

    ``once_per_occurrence``: with ``True``, a run whose message names its scheduled time
    (:data:`OCCURRENCE_HEADER`, as :class:`LeaderScheduler` sends) also goes through
    :func:`pgsolo.run_once`, keyed :func:`occurrence_key` (``pgsolo migrate`` must have
    run): it runs once to success per scheduled time, however many sends of that time
    arrive, and one that finds it done is a duplicate, a :class:`DuplicateTaskError` that
    is never retried. A run that failed or died is run again by the next send of that
    time (a retry keeps the header). A run without the header runs as any other.
    """

    unique_on: ClassVar[Sequence[str] | None] = None
    on_duplicate: ClassVar[Literal["raise", "retry"]] = "raise"
    once_per_occurrence: ClassVar[bool] = False

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
        signature = _body_signature(cls) if unique_on and "run" in vars(cls) else None
        if signature is not None and unique_on is not None:
            _refuse_unknown_names(str(getattr(cls, "name", cls.__name__)), signature, unique_on)
        if cls.on_duplicate not in ("raise", "retry"):
            raise InvalidArgumentError(
                f"on_duplicate is 'raise' or 'retry', got {cls.on_duplicate!r}"
            )
        if not isinstance(cls.once_per_occurrence, bool):
            raise InvalidArgumentError(
                f"once_per_occurrence is True or False, got {cls.once_per_occurrence!r}"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = task_key(self.name, self.run, args, kwargs, self.unique_on)
        at = _occurrence_in(self.request.headers) if self.once_per_occurrence else None
        dsn = dsn_of(self.app)
        op_key = None if at is None else validate_op_key(occurrence_key(key, at))
        not_run: list[OnceResult] = []

        def work(conn: Any) -> Any:
            if op_key is None:
                return self._body(args, kwargs)
            returned: list[Any] = []
            # The body's value is the task's result, not stored: it need not be JSON.
            # On the connection that holds the task's key: one connection per run.
            once = run_once(conn, op_key, lambda _ctx: returned.append(self._body(args, kwargs)))
            if once.outcome == "ran":
                return returned[0]
            not_run.append(once)
            return None

        held_back: list[Callable[[], object]] = []
        token = _held_back.set(held_back)
        try:
            result = run_job(
                dsn,
                key,
                work,
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
        if result.completed and not not_run:
            return result.value
        if not_run and not_run[0].outcome == "already-succeeded":
            # Retrying could never run it: the duplicate fails at once, whatever on_duplicate.
            raise DuplicateTaskError(
                f"task {self.name}[{self.request.id}] did not run: it already ran for its"
                f" occurrence {op_key}",
                key=op_key,
            )
        held = op_key if not_run else key
        duplicate = DuplicateTaskError(
            f"task {self.name}[{self.request.id}] did not run: another run of {held} holds its"
            " lock",
            key=held,
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
    app's ``pgsolo_database_url`` (or the environment's), and keeps the schedule as Celery's own
    scheduler does (its schedule file, ``-s``): each entry falls due and is moved on to
    its next time in every replica, and is sent by the leader alone. A replica that is
    not leading, or whose term the keeper found lost, sends nothing, from the next entry
    on; one that stands by sends from the first entry that falls due after it leads.

    Each message it sends carries, in the header :data:`OCCURRENCE_HEADER`, the scheduled
    time it is for (:func:`scheduled_time`), which a :class:`Singleton` task with
    ``once_per_occurrence=True`` runs once, whichever replica sent it and however often.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._term: Term | None = None
        self._stopping = threading.Event()
        self._candidate: threading.Thread | None = None
        self._campaign_ended: BaseException | None = None
        super().__init__(*args, **kwargs)
        if kwargs.get("lazy"):  # beat's introspection builds one that never runs
            return
        dsn = dsn_of(self.app)
        libpq_dsn(dsn)  # a string no replica could connect with stops beat as it starts
        self._candidate = threading.Thread(
            target=self._stand,
            args=(dsn, beat_leader_name(self.app)),
            name="pgsolo-beat-leader",
            daemon=True,
        )
        self._candidate.start()

    def _stand(self, dsn: str, name: str) -> None:
        """The candidate's thread. A campaign stands again after a lost term or while the
        database is away; one that ended otherwise (a transaction-pooling proxy, a
        standby, a lead that failed) can never lead, and beat stops with its error at its
        next tick, rather than run on sending nothing."""
        try:
            campaign(dsn, name, self._lead, stop=self._stopping, fencing=False)
        except BaseException as exc:
            self._campaign_ended = exc
            logger.exception("beat: this replica can never lead, and beat stops")

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if (ended := self._campaign_ended) is not None:
            raise ended
        return float(super().tick(*args, **kwargs))

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
        if not self.leading:
            logger.debug("beat: not leading, not sending %s (%s)", entry.name, entry.task)
            return
        at = scheduled_time(entry.schedule, entry.last_run_at, entry.default_now())
        if at is not None:
            headers = {**(entry.options.get("headers") or {}), OCCURRENCE_HEADER: at.isoformat()}
            # A copy: the entry itself is the schedule's, and saved in its file.
            entry = type(entry)(**dict(entry, options={**entry.options, "headers": headers}))
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        self._stopping.set()
        if self._candidate is not None:
            self._candidate.join()  # the term ends with it, and another replica leads
        super().close()
