"""``python -m benchmarks.paired``: pgsolo ÷ the recipe by hand on psycopg 3, sync, over
a local socket, measured tightly enough to see a change of 5%.

The suite's direct-socket rows time about 25 contenders in turn, so the two sides of one
ratio run seconds apart, and on a small virtual machine their rounds spread from 0.7x to
1.5x: a change of pgsolo's own cost by 10% does not show. Here only the two sides run, in
short blocks that alternate (which one goes first alternates too), and the ratio is the
median of the blocks' ratios, with its quartiles. ``--pin`` puts this process on the
first core and the server's two backends on the others, so that neither migrates between
cores mid-block (the server must run on this machine, as the embedded one does).

Use it before and after a change to a lock's path, on the same machine, one after the
other (a git worktree of the old source, ``PYTHONPATH=that/src``)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Protocol

import psycopg

from benchmarks.bench_locks import (
    PgsoloSession,
    PgsoloXact,
    PsycopgRecipeSession,
    PsycopgRecipeXact,
    Target,
    server,
)
from benchmarks.suite import DSN_ENV


class _SyncContender(Protocol):
    conn: psycopg.Connection

    def open(self, target: Target) -> None: ...
    def op(self) -> None: ...
    def close(self) -> None: ...


PAIRS: dict[str, tuple[Callable[[], _SyncContender], Callable[[], _SyncContender]]] = {
    "session": (PsycopgRecipeSession, PgsoloSession),
    "xact": (PsycopgRecipeXact, PgsoloXact),
}


def _pin(contenders: tuple[_SyncContender, ...], cores: list[int]) -> None:
    os.sched_setaffinity(0, {cores[0]})
    for c in contenders:
        os.sched_setaffinity(c.conn.info.backend_pid, set(cores[1:]))


def _block(op: Callable[[], None], ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        op()
    return (time.perf_counter() - start) / ops * 1e6


def measure(target: Target, pair: str, blocks: int, ops: int, *, pin: list[int] | None) -> str:
    """One pair's ratio; ``pin``: the cores to keep this process (the first) and the
    server's backends (the rest) on."""
    recipe, pgsolo = (make() for make in PAIRS[pair])
    for c in (recipe, pgsolo):
        c.open(target)
    try:
        if pin is not None:
            _pin((recipe, pgsolo), pin)
        for c in (recipe, pgsolo):  # warm up, past psycopg's prepare threshold (5)
            _block(c.op, 300)
        times: dict[str, list[float]] = {"recipe": [], "pgsolo": []}
        for n in range(blocks):
            order = (("recipe", recipe), ("pgsolo", pgsolo))
            for name, c in order if n % 2 else order[::-1]:
                times[name].append(_block(c.op, ops))
    finally:
        for c in (recipe, pgsolo):
            c.close()
    ratios = [p / r for p, r in zip(times["pgsolo"], times["recipe"], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return (
        f"{pair}: pgsolo ÷ recipe {median:.3f} (quartiles {q1:.3f}-{q3:.3f});"
        f" {statistics.median(times['pgsolo']):.1f} µs vs"
        f" {statistics.median(times['recipe']):.1f} µs per op;"
        f" {blocks} blocks of {ops} ops each{', pinned' if pin is not None else ''}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.paired",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("pairs", nargs="*", metavar="session|xact", help="default: both")
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL DSN (default: ${DSN_ENV}, else a throwaway embedded server)",
    )
    parser.add_argument("--blocks", type=int, default=80, help="blocks per side (default 80)")
    parser.add_argument("--ops", type=int, default=200, help="operations per block (default 200)")
    parser.add_argument("--pin", action="store_true", help="this process and the server apart")
    args = parser.parse_args(argv)
    if args.blocks < 4 or args.ops < 1:
        parser.error("--blocks must be at least 4 and --ops at least 1")
    if unknown := set(args.pairs) - set(PAIRS):
        parser.error(f"unknown pair {sorted(unknown)[0]!r}: session or xact")
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        parser.error("--pin needs at least 2 cores")
    with server(args.dsn) as (target, server_kind):
        print(f"server: {server_kind}", file=sys.stderr)
        for pair in args.pairs or PAIRS:
            pin = cores if args.pin else None
            print(measure(target, pair, args.blocks, args.ops, pin=pin), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
