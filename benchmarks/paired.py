"""``python -m benchmarks.paired``: pgsolo ÷ the recipe by hand (psycopg 3 sync, psycopg 3
async, asyncpg), over a local socket, measured tightly enough to see a change of 5%; and
next to them the floor (:mod:`benchmarks.floor`: pgsolo's own messages sent by hand), which
splits the ratio into what pgsolo's messages cost the server and the driver (floor ÷
recipe) and what pgsolo's own Python costs (pgsolo ÷ floor).

The suite's direct-socket rows time about 25 contenders in turn, so the two sides of one
ratio run seconds apart, and on a small virtual machine their rounds spread from 0.7x to
1.5x: a change of pgsolo's own cost by 10% does not show. Here only the three sides run,
in short blocks that alternate (their order reverses every block), and a ratio is the
median of the blocks' ratios, with its quartiles. ``--pin`` puts this process on the
first core and the server's backends on the others, so that neither migrates between
cores mid-block (the server must run on this machine, as the embedded one does).

Use it before and after a change to a lock's path, on the same machine, one after the
other (a git worktree of the old source, ``PYTHONPATH=that/src``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from benchmarks.bench_locks import (
    AsyncpgRecipeSession,
    AsyncpgRecipeXact,
    AsyncPsycopgRecipeSession,
    AsyncPsycopgRecipeXact,
    PgsoloJob,
    PgsoloSession,
    PgsoloXact,
    PsycopgRecipeSession,
    PsycopgRecipeXact,
    PsycopgRecipeXactWait,
    Target,
    server,
)
from benchmarks.floor import AsyncpgFloor, AsyncPsycopgFloor, PsycopgFloor
from benchmarks.frameworks import APgsoloOn, asyncpg_connection
from benchmarks.suite import DSN_ENV

# A wait that is never contended here: the cost of a waiting lock's messages, one slice.
WAIT_SECONDS = 60.0

_Makers = tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]

# Each pair: the recipe by hand, pgsolo, and the floor (floor.py: pgsolo's own messages by
# hand, with nothing of pgsolo's around them).
PAIRS: dict[str, _Makers] = {
    "session": (PsycopgRecipeSession, PgsoloSession, lambda: PsycopgFloor("session")),
    "xact": (PsycopgRecipeXact, PgsoloXact, lambda: PsycopgFloor("xact")),
    "xact-wait": (
        PsycopgRecipeXactWait,
        lambda: PgsoloXact(wait=WAIT_SECONDS),
        lambda: PsycopgFloor("xact-wait"),
    ),
    # A job's recipe is the article's transaction; pgsolo's marks it and checks the mark
    # before its COMMIT (DESIGN.md, the commit check).
    "job": (PsycopgRecipeXact, PgsoloJob, lambda: PsycopgFloor("job")),
    "job-wait": (
        PsycopgRecipeXactWait,
        lambda: PgsoloJob(wait=WAIT_SECONDS),
        lambda: PsycopgFloor("job-wait"),
    ),
}


async def _psycopg_async(target: Target) -> tuple[Any, Any]:
    conn = await psycopg.AsyncConnection.connect(target.conninfo(), autocommit=True)
    return conn, conn.close


ASYNC_PAIRS: dict[str, _Makers] = {
    "async-session": (
        AsyncPsycopgRecipeSession,
        lambda: APgsoloOn("session", _psycopg_async),
        lambda: AsyncPsycopgFloor("session"),
    ),
    "async-xact": (
        AsyncPsycopgRecipeXact,
        lambda: APgsoloOn("xact", _psycopg_async),
        lambda: AsyncPsycopgFloor("xact"),
    ),
    "asyncpg-session": (
        AsyncpgRecipeSession,
        lambda: APgsoloOn("session", asyncpg_connection),
        lambda: AsyncpgFloor("session"),
    ),
    "asyncpg-xact": (
        AsyncpgRecipeXact,
        lambda: APgsoloOn("xact", asyncpg_connection),
        lambda: AsyncpgFloor("xact"),
    ),
}


def _backend_pid(conn: Any) -> int:
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return conn.info.backend_pid
    return int(conn.get_server_pid())  # asyncpg


def _pin(contenders: tuple[Any, ...], cores: list[int]) -> None:
    os.sched_setaffinity(0, {cores[0]})
    for c in contenders:
        os.sched_setaffinity(_backend_pid(c.conn), set(cores[1:]))


def _block(op: Callable[[], None], ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        op()
    return (time.perf_counter() - start) / ops * 1e6


async def _ablock(op: Callable[[], Awaitable[None]], ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        await op()
    return (time.perf_counter() - start) / ops * 1e6


class _Side:
    """One side of a pair, timed a block at a time from plain code: an async contender's
    block runs on the pair's own event loop (one run_until_complete per block, not per
    operation)."""

    def __init__(self, contender: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        self.contender = contender
        self.loop = loop

    def _run(self, result: Any) -> Any:
        return self.loop.run_until_complete(result) if self.loop is not None else result

    def open(self, target: Target) -> None:
        self._run(self.contender.open(target))

    def block(self, ops: int) -> float:
        if self.loop is None:
            return _block(self.contender.op, ops)
        return float(self.loop.run_until_complete(_ablock(self.contender.op, ops)))

    def close(self) -> None:
        self._run(self.contender.close())


def measure(target: Target, pair: str, blocks: int, ops: int, *, pin: list[int] | None) -> str:
    """One pair's ratios; ``pin``: the cores to keep this process (the first) and the
    server's backends (the rest) on."""
    loop = asyncio.new_event_loop() if pair in ASYNC_PAIRS else None
    makers = ASYNC_PAIRS[pair] if pair in ASYNC_PAIRS else PAIRS[pair]
    sides = dict(zip(SIDES, (_Side(make(), loop) for make in makers), strict=True))
    opened: list[_Side] = []  # a side that failed to open has nothing to close
    try:
        for side in sides.values():
            side.open(target)
            opened.append(side)
        if pin is not None:
            _pin(tuple(side.contender for side in sides.values()), pin)
        for side in sides.values():  # warm up, past the drivers' prepare thresholds (5)
            side.block(300)
        times: dict[str, list[float]] = {name: [] for name in SIDES}
        for n in range(blocks):
            order = list(sides.items())
            for name, side in order if n % 2 else order[::-1]:
                times[name].append(side.block(ops))
    finally:
        for side in opened:
            side.close()
        if loop is not None:
            loop.close()
    return _report(pair, times, blocks, ops, pinned=pin is not None)


