"""Item 3: handoff latency. A holder releases a lock that a waiter is queued on; how
long after the release does the waiter have it?

Holder and waiter are threads of this process with connections of their own, and both
moments come from the same clock (``time.perf_counter_ns``): *release* is taken just
before the holder sends ``pg_advisory_unlock``, *grant* just after the waiter's acquire
returns. The waiter is known to be queued before the release (its backend waits in
``pg_locks``, or a polling waiter has missed once), and the release comes a random
0-50 ms later, so a polling waiter is caught at a random point of its period.

Waiters: pgsolo's wait mode (``session_lock(wait=...)``: the server queues the backend
and wakes it at the release), the bare ``pg_advisory_lock`` on psycopg (the floor), and
a polling design that tries ``pg_try_advisory_lock`` every 50 ms, like peers that
retry on a timer. pgsolo waits in slices of 2 s (``pgsolo.locking.waits``), each its own
statement, so that a waiter never holds back VACUUM; a release almost never falls between
two of them at that length, so a fourth waiter, pgsolo's wait mode cut into 50 ms slices,
is released at a random point of its slice, some in the gap: the worst case of slicing.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

import pgsolo
from benchmarks.registry import Context, Ratio, Row, quantile, scenario
from pgsolo.locking import waits

KEY = (42, 2001)
POLL_PERIOD_S = 0.05
WAIT_S = 30.0  # pgsolo's bound on a wait; a handoff takes milliseconds
QUEUED_TIMEOUT_S = 10.0
SHORT_SLICE_S = 0.05  # the slices of the fourth waiter: as long as the random delay

Release = Callable[[], None]
Acquire = Callable[[psycopg.Connection[Any], threading.Event], Release]


def _pgsolo_wait(conn: psycopg.Connection[Any], missed: threading.Event) -> Release:
    lock = pgsolo.session_lock(conn, KEY, wait=WAIT_S)
    lock.acquire()
    return lock.release


def _pgsolo_short_slices(conn: psycopg.Connection[Any], missed: threading.Event) -> Release:
    slice_s, waits.WAIT_SLICE_SECONDS = waits.WAIT_SLICE_SECONDS, SHORT_SLICE_S
    try:
        return _pgsolo_wait(conn, missed)
    finally:
        waits.WAIT_SLICE_SECONDS = slice_s


def _blocking(conn: psycopg.Connection[Any], missed: threading.Event) -> Release:
    conn.execute("SELECT pg_advisory_lock(%s, %s)", KEY)
    return lambda: _unlock(conn)


def _polling(conn: psycopg.Connection[Any], missed: threading.Event) -> Release:
    deadline = time.monotonic() + WAIT_S
    while not _try(conn):
        missed.set()
        if time.monotonic() > deadline:
            raise TimeoutError("the polling waiter never got the lock")
        time.sleep(POLL_PERIOD_S)
    return lambda: _unlock(conn)


def _try(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", KEY).fetchone()
    return bool(row and row[0])


def _unlock(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT pg_advisory_unlock(%s, %s)", KEY).fetchone()
    if not (row and row[0]):
        raise RuntimeError("the lock was not held at release")


@dataclass
class Waiter:
    name: str
    acquire: Acquire
    round_samples: list[list[float]] = field(default_factory=list)  # ms, per round


WAITERS = [
    Waiter("pgsolo wait mode", _pgsolo_wait),
    Waiter("pg_advisory_lock (psycopg)", _blocking),
    Waiter(f"polling every {POLL_PERIOD_S * 1000:g} ms", _polling),
    Waiter(f"pgsolo wait mode in {SHORT_SLICE_S * 1000:g} ms slices", _pgsolo_short_slices),
]


def _queued(observer: psycopg.Connection[Any], pid: int) -> bool:
    row = observer.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND NOT granted",
        (pid,),
    ).fetchone()
    return bool(row and row[0])


def _handoff(
    waiter: Waiter,
    holder: psycopg.Connection[Any],
    waiting: psycopg.Connection[Any],
    observer: psycopg.Connection[Any],
    rng: random.Random,
) -> float:
    """One handoff, in ms from the release to the grant."""
    holder.execute("SELECT pg_advisory_lock(%s, %s)", KEY)
    missed = threading.Event()
    granted_at: list[int] = []
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            release = waiter.acquire(waiting, missed)
            granted_at.append(time.perf_counter_ns())
            release()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=wait, name="handoff-waiter", daemon=True)
    thread.start()
    deadline = time.monotonic() + QUEUED_TIMEOUT_S
    pid = waiting.info.backend_pid
    while not (missed.is_set() or _queued(observer, pid)):
        if time.monotonic() > deadline or not thread.is_alive():
            _unlock(holder)
            thread.join(WAIT_S)
            raise RuntimeError(f"{waiter.name} never queued for the lock: {failure!r}")
        time.sleep(0.001)
    time.sleep(rng.uniform(0, POLL_PERIOD_S))
    released_at = time.perf_counter_ns()
    _unlock(holder)
    thread.join(WAIT_S)
    if failure or not granted_at:
        raise RuntimeError(f"{waiter.name} did not get the lock: {failure!r}")
    return (granted_at[0] - released_at) / 1e6


@scenario("3", "handoff latency: release to grant")
def handoff(ctx: Context) -> list[Row]:
    per_round = ctx.size(30, 5)
    rng = random.Random(3)
    conninfo = ctx.target.conninfo()
    with (
        psycopg.connect(conninfo, autocommit=True) as holder,
        psycopg.connect(conninfo, autocommit=True) as waiting,
        psycopg.connect(conninfo, autocommit=True) as observer,
    ):
        for w in WAITERS:  # warm up: psycopg's prepared statements, pgsolo's first call
            _handoff(w, holder, waiting, observer, rng)
        for round_no in range(ctx.rounds):
            order = WAITERS if round_no % 2 == 0 else WAITERS[::-1]
            for w in order:
                w.round_samples.append(
                    [_handoff(w, holder, waiting, observer, rng) for _ in range(per_round)]
                )
    whole, floor, polling, sliced = WAITERS
    rows = []
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        for ours, other in ((whole, polling), (whole, floor), (sliced, floor)):
            rows.append(
                Row(
                    scenario="3",
                    title=f"{ours.name} ÷ {other.name}, {label} release to grant",
                    ratio=Ratio.paired(_per_round(ours, q), _per_round(other, q)),
                    detail=f"{_ms(ours, q)} vs {_ms(other, q)}"
                    f" ({per_round * ctx.rounds} handoffs each)",
                    data={
                        "ours_ms": ours.round_samples,
                        "theirs_ms": other.round_samples,
                        "quantile": q,
                    },
                )
            )
    return rows


def _per_round(w: Waiter, q: float) -> list[float]:
    return [quantile(samples, q) for samples in w.round_samples]


def _ms(w: Waiter, q: float) -> str:
    pooled = [s for samples in w.round_samples for s in samples]
    value = statistics.median(pooled) if q == 0.5 else quantile(pooled, q)
    return f"{value:.2f} ms"
