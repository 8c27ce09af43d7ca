"""What a job is: its validated definition (:class:`Job`), what one attempt at it ended
as (:class:`JobResult`), and how a work says it failed without raising (:class:`Failure`)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    TypeAlias,
    TypedDict,
    TypeVar,
    Unpack,
    cast,
)

from .._types import Lifetime, Outcome, check_period
from ..drivers.conninfo import DEFAULT_APP_PREFIX, application_name_for
from ..errors import InvalidArgumentError, UsageError
from ..keys import (
    Key,
    KeyLike,
    Registry,
    key_of,
    semaphore_keys,
    semaphore_session_name,
    text_of,
)
from ..locking import Keep, as_keep, wait_ms_of
from ..reasons import FailReason, LostReason, Reason, SkipReason

__all__ = [
    "Failure",
    "Job",
    "JobCompleted",
    "JobFailed",
    "JobLost",
    "JobOptions",
    "JobResult",
    "JobSkipped",
    "awork_value",
    "job_result",
    "refuse_cancel_without_tasks",
    "refuse_unknown_options",
    "replace_result",
    "through_locker",
    "work_value",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _JobResult(Generic[T]):
    """What one attempt at a job ended as (``pgsolo.JobResult`` at run time)."""

    outcome: Outcome
    job: str
    key: Key
    reason: Reason | None = None
    """A short code of :mod:`pgsolo.reasons`, never a message: ``busy`` or
    ``already-done-this-period`` for a skip, how the lock went for ``lost``
    (``connection-lost``, ``lock-released``, ``work-ended-transaction``, ...); None for
    ``completed`` and for a ``failed`` run (its exception is :attr:`error`)."""
    value: T | None = None
    """The callable's return value: for ``completed``, and for ``lost`` when the work
    returned before the loss was found (None if the loss cut it short)."""
    error: BaseException | None = field(default=None, compare=False)
    lock_wait: float = 0.0
    """Seconds spent getting (or failing to get) the lock."""
    duration: float = 0.0
    """Seconds the work ran."""
    backend_pid: int | None = None

    @property
    def completed(self) -> bool:
        return self.outcome == "completed"

    @property
    def skipped(self) -> bool:
        return self.outcome == "skipped"


# One subclass per outcome, so that a type checker narrows a result by its outcome:
# after ``if result.completed:`` (or ``result.outcome == "completed"``, or a ``match``),
# ``result.value`` is ``T``, not ``T | None``. At run time they add nothing but their
# name; the narrower types are declarations for type checkers only.


class JobCompleted(_JobResult[T]):
    """A ``completed`` attempt: :attr:`value` is what the callable returned."""

    __slots__ = ()
    if TYPE_CHECKING:
        outcome: Literal["completed"]
        value: T

        @property
        def completed(self) -> Literal[True]: ...
        @property
        def skipped(self) -> Literal[False]: ...


class JobSkipped(_JobResult[T]):
    """A ``skipped`` attempt (``busy``, ``already-done-this-period``): nothing ran."""

    __slots__ = ()
    if TYPE_CHECKING:
        outcome: Literal["skipped"]
        reason: SkipReason
        value: None

        @property
        def completed(self) -> Literal[False]: ...
        @property
        def skipped(self) -> Literal[True]: ...


class JobFailed(_JobResult[T]):
    """A ``failed`` attempt: the callable raised (:attr:`error`) or returned a
    :class:`Failure`."""

    __slots__ = ()
    if TYPE_CHECKING:
        outcome: Literal["failed"]
        reason: FailReason | None
        value: None

        @property
        def completed(self) -> Literal[False]: ...
        @property
        def skipped(self) -> Literal[False]: ...


class JobLost(_JobResult[T]):
    """A ``lost`` attempt: the lock vanished while the work ran (:attr:`reason` says how).
    :attr:`value` is what the work returned, if it returned: it ran to its end, but not
    all of it under the lock."""

    __slots__ = ()
    if TYPE_CHECKING:
        outcome: Literal["lost"]
        reason: LostReason
        value: T | None

        @property
        def completed(self) -> Literal[False]: ...
        @property
        def skipped(self) -> Literal[False]: ...


if TYPE_CHECKING:
    JobResult: TypeAlias = JobCompleted[T] | JobSkipped[T] | JobFailed[T] | JobLost[T]
else:
    # At run time the common base: ``isinstance(r, JobResult)`` and ``JobResult[int]`` work.
    JobResult = _JobResult
    JobResult.__name__ = JobResult.__qualname__ = "JobResult"

_BY_OUTCOME: dict[str, type[_JobResult[Any]]] = {
    "completed": JobCompleted,
    "skipped": JobSkipped,
    "failed": JobFailed,
    "lost": JobLost,
}


def job_result(outcome: Outcome, job: str, key: Key, **fields: Any) -> JobResult[Any]:
    """The result of an attempt, of the class of its ``outcome``."""
    result: JobResult[Any] = _BY_OUTCOME[outcome](outcome, job, key, **fields)  # type: ignore[assignment]
    return result


def replace_result(result: JobResult[Any], **changes: Any) -> JobResult[Any]:
    """``dataclasses.replace`` for a result, whose class follows its outcome: replacing
    the outcome alone would leave a ``JobFailed`` that says ``completed``."""
    values = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)} | changes
    return job_result(**values)


@dataclass(frozen=True, slots=True)
class Failure:
    """What a job's work returns, instead of raising, when it ran to its end and failed:
    ``pgsolo run``'s COMMAND exited non-zero, was killed by a signal, or could not start.

    The attempt ends ``failed`` with this ``reason`` and ``error`` (either may be None),
    and no period is recorded. The lock ends as after a completed run: a session lock is
    released and checked, so a lock gone by then makes the attempt ``lost``; a
    transaction-level lock's transaction is rolled back."""

    reason: FailReason | None = None
    error: BaseException | None = None


