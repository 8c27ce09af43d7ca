"""Prometheus metrics of bare locks and jobs, counted in a registry of the test's own
(``pgsolo.metrics.use_registry``): the global one is left alone, and a test sees only what
its own locks counted."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_open

import pgsolo
import pgsolo.metrics
from _support import Connect, hold, new_job, terminate, unhold, unique_name
from pgsolo.jobs import run_job
from pgsolo.keys import Key
from pgsolo.metrics import (
    LAST_SUCCESS,
    _InstrumentedJobCounts,
    _InstrumentedLockCounts,
    _JobCounts,
    _LockCounts,
)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh registry pgsolo counts in for the test; the global one again afterwards."""
    fresh = CollectorRegistry()
    pgsolo.metrics.use_registry(fresh)
    try:
        yield fresh
    finally:
        pgsolo.metrics.use_registry(None)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_bare_locks_count_acquired_busy_and_timeout_by_name(
    registry: CollectorRegistry, connect: Connect
) -> None:
    name = unique_name("metrics-bare")
    holder = hold(connect, name)
    conn = connect()
    with pgsolo.session_lock(conn, name) as lock:  # busy: another session holds it
        assert not lock.acquired
    with pytest.raises(pgsolo.LockTimeoutError), pgsolo.session_lock(conn, name, wait=0.2):
        pass
    unhold(holder, name)
    tx = connect(autocommit=False)
    for _ in range(2):
        with pgsolo.xact_lock(tx, name) as lock:
            assert lock.acquired

    count = "pgsolo_lock_acquisitions_total"
    assert value(registry, count, lock=name, lifetime="session", outcome="busy") == 1
    assert value(registry, count, lock=name, lifetime="session", outcome="timeout") == 1
    assert value(registry, count, lock=name, lifetime="xact", outcome="acquired") == 2
    waits = "pgsolo_lock_wait_seconds"
    assert value(registry, f"{waits}_count", lock=name, outcome="timeout") == 1
    assert value(registry, f"{waits}_sum", lock=name, outcome="timeout") >= 0.2
    # Counted in the test's registry only.
    assert (
        REGISTRY.get_sample_value(count, {"lock": name, "lifetime": "xact", "outcome": "acquired"})
        is None
    )


def test_a_registry_that_refuses_one_metric_gets_none_and_takes_them_all_once_it_is_free(
    registry: CollectorRegistry, connect: Connect
) -> None:
    """Guards the all-or-none registration, made with prometheus_client's public
    register/unregister only: a name already taken in the registry makes the lock fail
    with the registry's error, and leaves none of pgsolo's metrics behind, so that the
    next lock, once the name is free, registers them all instead of refusing duplicates."""
    from prometheus_client import Counter  # noqa: PLC0415 - as the module's other imports

    squatter = Counter("pgsolo_lock_losses", "taken before pgsolo", registry=registry)
    name = unique_name("metrics-refused")
    conn = connect()
    with pytest.raises(ValueError, match="pgsolo_lock_losses"), pgsolo.session_lock(conn, name):
        pass
    assert value(registry, "pgsolo_job_attempts_total") == 0
    assert "pgsolo_job_attempts" not in {m.name for m in registry.collect()}
    registry.unregister(squatter)
    with pgsolo.session_lock(conn, name) as lock:
        assert lock.acquired
    acquired = {"lock": name, "lifetime": "session", "outcome": "acquired"}
    assert value(registry, "pgsolo_lock_acquisitions_total", **acquired) == 1


def test_a_lost_lock_counts_once_though_the_keeper_and_the_release_both_see_it(
    registry: CollectorRegistry, connect: Connect, observer: Any
) -> None:
    name = unique_name("metrics-lost")
    conn = connect()
    seen = threading.Event()
    keep = pgsolo.Keep(interval=0.05, on_lost=lambda error: seen.set())
    lock = pgsolo.session_lock(conn, name, keep=keep)
    lock.acquire()
    terminate(observer, conn.info.backend_pid)
    assert seen.wait(30)
    with pytest.raises(pgsolo.LockLostError):  # and the release sees it again
        lock.release()

    labels = {"lock": name, "lifetime": "session"}
    assert value(registry, "pgsolo_lock_losses_total", reason="connection-lost", **labels) == 1
    assert value(registry, "pgsolo_lock_acquisitions_total", outcome="acquired", **labels) == 1


