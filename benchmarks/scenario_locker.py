"""Item 12: what a :class:`pgsolo.Locker` costs and saves.

- **uncontended**: try + release through a Locker of one connection ÷ ``session_lock`` on
  a dedicated connection, both in blocks of the same size that alternate within a round
  (goal <= 1.2).
- **10,000 keys, one after another**: acquire + release of distinct keys through a Locker
  of 4 connections ÷ one connection per lock from a pool of 4 (getconn, lock, release,
  putconn).
- **10,000 keys held at once**: through a Locker of 4: the time per lock, the backends
  that hold them and the client memory per lock (tracemalloc). One pooled connection per
  lock cannot do it at all: it would need 10,000 backends (the server's
  ``max_connections`` is in the row).
- **hand-off**: another session frees a key a waiter wants; from the unlock to the
  waiter's acquisition, through a Locker (tries, 1 ms doubling to 50 ms) ÷ by
  ``session_lock(wait=)`` on a dedicated connection (a wait on the server).

``python -m benchmarks --only 12`` runs it alone.
"""

from __future__ import annotations

import statistics
import threading
import time
import tracemalloc
from typing import Any

import psycopg
import psycopg_pool

import pgsolo
from benchmarks.registry import Context, Goal, Ratio, Row, quantile, scenario

UNCONTENDED_GOAL = Goal("<=", 1.2)
BLOCK = 300
KEYS = 10_000
CONNECTIONS = 4
HANDOFFS = 21
HANDOFF_KEY = 4242


def _timed_block(take: Any) -> float:
    started = time.perf_counter()
    for _ in range(BLOCK):
        lock = take()
        lock.acquire()
        lock.release()
    return (time.perf_counter() - started) / BLOCK


def _uncontended(conninfo: str, rounds: int) -> tuple[list[float], list[float]]:
    ours, theirs = [], []
    with (
        pgsolo.Locker(conninfo, max_connections=1) as locker,
        psycopg.connect(conninfo, autocommit=True) as conn,
    ):

        def through_locker() -> Any:
            return locker.session_lock("pgsolo-bench:locker")

        def dedicated() -> Any:
            return pgsolo.session_lock(conn, "pgsolo-bench:locker")

        _timed_block(through_locker), _timed_block(dedicated)  # warm both
        for round_no in range(rounds):
            for side in (0, 1) if round_no % 2 == 0 else (1, 0):
                if side == 0:
                    ours.append(_timed_block(through_locker))
                else:
                    theirs.append(_timed_block(dedicated))
    return ours, theirs


