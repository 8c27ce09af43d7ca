"""Item 11: Celery (issue 26). What a ``pgsolo.celery.Singleton`` task costs over the
same plain task, and how long the beats of ``pgsolo.celery:LeaderScheduler`` go without a
sender when their leader is killed with ``kill -9``. The app is ``celery_app.py``'s, on
kombu's filesystem transport: no server but PostgreSQL.

*Overhead per task.* Three tasks with one body, nothing: ``plain``, ``singleton`` and
``recipe`` (the article's recipe written by hand in the task: a connection of its own,
``pg_try_advisory_lock``, the body, ``pg_advisory_unlock``), run by ``task.apply()`` (a
worker's path without the broker) in this process, taking turns task by task, with a
fourth side, a bare ``psycopg.connect()`` and close. Then ``plain`` and ``singleton``
through a real ``celery worker --pool solo``: a block queued at once (moved into the
broker whole, :func:`benchmarks.celery_app.post`), the time per task from the block's
first result to its last (the results' ``date_done``, the worker's clock), so that the
idle worker's polling is not in it. Each run of a Singleton opens a connection of its own, and that
dominates: a new backend and its authentication (SCRAM, over TCP) cost more than
everything else the task does. What pgsolo adds over the recipe, which opens one too:
two round trips (the server's keepalives for the session, over TCP only; the route
check's stamp) and the keeper, whose thread is handed on from run to run
(:mod:`pgsolo._threads`). The goal, Singleton ÷ recipe <= 1.25, gives them a quarter of what
the recipe costs.

*Beat takeover.* Two ``celery beat -S pgsolo.celery:LeaderScheduler`` processes, an entry
due every second (a *tick*). The leader is known (it started first and holds the lock);
the other waits on the lock (seen in ``pg_locks`` through :func:`pgsolo.advisory_locks`).
A random 0-1 tick later the leader gets ``SIGKILL`` (*killed*, on the monotonic clock),
then: the successor holds the lock (the observer's first look, every 5 ms, that shows
another backend holding it), and its first message (the broker's file, named with the
sender's monotonic clock in ms and carrying the sender's pid as its origin). A new beat
then stands by for the next kill. The sends of the whole run must come from the leaders
in turn: a message from a beat that did not lead is a failure. The issue's goal: the
first send within 2 s plus one tick of the kill (the successor sends from the first entry
due once it leads, up to a tick later), and so the lock within 2 s.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import pgsolo
from benchmarks.registry import Context, Goal, Ratio, Row, quantile, scenario
from pgsolo.keys import Key, leader_key

REPO = Path(__file__).resolve().parent.parent
TICK_S = 1.0
LOCK_GOAL_MS = 2000.0
SEND_GOAL_MS = LOCK_GOAL_MS + TICK_S * 1000
RECIPE_GOAL = Goal("<=", 1.25)
LOOK_EVERY_S = 0.005
START_TIMEOUT_S = 60.0  # a celery process starts, imports and connects in this time
SIDES = ("plain", "singleton", "recipe", "connect")


def has_celery(ctx: Context) -> str | None:
    if importlib.util.find_spec("celery") is None:
        return "Celery is not installed (pip install -e '.[celery]')"
    return None


def _celery(env: dict[str, str], folder: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - our own interpreter and app, no shell
        [sys.executable, "-m", "celery", "-A", "benchmarks.celery_app:app", *args],
        cwd=folder,  # anything a celery process leaves in its directory goes with it
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def _until(what: str, check: Callable[[], Any], timeout: float = START_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(LOOK_EVERY_S)
    return found


# -- overhead per task ------------------------------------------------------------------


def _applied(ctx: Context, app: Any) -> dict[str, list[float]]:
    """Seconds per task of each side, per round, by ``task.apply()``: the sides take turns
    task by task (a connection costs milliseconds, so drift of the machine within a block
    would weigh more than the difference), and each round's is the median of its tasks."""
    per_round = ctx.size(40, 5)
    conninfo = ctx.target.conninfo()

    def connect() -> None:
        with psycopg.connect(conninfo, autocommit=True):
            pass

    sides: dict[str, Callable[[], object]] = {
        name: functools.partial(app.tasks[name].apply, throw=True) for name in SIDES[:3]
    }
    sides["connect"] = connect
    for side in sides.values():  # warm up: first-use imports and setup
        side()
    seconds: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(ctx.rounds):
        taken: dict[str, list[float]] = {name: [] for name in SIDES}
        for n in range(per_round):
            for name in SIDES[n % len(SIDES) :] + SIDES[: n % len(SIDES)]:
                started = time.perf_counter()
                sides[name]()
                taken[name].append(time.perf_counter() - started)
        for name in SIDES:
            seconds[name].append(statistics.median(taken[name]))
    return seconds


