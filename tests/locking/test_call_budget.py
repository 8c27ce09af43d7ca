"""How many Python calls pgsolo itself makes for one acquire and release, per kind of
connection and lifetime, against a budget written here.

Why calls and not time: the timed rows of ``benchmarks/`` are too noisy to catch a 20%
regression in CI (two such went unnoticed). The calls made in pgsolo's own files (and in
the methods dataclasses generate for its classes, and the standard library's Python
functions pgsolo calls itself) for a warm lock on an idle connection are the same on every
run and machine, and a change that adds some fails here, naming them. A budget is lowered
when pgsolo gets cheaper; raising one needs a reason in the commit that does it, and a
benchmark run next to it (``python -m benchmarks --only 1-2``).

A call is counted once however often its generator or coroutine resumes (a resume count
depends on how soon the server answers). ``call_budget.json`` records which functions
the last accepted run called, so that a failure can say which calls were added; write it
again with ``PGSOLO_RECORD_CALLS=1`` once a change is accepted.
"""

from __future__ import annotations

import _weakrefset
import collections
import gc
import json
import logging
import os
import sys
import sysconfig
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import pgsolo
from _drivers import ASYNC_KINDS, SYNC_KINDS, AKind, Kind, asyncpg_options
from pgsolo import Key, metrics
from pgsolo.locking import poll_pauses
from pgsolo.testing import Relay

PACKAGE = str(Path(pgsolo.__file__).parent) + os.sep
RECORD = Path(__file__).with_name("call_budget.json")

