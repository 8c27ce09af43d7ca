"""How long `pgsolo locks` takes with many advisory locks held.

Run from the repository root:

    .venv/bin/python benchmarks/bench_monitor.py [--dsn DSN] [--locks N] [--sessions S]

N advisory locks (default 10,000) are taken by S sessions (default 4, N/S each, every
one in a single statement with generate_series), plus one session waiting behind the
first so that the wait-chain part of the query has work too. Then this prints the
median time of ``pgsolo.advisory_locks()`` (in process) and of ``pgsolo locks --json``
and ``pgsolo locks`` (a whole new process each: interpreter start, import, connect,
query, output). The shared lock table must hold N: on a server that cannot, the
locking statement fails with "out of shared memory" and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg

import pgsolo
from pgsolo.testing import throwaway_server

NAMESPACE = 7_200_000


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with throwaway_server() as embedded:
        yield embedded.dsn


def wait_behind_first(conn: psycopg.Connection) -> None:
    with contextlib.suppress(psycopg.Error):  # ended by closing the connection
        conn.execute(f"SELECT pg_advisory_lock({NAMESPACE}, 1)")


def timed(call: object, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="PostgreSQL DSN; default: a throwaway embedded server")
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with server(args.dsn) as dsn:
        holders = [
            psycopg.connect(dsn, autocommit=True, application_name=f"bench-holder-{i}")
            for i in range(args.sessions)
        ]
        waiter = psycopg.connect(dsn, autocommit=True, application_name="bench-waiter")
        try:
            per = -(-args.locks // args.sessions)
            for i, conn in enumerate(holders):
                first, last = i * per + 1, min((i + 1) * per, args.locks)
                conn.execute(
                    f"SELECT count(pg_advisory_lock({NAMESPACE}, g))"
                    f" FROM generate_series({first}, {last}) g"
                )
            waiter.execute("SET lock_timeout = '120s'")
            wait = threading.Thread(target=wait_behind_first, args=(waiter,), daemon=True)
            wait.start()
            with psycopg.connect(dsn, autocommit=True) as conn:
                deadline = time.monotonic() + 10
                while not any(
                    not lock.granted
                    for lock in pgsolo.advisory_locks(conn, pid=waiter.info.backend_pid)
                ):
                    if time.monotonic() > deadline:
                        sys.exit("the waiter never started waiting")
                    time.sleep(0.05)
                rows = pgsolo.advisory_locks(conn)
                api = timed(lambda: pgsolo.advisory_locks(conn), args.repeat)
            env = {**os.environ, "PGSOLO_DSN": dsn}
            command = [sys.executable, "-m", "pgsolo", "locks"]

            def cli(*extra: str) -> None:
                subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
                    [*command, *extra], env=env, check=True, capture_output=True
                )

            cli_json = timed(lambda: cli("--json"), args.repeat)
            cli_table = timed(cli, args.repeat)
            startup = timed(lambda: cli("--help"), args.repeat)
        finally:
            for conn in (*holders, waiter):
                conn.close()
    held = sum(1 for lock in rows if lock.granted)
    print(f"{held} advisory locks held by {args.sessions} sessions, {len(rows) - held} waiting")
    for label, samples in (
        ("advisory_locks() in process", api),
        ("pgsolo locks --json (new process)", cli_json),
        ("pgsolo locks (table, new process)", cli_table),
        ("pgsolo --help (new process, for scale)", startup),
    ):
        print(
            f"{label:42s} median {statistics.median(samples) * 1000:8.1f} ms"
            f"  (min {min(samples) * 1000:.1f}, max {max(samples) * 1000:.1f}, n={len(samples)})"
        )


if __name__ == "__main__":
    main()