def test_a_number_has_no_name_and_pgsolo_names_count_by_prefix(
    registry: CollectorRegistry, connect: Connect, key: Key
) -> None:
    """A key given as a number is unbounded (a tenant id): one series for all of them.
    pgsolo's own names (one per operation key) count under their prefix."""
    conn = connect()
    for resource in range(3):
        with pgsolo.session_lock(conn, (key.value[0], resource)):  # type: ignore[index]
            pass
    assert (
        value(
            registry,
            "pgsolo_lock_acquisitions_total",
            lock="",
            lifetime="session",
            outcome="acquired",
        )
        == 3
    )
    assert pgsolo.metrics.lock_label("pgsolo:once:charge:order:8812") == "pgsolo:once"
    assert pgsolo.metrics.lock_label("daily-settlement") == "daily-settlement"
    pgsolo.metrics.use_registry(registry, lock_names=False)  # names built from data
    assert pgsolo.metrics.lock_label("tenant-8812") == ""


def test_counting_apart_and_back_keeps_the_registry_and_lock_names(
    registry: CollectorRegistry, connect: Connect, key: Key
) -> None:
    """Guards ``pgsolo run``'s publishing, which counted apart and then put the registry
    back with ``lock_names`` reset to True: a process that counted bare locks under
    ``lock=""`` (names built from data) would have started a series per name."""
    pgsolo.metrics.use_registry(registry, lock_names=False)
    restore = pgsolo.metrics.count_apart()
    apart = pgsolo.metrics.registry()
    assert apart is not registry
    assert pgsolo.metrics.lock_label("tenant-8812") == ""
    with pgsolo.session_lock(connect(), key):
        pass
    restore()
    assert pgsolo.metrics.registry() is registry
    assert pgsolo.metrics.lock_label("tenant-8812") == ""
    counted = {"lock": "", "lifetime": "session", "outcome": "acquired"}
    assert value(apart, "pgsolo_lock_acquisitions_total", **counted) == 1
    assert value(registry, "pgsolo_lock_acquisitions_total", **counted) == 0


def test_a_job_completed_sets_its_last_success_and_a_skip_leaves_it(
    registry: CollectorRegistry, db: str, connect: Connect
) -> None:
    job = new_job("metrics-job")
    gauge = "pgsolo_job_last_success_timestamp_seconds"
    before = time.time()
    assert run_job(db, job, lambda conn: None).outcome == "completed"
    first = value(registry, gauge, job=job)
    assert before <= first <= time.time()

    holder = hold(connect, job)
    assert run_job(db, job, lambda conn: None).outcome == "skipped"
    unhold(holder, job)

    def fail(conn: psycopg.Connection) -> None:
        raise RuntimeError("boom")

    assert run_job(db, job, fail, raise_errors=False).outcome == "failed"
    assert value(registry, gauge, job=job) == first  # neither a skip nor a failure is one
    assert (
        value(registry, "pgsolo_job_attempts_total", job=job, outcome="skipped", reason="busy") == 1
    )
    # The job's lock counts as a lock too, under the job's name.
    assert (
        value(registry, "pgsolo_lock_acquisitions_total", lock=job, lifetime="xact", outcome="busy")
        == 1
    )


