"""``python -m benchmarks.locker [--dsn DSN]``: what a :class:`pgsolo.Locker` costs and saves.

- **uncontended**: try + release through a Locker of one connection ÷ ``session_lock`` on
  a dedicated connection, in interleaved blocks (their order reverses every block); the
  ratio is the median of the blocks' ratios (goal <= 1.2).
- **many keys**: 10,000 distinct keys acquired and held at once, then released, through a
  Locker of 4 connections: time, the server backends that hold them, and the client memory
  the locks take (tracemalloc); next to it, one connection per lock from a pool, as far as
  the server's ``max_connections`` lets it go.
- **hand-off**: another session frees a key a waiter wants: from the unlock to the
  waiter's acquisition, through a Locker (tries, 1 ms doubling to 50 ms) and by
  ``session_lock(wait=)`` on a dedicated connection (a wait on the server).

The server is ``--dsn``, else ``PGSOLO_BENCH_DSN`` or ``PGSOLO_DSN``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import tracemalloc
from typing import Any

import psycopg
import psycopg_pool

import pgsolo

BLOCK = 300


def uncontended(dsn: str, blocks: int) -> float:
    ratios = []
    with (
        pgsolo.Locker(dsn, max_connections=1) as locker,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):

        def through_locker() -> float:
            started = time.perf_counter()
            for _ in range(BLOCK):
                lock = locker.session_lock("bench-locker")
                lock.acquire()
                lock.release()
            return time.perf_counter() - started

        def dedicated() -> float:
            started = time.perf_counter()
            for _ in range(BLOCK):
                lock = pgsolo.session_lock(conn, "bench-locker")
                lock.acquire()
                lock.release()
            return time.perf_counter() - started

        through_locker(), dedicated()  # warm
        for block in range(blocks):
            if block % 2:
                theirs, ours = dedicated(), through_locker()
            else:
                ours, theirs = through_locker(), dedicated()
            ratios.append(ours / theirs)
    return statistics.median(ratios)


def backends(dsn: str, application_name: str) -> int:
    """How many backends named ``application_name`` hold advisory locks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s",
            (application_name,),
        ).fetchone()
    return int(row[0]) if row else 0


def many_keys(dsn: str, count: int) -> dict[str, Any]:
    tracemalloc.start()
    started = time.perf_counter()
    with pgsolo.Locker(dsn, max_connections=4, application_name="bench-locker") as locker:
        locks = [locker.session_lock(f"bench-many-{i}") for i in range(count)]
        for lock in locks:
            lock.acquire()
        acquired = time.perf_counter() - started
        memory, _ = tracemalloc.get_traced_memory()
        held_by = backends(dsn, "bench-locker")
        started = time.perf_counter()
        for lock in locks:
            lock.release()
        released = time.perf_counter() - started
    tracemalloc.stop()
    return {
        "keys": count,
        "acquire_s": acquired,
        "release_s": released,
        "backends": held_by,
        "client_bytes_per_lock": memory / count,
    }


def pooled(dsn: str, count: int) -> dict[str, Any]:
    """One connection per lock from a pool: ``count`` held at once."""
    started = time.perf_counter()
    with psycopg_pool.ConnectionPool(
        dsn,
        min_size=0,
        max_size=count,
        kwargs={"autocommit": True, "application_name": "bench-pooled"},
        open=True,
    ) as pool:
        conns = [pool.getconn() for _ in range(count)]
        locks = [pgsolo.session_lock(conn, f"bench-pool-{i}") for i, conn in enumerate(conns)]
        for lock in locks:
            lock.acquire()
        acquired = time.perf_counter() - started
        held_by = backends(dsn, "bench-pooled")
        for lock, conn in zip(locks, conns, strict=True):
            lock.release()
            pool.putconn(conn)
    return {"keys": count, "acquire_s": acquired, "backends": held_by}


def handoff(dsn: str, rounds: int, *, through_locker: bool) -> list[float]:
    latencies: list[float] = []
    with (
        psycopg.connect(dsn, autocommit=True) as holder,
        psycopg.connect(dsn, autocommit=True) as own,
        pgsolo.Locker(dsn, max_connections=1) as locker,
    ):
        for _ in range(rounds):
            holder.execute("SELECT pg_advisory_lock(4242)")
            got: list[float] = []
            if through_locker:
                lock: Any = locker.session_lock(4242, wait=30)
            else:
                lock = pgsolo.session_lock(own, 4242, wait=30)

            def take(lock: Any = lock, got: list[float] = got) -> None:
                lock.acquire()
                got.append(time.perf_counter())

            waiter = threading.Thread(target=take)
            waiter.start()
            time.sleep(0.1 + 0.05 * (len(latencies) % 7) / 7)  # freed at no fixed phase
            freed = time.perf_counter()
            holder.execute("SELECT pg_advisory_unlock(4242)")
            waiter.join()
            latencies.append(got[0] - freed)
            lock.release()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.locker")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--pooled", type=int, default=80)
    args = parser.parse_args()
    dsn = args.dsn or os.environ.get("PGSOLO_BENCH_DSN") or os.environ["PGSOLO_DSN"]
    ratio = uncontended(dsn, args.blocks)
    print(f"uncontended try+release, Locker ÷ dedicated connection: {ratio:.2f}")
    many = many_keys(dsn, args.keys)
    print(
        f"{many['keys']} keys through a Locker of 4: acquired in {many['acquire_s']:.2f} s,"
        f" released in {many['release_s']:.2f} s, held by {many['backends']} backends,"
        f" {many['client_bytes_per_lock']:.0f} client bytes per lock"
    )
    pool = pooled(dsn, args.pooled)
    print(
        f"{pool['keys']} keys, one pooled connection each: acquired in {pool['acquire_s']:.2f} s"
        f" (with the connects), held by {pool['backends']} backends"
    )
    for label, through in (("Locker (tries)", True), ("session_lock(wait=)", False)):
        latencies = sorted(handoff(dsn, 21, through_locker=through))
        print(
            f"hand-off, {label}: p50 {1000 * statistics.median(latencies):.1f} ms,"
            f" max {1000 * latencies[-1]:.1f} ms"
        )


if __name__ == "__main__":
    main()
