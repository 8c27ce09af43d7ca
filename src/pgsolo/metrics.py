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

    job_attempts: Any
    job_lock_wait: Any
    job_duration: Any
    job_last_success: Any
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
        from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415

        return cls(
            job_attempts=Counter(
                "pgsolo_job_attempts",
                "Attempts at a pgsolo job, by outcome (a skip is not a success).",
                ["job", "outcome", "reason"],
                registry=None,
            ),
            job_lock_wait=Histogram(
                "pgsolo_job_lock_wait_seconds",
                "Time spent getting, or failing to get, a job's lock.",
                ["job"],
                buckets=_BUCKETS,
                registry=None,
            ),
            job_duration=Histogram(
                "pgsolo_job_duration_seconds",
                "Time a job's work ran.",
                ["job", "outcome"],
                buckets=_BUCKETS,
                registry=None,
            ),
            job_last_success=Gauge(
                LAST_SUCCESS,
                "Unix time at which the job last completed (alert when it gets old).",
                ["job"],
                registry=None,
            ),
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
# A histogram's upper bounds as prometheus_client keeps them: floats, +Inf last.
_BOUNDS = (*(float(bound) for bound in _BUCKETS), float("inf"))


def _lock_counts() -> _LockCounts | _InstrumentedLockCounts:
    """Where the locks' counts are kept: pgsolo's own tallies, unless prometheus_client
    runs in its multiprocess mode, whose scrape reads only what each process wrote to
    disk through prometheus_client's own instruments."""
    # prometheus_client still honours the old, lower-case name.
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ:
        return _InstrumentedLockCounts()
    return _LockCounts()


class _Waits:
    """One series of ``pgsolo_lock_wait_seconds`` (a lock, an outcome): its buckets and its
    sum, added to in the order the waits came, as prometheus_client's Histogram adds
    them (a float sum depends on the order), by every lifetime of the lock.

    A lock only appends its wait, with the tally it counts in, to ``arrived`` (one step,
    which threads can take at once); they are added up, in the order they came, when a
    scrape reads the series or enough of them wait (:meth:`add_up`): a mutex, three
    sums and a bisection on every lock's path cost a tenth of pgsolo's own Python."""

    __slots__ = ("arrived", "buckets", "created", "mutex", "total")

    def __init__(self) -> None:
        self.created = time.time()
        self.total = 0.0
        self.buckets = [0] * len(_BOUNDS)
        self.mutex = threading.Lock()
        self.arrived: list[tuple[_Tally, float]] = []

    def add_up(self) -> None:
        """Add the waits that arrived, each to its tally and to this series."""
        with self.mutex:
            arrived = self.arrived
            taken = arrived[: len(arrived)]  # what arrives meanwhile stays, for the next
            del arrived[: len(taken)]
            for tally, wait in taken:
                tally.count += 1
                self.total += wait
                # The first bucket whose bound the wait is at most, as prometheus_client
                # puts it: a NaN is at most none, and goes in none.
                index = bisect.bisect_left(_BOUNDS, wait)
                if wait <= _BOUNDS[index]:
                    self.buckets[index] += 1


# How many waits may arrive before the one that arrives adds them up (memory stays
# bounded in a process nobody scrapes).
_ADD_UP_AT = 256


class _Tally:
    """One series of ``pgsolo_lock_acquisitions`` (a lock, a lifetime, an outcome), and the
    series of ``pgsolo_lock_wait_seconds`` its waits go to."""

    __slots__ = ("count", "created", "waits")

    def __init__(self, waits: _Waits) -> None:
        self.created = time.time()
        self.count = 0  # of the waits added up (_Waits.add_up)
        self.waits = waits

    def add(self, wait: float) -> None:
        arrived = self.waits.arrived
        arrived.append((self, wait))
        if len(arrived) >= _ADD_UP_AT:
            self.waits.add_up()


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
        from prometheus_client.utils import floatToGoString  # noqa: PLC0415

        to_go: Callable[[float], str] = floatToGoString  # as prometheus_client writes a bound
        les = [to_go(bound) for bound in _BOUNDS]
        created = _created_series()
        acquisitions, waits = self.describe()
        with self._mutex:
            tallies, all_waits = list(self._tallies.items()), list(self._waits.items())
        name = _ACQUISITIONS[0]
        for series in {id(tally.waits): tally.waits for _, tally in tallies}.values():
            series.add_up()
        for (lock, lifetime, outcome), tally in tallies:
            with tally.waits.mutex:
                count = tally.count
            labels = {"lock": lock, "lifetime": lifetime, "outcome": outcome}
            acquisitions.add_sample(f"{name}_total", labels, float(count))
            if created:
                acquisitions.add_sample(f"{name}_created", labels, tally.created)
        name = _WAITS[0]
        for (lock, outcome), series in all_waits:
            with series.mutex:
                total, buckets = series.total, list(series.buckets)
            running = 0.0
            for le, count in zip(les, buckets, strict=True):
                running += count
                waits.add_sample(
                    f"{name}_bucket", {"lock": lock, "outcome": outcome, "le": le}, running
                )
            labels = {"lock": lock, "outcome": outcome}
            waits.add_sample(f"{name}_count", labels, running)
            waits.add_sample(f"{name}_sum", labels, total)
            if created:
                waits.add_sample(f"{name}_created", labels, series.created)
        return [acquisitions, waits]


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
# The same for a job's four, by (instruments, job, outcome, reason).
_JOB_CHILDREN: dict[tuple[int, str, str, str | None], tuple[Any, Any, Any, Any]] = {}


def add_up_waits() -> None:
    """Add up the waits of every lock that arrived and were not added up yet (what a
    scrape does first): for a count of a lock's own work that the lock which arrives
    256th, and adds up the 255 before it, must not change."""
    for series in list(_LOCK_SERIES.values()):
        if isinstance(series, _Tally):
            series.waits.add_up()


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
    children = _JOB_CHILDREN.get(labels)
    if children is None:
        # A reason is a code from the fixed vocabulary of pgsolo.reasons (never a
        # message), so as a label it makes a bounded number of series.
        children = (
            instruments.job_attempts.labels(job, outcome, reason or ""),
            instruments.job_lock_wait.labels(job),
            None if outcome == "skipped" else instruments.job_duration.labels(job, outcome),
            instruments.job_last_success.labels(job) if outcome == "completed" else None,
        )
        _JOB_CHILDREN[labels] = children
    attempts, lock_waits, durations, last_success = children
    attempts.inc()
    lock_waits.observe(lock_wait)
    if durations is not None:
        durations.observe(duration)
    if last_success is not None:
        last_success.set(time.time())


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
            instruments.job_last_success.labels(job).set(seconds)
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