# pgsolo's calls for one warm `with session_lock(conn, key):` / `with xact_lock(conn, key):`
# around nothing, on a connection with no transaction open (the first lock on a
# connection checks its route once, outside the budget), and one run_job. A psycopg session
# lock's budget includes the calls that choose and send its prepared statements
# (drivers/prepared.py): 8 calls that save the server 30 µs per lock and unlock. An
# asyncpg session lock runs its prepared calls through asyncpg's protocol, written in C
# (_asyncpg_private.ready_run): the 4 calls the protocol makes into asyncio from there
# (a future, a transport's write, for each call) count as pgsolo's, since their caller's
# frame is pgsolo's; they replace 20 of asyncpg's own, 4 µs per lock and unlock. A psycopg
# transaction lock on a connection with autocommit off (SQLAlchemy's, Django's in a
# transaction) sends psycopg's BEGIN with its statement, directly, where a cursor sent it
# (1 call more, 5 on a task, which waits for the answer itself: a cursor's calls were
# psycopg's): a Ctrl-C as a wait's slice ran out made psycopg close the connection. An
# asyncpg transaction lock checks that the connection did not go back to its pool before
# each statement of its transaction (2 calls): its COMMIT went to the next borrower's. A
# job checks what its work returned (1 call): a coroutine or generator, whose body never
# ran, was reported completed and used up its period. Every lock counts its outcome in
# pgsolo's own tally (metrics.py, 1 call), where prometheus_client's Counter and
# Histogram made 12 calls of their own (not counted here, being another library's) and
# took three mutexes: 3 µs of pgsolo's 15 per asyncpg session lock and unlock. An asyncpg
# lock asks whether its connection is open, and in a transaction, of asyncpg's protocol
# (_asyncpg_private.open_protocol, 5 calls counted here), where asyncpg's own is_closed(),
# is_in_transaction() and _check_open() made 11, which were not. A session lock asks its
# driver once, before it takes the lock and before it gives it back, whether the
# connection is open with no transaction (DriverBase.idle_pid), where it asked two or
# three questions: 5 or 6 calls less per lock on most drivers; 2 more on SQLAlchemy's and
# 3 on Django's, whose answer (drivers.IdleByStatus) asks whether the connection is
# closed before the claim too, which their transaction status alone cannot tell. A plain
# try finds its spec by the key as given, without resolving it (1 call less), and a
# lock's release is its shell's __exit__, with no frame below it (1 less). An asyncpg
# session lock sends its try and its unlock by the driver's own way
# (driver.lone_calls: the call the session has prepared, made ready once per checkout):
# 12 calls less. An asyncpg transaction lock's two messages wait in the caller's own task,
# out of reach of its cancellation (drivers/_in_place.py), where each ran in a task of its
# own behind asyncio.shield: 4 calls more counted here (a stand-in future and the callback
# that wakes it, per message), where ensure_future() and shield() were 4 whose own work (a
# task, a future, two callbacks, three turns of the loop) ran in the standard library,
# uncounted: 33 µs less per lock over a local socket. A job counts its attempt in pgsolo's
# own tallies too (metrics._JobTally.add, 1 call more), where prometheus_client's Counter,
# two Histograms and Gauge made 18 calls of their own and took four mutexes: 22k of the
# 314k instructions of pgsolo's own per waiting job (benchmarks.instructions job-wait). A
# job defined before from the same plain values is the one kept then
# (jobs/definition.py:_seen_as, 1 call), where its options were checked again (6 calls
# and a frozen dataclass of 11 fields): 27k instructions. A job without a period makes
# none of the period's steps (3 calls less: two generators made and run to their end under
# the lock, and the check that its connection has no transaction makes its refusal's
# words only when it refuses). Behind a relay (to the server, a proxy or a NAT) a session
# lock's try and unlock are guarded by the backend's pid, and take the same short way as
# on a direct connection, without a plan (psycopg 74 calls before, asyncpg 85), sent as
# written, since the pid is in each one's text: on asyncpg as asyncpg's own round trip,
# out of pgsolo's shield, as a direct lock's.
BUDGETS: dict[str, int] = {
    "psycopg/session": 56,
    "psycopg/xact": 59,
    "psycopg-implicit/session": 56,
    "psycopg2-autocommit/session": 55,
    "psycopg2-autocommit/xact": 61,
    "pg8000-autocommit/session": 81,
    "pg8000-autocommit/xact": 86,
    "sqlalchemy-psycopg/session": 137,
    "sqlalchemy-psycopg/xact": 93,
    "django/session": 92,
    "django/xact": 82,
    "psycopg-async/session": 76,
    "psycopg-async/xact": 80,
    "asyncpg/session": 46,
    "asyncpg/xact": 71,
    "sqlalchemy-async-psycopg/session": 167,
    "sqlalchemy-async-psycopg/xact": 107,
    "psycopg/run_job": 98,
    "psycopg-async/run_job": 118,
    "psycopg/session-relayed": 50,
    "asyncpg/session-relayed": 48,
}
# The cases with a test of their own, below.
OWN_TESTS = {
    "psycopg/run_job",
    "psycopg-async/run_job",
    "psycopg/session-relayed",
    "asyncpg/session-relayed",
}

_SYNC = {kind.name: kind for kind in SYNC_KINDS}
_ASYNC = {kind.name: kind for kind in ASYNC_KINDS}


class _Counting:
    """pgsolo's calls while it is on: one per frame, by ``file:function``."""

    def __init__(self) -> None:
        self.frames: dict[FrameType, str] = {}  # holding each frame: no id is reused
        self.collecting = True

    def __enter__(self) -> _Counting:
        # The cyclic collector, run while counting, closes the suspended generators of
        # earlier tests' garbage, and a close resumes pgsolo's frame (a wait's
        # poll_pauses, once in CI): collected before, and not while counting.
        gc.collect()
        # A lock's wait is added up with the 255 before it, by the lock that arrives
        # 256th (metrics._Waits): added up now, so that the lock counted is never that one.
        metrics.add_up_waits()
        self.collecting = gc.isenabled()
        gc.disable()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        if self.collecting:
            gc.enable()

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame not in self.frames:
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE):
                name = f"{path[len(PACKAGE) :]}:{frame.f_code.co_qualname}"
                self.frames[frame] = name.replace(os.sep, "/")
            elif path == "<string>" and (owner := _generated_for_pgsolo(frame)) is not None:
                # A dataclass's __init__, __eq__, __hash__, a named tuple's __new__:
                # pgsolo's calls too.
                method = "__new__" if "_cls" in frame.f_locals else frame.f_code.co_name
                name = f"{owner.__module__}:{owner.__qualname__}.{method}"
                self.frames[frame] = f"{name} (generated)"
            elif _in_stdlib(path) and _called_by_pgsolo(frame) and not _on_death(frame):
                # The standard library's Python that pgsolo calls itself (a weak dictionary's
                # lookup, a logger's level check): moving work into or out of it is no gain.
                name = f"{frame.f_globals.get('__name__')}:{frame.f_code.co_qualname}"
                self.frames[frame] = f"{name} (stdlib)"

    def calls(self) -> collections.Counter[str]:
        return collections.Counter(self.frames.values())


STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
# Run when an object dies, wherever that happens to be: on no lock's path. The standard
# library's weak collections' callbacks (a WeakSet's entry went while pgsolo's code ran,
# once, after the Django tests in the same process) and finalizers (an asyncio transport
# of an earlier test's, once in CI). pgsolo's own books drop their entries in C, unseen.
_WEAK_COLLECTIONS = {weakref.__file__, _weakrefset.__file__}


def _in_stdlib(path: str) -> bool:
    return path.startswith(STDLIB) and "-packages" + os.sep not in path


def _on_death(frame: FrameType) -> bool:
    code = frame.f_code
    if code.co_name == "__del__":
        return True
    return code.co_filename in _WEAK_COLLECTIONS and code.co_name in ("_remove", "remove")


def _called_by_pgsolo(frame: FrameType) -> bool:
    caller = frame.f_back
    return caller is not None and caller.f_code.co_filename.startswith(PACKAGE)


def _generated_for_pgsolo(frame: FrameType) -> type | None:
    """The class of pgsolo's whose generated method runs in ``frame``, if it is one."""
    local = frame.f_locals
    owner = local["_cls"] if "_cls" in local else type(local.get("self"))  # a named tuple's
    return owner if isinstance(owner, type) and owner.__module__.startswith("pgsolo.") else None


def _check(case: str, calls: collections.Counter[str]) -> None:
    budget, total = BUDGETS[case], sum(calls.values())
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    if os.environ.get("PGSOLO_RECORD_CALLS") and total <= budget:
        recorded[case] = dict(sorted(calls.items()))
        RECORD.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
    if total <= budget:
        return
    before = collections.Counter(recorded.get(case, {}))
    added = calls - before
    lines = [f"  +{count} {name}" for name, count in sorted(added.items())]
    pytest.fail(
        f"{case}: pgsolo made {total} calls, over its budget of {budget}"
        f" ({sum(before.values())} when it was recorded). Calls added:\n"
        + ("\n".join(lines) or "  (none by name: more of the same)")
    )


@pytest.fixture(autouse=True)
def _no_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    """A log line at DEBUG is built only when that level is on: off, as by default."""
    caplog.set_level(logging.WARNING, logger="pgsolo")


def _sync_lock(conn: object, key: Key, lifetime: str) -> None:
    make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    with make(conn, key) as lock:  # type: ignore[operator]
        assert lock.acquired


async def _async_lock(conn: object, key: Key, lifetime: str) -> None:
    make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    async with make(conn, key) as lock:  # type: ignore[operator]
        assert lock.acquired


def _measured_sync(run: Callable[[], None], between: Callable[[], None]) -> Any:
    for _ in range(WARM_UPS):
        run()
        between()
    with _Counting() as counting:
        run()
    between()
    return counting.calls()


async def _measured_async(run: Callable[[], Awaitable[None]], between: Callable[[], None]) -> Any:
    for _ in range(WARM_UPS):
        await run()
        between()
    with _Counting() as counting:
        await run()
    between()
    return counting.calls()


# What a connection does once: its route, the SQL of the key, the driver's imports; and
# what it does for its first few locks: a psycopg session lock runs as written until it
# ran as many times as the connection's prepare_threshold (5 by default), then by name. A
# connection that locks again and again spends its life in the second.
WARM_UPS = 6

