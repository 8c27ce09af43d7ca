"""Prometheus metrics of locks and jobs, with the ``pgsolo[prometheus]`` extra.

Counted from the application, as the article advises: nothing here polls ``pg_locks``.
Without ``prometheus_client`` installed every call is a no-op (and publishing one is a
:class:`~pgsolo.UsageError` saying which extra to install).

Labels stay bounded, since every label value is a new series kept for the life of the
process: a job is labelled by its name (chosen in code), a reason by a code of
:mod:`pgsolo.reasons`, a lock by the name it was given as. A key given as a number has no
name, and an int64 is unbounded (a tenant id...), so those locks share the label
``lock=""``; pgsolo's own names (``pgsolo:once:<operation key>``, one per operation) count
under their prefix (``pgsolo:once``). Code that builds names from data
(``f"tenant-{id}"``) turns them off with ``use_registry(..., lock_names=False)``.

This module sits below locking (DESIGN §3): locks count themselves here, and jobs too.
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ._interrupts import ctrl_c_held
from .errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = [
    "LOCK_OUTCOMES",
    "add_up_waits",
    "check_textfile",
    "count_apart",
    "count_nothing",
    "lock_label",
    "observe_job",
    "observe_lock",
    "observe_lock_lost",
    "prepare",
    "push",
    "registry",
    "use_registry",
    "write_textfile",
]

LOCK_OUTCOMES = ("acquired", "busy", "timeout", "error")
LAST_SUCCESS = "pgsolo_job_last_success_timestamp_seconds"
_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
_INSTALL = "install the extra: pip install 'pgsolo[prometheus]'"


@dataclass(frozen=True)
class _Instruments:
    """pgsolo's metrics, registered once in one registry."""

    # pgsolo_job_attempts, pgsolo_job_lock_wait_seconds, pgsolo_job_duration_seconds and
    # the last success: every job counts in them.
    job_counts: _JobCounts | _InstrumentedJobCounts
    # pgsolo_lock_acquisitions and pgsolo_lock_wait_seconds: every lock counts in them.
    lock_counts: _LockCounts | _InstrumentedLockCounts
    lock_losses: Any

    @classmethod
    def create(cls, registry: CollectorRegistry) -> _Instruments:
        """Register them all, or none: one left registered by a try that failed halfway (a
        name taken) would make every later try refuse a duplicate name. The caller holds
        Ctrl-C back: one landing inside ``register`` would leave a name there that no
        ``unregister`` can take back."""
        instruments = cls._unregistered()
        registered = []
        try:
            for collector in (getattr(instruments, f.name) for f in fields(instruments)):
                registry.register(collector)
                registered.append(collector)
        except BaseException:
            for collector in registered:
                registry.unregister(collector)
            raise
        return instruments

    @classmethod
    def _unregistered(cls) -> _Instruments:
        from prometheus_client import Counter  # noqa: PLC0415

        return cls(
            job_counts=_job_counts(),
            lock_counts=_lock_counts(),
            lock_losses=Counter(
                "pgsolo_lock_losses",
                "Advisory locks lost while held, by reason (a code of pgsolo.reasons).",
                ["lock", "lifetime", "reason"],
                registry=None,
            ),
        )


_ACQUISITIONS = (
    "pgsolo_lock_acquisitions",
    "Attempts to take an advisory lock, by outcome (acquired, busy, timeout, error). A lock"
    " given as a number is counted under lock=''.",
)
_WAITS = ("pgsolo_lock_wait_seconds", "Time an attempt to take an advisory lock took, by outcome.")
_JOB_ATTEMPTS = (
    "pgsolo_job_attempts",
    "Attempts at a pgsolo job, by outcome (a skip is not a success).",
)
_JOB_LOCK_WAITS = (
    "pgsolo_job_lock_wait_seconds",
    "Time spent getting, or failing to get, a job's lock.",
)
_JOB_DURATIONS = ("pgsolo_job_duration_seconds", "Time a job's work ran.")
_LAST_SUCCESSES = (
    LAST_SUCCESS,
    "Unix time at which the job last completed (alert when it gets old).",
)
# A histogram's upper bounds as prometheus_client keeps them: floats, +Inf last.
_BOUNDS = (*(float(bound) for bound in _BUCKETS), float("inf"))