def test_the_textfile_is_replaced_whole_and_keeps_a_last_success_this_process_lacks(
    registry: CollectorRegistry, db: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.prom"
    path.write_text(
        "# TYPE pgsolo_job_last_success_timestamp_seconds gauge\n"
        'pgsolo_job_last_success_timestamp_seconds{job="nightly"} 1700000000.0\n'
    )
    job = new_job("metrics-file")
    run_job(db, job, lambda conn: None)
    pgsolo.metrics.write_textfile(path)

    text = path.read_text()
    assert 'pgsolo_job_last_success_timestamp_seconds{job="nightly"} 1.7e+09' in text
    assert f'pgsolo_job_attempts_total{{job="{job}",outcome="completed",reason=""}} 1.0' in text
    assert "python_gc" not in text  # only what the registry in use holds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.prom"]  # no temporary left


def test_bad_input_is_a_usage_error(registry: CollectorRegistry, tmp_path: Path) -> None:
    with pytest.raises(pgsolo.UsageError, match=r"\.prom"):
        pgsolo.metrics.write_textfile(tmp_path / "jobs.txt")
    with pytest.raises(pgsolo.UsageError, match="CollectorRegistry"):
        pgsolo.metrics.use_registry("REGISTRY")  # type: ignore[arg-type]
    assert pgsolo.metrics.registry() is registry  # unchanged by the refusal


def test_without_prometheus_client_locks_work_and_publishing_is_a_usage_error(
    dsn: str, tmp_path: Path
) -> None:
    """A core install without the extra: ``sys.modules[name] = None`` makes every import of
    prometheus_client fail, as it does where the package is not installed."""
    program = f"""
import sys
sys.modules["prometheus_client"] = None
import psycopg, pgsolo, pgsolo.metrics
with psycopg.connect({dsn!r}, autocommit=True) as conn:
    with pgsolo.session_lock(conn, "no-metrics") as lock:
        assert lock.acquired
try:
    pgsolo.metrics.write_textfile({str(tmp_path / "x.prom")!r})
except pgsolo.UsageError as exc:
    print("usage:", exc)
from pgsolo.cli import main
sys.exit(main(["run", "--key", "k", "--dsn", {dsn!r}, "--metrics-textfile",
               {str(tmp_path / "y.prom")!r}, "--", "true"]))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "usage: metrics need prometheus_client" in done.stdout
    assert "pgsolo[prometheus]" in done.stderr
    assert list(tmp_path.iterdir()) == []


# Where a real SIGINT lands, in the first lock's import of prometheus_client and in its
# registration of pgsolo's metrics: a trace function raises it there.
_CUT_SHORT = {
    # the import: as a module (platform_collector) returns from registering python_info
    "import": """
def cut_here(frame, event, arg):
    return (
        event == "return"
        and frame.f_code.co_name == "__init__"
        and frame.f_code.co_filename.endswith("platform_collector.py")
    )
""",
    # the registration: with some of a metric's names recorded, and not the rest
    "register": """
def cut_here(frame, event, arg):
    if frame.f_code.co_name != "register" or not frame.f_code.co_filename.endswith(
        "registry.py"
    ):
        return False
    registry, collector = frame.f_locals["self"], frame.f_locals.get("collector")
    recorded = [c for c in registry._names_to_collectors.values() if c is collector]
    return (
        getattr(collector, "_name", "") == "pgsolo_lock_acquisitions"
        and bool(recorded)
        and collector not in registry._collector_to_names
    )
""",
}


@pytest.mark.parametrize("where", sorted(_CUT_SHORT))
def test_a_ctrl_c_in_the_first_lock_s_metrics_leaves_the_next_lock_counted(
    dsn: str, where: str
) -> None:
    """Guards a Ctrl-C landing where a lock first prepares its metrics, before it sends
    anything (CI's random SIGINTs found both): inside prometheus_client's first import,
    whose finished modules kept the global registry with ``python_info`` registered by
    the one cut short, and inside ``CollectorRegistry.register``, which had recorded one
    of ``pgsolo_lock_acquisitions``'s names and not the others. Either way every later
    lock raised DuplicateTimeseries. Here a real SIGINT comes exactly there, in a fresh
    process: the first lock is interrupted, before it took anything, and the next one is
    taken and counted."""
    program = f"""
import signal, sys
import psycopg, pgsolo, pgsolo.metrics
assert "prometheus_client" not in sys.modules
{_CUT_SHORT[where]}
def interrupt(frame, event, arg):
    if cut_here(frame, event, arg):
        sys.settrace(None)
        signal.raise_signal(signal.SIGINT)
        return None
    return interrupt

with psycopg.connect({dsn!r}, autocommit=True) as conn:
    sys.settrace(interrupt)
    try:
        with pgsolo.session_lock(conn, "pgsolo-metrics-cut-short"):
            print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
    sys.settrace(None)
    with pgsolo.session_lock(conn, "pgsolo-metrics-cut-short") as lock:
        assert lock.acquired
    held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                        " AND pid = pg_backend_pid()").fetchone()[0]
    print("held", held)
from prometheus_client import REGISTRY, generate_latest
print(generate_latest(REGISTRY).decode())
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("interrupted\nheld 0\n")
    assert (
        'pgsolo_lock_acquisitions_total{lifetime="session",lock="pgsolo-metrics-cut-short",'
        'outcome="acquired"} 1.0'
    ) in done.stdout
    assert "python_info{" in done.stdout


# What a few locks count (name, lifetime, outcome, wait): waits on a bucket's bound, between
# bounds, past the last one; one lock under two lifetimes, whose waits share a series and
# are summed in the order they came (0.1 + 0.2 + 2.5 is 2.8, 0.1 + 2.5 + 0.2 is not); a
# NaN, which prometheus_client adds to the sum and to no bucket.
_OBSERVED = [
    ("metrics-same", "session", "acquired", 0.0),
    ("metrics-same", "session", "acquired", 0.001),
    ("metrics-same", "xact", "acquired", 0.0031),
    ("metrics-same", "session", "busy", 0.5),
    ("metrics-order", "session", "acquired", 0.1),
    ("metrics-order", "xact", "acquired", 0.2),
    ("metrics-order", "session", "acquired", 2.5),
    (None, "session", "timeout", 7200.0),
    ("pgsolo:once:abc", "xact", "error", 12.5),
    ("metrics-nan", "session", "error", float("nan")),
]


def _published(counts: Any, fmt: str) -> str:
    """What a scrape of ``counts`` alone gets, the values of ``_created`` and of the last
    success blanked (they are times)."""
    registry = CollectorRegistry()
    registry.register(counts)
    text = (generate_latest if fmt == "text" else generate_open)(registry).decode()
    return "\n".join(
        line.rpartition(" ")[0] if _timed(line.partition(" ")[0]) else line
        for line in text.splitlines()
    )


def _timed(name: str) -> bool:
    return "_created" in name or name.startswith(f"{LAST_SUCCESS}{{")


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
@pytest.mark.parametrize("created", [True, False])
def test_the_locks_counts_publish_as_prometheus_clients_own_instruments_do(
    fmt: str, created: bool
) -> None:
    """Guards pgsolo's own tallies of every lock (counted without prometheus_client's
    per-call mutexes, published at scrape time): a scrape gets what prometheus_client's
    Counter and Histogram publish for the same counts, sample for sample, with or without
    ``_created`` series (``disable_created_metrics()``)."""
    if not created:
        disable_created_metrics()
    try:
        tallied, instrumented = _LockCounts(), _InstrumentedLockCounts()
        for counts in (tallied, instrumented):
            for name, lifetime, outcome, wait in _OBSERVED:
                label = pgsolo.metrics.lock_label(name)
                counts.child(label, lifetime, outcome).add(wait)
        published = _published(tallied, fmt)
        assert published == _published(instrumented, fmt)
    finally:
        enable_created_metrics()
    assert (
        'pgsolo_lock_wait_seconds_bucket{le="0.005",lock="metrics-same",outcome="acquired"} 3.0'
        in published
    )
    assert ("_created" in published) is created


def _count_while_scraping(tallied: Any, count: Callable[[], None]) -> None:
    """``count`` in 8 threads at once, while another thread scrapes ``tallied``."""
    counting = True

    def scrape() -> None:
        while counting:
            _published(tallied, "text")

    scraper = threading.Thread(target=scrape)
    scraper.start()
    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counting = False
    scraper.join()


def test_every_wait_counts_once_when_threads_count_while_scrapes_add_them_up() -> None:
    """Guards the tallies' way of counting (a lock appends its wait; the one that arrives
    256th adds up those before it, and a scrape adds up the rest): 8 threads count 1,000
    locks each while another scrapes, and every wait counts once, in the count, the sum
    and the buckets, as prometheus_client's instruments count the same waits."""
    tallied, instrumented = _LockCounts(), _InstrumentedLockCounts()
    # Binary fractions: summed in any order, the same float.
    waits = [(i % 7) / 1024 for i in range(1000)]

    def count() -> None:
        series = tallied.child("many", "session", "acquired")
        for wait in waits:
            series.add(wait)

    _count_while_scraping(tallied, count)
    for wait in waits * 8:
        instrumented.child("many", "session", "acquired").add(wait)
    published = _published(tallied, "text")
    assert published == _published(instrumented, "text")
    assert (
        'pgsolo_lock_acquisitions_total{lifetime="session",lock="many",outcome="acquired"}'
        " 8000.0" in published
    )


def _printed_in_multiprocess_mode(program: str, directory: Path) -> list[str]:
    """What ``program`` prints, run in a process of its own under prometheus_client's
    multiprocess mode (its files in ``directory``)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_prometheus_clients_multiprocess_mode_scrapes_the_locks_counts(
    dsn: str, tmp_path: Path
) -> None:
    """Guards the locks' counts under prometheus_client's multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR``, a server of several processes), whose scrape reads only
    what each process wrote to disk: pgsolo's own tallies stay in a process's memory, so
    there they are kept by prometheus_client's instruments."""
    program = f"""
import psycopg, pgsolo
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
with psycopg.connect({dsn!r}, autocommit=True) as conn:
    with pgsolo.session_lock(conn, "pgsolo-metrics-multiprocess") as lock:
        assert lock.acquired
scrape = CollectorRegistry()
MultiProcessCollector(scrape)
waits = {{"lock": "pgsolo-metrics-multiprocess", "outcome": "acquired"}}
counted = {{**waits, "lifetime": "session"}}
print(scrape.get_sample_value("pgsolo_lock_acquisitions_total", counted))
print(scrape.get_sample_value("pgsolo_lock_wait_seconds_count", waits))
"""
    assert _printed_in_multiprocess_mode(program, tmp_path) == ["1.0", "1.0"]