def _worked(ctx: Context, app: Any, env: dict[str, str], folder: Path) -> dict[str, list[float]]:
    """Seconds per task of ``plain`` and ``singleton`` in a real worker, per round."""
    from benchmarks.celery_app import post  # noqa: PLC0415 - imports Celery, as celery() says

    per_block = ctx.size(50, 10)
    names = SIDES[:2]
    worker = _celery(
        env,
        folder,
        "worker",
        "--pool",
        "solo",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
    )
    seconds: dict[str, list[float]] = {name: [] for name in names}
    try:
        for name in names:  # the worker is up, and warm
            warm_up = app.tasks[name].delay()
            post(folder)
            warm_up.get(timeout=START_TIMEOUT_S, interval=0.01)
        for n in range(ctx.rounds):
            for name in names if n % 2 == 0 else names[::-1]:
                results = [app.tasks[name].delay() for _ in range(per_block)]
                post(folder)
                for result in results:  # raises what a task raised: a duplicate, say
                    # Looked at seldom, not to take the worker's CPU: the worker's clock
                    # times the block.
                    result.get(timeout=START_TIMEOUT_S, interval=0.1)
                done = sorted(result.date_done for result in results)
                seconds[name].append((done[-1] - done[0]).total_seconds() / (per_block - 1))
    finally:
        _stop([worker])
    return seconds


def _overhead_rows(applied: dict[str, list[float]], worked: dict[str, list[float]]) -> list[Row]:
    def us(samples: list[float]) -> float:
        return statistics.median(samples) * 1e6

    def over(seconds: dict[str, list[float]]) -> float:
        return us([s - p for s, p in zip(seconds["singleton"], seconds["plain"], strict=True)])

    return [
        Row(
            scenario="11",
            title="celery: Singleton ÷ plain task, task.apply() of a no-op",
            ratio=Ratio.paired(applied["singleton"], applied["plain"]),
            detail=f"{us(applied['singleton']):,.0f} vs {us(applied['plain']):,.0f} µs per"
            f" task: {over(applied):,.0f} µs of overhead, of which a connection's open and"
            f" close {us(applied['connect']):,.0f} µs (psycopg.connect alone)",
            data={"seconds_per_task": applied},
        ),
        Row(
            scenario="11",
            title="celery: Singleton ÷ the recipe by hand in the task, task.apply()",
            ratio=Ratio.paired(applied["singleton"], applied["recipe"]),
            goal=RECIPE_GOAL,
            detail=f"{us(applied['singleton']):,.0f} vs {us(applied['recipe']):,.0f} µs per"
            " task; both open a connection per run",
            data={"seconds_per_task": applied},
        ),
        Row(
            scenario="11",
            title="celery worker --pool solo: Singleton ÷ plain task, per task queued",
            ratio=Ratio.paired(worked["singleton"], worked["plain"]),
            detail=f"{us(worked['singleton']):,.0f} vs {us(worked['plain']):,.0f} µs per"
            f" task: {over(worked):,.0f} µs of overhead",
            data={"seconds_per_task": worked},
        ),
    ]


# -- beat takeover ----------------------------------------------------------------------