def _multiprocess() -> bool:
    """Whether prometheus_client runs in its multiprocess mode, whose scrape reads only
    what each process wrote to disk through prometheus_client's own instruments: pgsolo's
    own tallies, in a process's memory, would never be seen there."""
    # prometheus_client still honours the old, lower-case name.
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def _lock_counts() -> _LockCounts | _InstrumentedLockCounts:
    """Where the locks' counts are kept: pgsolo's own tallies, unless prometheus_client
    runs in its multiprocess mode."""
    return _InstrumentedLockCounts() if _multiprocess() else _LockCounts()


def _job_counts() -> _JobCounts | _InstrumentedJobCounts:
    """Where the jobs' counts are kept, as :func:`_lock_counts` chooses."""
    return _InstrumentedJobCounts() if _multiprocess() else _JobCounts()


class _Waits:
    """One series of a histogram (``pgsolo_lock_wait_seconds`` of a lock and an outcome,
    a job's lock wait or duration): its buckets and its sum, added to in the order the
    values came, as prometheus_client's Histogram adds them (a float sum depends on the
    order).

    A lock or a job only appends its value, with the tally it counts in (None: none), to
    ``arrived`` (one step, which threads can take at once); they are added up, in the
    order they came, when a scrape reads the series or enough of them arrived
    (:meth:`add_up`): a mutex, three sums and a bisection on every lock's path cost a
    tenth of pgsolo's own Python."""

    __slots__ = ("arrived", "buckets", "created", "mutex", "total")

    def __init__(self) -> None:
        self.created = time.time()
        self.total = 0.0
        self.buckets = [0] * len(_BOUNDS)
        self.mutex = threading.Lock()
        self.arrived: list[tuple[_Tally | None, float]] = []

    def add_up(self) -> None:
        """Add the values that arrived, each to its tally and to this series."""
        with self.mutex:
            arrived = self.arrived
            taken = arrived[: len(arrived)]  # what arrives meanwhile stays, for the next
            del arrived[: len(taken)]
            for tally, value in taken:
                if tally is not None:
                    tally.count += 1
                self.total += value
                # The first bucket whose bound the value is at most, as prometheus_client
                # puts it: a NaN is at most none, and goes in none.
                index = bisect.bisect_left(_BOUNDS, value)
                if value <= _BOUNDS[index]:
                    self.buckets[index] += 1

    def publish(self, family: Metric, labels: dict[str, str], *, created: bool) -> None:
        """This series' samples in ``family`` (added up by the caller), as
        prometheus_client's Histogram publishes them."""
        with self.mutex:
            total, buckets = self.total, list(self.buckets)
        name, running = family.name, 0.0
        for le, count in zip(_les(), buckets, strict=True):
            running += count
            family.add_sample(f"{name}_bucket", {**labels, "le": le}, running)
        family.add_sample(f"{name}_count", labels, running)
        family.add_sample(f"{name}_sum", labels, total)
        if created:
            family.add_sample(f"{name}_created", labels, self.created)


@functools.cache
def _les() -> tuple[str, ...]:
    """The histograms' bounds, as prometheus_client writes a bound (once: every series of
    every scrape writes them)."""
    from prometheus_client.utils import floatToGoString  # noqa: PLC0415

    to_go: Callable[[float], str] = floatToGoString
    return tuple(to_go(bound) for bound in _BOUNDS)


# How many values may arrive at a series before the one that arrives adds them up (memory
# stays bounded in a process nobody scrapes).
_ADD_UP_AT = 256


