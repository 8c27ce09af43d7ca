"""A chaos worker process: attempts, each a seeded pick of a pgsolo API, a route to the
server (straight, through the relay, through PgBouncer) and a key, until its share of
the attempt budget or the time is spent. Everything it learns goes to the database (the
judge) and to counters in shared memory that only it writes: a worker killed with
SIGKILL leaves nothing half-done that another process waits on."""

from __future__ import annotations

import ctypes
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

import pgsolo
from chaos.judge import EFFECT, Judge, Run

KINDS = ("job_xact", "job_session", "xact_lock", "session_lock", "run_once", "cli")
WEIGHTS = (25, 20, 20, 15, 15, 3)  # `pgsolo run` starts two interpreters: fewer of those
OUTCOMES = ("completed", "skipped", "failed", "lost", "overlap", "unrecorded")
NAMESPACE = 7140
CLI_TIMEOUT_S = 40.0
CLOCK = "SELECT clock_timestamp()"
# `pgsolo run`'s COMMAND: its interval by the database's clock, read while the lock is held.
CLI_COMMAND = (
    "import os, time, psycopg\n"
    "c = psycopg.connect(os.environ['CHAOS_DSN'], autocommit=True, connect_timeout=5)\n"
    "s = c.execute('SELECT clock_timestamp()').fetchone()[0]\n"
    "time.sleep(float(os.environ['CHAOS_WORK_S']))\n"
    "e = c.execute('SELECT clock_timestamp()').fetchone()[0]\n"
    "print(s.isoformat(), e.isoformat(), flush=True)\n"
)


@dataclass(frozen=True)
class Plan:
    """What every worker is told (picklable, for spawned processes)."""

    dsns: dict[str, str]  # route -> DSN
    direct: str
    keys: int
    quota: int  # attempts per worker
    deadline: float  # time.time() after which no attempt starts
    seed: int
    tag: str  # this run's, in operation keys and in the CLI children's environment
    operations: int
    bouncer_workers: int  # PgBouncer's pool is small: only the first few use it
    control: bool = False  # the same work with no lock at all: the judge must see overlaps


def counter_index(worker: int, kind: str, outcome: str) -> int:
    return (worker * len(KINDS) + KINDS.index(kind)) * len(OUTCOMES) + OUTCOMES.index(outcome)