class JobOptions(TypedDict, total=False):
    """pgsolo's options of a job: the keyword arguments of :func:`~pgsolo.run_job`,
    :func:`~pgsolo.run_job_async`, :func:`~pgsolo.singleton` and :meth:`Job.define`,
    written once here. Any other keyword is a :class:`~pgsolo.UsageError` (and a type
    checker's error); the job function's own keywords are bound with ``functools.partial``."""

    name: str | None
    """The job's name in logs, metrics and the ledger; default: the key's name, or its
    text."""
    lifetime: Lifetime
    """``"xact"`` (default): the work runs inside the locked transaction and commits with
    it; ``"session"``: a session lock on the pinned connection, for work that spans
    commits or external calls."""
    wait: float | None
    """Seconds to wait for a busy lock (``math.inf``: no end); default None: busy means
    skip."""
    limit: int | None
    """How many runs of the job may run at once: with a name as key, each run holds one
    of ``limit`` slots, the keys of the semaphore of that name (DESIGN §2, Semaphore
    keys), the ones :func:`~pgsolo.semaphore` takes too; busy means every slot is held.
    Not with ``period=`` (once per period is one run), ``namespace=`` or ``registry=``.
    Default None: the one key of ``key``."""
    period: str | None
    """``"day"`` (or ``daily``, ``hour``, ``"900 seconds"``, ``15m``, ``24h``...): each
    completed run is recorded durably, so a second run in the same period, by the
    database's clock, is skipped (needs ``pgsolo migrate``)."""
    timezone: str | None
    """Where a day, week, month or year of ``period`` starts at midnight (an IANA name,
    ``"Europe/Paris"``); default UTC."""
    record: bool
    """Write every attempt to the ledger (``pgsolo migrate``); default False."""
    raise_errors: bool
    """A failure re-raises the work's exception after it is logged and recorded (default
    True); False returns it in a ``failed`` result."""
    application_name: str | None
    """The ``application_name`` of a connection pgsolo opens; default ``pgsolo:<job
    name>``, unless the connection string or ``PGAPPNAME`` names it."""
    namespace: int | None
    """With a name as key: the pair key ``(namespace, hash of the name)``."""
    registry: Registry | None
    """Where a name's key is registered (keys.md)."""
    keep: bool | Keep
    """A session job's lock is watched while the work runs (``True`` or a
    :class:`~pgsolo.Keep`): a loss makes the outcome ``lost``; default False."""