class _Tally:
    """One series of a counter (``pgsolo_lock_acquisitions`` of a lock, a lifetime and an
    outcome; ``pgsolo_job_attempts`` of a job, an outcome and a reason), counted as its
    values are added up in the histogram series they go to (``waits``)."""

    __slots__ = ("count", "created", "waits")

    def __init__(self, waits: _Waits) -> None:
        self.created = time.time()
        self.count = 0  # of the values added up (_Waits.add_up)
        self.waits = waits

    def add(self, wait: float) -> None:
        arrived = self.waits.arrived
        arrived.append((self, wait))
        if len(arrived) >= _ADD_UP_AT:
            self.waits.add_up()

    def publish(self, family: Metric, labels: dict[str, str], *, created: bool) -> None:
        """This series' sample in ``family``, its waits added up by the caller."""
        with self.waits.mutex:
            count = self.count
        family.add_sample(f"{family.name}_total", labels, float(count))
        if created:
            family.add_sample(f"{family.name}_created", labels, self.created)


class _LockCounts:
    """``pgsolo_lock_acquisitions`` and ``pgsolo_lock_wait_seconds``, counted by pgsolo and
    published as prometheus_client's Counter and Histogram publish them, sample for
    sample. Every lock counts in both: through prometheus_client's instruments that took
    a fifth of pgsolo's own Python per lock (a mutex per value, three values per lock, and
    checks on every call); here it is one mutex and a bisection, and the samples are
    built when a scrape asks for them."""

    _name = _ACQUISITIONS[0]  # as prometheus_client's instruments name themselves

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, str, str], _Tally] = {}
        self._waits: dict[tuple[str, str], _Waits] = {}
        self._mutex = threading.Lock()

    def child(self, lock: str, lifetime: str, outcome: str) -> _Tally:
        with self._mutex:
            tally = self._tallies.get((lock, lifetime, outcome))
            if tally is None:
                waits = self._waits.setdefault((lock, outcome), _Waits())
                tally = self._tallies[lock, lifetime, outcome] = _Tally(waits)
            return tally

    def describe(self) -> list[Metric]:
        from prometheus_client.metrics_core import Metric  # noqa: PLC0415

        return [Metric(*_ACQUISITIONS, "counter"), Metric(*_WAITS, "histogram")]

    def collect(self) -> list[Metric]:
        created = _created_series()
        acquisitions, waits = self.describe()
        with self._mutex:
            tallies, all_waits = list(self._tallies.items()), list(self._waits.items())
        # Every series added up once, first: a counter and its histogram's count then
        # publish the same additions.
        for _, series in all_waits:
            series.add_up()
        for (lock, lifetime, outcome), tally in tallies:
            labels = {"lock": lock, "lifetime": lifetime, "outcome": outcome}
            tally.publish(acquisitions, labels, created=created)
        for (lock, outcome), series in all_waits:
            series.publish(waits, {"lock": lock, "outcome": outcome}, created=created)
        return [acquisitions, waits]


class _JobTally:
    """What one (job, outcome, reason) counts in: its attempts, the job's lock waits, the
    job's durations of that outcome (none for a skip), and its last success (for
    ``completed``)."""

    __slots__ = ("attempts", "durations", "job", "last_successes")

    def __init__(
        self,
        job: str,
        attempts: _Tally,
        durations: _Waits | None,
        last_successes: dict[str, float] | None,
    ) -> None:
        self.job = job
        self.attempts = attempts
        self.durations = durations
        self.last_successes = last_successes

    def add(self, lock_wait: float, duration: float) -> None:
        # Appended as a lock's wait is, here and not in a method of _Waits: every job comes
        # here, and a call each would be two more. The attempt counts as its lock wait is
        # added up.
        lock_waits = self.attempts.waits
        lock_waits.arrived.append((self.attempts, lock_wait))
        if len(lock_waits.arrived) >= _ADD_UP_AT:
            lock_waits.add_up()
        if (durations := self.durations) is not None:
            durations.arrived.append((None, duration))
            if len(durations.arrived) >= _ADD_UP_AT:
                durations.add_up()
        if self.last_successes is not None:
            self.last_successes[self.job] = time.time()