def _die_with_parent() -> None:  # in the child, before exec: SIGKILL when the worker dies
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Worker:
    def __init__(self, worker: int, incarnation: int, plan: Plan, shared: Any) -> None:
        self.worker = worker
        self.plan = plan
        self.progress, self.counters, self.heartbeat = shared
        self.rng = random.Random(plan.seed * 1_000_003 + worker * 1009 + incarnation)
        self.judge = Judge(plan.direct)
        self.held: dict[str, psycopg.Connection[Any]] = {}
        self.routes = [r for r in plan.dsns if r != "bouncer" or worker < plan.bouncer_workers]

    def loop(self) -> None:
        while self.progress[self.worker] < self.plan.quota and time.time() < self.plan.deadline:
            self.heartbeat[self.worker] = time.time()
            kind = self.rng.choices(KINDS, WEIGHTS)[0]
            route = self.rng.choice(self.routes)
            outcome = self.attempt(kind, route, self.rng.randrange(self.plan.keys))
            self.counters[counter_index(self.worker, kind, outcome)] += 1
            self.progress[self.worker] += 1
            self.heartbeat[self.worker] = time.time()
        for conn in self.held.values():
            conn.close()
        self.judge.close()

    # -- one attempt --------------------------------------------------------------------

    def attempt(self, kind: str, route: str, slot: int) -> str:
        key = (NAMESPACE, slot)
        work_s = self.rng.uniform(0.0, 0.015)
        span: list[datetime] = []

        def work(conn: psycopg.Connection[Any]) -> None:
            span.append(_clock(conn))
            time.sleep(work_s)
            span.append(_clock(conn))

        wait = self.rng.choice((None, None, 0.5))
        try:
            if self.plan.control:
                work(self._conn(route))
                run = Run(kind, route, self.worker, slot, "completed", *span)
                return self._record(run)
            if kind == "run_once":
                return self._once(route, wait)
            if kind == "cli":
                return self._cli(route, slot, work_s)
            if kind in ("job_xact", "job_session"):
                result = pgsolo.run_job(
                    self.plan.dsns[route],
                    key,
                    work,
                    name=f"chaos-{slot}",
                    lifetime="xact" if kind == "job_xact" else "session",
                    keep=kind == "job_session" and pgsolo.Keep(interval=0.2, timeout=1.0),
                    wait=wait,
                    raise_errors=False,
                )
                outcome: str = result.outcome
            else:
                outcome = self._bare(kind, route, key, work, wait)
        except pgsolo.LockLostError:
            outcome = "lost"
        except (psycopg.Error, pgsolo.PgsoloError, OSError):
            self._drop(route)
            outcome = "failed"
        if outcome == "skipped":
            return outcome
        run = Run(kind, route, self.worker, slot, outcome, *([*span, None, None])[:2])
        return self._record(run)

    def _bare(
        self,
        kind: str,
        route: str,
        key: tuple[int, int],
        work: Callable[[psycopg.Connection[Any]], None],
        wait: float | None,
    ) -> str:
        conn = self._conn(route)
        make = pgsolo.xact_lock if kind == "xact_lock" else pgsolo.session_lock
        with make(conn, key, wait=wait) as lock:
            if not lock.acquired:
                return "skipped"
            work(conn)
        return "completed"

    def _once(self, route: str, wait: float | None) -> str:
        conn = self._conn(route)
        op_key = f"chaos-{self.plan.tag}-{self.rng.randrange(self.plan.operations)}"
        duplicate = []

        def operation(ctx: pgsolo.OperationContext[Any]) -> str:
            if ctx.conn.execute(EFFECT, (op_key, ctx.idempotency_key, self.worker)).fetchone():
                return "done"
            duplicate.append(op_key)  # the effect of an earlier success is there already
            return "again"

        result = pgsolo.run_once(conn, op_key, operation, wait=wait)
        if duplicate and result.outcome == "ran":
            self.judge.duplicate_effect(route, self.worker, op_key)
            return "overlap"
        return "completed" if result.outcome == "ran" else "skipped"

    def _cli(self, route: str, slot: int, work_s: float) -> str:
        env = {
            **os.environ,
            "CHAOS_DSN": self.plan.direct,
            "CHAOS_WORK_S": f"{work_s:.4f}",
            "CHAOS_TAG": self.plan.tag,
        }
        command = [sys.executable, "-m", "pgsolo", "run", "--dsn", self.plan.dsns[route]]
        command += ["--key", f"{NAMESPACE}:{slot}", "--check-interval", "0.2"]
        command += ["--connect-timeout", "5", "--", sys.executable, "-c", CLI_COMMAND]
        try:
            done = subprocess.run(  # noqa: S603 - our own interpreter and arguments
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
                check=False,
                preexec_fn=_die_with_parent,
            )
        except subprocess.TimeoutExpired:
            return "failed"
        span = [datetime.fromisoformat(t) for t in done.stdout.split()[:2]]
        outcome = {0: "completed", 75: "skipped", 70: "lost"}.get(done.returncode, "failed")
        if outcome == "skipped":
            return outcome
        if outcome == "completed" and len(span) != 2:
            outcome = "failed"  # exit 0 without the interval: not a run the judge can see
        run = Run("cli", route, self.worker, slot, outcome, *([*span, None, None])[:2])
        return self._record(run)

    # -- connections and the judge ------------------------------------------------------

    def _record(self, run: Run) -> str:
        try:
            verdict = self.judge.record(run)
        except psycopg.Error:
            return "unrecorded"
        return "overlap" if verdict == "overlap" else run.outcome

    def _conn(self, route: str) -> psycopg.Connection[Any]:
        conn = self.held.get(route)
        if conn is None or conn.closed or conn.broken:
            conn = psycopg.connect(
                self.plan.dsns[route], autocommit=True, connect_timeout=5, prepare_threshold=None
            )
            self.held[route] = conn
        return conn

    def _drop(self, route: str) -> None:
        conn = self.held.pop(route, None)
        if conn is not None:
            conn.close()


def _clock(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute(CLOCK).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def main(worker: int, incarnation: int, plan: Plan, shared: Any) -> None:
    """A worker process's body (spawned: no state inherited from the driver)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when workers stop
    # pgsolo logs every fault it meets, by design; thousands of them hide the verdict
    logging.getLogger("pgsolo").setLevel(logging.CRITICAL + 1)
    Worker(worker, incarnation, plan, shared).loop()
