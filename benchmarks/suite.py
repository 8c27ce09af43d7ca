"""pgsolo's benchmark suite: every scenario of the benchmarks issue, against one server,
in one process run.

    .venv/bin/python -m benchmarks [--quick] [--dsn DSN] [--rounds R] [--only 3,4]
        [--latency-ms X] [--out DIR]

Each scenario reports RATIOS of two costs measured in the same run (pgsolo's ÷ the
other's), the median over interleaved rounds with the lowest and highest round (the
quartiles, in brackets, for the direct-socket rows of items 1-2, which take many short
rounds), next to the goal the issue sets. Results go to stdout as a table, and to ``DIR``:
``benchmarks.json`` and ``benchmarks.png`` (DIR: ``docs`` by default, a new temporary
directory with ``--quick``). Exit status 1 when a scenario failed to run or a check
inside one failed (e.g. an overlap seen by the database); a missed goal is reported,
not an error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

import pgsolo
from benchmarks import (  # noqa: F401 - each module registers its scenario
    scenario_celery,
    scenario_contention,
    scenario_handoff,
    scenario_leadership,
    scenario_listing,
    scenario_lock_loss,
    scenario_locker,
    scenario_retention,
    scenario_semaphore,
    scenario_startup,
    scenario_uncontended,
)
from benchmarks.bench_locks import _cpu_model, _source_state, server
from benchmarks.registry import SCENARIOS, Context, Row

REPO = Path(__file__).resolve().parent.parent
DSN_ENV = "PGSOLO_BENCH_DSN"


def _fmt_ratio(row: Row) -> str:
    r = row.ratio
    if r is None:
        return ""
    if r.spread == "quartiles":
        return f"{r.median:.2f} [{r.low:.2f}-{r.high:.2f}]"
    return f"{r.median:.2f} ({r.low:.2f}-{r.high:.2f})"


def print_table(rows: list[Row]) -> None:
    header = f"{'#':<4} {'measurement':<72} {'ratio (min-max)':>20} {'goal':>8}  verdict"
    print(header)
    print("-" * len(header))
    for row in rows:
        goal = "" if row.goal is None else str(row.goal)
        print(f"{row.scenario:<4} {row.title:<72} {_fmt_ratio(row):>20} {goal:>8}  {row.verdict}")
        print(f"{'':<4}   {row.detail}")


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # after the name, which may hold spaces


def _pin_apart(backend_pid: int) -> None:
    """``--pin``: this process (and what it starts: Celery, the contention rows' workers)
    on the first core, the server (its postmaster, whose new backends inherit it, and
    every process it runs now) on the others. On a small virtual machine a round trip
    costs several times as much when the backend last ran on the other core than on this
    one, and which it is changes from one connection to the next: unpinned, two sides of
    one ratio on two connections can differ by that alone."""
    cores = sorted(os.sched_getaffinity(0))
    postmaster = _parent_of(backend_pid)
    if len(cores) < 2 or postmaster is None:
        sys.exit("--pin needs 2 cores and the server on this machine")
    os.sched_setaffinity(0, {cores[0]})
    os.sched_setaffinity(postmaster, set(cores[1:]))  # first: what it forks from now on
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent_of(int(entry.name)) == postmaster:
            with contextlib.suppress(OSError):  # a backend that just ended
                os.sched_setaffinity(int(entry.name), set(cores[1:]))


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[Row]]:
    wanted = set(args.only.split(",")) if args.only else None
    rows: list[Row] = []
    notes: list[dict[str, str]] = []
    started = time.perf_counter()
    load = [os.getloadavg()[0]]
    with server(args.dsn) as (target, server_kind):
        with psycopg.connect(target.conninfo()) as probe:
            row = probe.execute("SHOW server_version").fetchone()
            version = str(row[0]) if row else "?"
            if args.pin:
                _pin_apart(probe.info.backend_pid)
        ctx = Context(target, server_kind, args.rounds, args.quick, args.latency_ms)
        for sc in sorted(SCENARIOS, key=lambda s: s.number):
            if wanted is not None and sc.number not in wanted:
                continue
            if (reason := sc.unavailable(ctx)) is not None:
                print(f"[{sc.number}] {sc.name}: skipped, {reason}", file=sys.stderr)
                notes.append({"scenario": sc.number, "skipped": reason})
                continue
            print(f"[{sc.number}] {sc.name} ...", file=sys.stderr, flush=True)
            sc_started = time.perf_counter()
            try:
                rows += sc.run(ctx)
            except Exception as exc:
                traceback.print_exc()
                notes.append({"scenario": sc.number, "error": repr(exc)})
            print(
                f"[{sc.number}] done in {time.perf_counter() - sc_started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    load.append(os.getloadavg()[0])
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "pgsolo": pgsolo.__version__,
        "source": _source_state(),
        "machine": {
            "cores": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": sys.version.split()[0],
            "psycopg": psycopg.__version__,
            "load_1min": [round(x, 2) for x in load],
        },
        "server": f"PostgreSQL {version}, {server_kind}"
        + (", pinned apart (--pin)" if args.pin else ""),
        "rounds": args.rounds,
        "quick": args.quick,
        "latency_ms": args.latency_ms,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "notes": notes,
    }
    return meta, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV),
        help=f"PostgreSQL DSN (default: ${DSN_ENV}, else a throwaway embedded server)",
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds per scenario")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5; quick: 3)")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=5.0,
        help="the delay per server reply of the proxied runs of items 1-2 (default 5)",
    )
    parser.add_argument("--only", metavar="N,N", help="only these scenarios, e.g. 1-2,3")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="this process on the first core, the server (on this machine) on the others",
    )
    parser.add_argument("--out", type=Path, help="where benchmarks.json and benchmarks.png go")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 5)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 0 <= args.latency_ms <= 1000:
        parser.error("--latency-ms must be between 0 and 1000")
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="pgsolo-bench-")) if args.quick else REPO / "docs"
    )
    warnings.filterwarnings("ignore", module="platformdirs")
    # SIGTERM unwinds like Ctrl-C: the embedded server stops and its directory goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    meta, rows = run(args)

    m = meta["machine"]
    print(f"pgsolo {meta['pgsolo']} benchmarks — {meta['date']} — source {meta['source']}")
    print(
        f"{m['cores']} cores, {m['cpu']}, Python {m['python']}, psycopg {m['psycopg']};"
        f" {meta['server']}; 1-min load {m['load_1min'][0]} -> {m['load_1min'][1]}"
    )
    print(
        f"{meta['rounds']} interleaved rounds{' (quick)' if args.quick else ''};"
        f" ratio = pgsolo's cost ÷ the other's, median round (lowest-highest),"
        " or [quartiles] for a row of many short rounds"
    )
    print()
    print_table(rows)
    for note in meta["notes"]:
        print(f"scenario {note['scenario']}: {note.get('skipped') or note.get('error')}")

    out.mkdir(parents=True, exist_ok=True)
    result = {**meta, "rows": [r.as_json() for r in rows]}
    (out / "benchmarks.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    written = [out / "benchmarks.json"]
    try:
        from benchmarks.plot import plot  # noqa: PLC0415 - matplotlib is optional

        plot(rows, out / "benchmarks.png", f"pgsolo {meta['pgsolo']}, {meta['date']}")
        written.append(out / "benchmarks.png")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
    print(f"\nwrote {' and '.join(map(str, written))}")
    failed = any("error" in n for n in meta["notes"]) or any(r.problems for r in rows)
    return 1 if failed else 0