class _JobCounts:
    """A job's four metrics (``pgsolo_job_attempts``, ``pgsolo_job_lock_wait_seconds``,
    ``pgsolo_job_duration_seconds``, ``pgsolo_job_last_success_timestamp_seconds``),
    counted by pgsolo as :class:`_LockCounts` counts a lock's: through prometheus_client's
    Counter, Histograms and Gauge they took four mutexes and two bisections of its Python
    per job, a tenth of pgsolo's own Python for a job that does nothing."""

    _name = _JOB_ATTEMPTS[0]

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, str, str], _JobTally] = {}
        self._lock_waits: dict[str, _Waits] = {}
        self._durations: dict[tuple[str, str], _Waits] = {}
        self._last_successes: dict[str, float] = {}
        self._mutex = threading.Lock()

    def child(self, job: str, outcome: str, reason: str) -> _JobTally:
        with self._mutex:
            tally = self._tallies.get((job, outcome, reason))
            if tally is None:
                # Made in the order prometheus_client's instruments made their children,
                # which is the order a scrape lists them in.
                waits = self._lock_waits.setdefault(job, _Waits())
                attempts = _Tally(waits)
                durations = None
                if outcome != "skipped":
                    durations = self._durations.setdefault((job, outcome), _Waits())
                last = self._last_successes if outcome == "completed" else None
                tally = self._tallies[job, outcome, reason] = _JobTally(
                    job, attempts, durations, last
                )
            return tally

    def set_last_success(self, job: str, seconds: float) -> None:
        self._last_successes[job] = seconds

    def describe(self) -> list[Metric]:
        from prometheus_client.metrics_core import Metric  # noqa: PLC0415

        return [
            Metric(*_JOB_ATTEMPTS, "counter"),
            Metric(*_JOB_LOCK_WAITS, "histogram"),
            Metric(*_JOB_DURATIONS, "histogram"),
            Metric(*_LAST_SUCCESSES, "gauge"),
        ]

    def collect(self) -> list[Metric]:
        created = _created_series()
        attempts, lock_waits, durations, last_successes = self.describe()
        with self._mutex:
            tallies = list(self._tallies.items())
            all_lock_waits = list(self._lock_waits.items())
            all_durations = list(self._durations.items())
        for _, series in [*all_lock_waits, *all_durations]:  # first, as _LockCounts does
            series.add_up()
        for (job, outcome, reason), tally in tallies:
            labels = {"job": job, "outcome": outcome, "reason": reason}
            tally.attempts.publish(attempts, labels, created=created)
        for job, series in all_lock_waits:
            series.publish(lock_waits, {"job": job}, created=created)
        for (job, outcome), series in all_durations:
            series.publish(durations, {"job": job, "outcome": outcome}, created=created)
        for job, seconds in self._last_successes.copy().items():  # copied in one step
            last_successes.add_sample(LAST_SUCCESS, {"job": job}, seconds)
        return [attempts, lock_waits, durations, last_successes]


def _created_series() -> bool:
    """Whether prometheus_client publishes ``_created`` series now (its
    ``disable_created_metrics()``, or ``PROMETHEUS_DISABLE_CREATED_SERIES``), asked of a
    counter of its own."""
    from prometheus_client import Counter  # noqa: PLC0415

    probe = Counter("pgsolo_probe", "", registry=None)
    return any(sample.name.endswith("_created") for sample in next(iter(probe.collect())).samples)


class _InstrumentedLockCounts:
    """The same two metrics kept by prometheus_client's own instruments, for its
    multiprocess mode."""

    _name = _ACQUISITIONS[0]

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram  # noqa: PLC0415

        self._acquisitions = Counter(*_ACQUISITIONS, ["lock", "lifetime", "outcome"], registry=None)
        self._waits = Histogram(*_WAITS, ["lock", "outcome"], buckets=_BUCKETS, registry=None)

    def child(self, lock: str, lifetime: str, outcome: str) -> _InstrumentedCount:
        return _InstrumentedCount(
            self._acquisitions.labels(lock, lifetime, outcome), self._waits.labels(lock, outcome)
        )

    def describe(self) -> list[Metric]:
        return [*self._acquisitions.describe(), *self._waits.describe()]

    def collect(self) -> list[Metric]:
        return [*self._acquisitions.collect(), *self._waits.collect()]