class Broker:
    """The messages in the filesystem broker's folder: when each was sent (the sender's
    monotonic clock, in ms) and by which process."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._read: dict[str, tuple[int, int]] = {}

    def sends(self) -> list[tuple[int, int]]:
        """``(ms, pid)`` of every message, in the order sent."""
        for path in self.folder.glob("*.msg"):
            if path.name in self._read:
                continue
            try:  # the origin is gen<pid>@<host>
                origin = json.loads(path.read_text())["headers"]["origin"]
            except ValueError:  # kombu writes the file in place: this one is being written
                continue
            sent_ms = int(path.name.split("_")[0])
            self._read[path.name] = (sent_ms, int(origin.removeprefix("gen").split("@")[0]))
        return sorted(self._read.values())

    def first_from(self, pid: int) -> int | None:
        return next((ms for ms, sender in self.sends() if sender == pid), None)


def _takeovers(
    ctx: Context, key: Key, env: dict[str, str], folder: Path
) -> tuple[list[list[float]], list[list[float]], list[str]]:
    """Per round, ms from each kill to the successor's lock and to its first send; and
    what went wrong (a beat that sent while another led)."""
    per_round = 2
    rng = random.Random(11)
    broker = Broker(folder / "broker")
    beats: list[subprocess.Popen[bytes]] = []

    def beat() -> subprocess.Popen[bytes]:
        schedule = str(folder / f"schedule-{len(beats)}")
        beats.append(
            _celery(env, folder, "beat", "-S", "pgsolo.celery:LeaderScheduler", "-s", schedule)
        )
        return beats[-1]

    locked: list[list[float]] = []
    sent: list[list[float]] = []
    with psycopg.connect(ctx.target.conninfo(), autocommit=True) as observer:

        def holder() -> int | None:
            locks = pgsolo.advisory_locks(observer, key=key)
            return next((lock.pid for lock in locks if lock.granted), None)

        def queued() -> bool:
            return any(not lock.granted for lock in pgsolo.advisory_locks(observer, key=key))

        def held_by_other(before: int) -> bool:
            return holder() not in (None, before)

        try:
            leader = beat()
            _until("the first beat to lead", holder)
            _until("the first beat to send", functools.partial(broker.first_from, leader.pid))
            for _ in range(ctx.size(ctx.rounds, 1)):  # each beat takes seconds to start
                locked.append([])
                sent.append([])
                for _ in range(per_round):
                    successor = beat()
                    _until("the next beat to wait for the lock", queued)
                    time.sleep(rng.uniform(0, TICK_S))
                    before = _until("the leader's lock", holder)
                    killed_at = time.monotonic()
                    os.kill(leader.pid, signal.SIGKILL)
                    _until("the successor's lock", functools.partial(held_by_other, before))
                    locked[-1].append((time.monotonic() - killed_at) * 1000)
                    first = _until(
                        "the successor's send", functools.partial(broker.first_from, successor.pid)
                    )
                    sent[-1].append(first - killed_at * 1000)
                    leader.wait()
                    leader = successor
        finally:
            _stop(beats)
    # Each beat in turn, once: a beat that sent while another led would come back.
    origins = [pid for _, pid in broker.sends()]
    turns = [pid for n, pid in enumerate(origins) if n == 0 or origins[n - 1] != pid]
    leaders = [b.pid for b in beats]
    problems = [] if turns == leaders else [f"beats sent in turn {turns}, led {leaders}"]
    return locked, sent, problems


def _takeover_rows(
    locked: list[list[float]], sent: list[list[float]], problems: list[str]
) -> list[Row]:
    rows = []
    for what, samples_by_round, goal_ms in (
        ("lock", locked, LOCK_GOAL_MS),
        ("first send", sent, SEND_GOAL_MS),
    ):
        pooled = [ms for samples in samples_by_round for ms in samples]
        detail = (
            f"p50 {quantile(pooled, 0.5):,.0f} ms, slowest {max(pooled):,.0f} ms"
            f" ({len(pooled)} takeovers, an entry due every {TICK_S:g} s)"
        )
        for label, q in (("p50", 0.5), ("max", 1.0)):
            title = f"celery beat: the leader's kill -9 to the successor's {what}, {label} in ms"
            rows.append(
                Row(
                    scenario="11",
                    title=title,
                    ratio=Ratio.of([quantile(samples, q) for samples in samples_by_round]),
                    goal=Goal("<", goal_ms) if label == "max" else None,
                    detail=detail,
                    problems=problems,
                    data={"ms": samples_by_round, "quantile": q, "tick_s": TICK_S},
                )
            )
    return rows


@scenario(
    "11",
    "celery: Singleton's overhead per task, and the beat's takeover after kill -9",
    requires=has_celery,
)
def celery(ctx: Context) -> list[Row]:
    # Both import Celery, which the suite's other scenarios do without.
    from benchmarks.celery_app import FOLDER_ENV, TICK_ENV, make_app  # noqa: PLC0415
    from pgsolo.celery import beat_leader_name  # noqa: PLC0415

    conninfo = ctx.target.conninfo()
    with tempfile.TemporaryDirectory(prefix="pgsolo-bench-celery-") as tmp:
        worker_folder, beat_folder = Path(tmp) / "worker", Path(tmp) / "beat"
        env = {
            **os.environ,
            "PGSOLO_DSN": conninfo,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.getenv("PYTHONPATH")) if p),
        }
        for folder in (worker_folder, beat_folder):
            for sub in ("broker", "outbox", "results"):
                (folder / sub).mkdir(parents=True)
        app = make_app(worker_folder, conninfo, outbox=True)
        applied = _applied(ctx, app)
        worked = _worked(ctx, app, {**env, FOLDER_ENV: str(worker_folder)}, worker_folder)
        locked, sent, problems = _takeovers(
            ctx,
            leader_key(beat_leader_name(app)),  # the beats' app has the same name
            {**env, FOLDER_ENV: str(beat_folder), TICK_ENV: str(TICK_S)},
            beat_folder,
        )
    return _overhead_rows(applied, worked) + _takeover_rows(locked, sent, problems)