@dataclass(frozen=True, slots=True)
class Job:
    """A validated job definition. Built by :func:`run_job` and :func:`singleton`."""

    name: str
    key: Key
    lifetime: Lifetime = "xact"
    wait: float | None = None
    period: str | None = None
    record: bool = False
    application_name: str | None = None
    keep: Keep | None = None
    """Session jobs: the keeper watches the lock while the work runs (``keep=``)."""

    raise_errors: bool = True
    """A failed run re-raises its exception (True) or returns it in a ``failed`` result."""

    semaphore: str | None = None
    """With ``limit=``: the name its slots are derived from (the key given)."""
    slots: tuple[Key, ...] = ()
    """With ``limit=``: the keys of its slots, one of which a run holds (``key`` is the
    one it holds, once it holds one; the first before)."""

    @property
    def limit(self) -> int:
        """How many runs of the job may run at once."""
        return len(self.slots) or 1

    def holding(self, key: Key) -> Job:
        """This job, as the run that holds ``key``, one of its slots."""
        return self if key == self.key else dataclasses.replace(self, key=key)

    @classmethod
    def define(cls, key: KeyLike, **options: Unpack[JobOptions]) -> Job:
        """The job of ``key`` with ``options``, each checked: a bad value is a
        :class:`UsageError` or :class:`InvalidArgumentError`, before anything connects."""
        seen = _seen_as(key, options)
        if seen is not None and (job := _DEFINED.get(seen)) is not None:
            return job
        job = cls._checked(key, options)
        if seen is not None:
            if len(_DEFINED) >= _DEFINED_AT_MOST:
                _DEFINED.clear()  # jobs whose names come from data: start afresh
            _DEFINED[seen] = job
        return job

    @classmethod
    def _checked(cls, key: KeyLike, options: JobOptions) -> Job:
        refuse_unknown_options("Job.define", options)
        name = options.get("name")
        lifetime = options.get("lifetime", "xact")
        wait = options.get("wait")
        period = options.get("period")
        timezone = options.get("timezone")
        record = options.get("record", False)
        raise_errors = options.get("raise_errors", True)
        namespace = options.get("namespace")
        registry = options.get("registry")
        limit = options.get("limit")
        if limit is None:
            slots: tuple[Key, ...] = ()
            resolved = key_of(key, namespace, registry)
        else:
            slots = _slots(key, limit, options)
            resolved = slots[0]
            name = str(key) if name is None else name
        if lifetime not in ("xact", "session"):
            raise UsageError(f"lifetime must be 'xact' or 'session', got {lifetime!r}")
        wait_ms_of(wait)
        if period is not None:  # its one spelling, the one recorded; InvalidArgumentError
            period = check_period(period, timezone)
        elif timezone is not None:
            raise UsageError(
                f"timezone= is the time zone of a period; got {timezone!r} and no period="
            )
        job_name = name if name is not None else (resolved.name or resolved.text)
        if not isinstance(job_name, str) or not job_name or "\0" in job_name:
            raise UsageError(f"a job name must be non-empty text without NUL, got {job_name!r}")
        try:
            job_name.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"a job name must be valid Unicode text, got {job_name!r}") from None
        for option, value in (("record", record), ("raise_errors", raise_errors)):
            if not isinstance(value, bool):
                raise UsageError(f"{option} must be True or False, got {value!r}")
        app_name = options.get("application_name")
        if app_name is not None and not isinstance(app_name, str):
            raise UsageError(f"application_name must be text, got {app_name!r}")
        keeping = as_keep(options.get("keep", False))
        if keeping is not None and lifetime != "session":
            raise UsageError(
                "keep= watches a session lock; a transaction-level job's lock lives and dies"
                " with its transaction, and its COMMIT already checks it"
            )
        return cls(
            job_name,
            resolved,
            lifetime,
            wait,
            period,
            record,
            app_name,
            keeping,
            raise_errors,
            text_of(cast(str, key)) if slots else None,
            slots,
        )

    def application_name_for(self, dsn: str) -> str:
        """``pgsolo:<job name>`` (with ``limit=``, the semaphore's
        ``pgsolo:semaphore:<name>/<limit>``, which ``pgsolo locks`` reads back) unless the
        caller, the DSN or ``PGAPPNAME`` names it."""
        if self.semaphore is not None:
            default = semaphore_session_name(self.semaphore, self.limit)
        else:
            default = f"{DEFAULT_APP_PREFIX}{self.name}"
        return application_name_for(dsn, default, self.application_name)