def _backends(conninfo: str, application_name: str) -> int:
    """How many backends named ``application_name`` hold advisory locks."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s",
            (application_name,),
        ).fetchone()
    return int(row[0]) if row else 0


def _one_after_another(conninfo: str, keys: int) -> tuple[float, float]:
    """Seconds per acquire + release of distinct keys: through a Locker, and with one
    pooled connection per lock."""
    with pgsolo.Locker(conninfo, max_connections=CONNECTIONS) as locker:
        started = time.perf_counter()
        for i in range(keys):
            lock = locker.session_lock(f"pgsolo-bench:seq:{i}")
            lock.acquire()
            lock.release()
        through_locker = (time.perf_counter() - started) / keys
    with psycopg_pool.ConnectionPool(
        conninfo,
        min_size=CONNECTIONS,
        max_size=CONNECTIONS,
        kwargs={"autocommit": True},
        open=True,
    ) as pool:
        pool.wait()
        started = time.perf_counter()
        for i in range(keys):
            conn = pool.getconn()
            pooled_lock = pgsolo.session_lock(conn, f"pgsolo-bench:seq:{i}")
            pooled_lock.acquire()
            pooled_lock.release()
            pool.putconn(conn)
        pooled = (time.perf_counter() - started) / keys
    return through_locker, pooled


def _held_at_once(conninfo: str, keys: int, *, traced: bool) -> dict[str, float]:
    """``keys`` held at once through a Locker: the time per lock, or (``traced``, which
    slows Python down) the client memory per lock; the backends that hold them."""
    name = "pgsolo-bench-locker"
    if traced:
        tracemalloc.start()
    try:
        with pgsolo.Locker(conninfo, max_connections=CONNECTIONS, application_name=name) as locker:
            locks = [locker.session_lock(f"pgsolo-bench:many:{i}") for i in range(keys)]
            started = time.perf_counter()
            for lock in locks:
                lock.acquire()
            acquired = (time.perf_counter() - started) / keys
            memory = tracemalloc.get_traced_memory()[0] if traced else 0
            held_by = _backends(conninfo, name)
            started = time.perf_counter()
            for lock in locks:
                lock.release()
            released = (time.perf_counter() - started) / keys
    finally:
        if traced:
            tracemalloc.stop()
    return {
        "acquire_s_per_lock": acquired,
        "release_s_per_lock": released,
        "backends": held_by,
        "client_bytes_per_lock": memory / keys,
    }


def _handoffs(conninfo: str, rounds: int, *, through_locker: bool) -> list[float]:
    """Seconds from another session's unlock to the waiter's acquisition."""
    latencies: list[float] = []
    with (
        psycopg.connect(conninfo, autocommit=True) as holder,
        psycopg.connect(conninfo, autocommit=True) as own,
        pgsolo.Locker(conninfo, max_connections=1) as locker,
    ):
        for round_no in range(rounds):
            holder.execute(f"SELECT pg_advisory_lock({HANDOFF_KEY})")
            got: list[float] = []
            lock: Any
            if through_locker:
                lock = locker.session_lock(HANDOFF_KEY, wait=30)
            else:
                lock = pgsolo.session_lock(own, HANDOFF_KEY, wait=30)

            def take(lock: Any = lock, got: list[float] = got) -> None:
                lock.acquire()
                got.append(time.perf_counter())

            waiter = threading.Thread(target=take)
            waiter.start()
            time.sleep(0.1 + 0.05 * (round_no % 7) / 7)  # freed at no fixed phase of a pause
            freed = time.perf_counter()
            holder.execute(f"SELECT pg_advisory_unlock({HANDOFF_KEY})")
            waiter.join()
            latencies.append(got[0] - freed)
            lock.release()
    return latencies


def _max_connections(conninfo: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
    return int(row[0]) if row else 0


@scenario("12", "Locker: many session locks over few connections")
def locker(ctx: Context) -> list[Row]:
    conninfo = ctx.target.conninfo()
    keys = ctx.size(KEYS, 500)
    ours, theirs = _uncontended(conninfo, ctx.rounds)
    sequential = [_one_after_another(conninfo, keys) for _ in range(ctx.rounds)]
    held = _held_at_once(conninfo, keys, traced=False)
    held["client_bytes_per_lock"] = _held_at_once(conninfo, keys, traced=True)[
        "client_bytes_per_lock"
    ]
    waits = {
        through: _handoffs(conninfo, ctx.size(HANDOFFS, 5), through_locker=through)
        for through in (True, False)
    }
    seq_ours = [pair[0] for pair in sequential]
    seq_theirs = [pair[1] for pair in sequential]
    locker_waits, server_waits = waits[True], waits[False]
    return [
        Row(
            scenario="12",
            title="Locker try + release ÷ session_lock on a dedicated connection, direct socket",
            ratio=Ratio.paired(ours, theirs),
            goal=UNCONTENDED_GOAL,
            detail=f"{statistics.median(ours) * 1e6:.0f} vs"
            f" {statistics.median(theirs) * 1e6:.0f} µs per try + release",
            data={"ours_s": ours, "theirs_s": theirs},
        ),
        Row(
            scenario="12",
            title=f"{keys:,} keys one after another: Locker of {CONNECTIONS} ÷ a pooled"
            " connection per lock",
            ratio=Ratio.paired(seq_ours, seq_theirs),
            detail=f"{statistics.median(seq_ours) * 1e6:.0f} vs"
            f" {statistics.median(seq_theirs) * 1e6:.0f} µs per acquire + release",
            data={"ours_s": seq_ours, "theirs_s": seq_theirs},
        ),
        Row(
            scenario="12",
            title=f"{keys:,} keys held at once through a Locker of {CONNECTIONS}",
            ratio=None,
            detail=f"{held['acquire_s_per_lock'] * 1e6:.0f} µs per acquire,"
            f" {held['release_s_per_lock'] * 1e6:.0f} µs per release, held by"
            f" {held['backends']:.0f} backends, {held['client_bytes_per_lock']:,.0f} client"
            f" bytes per lock; one pooled connection per lock would need {keys:,} backends"
            f" (max_connections {_max_connections(conninfo)})",
            problems=[]
            if held["backends"] <= CONNECTIONS
            else [f"{held['backends']:.0f} backends held them, more than {CONNECTIONS}"],
            data=held,
        ),
        Row(
            scenario="12",
            title="hand-off: Locker (tries) ÷ session_lock(wait=) on a dedicated connection",
            ratio=Ratio.of([statistics.median(locker_waits) / statistics.median(server_waits)]),
            detail=f"p50 {statistics.median(locker_waits) * 1000:.1f} ms, p95"
            f" {quantile(locker_waits, 0.95) * 1000:.1f} ms vs p50"
            f" {statistics.median(server_waits) * 1000:.1f} ms, p95"
            f" {quantile(server_waits, 0.95) * 1000:.1f} ms from the unlock to the waiter's"
            " acquisition",
            data={"locker_s": locker_waits, "server_s": server_waits},
        ),
    ]
