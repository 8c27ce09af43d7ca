"""Item 6: ``pgsolo locks`` with 10,000 advisory locks held, against the same question
asked by hand: a fresh ``python -c`` that connects with psycopg and reads the article's
``pg_locks`` query. Both are whole processes started per run, DSN in ``PGSOLO_DSN``.

Runs only when this build has the command (``pgsolo locks --help`` exits 0).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from typing import Any

import psycopg

from benchmarks.commands import COMMAND_TIMEOUT_S, pgsolo_command, timed
from benchmarks.registry import Context, Ratio, Row, scenario

LOCKS = 10_000
NAMESPACE = 42_004  # keys (42004, 1) .. (42004, 10000), held by one session
BY_HAND = """
import os, psycopg
with psycopg.connect(os.environ["PGSOLO_DSN"]) as conn:
    conn.execute('''
        SELECT l.locktype, l.classid, l.objid, l.objsubid, l.mode, l.granted, l.pid,
               a.application_name, a.state, a.query_start, a.query
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' ''').fetchall()
"""


def has_locks_command(ctx: Context) -> str | None:
    proc = subprocess.run(  # noqa: S603 - our own script, no shell
        [*pgsolo_command(), "locks", "--help"],
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    return None if proc.returncode == 0 else "this build has no `pgsolo locks` command"


def _hold(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "SELECT count(pg_advisory_lock(%s, i)) FROM generate_series(1, %s) AS i",
        (NAMESPACE, LOCKS),
    )


@scenario("6", f"pgsolo locks with {LOCKS:,} advisory locks held", requires=has_locks_command)
def listing(ctx: Context) -> list[Row]:
    per_round = ctx.size(5, 1)
    conninfo = ctx.target.conninfo()
    commands = {
        "pgsolo locks --json": [*pgsolo_command(), "locks", "--json"],
        "pg_locks by hand": [sys.executable, "-c", BY_HAND],
    }
    env = {"PGSOLO_DSN": conninfo}
    with psycopg.connect(conninfo, autocommit=True) as holder:
        _hold(holder)
        for argv in commands.values():
            timed(argv, env)
        medians: dict[str, list[float]] = {name: [] for name in commands}
        for round_no in range(ctx.rounds):
            order = list(commands) if round_no % 2 == 0 else list(commands)[::-1]
            for name in order:
                runs = [timed(commands[name], env) * 1000 for _ in range(per_round)]
                medians[name].append(statistics.median(runs))
        holder.execute("SELECT pg_advisory_unlock_all()")
    ours, theirs = medians["pgsolo locks --json"], medians["pg_locks by hand"]
    return [
        Row(
            scenario="6",
            title=f"pgsolo locks --json ÷ pg_locks query by hand, {LOCKS:,} locks held",
            ratio=Ratio.paired(ours, theirs),
            detail=f"{statistics.median(ours):.0f} vs {statistics.median(theirs):.0f} ms"
            " per process run",
            data={"round_medians_ms": medians},
        )
    ]
