"""The "as found" law (``_async/test_as_found.py``) under a random mix: a Hypothesis state
machine runs lock calls, jobs and operations one after another on one bare connection and
on one pooled SQLAlchemy connection, with work that succeeds or raises, keys that another
session holds or not, and real interruptions: a SIGINT to the main thread after a random
delay, as Ctrl-C sends it, landing wherever the call happens to be (in the driver's wait,
in pgsolo's own bookkeeping, in the work, or just after the call returned).

After every step the bare connection and the pool's connection must look as they did when
fresh (``Handle.fingerprint``), hold no advisory lock, and behave (a rollback undoes).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import pgsolo
import pgsolo.sqlalchemy
from _drivers import raw_state
from _support import FUZZ_SCALE, WORK, Boom, work_rows

CALLS = ["session_lock", "xact_lock", "run_job", "run_job-session", "run_once"]


@contextlib.contextmanager
def interrupting(delay: float | None) -> Iterator[list[bool]]:
    """Send the main thread a real SIGINT ``delay`` seconds from now, while the block runs
    (never after it: the signal is sent and the block left under one lock). The list it
    yields says afterwards whether a KeyboardInterrupt came, which it swallows."""
    main = threading.main_thread().ident
    assert main is not None
    assert main == threading.get_ident(), "a signal interrupts the main thread only"
    guard = threading.Lock()
    inside = [True]
    came = [False]
    go = threading.Event()  # set inside the block: no signal lands before it

    def interrupt() -> None:
        go.wait()
        time.sleep(delay or 0)
        with guard:
            if inside[0]:
                signal.pthread_kill(main, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt)
    if delay is not None:
        interrupter.start()
    report = sys.unraisablehook

    def drop_lost_interrupts(unraisable: Any) -> None:
        # A Ctrl-C that lands in a __del__ or a gc callback is dropped by Python (the call
        # goes on, uninterrupted): so it is for a user, and not a failure of this test.
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            report(unraisable)

    sys.unraisablehook = drop_lost_interrupts
    try:
        try:
            go.set()
            yield came
        finally:
            with guard:
                inside[0] = False
            # A signal sent just before is handled at the next Python call: this one.
            if delay is not None:
                interrupter.join()
    except KeyboardInterrupt:
        came[0] = True
        if delay is not None:
            interrupter.join()
    finally:
        sys.unraisablehook = report


class AsFound(RuleBasedStateMachine):
    dsn: str = ""
    observer: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.bare = psycopg.connect(self.dsn, autocommit=True)
        self.holder = psycopg.connect(self.dsn, autocommit=True)
        self.engine = sqlalchemy.create_engine(
            "postgresql+psycopg://", creator=lambda: psycopg.connect(self.dsn), pool_size=1
        )
        pgsolo.sqlalchemy.install(self.engine)
        self.fresh_bare = raw_state(self.bare)
        with self.engine.connect() as conn:
            self.fresh_pooled = self.pooled_state(conn)
        self.name = f"stateful-{uuid.uuid4().hex}"

    @staticmethod
    def pooled_state(conn: sqlalchemy.Connection) -> dict[str, object]:
        return {
            "in_transaction": conn.in_transaction(),
            "driver": raw_state(conn.connection.driver_connection),
        }

    def teardown(self) -> None:
        self.bare.close()
        self.holder.close()
        self.engine.dispose()

    def perform(
        self, call: str, conn: Any, execute: Callable[[str], object], *, raises: bool
    ) -> None:
        tag = str(uuid.uuid4())

        def work(*_: object) -> None:
            execute(f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'work')")
            if raises:
                raise Boom

        name = self.name
        if call == "session_lock":
            with pgsolo.session_lock(conn, name) as lock:
                if lock.acquired:
                    work()
        elif call == "xact_lock":
            with pgsolo.xact_lock(conn, name) as lock:
                if lock.acquired:
                    work()
        elif call == "run_once":
            pgsolo.run_once(conn, f"{name}:{tag}", work)
        else:
            lifetime = "session" if call == "run_job-session" else "xact"
            pgsolo.run_job(conn, name, work, lifetime=lifetime)

    @rule(
        call=st.sampled_from(CALLS),
        pooled=st.booleans(),
        raises=st.booleans(),
        held_elsewhere=st.booleans(),
        interrupt_after=st.one_of(st.none(), st.floats(0, 0.02)),
    )
    def a_call(
        self,
        call: str,
        pooled: bool,
        raises: bool,
        held_elsewhere: bool,
        interrupt_after: float | None,
    ) -> None:
        with contextlib.ExitStack() as stack:
            if held_elsewhere:
                held = stack.enter_context(pgsolo.session_lock(self.holder, self.name))
                assert held.acquired
            with interrupting(interrupt_after):
                try:
                    if pooled:
                        with self.engine.connect() as conn:
                            self.perform(
                                call,
                                conn,
                                lambda s: conn.execute(sqlalchemy.text(s)),
                                raises=raises,
                            )
                    else:
                        self.perform(call, self.bare, self.bare.execute, raises=raises)
                except (Boom, pgsolo.PgsoloError):
                    pass

    @invariant()
    def the_bare_connection_is_as_found(self) -> None:
        assert raw_state(self.bare) == self.fresh_bare
        assert self.observer.advisory(pid=self.bare.info.backend_pid) == set()
        assert pgsolo.held_session_locks(self.bare) == []

    @invariant()
    def the_pools_connection_is_as_found_and_behaves(self) -> None:
        with self.engine.connect() as conn:
            assert self.pooled_state(conn) == self.fresh_pooled
            pid = conn.connection.driver_connection.info.backend_pid
            assert self.observer.advisory(pid=pid) == set()
            tag = str(uuid.uuid4())
            with conn.begin() as transaction:
                conn.execute(
                    sqlalchemy.text(f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'x')")
                )
                transaction.rollback()
            assert work_rows(self.observer, tag) == []
            assert self.pooled_state(conn) == self.fresh_pooled


@pytest.mark.timeout(300)
def test_a_random_mix_of_calls_endings_and_interrupts_leaves_everything_as_found(
    db: str, observer: Any
) -> None:
    AsFound.dsn, AsFound.observer = db, observer
    # No shrinking and no example database: an interruption lands where it lands, so a
    # failing mix does not replay the same; the first failure is reported as it happened.
    machine = settings(
        max_examples=15 * FUZZ_SCALE,
        stateful_step_count=15,
        phases=[Phase.generate],
        database=None,
        report_multiple_bugs=False,
    )(AsFound)
    machine.TestCase().runTest()