class _InstrumentedCount:
    __slots__ = ("acquisitions", "waits")

    def __init__(self, acquisitions: Any, waits: Any) -> None:
        self.acquisitions, self.waits = acquisitions, waits

    def add(self, wait: float) -> None:
        self.acquisitions.inc()
        self.waits.observe(wait)


class _InstrumentedJobCounts:
    """A job's four metrics kept by prometheus_client's own instruments, for its
    multiprocess mode."""

    _name = _JOB_ATTEMPTS[0]

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415

        self._attempts = Counter(*_JOB_ATTEMPTS, ["job", "outcome", "reason"], registry=None)
        self._lock_waits = Histogram(*_JOB_LOCK_WAITS, ["job"], buckets=_BUCKETS, registry=None)
        self._durations = Histogram(
            *_JOB_DURATIONS, ["job", "outcome"], buckets=_BUCKETS, registry=None
        )
        self._last_successes = Gauge(*_LAST_SUCCESSES, ["job"], registry=None)

    def child(self, job: str, outcome: str, reason: str) -> _InstrumentedJob:
        return _InstrumentedJob(
            self._attempts.labels(job, outcome, reason),
            self._lock_waits.labels(job),
            None if outcome == "skipped" else self._durations.labels(job, outcome),
            self._last_successes.labels(job) if outcome == "completed" else None,
        )

    def set_last_success(self, job: str, seconds: float) -> None:
        self._last_successes.labels(job).set(seconds)

    def describe(self) -> list[Metric]:
        return [
            *self._attempts.describe(),
            *self._lock_waits.describe(),
            *self._durations.describe(),
            *self._last_successes.describe(),
        ]

    def collect(self) -> list[Metric]:
        return [
            *self._attempts.collect(),
            *self._lock_waits.collect(),
            *self._durations.collect(),
            *self._last_successes.collect(),
        ]


class _InstrumentedJob:
    __slots__ = ("attempts", "durations", "last_success", "lock_waits")

    def __init__(self, attempts: Any, lock_waits: Any, durations: Any, last_success: Any) -> None:
        self.attempts, self.lock_waits = attempts, lock_waits
        self.durations, self.last_success = durations, last_success

    def add(self, lock_wait: float, duration: float) -> None:
        self.attempts.inc()
        self.lock_waits.observe(lock_wait)
        if self.durations is not None:
            self.durations.observe(duration)
        if self.last_success is not None:
            self.last_success.set(time.time())


class _State:
    """The registry in use, and the instruments of every registry used so far (a
    registry refuses a second metric of the same name, so each is created once)."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.registry: CollectorRegistry | None = None  # None: prometheus_client's global one
        self.lock_names = True
        self.unavailable = False
        self.instruments: dict[int, tuple[CollectorRegistry, _Instruments]] = {}
        self.cached: _Instruments | None = None  # those of the registry in use

    def current(self) -> _Instruments | None:
        cached = self.cached  # every lock comes here: no mutex once they exist
        if cached is not None or self.unavailable:
            return cached
        with self.mutex, ctrl_c_held():
            try:
                default = _global_registry()
            except ImportError:
                self.unavailable = True
                return None
            target = self.registry if self.registry is not None else default
            known = self.instruments.get(id(target))
            if known is None:
                known = (target, _Instruments.create(target))
                self.instruments[id(target)] = known
            self.cached = known[1]
            return known[1]


_state = _State()


def _global_registry() -> CollectorRegistry:
    """prometheus_client's global registry, imported if need be. The import holds Ctrl-C
    back: one cut short leaves behind the modules it finished, the registry among them,
    holding what the unfinished ones registered, and the next try would run those again
    and refuse the duplicate names forever after."""
    with ctrl_c_held():
        from prometheus_client import REGISTRY  # noqa: PLC0415
    return REGISTRY


def prepare() -> None:
    """Import prometheus_client and register the instruments now, once per registry: a
    lock calls this before it sends anything, so that nothing between the server's grant
    and the lock's books can take the time of an import (where a Ctrl-C would land)."""
    if _state.cached is None:  # once they exist, no call: every lock comes here
        _state.current()


