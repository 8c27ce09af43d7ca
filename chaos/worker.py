"""A chaos worker process: attempts, each a seeded pick of a way in (a kind of connection,
``chaos/ways.py``), a pgsolo call on it and a key, until its share of the attempt budget
or the time is spent. Everything it learns goes to the database (the judge) and to
counters in shared memory that only it writes: a worker killed with SIGKILL leaves
nothing half-done that another process waits on.

Interrupts are real. The driver sends a worker SIGINT at random moments: during an
attempt it is a ``KeyboardInterrupt`` in whatever runs (an async attempt's task is
cancelled, as ``asyncio.run`` does); the worker catches it at its loop's top, checks the
connection and goes on. Outside an attempt (the worker's own checks and records) the
signal is let pass. An async attempt is also cancelled at a random moment now and then.
After every attempt the worker fingerprints the connection as its next user gets it and
reports one that came back changed or holding a lock (``chaos/judge.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import Any

import psycopg

import pgsolo
from chaos.judge import EFFECT, Judge, Run
from chaos.ways import (
    COMBOS,
    WAYS,
    AsyncWay,
    Dead,
    Fingerprint,
    Way,
    effect_sql,
    without_identity,
)

# Each way's calls, weighted. `pgsolo run` starts two interpreters: fewer of those.
CALL_WEIGHTS = {
    "job_xact": 25,
    "job_session": 20,
    "xact_lock": 20,
    "session_lock": 15,
    "run_once": 15,
    "leader": 10,
    "semaphore": 10,
    "cli": 3,
}
OUTCOMES = (
    "completed",
    "skipped",
    "failed",
    "lost",
    "interrupted",  # SIGINT during the attempt
    "cancelled",  # an async attempt's task cancelled at a random moment
    "overlap",
    "unrecorded",
)
OWN_CONNECTION = ("job_xact", "job_session", "cli")  # open and close their own: nothing to check
NAMESPACE = 7140
CLI_TIMEOUT_S = 40.0
WORK_MAX_S = 0.015  # the work, inside the lock: long enough to overlap another run
WAIT_S = 0.2  # one attempt in three waits this long for a busy key (a holder takes ~30 ms)
# A candidate always waits: one that would try once waits this long, and a wait that runs
# out is a skip. Its term is judged in a slot of its own: a leader's key is not the slot's.
LEADER_TRY_S = 0.05
LEADER_SLOTS = 1_000_000
# A semaphore of 2 per key: its holders are judged per slot of it, where no two may
# overlap, so that no more than 2 hold it at once.
SEMAPHORE_LIMIT = 2
SEMAPHORE_SLOTS = 2_000_000
CANCEL_RATE = 0.1  # of async attempts
CANCEL_WITHIN_S = 0.03
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
    """What every worker is told (picklable, for the fork server)."""

    dsns: dict[str, str]  # route -> DSN
    direct: str
    keys: int
    quota: int  # attempts per worker
    deadline: float  # time.time() after which no attempt starts
    seed: int
    tag: str  # this run's, in operation keys and in the CLI children's environment
    operations: int
    bouncer_workers: int  # PgBouncer's pool is small: only the first few use it
    ways: tuple[str, ...]  # the ways in this run takes (chaos/ways.py WAYS)
    control: bool = False  # the same work with no lock at all: the judge must see overlaps


def counter_index(worker: int, combo: tuple[str, str], outcome: str) -> int:
    return (worker * len(COMBOS) + COMBOS.index(combo)) * len(OUTCOMES) + OUTCOMES.index(outcome)


def finished(plan: Plan, progress: int, faults_pending: Any) -> bool:
    """Whether a worker that made ``progress`` attempts is done: its quota made and every
    kind of fault injected (``faults_pending[0]`` cleared by the driver), or the deadline
    passed."""
    if time.time() >= plan.deadline:
        return True
    return progress >= plan.quota and not faults_pending[0]


def _die_with_parent() -> None:  # in the child, before exec: SIGKILL when the worker dies
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Worker:
    def __init__(self, worker: int, incarnation: int, plan: Plan, shared: Any) -> None:
        self.worker = worker
        self.plan = plan
        self.progress, self.counters, self.heartbeat, self.ready, self.faults_pending = shared
        self.rng = random.Random(plan.seed * 1_000_003 + worker * 1009 + incarnation)
        self.judge = Judge(plan.direct)
        self.semaphore_slot: int | None = None  # the slot a semaphore attempt held
        # PgBouncer's pool is small: only the first few workers' psycopg way goes through it
        routes = [r for r in plan.dsns if r != "bouncer"]
        psycopg_routes = [*routes, *(["bouncer"] if "bouncer" in plan.dsns else [])]
        if worker >= plan.bouncer_workers:
            psycopg_routes = routes
        self.routes = {
            name: self.rng.choice(psycopg_routes if name == "psycopg" else routes)
            for name in plan.ways
        }
        self.ways: dict[str, Way] = {
            name: WAYS[name](plan.dsns[self.routes[name]]) for name in plan.ways
        }
        self.fresh: dict[str, Fingerprint] = {}
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[str] | None = None
        self.armed = False  # in an attempt: SIGINT interrupts it
        self.interrupts = 0
        # where an attempt is: connect, pgsolo, work (the caller's statements), give back
        self.phase = "pgsolo"

    # -- the loop ---------------------------------------------------------------------

    def on_sigint(self, _signum: int, _frame: FrameType | None) -> None:
        if self.task is not None:  # what asyncio.run does: cancel the main task
            self.interrupts += 1
            self.task.cancel()
        elif self.armed:
            self.interrupts += 1
            raise KeyboardInterrupt

    def loop_forever(self) -> None:
        while not finished(self.plan, self.progress[self.worker], self.faults_pending):
            self.heartbeat[self.worker] = time.time()
            way = self.ways[self.rng.choice(self.plan.ways)]
            if way.name not in self.fresh and not self.record_fresh(way):
                time.sleep(0.2)  # the server is away: try again
                continue
            call = self.rng.choices(way.calls, [CALL_WEIGHTS[c] for c in way.calls])[0]
            outcome = self.attempt(way, call, self.rng.randrange(self.plan.keys))
            self.counters[counter_index(self.worker, (way.name, call), outcome)] += 1
            self.progress[self.worker] += 1
            if call not in OWN_CONNECTION:
                self.inspect(way, call, outcome)
            self.heartbeat[self.worker] = time.time()
        for way in self.ways.values():
            self.finish(way)
        self.judge.close()

    def finish(self, way: Way) -> None:
        """The last check of the way's backend, then let it go."""
        if way.name in self.fresh:
            self.inspect(way, "end", "end")
        if isinstance(way, AsyncWay):
            self.loop.run_until_complete(way.adiscard())
        else:
            way.close()

    # -- one attempt --------------------------------------------------------------------

    def attempt(self, way: Way, call: str, slot: int) -> str:
        kind = f"{way.name}:{call}"
        route = self.routes[way.name]
        key = (NAMESPACE, slot)
        work_s = self.rng.uniform(0.0, WORK_MAX_S)
        wait = self.rng.choice((None, None, WAIT_S))
        span: list[datetime] = []
        self.semaphore_slot = None
        interrupts = self.interrupts
        self.phase = "pgsolo"  # until the attempt says otherwise; kept when it fails
        try:
            if isinstance(way, AsyncWay):
                outcome = self.run_async(way, call, key, work_s, wait, span)
            else:
                outcome = self.run_sync(way, call, key, work_s, wait, span)
        except pgsolo.LockLostError:
            outcome = "lost"
        except Exception as exc:
            outcome = "interrupted" if self.interrupts != interrupts else "failed"
            self.note_failure(kind, exc)
        if self.interrupts != interrupts and outcome in ("failed", "cancelled"):
            outcome = "interrupted"
        if outcome == "skipped":
            return outcome
        if outcome.startswith("overlap"):  # run_once's duplicate effect, written already
            return "overlap"
        judged = slot
        if call == "leader":
            judged = LEADER_SLOTS + slot
        elif call == "semaphore":
            judged = SEMAPHORE_SLOTS + slot * SEMAPHORE_LIMIT + (self.semaphore_slot or 0)
        run = Run(kind, route, self.worker, judged, outcome, *([*span, None, None])[:2])
        return self._record(run)

    def run_sync(
        self,
        way: Way,
        call: str,
        key: tuple[int, int],
        work_s: float,
        wait: float | None,
        span: list[datetime],
    ) -> str:
        self.armed = True
        try:
            return self.sync_call(way, call, key, work_s, wait, span)
        except KeyboardInterrupt:
            return "interrupted"
        finally:
            self.armed = False

    def sync_call(
        self,
        way: Way,
        call: str,
        key: tuple[int, int],
        work_s: float,
        wait: float | None,
        span: list[datetime],
    ) -> str:
        def work(conn: Any) -> None:
            self.phase = "work"
            span.append(way.clock(conn))
            time.sleep(work_s)
            span.append(way.clock(conn))
            self.phase = "pgsolo"

        if call == "cli":
            return self._cli(way.dsn, key, work_s, span)
        if call in ("job_xact", "job_session") and not self.plan.control:
            result = pgsolo.run_job(
                way.dsn,
                key,
                work,
                name=f"chaos-{key[1]}",
                lifetime="xact" if call == "job_xact" else "session",
                keep=call == "job_session" and pgsolo.Keep(interval=0.2, timeout=1.0),
                wait=wait,
                raise_errors=False,
            )
            return str(result.outcome)
        self.phase = "connect"
        with way.checkout() as conn:
            self.phase = "pgsolo"
            try:
                outcome = self._sync_lock(way, conn, call, key, work, wait)
            except BaseException:
                way.end(conn, failed=True)  # the caller's own move after a failure
                raise
            self.phase = "give back"
            way.end(conn, failed=False)  # the caller ends a transaction the driver opened
        return outcome

    def _sync_lock(
        self,
        way: Way,
        conn: Any,
        call: str,
        key: tuple[int, int],
        work: Callable[[Any], None],
        wait: float | None,
    ) -> str:
        if self.plan.control:
            work(conn)
            return "completed"
        if call == "run_once":
            op_key, sql = self._operation(way)
            duplicate: list[str] = []

            def operation(ctx: pgsolo.OperationContext[Any]) -> str:
                self.phase = "work"
                done = way.effect(ctx.conn, sql, (op_key, ctx.idempotency_key, self.worker))
                self.phase = "pgsolo"
                if not done:
                    duplicate.append(op_key)  # the effect of an earlier success is there
                return "done"

            result = pgsolo.run_once(conn, op_key, operation, wait=wait)
            return self._once_outcome(way, result, duplicate, op_key)
        if call in ("leader", "semaphore"):
            return self._sync_many(conn, call, f"chaos-{key[1]}", work, wait)
        make = pgsolo.xact_lock if call == "xact_lock" else pgsolo.session_lock
        with make(conn, key, wait=wait) as lock:
            if not lock.acquired:
                return "skipped"
            work(conn)
        return "completed"

    def _sync_many(
        self, conn: Any, call: str, name: str, work: Callable[[Any], None], wait: float | None
    ) -> str:
        """A leader's term, or a semaphore's slot (the one held noted for the judge)."""
        if call == "leader":
            try:
                with pgsolo.leader(conn, name, wait=wait or LEADER_TRY_S, keep=False):
                    work(conn)
            except pgsolo.LockTimeoutError:
                return "skipped"
            return "completed"
        with pgsolo.semaphore(conn, name, limit=SEMAPHORE_LIMIT, wait=wait) as held:
            if not held.acquired:
                return "skipped"
            self.semaphore_slot = held.slot
            work(conn)
        return "completed"

    def run_async(
        self,
        way: AsyncWay,
        call: str,
        key: tuple[int, int],
        work_s: float,
        wait: float | None,
        span: list[datetime],
    ) -> str:
        task = self.loop.create_task(self.async_call(way, call, key, work_s, wait, span))
        cancel = None
        if not self.plan.control and self.rng.random() < CANCEL_RATE:
            cancel = self.loop.call_later(self.rng.uniform(0.0, CANCEL_WITHIN_S), task.cancel)
        self.task = task
        try:
            return self.loop.run_until_complete(task)
        except asyncio.CancelledError:
            return "cancelled"
        finally:
            self.task = None
            if cancel is not None:
                cancel.cancel()

    async def async_call(
        self,
        way: AsyncWay,
        call: str,
        key: tuple[int, int],
        work_s: float,
        wait: float | None,
        span: list[datetime],
    ) -> str:
        async def work(conn: Any) -> None:
            self.phase = "work"
            span.append(await way.aclock(conn))
            await asyncio.sleep(work_s)
            span.append(await way.aclock(conn))
            self.phase = "pgsolo"

        self.phase = "connect"
        async with way.acheckout() as conn:
            self.phase = "pgsolo"
            outcome = await self._async_lock(way, conn, call, key, work, wait)
            self.phase = "give back"
        return outcome

    async def _async_lock(
        self,
        way: AsyncWay,
        conn: Any,
        call: str,
        key: tuple[int, int],
        work: Callable[[Any], Awaitable[None]],
        wait: float | None,
    ) -> str:
        if self.plan.control:
            await work(conn)
            return "completed"
        if call == "run_once":
            op_key, sql = self._operation(way)
            duplicate: list[str] = []

            async def operation(ctx: pgsolo.OperationContext[Any]) -> str:
                self.phase = "work"
                params = (op_key, ctx.idempotency_key, self.worker)
                done = await way.aeffect(ctx.conn, sql, params)
                self.phase = "pgsolo"
                if not done:
                    duplicate.append(op_key)
                return "done"

            result = await pgsolo.run_once_async(conn, op_key, operation, wait=wait)
            return self._once_outcome(way, result, duplicate, op_key)
        if call in ("leader", "semaphore"):
            return await self._async_many(conn, call, f"chaos-{key[1]}", work, wait)
        make = pgsolo.xact_lock if call == "xact_lock" else pgsolo.session_lock
        async with make(conn, key, wait=wait) as lock:
            if not lock.acquired:
                return "skipped"
            await work(conn)
        return "completed"

    async def _async_many(
        self,
        conn: Any,
        call: str,
        name: str,
        work: Callable[[Any], Awaitable[None]],
        wait: float | None,
    ) -> str:
        """:meth:`_sync_many`, async."""
        if call == "leader":
            try:
                async with pgsolo.leader_async(conn, name, wait=wait or LEADER_TRY_S, keep=False):
                    await work(conn)
            except pgsolo.LockTimeoutError:
                return "skipped"
            return "completed"
        async with pgsolo.semaphore(conn, name, limit=SEMAPHORE_LIMIT, wait=wait) as held:
            if not held.acquired:
                return "skipped"
            self.semaphore_slot = held.slot
            await work(conn)
        return "completed"

    def _operation(self, way: Way) -> tuple[str, str]:
        """An operation key, shared by every way in (so that they contend on it), and the
        effect's statement in the way's parameter style."""
        op_key = f"chaos-{self.plan.tag}-{self.rng.randrange(self.plan.operations)}"
        return op_key, effect_sql(EFFECT, way.placeholder)

    def _once_outcome(
        self, way: Way, result: pgsolo.OnceResult, duplicate: list[str], op_key: str
    ) -> str:
        if duplicate and result.outcome == "ran":
            kind = f"{way.name}:run_once"
            self.judge.duplicate_effect(kind, self.routes[way.name], self.worker, op_key)
            return "overlap (recorded)"
        return "completed" if result.outcome == "ran" else "skipped"

    def _cli(self, dsn: str, key: tuple[int, int], work_s: float, span: list[datetime]) -> str:
        env = {
            **os.environ,
            "CHAOS_DSN": self.plan.direct,
            "CHAOS_WORK_S": f"{work_s:.4f}",
            "CHAOS_TAG": self.plan.tag,
        }
        if self.plan.control:
            command = [sys.executable, "-c", CLI_COMMAND]
        else:
            command = [sys.executable, "-m", "pgsolo", "run", "--dsn", dsn]
            command += ["--key", f"{key[0]}:{key[1]}", "--check-interval", "0.2"]
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
        span.extend(datetime.fromisoformat(t) for t in done.stdout.split()[:2])
        outcome = {0: "completed", 75: "skipped", 70: "lost"}.get(done.returncode, "failed")
        if outcome == "completed" and len(span) != 2:
            outcome = "failed"  # exit 0 without the interval: not a run the judge can see
        return outcome

    # -- the connection as its next user gets it -------------------------------------------

    def fingerprint(self, way: Way) -> Fingerprint:
        if isinstance(way, AsyncWay):
            return self.loop.run_until_complete(way.afingerprint())
        return way.fingerprint()

    def record_fresh(self, way: Way) -> bool:
        """The fingerprint of the way's connection before any attempt: what every later
        one must match."""
        try:
            self.fresh[way.name] = self.fingerprint(way)
        except Exception:
            self._discard(way)
            return False
        return True

    def inspect(self, way: Way, call: str, outcome: str) -> None:
        """Check the connection out again and compare it with the fresh one; one changed
        or holding a lock is reported and thrown away (so that it is counted once)."""
        kind = f"{way.name}:{call}"
        try:
            found = self.fingerprint(way)
        except Dead:
            return  # a fault killed it: a new one comes next
        except Exception as exc:
            self.phase = "check"
            self.note_failure(kind, exc)
            self._discard(way)
            return
        fresh = self.fresh[way.name]
        what = None
        if found.get("locks"):
            what = "leaked"
        elif without_identity(found) != without_identity(fresh):
            what = "changed"
        if what is None:
            return
        with contextlib.suppress(psycopg.Error):  # the judge away for good: the end says so
            self.judge.changed(kind, self.worker, outcome, what, fresh, found)
        self._discard(way)

    def _discard(self, way: Way) -> None:
        if isinstance(way, AsyncWay):
            self.loop.run_until_complete(way.adiscard())
        else:
            way.discard()

    # -- the judge ------------------------------------------------------------------------

    def note_failure(self, kind: str, exc: BaseException) -> None:
        error = f"{type(exc).__module__}.{type(exc).__qualname__}"
        with contextlib.suppress(psycopg.Error):
            self.judge.failure(kind, self.worker, error, self.phase)

    def _record(self, run: Run) -> str:
        try:
            verdict = self.judge.record(run)
        except psycopg.Error:
            return "unrecorded"
        return "overlap" if verdict == "overlap" else run.outcome


def main(worker: int, incarnation: int, plan: Plan, shared: Any) -> None:
    """A worker process's body (forked by a fork server: nothing inherited from the driver)."""
    # pgsolo logs every fault it meets, by design; thousands of them hide the verdict
    # (and so do the libraries' pools, reconnecting through restarts)
    for library in ("pgsolo", "sqlalchemy", "psycopg", "asyncpg", "asyncio"):
        logging.getLogger(library).setLevel(logging.CRITICAL + 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the worker can take it
    body = Worker(worker, incarnation, plan, shared)
    signal.signal(signal.SIGINT, body.on_sigint)
    body.ready[worker] = 1
    body.loop_forever()