SIDES = ("recipe", "pgsolo", "floor")


def _ratio(times: dict[str, list[float]], side: str, to: str) -> str:
    ratios = [a / b for a, b in zip(times[side], times[to], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return f"{median:.3f} (quartiles {q1:.3f}-{q3:.3f})"


def _report(
    pair: str, times: dict[str, list[float]], blocks: int, ops: int, *, pinned: bool
) -> str:
    per_op = ", ".join(f"{name} {statistics.median(times[name]):.1f}" for name in SIDES)
    return (
        f"{pair}: pgsolo ÷ recipe {_ratio(times, 'pgsolo', 'recipe')};"
        f" floor ÷ recipe {_ratio(times, 'floor', 'recipe')};"
        f" pgsolo ÷ floor {_ratio(times, 'pgsolo', 'floor')}\n"
        f"  µs per op: {per_op};"
        f" {blocks} blocks of {ops} ops each{', pinned' if pinned else ''}"
    )


def pairs_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The arguments every command over :data:`PAIRS` takes: which pairs, and the server."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument(
        "pairs", nargs="*", metavar="PAIR", help=f"{', '.join(PAIRS | ASYNC_PAIRS)} (default: all)"
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL DSN (default: ${DSN_ENV}, else a throwaway embedded server)",
    )
    return parser


def chosen_pairs(parser: argparse.ArgumentParser, pairs: list[str]) -> list[str]:
    """The pairs asked for (every one if none), each known, else the parser's error."""
    if unknown := set(pairs) - set(PAIRS) - set(ASYNC_PAIRS):
        parser.error(
            f"unknown pair {sorted(unknown)[0]!r}: one of {', '.join(PAIRS | ASYNC_PAIRS)}"
        )
    return pairs or [*PAIRS, *ASYNC_PAIRS]


def main(argv: list[str] | None = None) -> int:
    parser = pairs_parser("python -m benchmarks.paired", __doc__)
    parser.add_argument("--blocks", type=int, default=80, help="blocks per side (default 80)")
    parser.add_argument("--ops", type=int, default=200, help="operations per block (default 200)")
    parser.add_argument("--pin", action="store_true", help="this process and the server apart")
    args = parser.parse_args(argv)
    if args.blocks < 4 or args.ops < 1:
        parser.error("--blocks must be at least 4 and --ops at least 1")
    pairs = chosen_pairs(parser, args.pairs)
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        parser.error("--pin needs at least 2 cores")
    with server(args.dsn) as (target, server_kind):
        print(f"server: {server_kind}", file=sys.stderr)
        for pair in pairs:
            pin = cores if args.pin else None
            print(measure(target, pair, args.blocks, args.ops, pin=pin), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