def use_registry(registry: CollectorRegistry | None, *, lock_names: bool = True) -> None:
    """Count pgsolo's metrics in ``registry`` from now on (None: prometheus_client's
    global ``REGISTRY``, the default). ``lock_names=False`` counts every bare lock under
    ``lock=""``: for code whose lock names come from data, an unbounded set."""
    if registry is not None and not callable(getattr(registry, "register", None)):
        raise UsageError(
            f"use_registry() takes a prometheus_client CollectorRegistry or None, not"
            f" {type(registry).__name__}"
        )
    if not isinstance(lock_names, bool):
        raise UsageError("use_registry(lock_names=...) takes True or False")
    with _state.mutex:
        _state.registry = registry
        _state.lock_names = lock_names
        _state.cached = None


def count_nothing() -> Callable[[], None]:
    """Count nothing from now on, nor import prometheus_client: for a run whose counts
    nobody reads (``pgsolo run`` publishing none of them), which would otherwise pay for
    the import (about 30 ms) at its first lock. Returns what puts counting back."""
    with _state.mutex:
        previous = _state.unavailable, _state.cached
        _state.unavailable, _state.cached = True, None

    def restore() -> None:
        with _state.mutex:
            _state.unavailable, _state.cached = previous

    return restore


def count_apart() -> Callable[[], None]:
    """Count in a new registry of pgsolo's own from now on (what one run publishes: the
    process's own metrics in a textfile would clash with node_exporter's); returns what
    puts back the registry counted in before. UsageError without prometheus_client."""
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415
    except ImportError:
        raise UsageError(f"metrics need prometheus_client: {_INSTALL}") from None
    with _state.mutex:
        previous, lock_names = _state.registry, _state.lock_names
    use_registry(CollectorRegistry(auto_describe=True), lock_names=lock_names)
    return lambda: use_registry(previous, lock_names=lock_names)


def registry() -> CollectorRegistry:
    """The registry pgsolo counts in (UsageError without prometheus_client)."""
    try:
        default = _global_registry()
    except ImportError:
        raise UsageError(f"metrics need prometheus_client: {_INSTALL}") from None
    return _state.registry if _state.registry is not None else default


def lock_label(name: str | None) -> str:
    """The ``lock`` label of a key with this name (None: given as a number)."""
    if name is None or not _state.lock_names:
        return ""
    if name.startswith("pgsolo:"):  # pgsolo's own names: one per operation key
        return ":".join(name.split(":", 2)[:2])
    return name


# The series every lock counts in, by (instruments, lock, lifetime, outcome): looked up
# without a mutex, on every lock's path. Bounded as prometheus_client's own children are.
_LOCK_SERIES: dict[tuple[int, str, str, str], _Tally | _InstrumentedCount] = {}
# The same for a job's, by (instruments, job, outcome, reason).
_JOB_SERIES: dict[tuple[int, str, str, str | None], _JobTally | _InstrumentedJob] = {}


def add_up_waits() -> None:
    """Add up the values of every lock and job that arrived and were not added up yet
    (what a scrape does first): for a count of a lock's own work that the lock which
    arrives 256th, and adds up the 255 before it, must not change."""
    for series in list(_LOCK_SERIES.values()):
        if isinstance(series, _Tally):
            series.waits.add_up()
    for job in list(_JOB_SERIES.values()):
        if isinstance(job, _JobTally):
            job.attempts.waits.add_up()
            if job.durations is not None:
                job.durations.add_up()