# The jobs defined so far, by what they were defined from (_seen_as): a job's run checks
# the same options of the same key on every call, and the checks and the frozen
# dataclass's eleven fields cost a tenth of pgsolo's own Python per run of a job that does
# nothing. Only definitions that passed every check are kept.
_DEFINED: dict[tuple[object, ...], Job] = {}
_DEFINED_AT_MOST = 256
# The types of value a definition is kept for: compared by value, and never equal to a
# value of another (True == 1 and 1 == 1.0, so each value is kept with its type).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _seen_as(key: KeyLike, options: Mapping[str, object]) -> tuple[object, ...] | None:
    """What a definition of ``key`` with ``options`` is kept by, if it can be: every value
    one of :data:`_PLAIN` (a key also a pair of ints, or a Key with its name), kept with
    the types of the values, so that one equal to it is the same definition; None for any
    other (a Registry, whose names can change; a Keep). A NaN equals nothing but itself,
    and a definition with one is refused, so never kept."""
    kinds = tuple(map(type, options.values()))
    if not _PLAIN.issuperset(kinds):
        return None
    if type(key) is Key:  # whose name plays no part in its equality, but in a job's name
        return (Key, key, key.name, *options.items(), kinds)
    if type(key) is tuple:
        if len(key) != 2 or type(key[0]) is not int or type(key[1]) is not int:
            return None
    elif type(key) not in _PLAIN:
        return None
    return (type(key), key, *options.items(), kinds)


def _slots(key: KeyLike, limit: object, options: JobOptions) -> tuple[Key, ...]:
    """The slots of a job with ``limit=``: the keys of the semaphore named ``key``."""
    if not isinstance(key, str):
        raise UsageError(
            f"limit= takes a job whose key is a name (its slots are derived from it), got {key!r}"
        )
    for option in ("period", "namespace", "registry"):
        if options.get(option) is not None:
            raise UsageError(
                f"limit= and {option}= do not go together"
                + (": once per period is one run at a time" if option == "period" else "")
            )
    return semaphore_keys(key, limit)


# The names of JobOptions, as a set: every run_job checks its keyword arguments.
_OPTIONS = frozenset(JobOptions.__optional_keys__)


def refuse_unknown_options(
    caller: str, options: Mapping[str, object], *, decorator: bool = False
) -> None:
    """Keyword arguments of :func:`run_job` and :func:`singleton` are pgsolo's options
    (:class:`JobOptions`), never the function's: one that is not an option is a
    :class:`UsageError`, before anything connects, naming the option it was likely meant
    to be (``wiat=`` -> ``wait``), else the way to pass it to the function instead."""
    if options.keys() <= _OPTIONS:  # the common case, without sorting anything
        return
    known = sorted(_OPTIONS)
    unknown = sorted(set(options) - _OPTIONS)
    meant = {n: difflib.get_close_matches(n, known, n=1) for n in unknown}
    if all(meant.values()):
        hint = "did you mean " + ", ".join(f"{m[0]}= for {n}=" for n, m in meant.items())
    elif decorator:
        hint = (
            "the decorated function's own arguments are given when it is called"
            f" ({', '.join(f'{n}=...' for n in unknown)} there)"
        )
    else:
        hint = (
            "bind the function's own keyword arguments first, with functools.partial(fn,"
            f" {', '.join(f'{n}=...' for n in unknown)}); positional arguments after fn still"
            " go to fn"
        )
    raise UsageError(
        f"{caller}() got keyword argument(s) {', '.join(unknown)} that are not pgsolo"
        f" options ({', '.join(known)}): {hint}"
    )


