"""``python -m benchmarks.instructions``: the machine instructions one operation of each
side of a pair costs (:mod:`benchmarks.paired`'s pairs: the recipe by hand, pgsolo, the
floor), counted by valgrind: a count that does not move with the machine's noise.

The timed ratios cannot tell a change of a few percent of pgsolo's own Python on a small
virtual machine (their blocks spread by 10% either way), and over a local socket a lock's
Python costs several times as much in place as timed alone, by the cold caches the process
comes back to after each wait. The instructions it runs are what a change to a lock's path
changes, and are counted exactly: each side runs in a process of its own under valgrind's
cachegrind (no cache simulation), once with no operation after the warm-up and once with
``--ops``; the difference divided by ``--ops`` is one operation's. The server's part is
not counted (it runs in the server's process), nor the kernel's.

Needs valgrind (Debian's package); each side takes about half a minute. Use it before
and after a change to a lock's path, as :mod:`benchmarks.paired` (a git worktree of the
old source, ``PYTHONPATH=that/src``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys

from benchmarks.bench_locks import Target, server
from benchmarks.paired import ASYNC_PAIRS, PAIRS, SIDES, chosen_pairs, pairs_parser
from benchmarks.suite import DSN_ENV

WARM_UP = 300  # past the drivers' prepare thresholds (5), as paired.py warms up
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def run_side(dsn: str, pair: str, side: str, ops: int) -> None:
    """One side of ``pair``: warmed up, then ``ops`` operations (what valgrind counts)."""
    makers = ASYNC_PAIRS[pair] if pair in ASYNC_PAIRS else PAIRS[pair]
    contender = makers[SIDES.index(side)]()
    target = Target.parse(dsn)
    if pair not in ASYNC_PAIRS:
        contender.open(target)
        try:
            for _ in range(WARM_UP + ops):
                contender.op()
        finally:
            contender.close()
        return

    async def run() -> None:
        await contender.open(target)
        try:
            for _ in range(WARM_UP + ops):
                await contender.op()
        finally:
            await contender.close()

    asyncio.run(run())


def _instructions(valgrind: str, dsn: str, pair: str, side: str, ops: int) -> int:
    command = [
        valgrind,
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--run",
        pair,
        side,
        str(ops),
    ]
    # One hash seed: the layout of every dict, and so the probes of its lookups, follow it.
    env = {**os.environ, DSN_ENV: dsn, "PYTHONHASHSEED": "0"}
    done = subprocess.run(  # noqa: S603 - valgrind, this interpreter, fixed arguments
        command, env=env, capture_output=True, text=True, check=False
    )
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{pair} {side} under valgrind failed:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def measure(valgrind: str, dsn: str, pair: str, ops: int) -> str:
    """Each side's instructions per operation, and pgsolo's over the floor's."""
    per_op: dict[str, float] = {}
    for side in SIDES:
        idle = _instructions(valgrind, dsn, pair, side, 0)
        busy = _instructions(valgrind, dsn, pair, side, ops)
        per_op[side] = (busy - idle) / ops
    sides = ", ".join(f"{side} {per_op[side] / 1000:.1f}k" for side in SIDES)
    own = (per_op["pgsolo"] - per_op["floor"]) / 1000
    return f"{pair}: instructions per op: {sides}; pgsolo over the floor {own:.1f}k ({ops} ops)"


def main(argv: list[str] | None = None) -> int:
    parser = pairs_parser("python -m benchmarks.instructions", __doc__)
    parser.add_argument("--ops", type=int, default=1000, help="operations counted (default 1000)")
    parser.add_argument("--run", nargs=3, metavar=("PAIR", "SIDE", "OPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run is not None:  # a side, under valgrind
        pair, side, ops = args.run
        run_side(args.dsn, pair, side, int(ops))
        return 0
    if args.ops < 1:
        parser.error("--ops must be at least 1")
    pairs = chosen_pairs(parser, args.pairs)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        parser.error("needs valgrind on PATH (Debian: apt-get install valgrind)")
    with server(args.dsn) as (target, server_kind):
        print(f"server: {server_kind}", file=sys.stderr)
        for pair in pairs:
            print(measure(valgrind, target.conninfo(), pair, args.ops), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