SYNC_CASES = [c for c in BUDGETS if c.partition("/")[0] in _SYNC and c not in OWN_TESTS]
ASYNC_CASES = [c for c in BUDGETS if c.partition("/")[0] in _ASYNC and c not in OWN_TESTS]


def test_every_budget_names_a_case_that_runs() -> None:
    """Guards the table itself: a misspelt kind would leave its budget unchecked. (Django
    on psycopg2, a run of its own, has no budget.)"""
    django = {case for case in BUDGETS if case.startswith("django/")}
    missing = set(BUDGETS) - set(SYNC_CASES) - set(ASYNC_CASES) - OWN_TESTS
    assert missing in (set(), django if "django-psycopg2" in _SYNC else set())


def test_garbage_of_earlier_tests_is_not_counted_as_the_locks_calls() -> None:
    """Guards the count against the collector: a wait's pause generator left suspended in
    a reference cycle, as an earlier test may leave one, is closed when the collector runs,
    and its close resumes pgsolo's frame."""

    class Cycle:
        pass

    left = Cycle()
    left.itself = left  # type: ignore[attr-defined]
    left.pauses = poll_pauses()  # type: ignore[attr-defined]
    next(left.pauses)  # type: ignore[attr-defined]
    del left
    with _Counting() as counting:
        gc.collect()  # as a threshold reached by the lock's own allocations would
    assert counting.calls() == {}


@pytest.mark.parametrize("case", SYNC_CASES)
def test_one_lock_stays_within_its_call_budget(case: str, db: str, key: Key) -> None:
    name, _, lifetime = case.partition("/")
    kind: Kind = _SYNC[name]
    with kind.open(db) as handle:
        # A connection that opens transactions by itself is in one after each lock
        # (the caller's to end): ended between runs, outside the count.
        calls = _measured_sync(
            lambda: _sync_lock(handle.conn, key, lifetime),
            handle.rollback if kind.implicit else lambda: None,
        )
    _check(case, calls)


@pytest.mark.parametrize("case", ASYNC_CASES)
async def test_one_async_lock_stays_within_its_call_budget(case: str, db: str, key: Key) -> None:
    name, _, lifetime = case.partition("/")
    kind: AKind = _ASYNC[name]
    async with kind.open(db) as handle:

        async def run() -> None:
            await _async_lock(handle.conn, key, lifetime)

        calls = await _measured_async(run, lambda: None)
    _check(case, calls)


def test_one_job_stays_within_its_call_budget(db: str, key: Key) -> None:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(db, autocommit=True) as conn:
        calls = _measured_sync(lambda: pgsolo.run_job(conn, key, lambda _conn: None), lambda: None)
    _check("psycopg/run_job", calls)


async def test_one_async_job_stays_within_its_call_budget(db: str, key: Key) -> None:
    import psycopg  # noqa: PLC0415

    async def nothing(_conn: object) -> None:
        return None

    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:

        async def run() -> None:
            await pgsolo.run_job_async(conn, key, nothing)

        calls = await _measured_async(run, lambda: None)
    _check("psycopg-async/run_job", calls)


def test_a_lock_behind_a_relay_stays_within_its_call_budget(db: str, key: Key) -> None:
    import psycopg  # noqa: PLC0415

    with Relay(db) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
        calls = _measured_sync(lambda: _sync_lock(conn, key, "session"), lambda: None)
    _check("psycopg/session-relayed", calls)


async def test_an_asyncpg_lock_behind_a_relay_stays_within_its_call_budget(
    db: str, key: Key
) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    with Relay(db) as relay:
        conn = await asyncpg.connect(**asyncpg_options(relay.dsn))
        try:

            async def run() -> None:
                await _async_lock(conn, key, "session")

            calls = await _measured_async(run, lambda: None)
        finally:
            await conn.close()
    _check("asyncpg/session-relayed", calls)