def refuse_cancel_without_tasks(job: Job, *, tasks: bool) -> None:
    """``Keep(cancel=True)`` cancels the task that runs the work: code that runs in
    threads (``tasks`` False: :func:`run_job`) has none, so it is a :class:`UsageError`,
    before anything connects."""
    if not tasks and job.keep is not None and job.keep.cancel:
        raise UsageError("Keep(cancel=True) cancels an asyncio task: use run_job_async")


def refuse_unrunnable_work(fn: object, *, awaits: bool) -> None:
    """The job's work, checked before anything connects: a callable, and for code that
    does not await it (``awaits`` False: :func:`run_job`) not an ``async def`` function,
    whose call would only make a coroutine: the job would report ``completed`` (and use up
    its period) without its work ever running."""
    if not callable(fn):
        raise UsageError(f"the job's work must be a callable, got {fn!r}")
    if not awaits and inspect.iscoroutinefunction(fn):
        raise UsageError(
            f"run_job() cannot run an async function ({_name_of(fn)}): it would never be"
            " awaited; use run_job_async()"
        )


def work_value(value: T) -> T:
    """What the work returned, refused if it says the work never ran: a call of a
    generator function, or of a coroutine function ``run_job()`` cannot await (an object
    whose ``__call__`` is one, a lambda that calls one). Refused as the work's failure, so
    that no period or success is recorded for work that never ran."""
    if isinstance(value, _UNRUN):  # no call of inspect's: every job comes here
        raise _never_ran(value, "an async function needs run_job_async(); ")
    return value


async def awork_value(value: Awaitable[T]) -> T:
    """What the work returned, awaited if it is awaitable; refused as :func:`work_value`
    refuses it otherwise: a generator, or a plain value (the work was a plain function,
    which ``run_job_async()`` ran, but the caller meant another)."""
    if type(value) is types.CoroutineType or inspect.isawaitable(value):  # the first: no call
        return await value
    if isinstance(value, _UNRUN):
        raise _never_ran(value, "")
    raise UsageError(
        f"run_job_async()'s work returned {type(value).__name__}, not an awaitable: it ran"
        " as a plain function, under the lock; pass an async function, or use run_job()"
    )


# What a call returns without running its body: a coroutine, a generator, an async one.
_UNRUN = (types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)


def _never_ran(value: object, hint: str) -> UsageError:
    """The error for work that returned ``value`` (of :data:`_UNRUN`) without running its
    body, once ``value`` is closed: it never runs then, and a coroutine is not warned of as
    never awaited (an async generator never started needs no closing)."""
    close = getattr(value, "close", None)
    if callable(close):
        close()
    return UsageError(
        f"the job's work returned {type(value).__name__} {value!r}: its body never ran"
        f" ({hint}a generator function's body runs only when iterated)"
    )


def _name_of(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def untranslatable_name(name: str | None) -> InvalidArgumentError:
    """A job name the database cannot store or look up: its encoding (LATIN1, say) lacks
    a character of it. pgsolo sends text as UTF-8 and the server refuses to convert it."""
    return InvalidArgumentError(f"this database's encoding cannot hold the job name {name!r}")


def through_locker(options: dict[str, Any]) -> None:
    """A job through a Locker runs under a session lock: ``lifetime`` defaults to it, and
    ``"xact"`` is a :class:`UsageError` before anything connects (a Locker's connections
    are shared by its locks, and cannot carry a job's transaction)."""
    lifetime = options.setdefault("lifetime", "session")
    if lifetime != "session":
        raise UsageError(
            f"a job through a Locker runs under a session lock, not lifetime={lifetime!r}:"
            " a Locker's connections are shared by its locks and cannot carry the job's"
            " transaction (pass a connection or a connection string for that)"
        )