def observe_lock(name: str | None, lifetime: str, outcome: str, wait: float) -> None:
    """Count an attempt to take a lock (``outcome`` of LOCK_OUTCOMES), ``wait`` seconds."""
    instruments = _state.cached or _state.current()  # no call once they exist
    if instruments is None:
        return
    label = "" if name is None else lock_label(name)
    labels = (id(instruments), label, lifetime, outcome)
    series = _LOCK_SERIES.get(labels)
    if series is None:
        series = _LOCK_SERIES[labels] = instruments.lock_counts.child(label, lifetime, outcome)
    series.add(wait)


def observe_lock_lost(name: str | None, lifetime: str, reason: str | None) -> None:
    """Count a held lock that was lost (``reason``: a code of pgsolo.reasons)."""
    instruments = _state.current()
    if instruments is not None:
        instruments.lock_losses.labels(lock_label(name), lifetime, reason or "").inc()


def observe_job(
    job: str, outcome: str, reason: str | None, lock_wait: float, duration: float
) -> None:
    """Count one attempt at a job; a completed one is the job's last success."""
    instruments = _state.cached or _state.current()  # no call once they exist
    if instruments is None:
        return
    labels = (id(instruments), job, outcome, reason)
    series = _JOB_SERIES.get(labels)
    if series is None:
        # A reason is a code from the fixed vocabulary of pgsolo.reasons (never a
        # message), so as a label it makes a bounded number of series.
        series = _JOB_SERIES[labels] = instruments.job_counts.child(job, outcome, reason or "")
    series.add(lock_wait, duration)


class _Present:
    """The families of a registry that have samples: a metric family with no series yet
    (no success of any job so far) is left out of what is published, so that a
    Pushgateway keeps the value an earlier push gave it."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterable[Any]:
        return [family for family in self.source.collect() if family.samples]


def _published() -> CollectorRegistry:
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    view = CollectorRegistry(auto_describe=False)
    view.register(_Present(registry()))
    return view


def write_textfile(path: str | os.PathLike[str]) -> None:
    """Write pgsolo's registry to ``path`` for node_exporter's textfile collector,
    atomically (a temporary file in the same directory, then a rename).

    Each write replaces the file, and a process that has not completed a job would drop
    that job's last success from it: the values already in the file are kept for every
    job this process has no success of, so "no success for 25 hours" stays true to the
    database's history across cron runs."""
    path = check_textfile(path)
    instruments = _state.current()
    if instruments is None:
        raise UsageError(f"metrics need prometheus_client: {_INSTALL}")
    from prometheus_client import write_to_textfile  # noqa: PLC0415

    target = registry()
    for job, seconds in _last_successes(path).items():
        if target.get_sample_value(LAST_SUCCESS, {"job": job}) is None:  # none here yet
            instruments.job_counts.set_last_success(job, seconds)
    write_to_textfile(path, _published())


def check_textfile(path: str | os.PathLike[str]) -> str:
    """``path`` as a str if it can be node_exporter's textfile, or UsageError."""
    path = os.fspath(path)
    if not path.endswith(".prom"):
        raise UsageError(
            f"the metrics textfile {path!r} must end in .prom: node_exporter's textfile"
            " collector reads only those"
        )
    return path


def _last_successes(path: str) -> dict[str, float]:
    """The last-success gauge's values in an existing textfile (none if unreadable)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        families = list(text_string_to_metric_families(text))
    except (OSError, ValueError):
        return {}  # no file yet, or not one this function wrote: start afresh
    return {
        sample.labels["job"]: sample.value
        for family in families
        for sample in family.samples
        if sample.name == LAST_SUCCESS and "job" in sample.labels
    }


def push(gateway: str, job: str, *, timeout: float = 10) -> None:
    """Push pgsolo's registry to a Pushgateway at ``gateway`` (a URL), grouped under
    ``job``. A push replaces only the metrics it carries (POST), so a run that did not
    complete leaves the job's last success as an earlier push set it."""
    if _state.current() is None:
        raise UsageError(f"metrics need prometheus_client: {_INSTALL}")
    from prometheus_client import pushadd_to_gateway  # noqa: PLC0415

    pushadd_to_gateway(gateway, job=job, registry=_published(), timeout=timeout)