# What a few jobs count (job, outcome, reason, lock wait, duration): every outcome, a
# skip's duration (counted in no histogram), sums whose order matters, a NaN.
_JOBS_OBSERVED = [
    ("metrics-job-a", "completed", "", 0.0, 0.1),
    ("metrics-job-a", "skipped", "busy", 0.001, 0.0),
    ("metrics-job-a", "completed", "", 0.2, 2.5),
    ("metrics-job-a", "failed", "", 0.0031, 0.2),
    ("metrics-job-b", "lost", "connection-lost", 7200.0, 12.5),
    ("metrics-job-b", "skipped", "already-done-this-period", 0.5, 0.0),
    ("metrics-job-a", "completed", "", 2.5, 0.2),
    ("metrics-job-c", "failed", "period-not-recorded", float("nan"), float("nan")),
]


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
@pytest.mark.parametrize("created", [True, False])
def test_the_jobs_counts_publish_as_prometheus_clients_own_instruments_do(
    fmt: str, created: bool
) -> None:
    """Guards pgsolo's own tallies of every job (its attempts, lock waits, durations and
    last success, counted without prometheus_client's per-call mutexes): a scrape gets
    what prometheus_client's Counter, Histograms and Gauge publish for the same jobs,
    sample for sample, the last success's time aside."""
    if not created:
        disable_created_metrics()
    try:
        tallied, instrumented = _JobCounts(), _InstrumentedJobCounts()
        for counts in (tallied, instrumented):
            for job, outcome, reason, lock_wait, duration in _JOBS_OBSERVED:
                counts.child(job, outcome, reason).add(lock_wait, duration)
        published = _published(tallied, fmt)
        assert published == _published(instrumented, fmt)
    finally:
        enable_created_metrics()
    assert 'pgsolo_job_lock_wait_seconds_count{job="metrics-job-a"} 5.0' in published
    assert (
        'pgsolo_job_duration_seconds_bucket{job="metrics-job-a",le="5.0",outcome="completed"} 3.0'
        in published
    )
    assert 'pgsolo_job_duration_seconds_count{job="metrics-job-a",outcome="skipped"}' not in (
        published
    )
    # A last success for the one job that completed, and for no other.
    assert [line for line in published.splitlines() if line.startswith(f"{LAST_SUCCESS}{{")] == [
        f'{LAST_SUCCESS}{{job="metrics-job-a"}}'
    ]
    assert ("_created" in published) is created


