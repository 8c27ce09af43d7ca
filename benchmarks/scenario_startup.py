"""Item 7: what ``import pgsolo``, ``pgsolo --version`` and ``pgsolo --help`` cost a fresh
process (the command line loads a command's module, and the driver, only when that command
runs), against
what any user of psycopg pays anyway (``python -c 'import psycopg'``) and against a
bare interpreter (``python -c pass``); and, in seconds against the performance issue's
goals, ``pgsolo run --help`` and a whole ``pgsolo run --key K -- true`` on the suite's
server (what cron pays per run). Runs are interleaved, warm: bytecode cached, as an
installed package has it (:func:`benchmarks.commands.command_env`), and files in the page
cache."""

from __future__ import annotations

import statistics
import subprocess
import sys

from benchmarks.commands import COMMAND_TIMEOUT_S, command_env, pgsolo_command, timed
from benchmarks.registry import Context, Goal, Ratio, Row, scenario

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import psycopg": [sys.executable, "-c", "import psycopg"],
    "import pgsolo": [sys.executable, "-c", "import pgsolo"],
    "pgsolo --version": [*pgsolo_command(), "--version"],
    "pgsolo --help": [*pgsolo_command(), "--help"],
    "pgsolo run --help": [*pgsolo_command(), "run", "--help"],
}
# A whole run that takes a lock: it cannot skip the driver's import.
WHOLE_RUN = "pgsolo run --key k -- true"
# Whole processes, in seconds: the goals of the performance issue.
SECONDS_GOALS = {
    "pgsolo run --help": Goal("<=", 0.1),
    WHOLE_RUN: Goal("<=", 0.25),
}


def _heaviest_imports(count: int = 4) -> list[tuple[str, float]]:
    """pgsolo's own modules with the largest cumulative import time (``-X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import pgsolo"],
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=True,
    )
    found = []
    for line in proc.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[2].strip().startswith("pgsolo."):
            found.append((parts[2].strip(), int(parts[1]) / 1000))
    return sorted(found, key=lambda item: -item[1])[:count]


@scenario("7", "startup: import pgsolo, pgsolo --version, pgsolo --help")
def startup(ctx: Context) -> list[Row]:
    per_round = ctx.size(10, 2)
    commands = {
        **COMMANDS,
        WHOLE_RUN: [
            *pgsolo_command(),
            "run",
            "--dsn",
            ctx.target.conninfo(),
            "--key",
            "pgsolo-bench:startup",
            "--",
            "true",
        ],
    }
    for argv in commands.values():  # warm: bytecode written, files in the page cache
        timed(argv)
    samples: dict[str, list[list[float]]] = {name: [] for name in commands}
    for round_no in range(ctx.rounds):
        order = list(commands) if round_no % 2 == 0 else list(commands)[::-1]
        for name in order:
            samples[name].append([timed(commands[name]) * 1000 for _ in range(per_round)])
    medians = {name: [statistics.median(r) for r in rounds] for name, rounds in samples.items()}
    overall = {name: statistics.median(m) for name, m in medians.items()}
    bare = overall["python -c pass"]
    heaviest = ", ".join(f"{name} {ms:.0f} ms" for name, ms in _heaviest_imports())
    rows = []
    for name in ("import pgsolo", "pgsolo --version", "pgsolo --help"):
        rows.append(
            Row(
                scenario="7",
                title=f"{name} ÷ import psycopg, fresh process",
                ratio=Ratio.paired(medians[name], medians["import psycopg"]),
                detail=f"{overall[name]:.0f} vs {overall['import psycopg']:.0f} ms"
                f" ({overall[name] - bare:.0f} vs {overall['import psycopg'] - bare:.0f} ms"
                f" over a bare interpreter of {bare:.0f} ms)"
                + (f"; -X importtime, cumulative: {heaviest}" if name == "import pgsolo" else ""),
                data={"round_medians_ms": medians},
            )
        )
    for name, goal in SECONDS_GOALS.items():
        rows.append(
            Row(
                scenario="7",
                title=f"{name}, seconds per fresh process",
                ratio=Ratio.of([ms / 1000 for ms in medians[name]]),
                goal=goal,
                detail=(
                    _whose(overall[name], bare, overall["import psycopg"])
                    if name == WHOLE_RUN
                    else f"{overall[name]:.0f} ms ({overall[name] - bare:.0f} ms over a bare"
                    f" interpreter of {bare:.0f} ms)"
                ),
                data={"round_medians_ms": medians[name]},
            )
        )
    return rows


def _whose(total: float, bare: float, with_psycopg: float) -> str:
    """Who spends a whole run's milliseconds: the interpreter, the driver's import (which
    a run that takes a lock cannot skip), and pgsolo's own part."""
    return (
        f"{total:.0f} ms: a bare interpreter {bare:.0f} ms, import psycopg"
        f" {with_psycopg - bare:.0f} ms, pgsolo's own part (its modules, connecting, the"
        f" lock, starting and reaping COMMAND) {total - with_psycopg:.0f} ms"
    )