def test_a_jobs_last_success_is_the_time_it_completed_and_the_textfile_s_until_then() -> None:
    """Guards the last success of pgsolo's own tallies: the time of the job's last
    completed attempt, or the one set from a textfile (what ``write_textfile`` keeps of an
    earlier run's) until the job completes here."""
    tallied = _JobCounts()
    tallied.set_last_success("metrics-job-kept", 1_700_000_000.0)
    before = time.time()
    tallied.child("metrics-job-new", "completed", "").add(0.0, 0.1)
    after = time.time()
    tallied.child("metrics-job-new", "failed", "").add(0.0, 0.1)
    registry = CollectorRegistry()
    registry.register(tallied)
    assert registry.get_sample_value(LAST_SUCCESS, {"job": "metrics-job-kept"}) == 1.7e9
    assert before <= (registry.get_sample_value(LAST_SUCCESS, {"job": "metrics-job-new"}) or 0)
    assert (registry.get_sample_value(LAST_SUCCESS, {"job": "metrics-job-new"}) or 0) <= after
    tallied.child("metrics-job-kept", "completed", "").add(0.0, 0.1)
    assert (registry.get_sample_value(LAST_SUCCESS, {"job": "metrics-job-kept"}) or 0) > 1.7e9


def test_every_job_counts_once_when_threads_count_while_scrapes_add_them_up() -> None:
    """Guards the job tallies' way of counting, as the locks' test does: 8 threads count
    600 attempts each while another scrapes, and every attempt counts once, in the
    attempts, the lock waits and the durations, as prometheus_client's instruments count
    the same attempts."""
    tallied, instrumented = _JobCounts(), _InstrumentedJobCounts()
    # Binary fractions: summed in any order, the same float.
    attempts = [((i % 7) / 1024, (i % 5) / 256) for i in range(600)]

    def count() -> None:
        series = tallied.child("many", "completed", "")
        for lock_wait, duration in attempts:
            series.add(lock_wait, duration)

    _count_while_scraping(tallied, count)
    for lock_wait, duration in attempts * 8:
        instrumented.child("many", "completed", "").add(lock_wait, duration)
    published = _published(tallied, "text")
    assert published == _published(instrumented, "text")
    assert 'pgsolo_job_attempts_total{job="many",outcome="completed",reason=""} 4800.0' in (
        published
    )
    assert 'pgsolo_job_duration_seconds_count{job="many",outcome="completed"} 4800.0' in published


def test_prometheus_clients_multiprocess_mode_scrapes_the_jobs_counts(
    dsn: str, tmp_path: Path
) -> None:
    """Guards the jobs' counts under prometheus_client's multiprocess mode, as the locks'
    test does: there they are kept by prometheus_client's instruments."""
    program = f"""
import pgsolo
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
result = pgsolo.run_job({dsn!r}, "pgsolo-metrics-multiprocess-job", lambda conn: None)
assert result.completed, result
scrape = CollectorRegistry()
MultiProcessCollector(scrape)
job = {{"job": "pgsolo-metrics-multiprocess-job"}}
print(scrape.get_sample_value(
    "pgsolo_job_attempts_total", {{**job, "outcome": "completed", "reason": ""}}
))
print(scrape.get_sample_value("pgsolo_job_lock_wait_seconds_count", job))
durations = {{**job, "outcome": "completed"}}
print(scrape.get_sample_value("pgsolo_job_duration_seconds_count", durations))
"""
    assert _printed_in_multiprocess_mode(program, tmp_path) == ["1.0", "1.0", "1.0"]
