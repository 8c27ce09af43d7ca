"""Failover: the primary dies under a held session lock and its standby is promoted.

A session lock lives in the primary's memory only, so a failover releases it: the worker
that held it must learn that it lost it (the keeper: ``connection-lost``; ``pgsolo run``:
exit 70), and the next worker, through the same multi-host DSN, must land on the new
primary and get the key with a fencing token larger than any issued before, so that
downstream systems can refuse the old holder's late writes.

Each test gets a private primary + standby (``replica_pair``, about two seconds to
build), since a promotion cannot be undone. The primary is stopped with ``pg_ctl stop -m
immediate`` (a crash, as far as clients can tell) once the standby has replayed
everything, then the standby is promoted with ``pg_ctl promote``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import eventually, pgsolo_cli, pgsolo_in_background, touching
from pgsolo import Keep, Key, LockLostError
from pgsolo.testing import ReplicaPair

LOSS_BOUND = 30.0  # generous: the keeper beats every 0.2 s with a 2 s deadline
RUN_BOUND = 60.0  # for ``pgsolo run`` processes, which never come near it when things work


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def fail_over(pair: ReplicaPair) -> None:
    """Crash the primary once the standby has everything, then promote the standby."""
    pair.wait_replayed()
    pair.stop_primary(mode="immediate")
    pair.promote()


def test_promotion_under_a_held_session_lock_is_a_loss_and_the_key_moves_to_the_new_primary(
    replica_pair: ReplicaPair, key: Key
) -> None:
    """The keeper reports the failover as a lost lock (once, ``connection-lost``); the next
    acquisition through the same read-write multi-host DSN lands on the promoted standby
    and gets a larger fencing token (a sequence may skip ahead after a failover, never
    back); and the old lock's ``with`` block ends with ``LockLostError``."""
    dsn = replica_pair.multi_host_dsn()
    with connect(replica_pair.primary_dsn) as admin:
        pgsolo.migrate(admin)  # fencing tokens need pgsolo's sequence
    found: list[LockLostError] = []
    keep = Keep(interval=0.2, timeout=2, on_lost=found.append)
    block_ended = False
    with connect(dsn) as conn:
        assert conn.info.port == replica_pair.primary_port
        lock = pgsolo.session_lock(conn, key, keep=keep, fencing=True)
        try:
            with lock:
                assert lock.acquired
                token_before = lock.token
                assert token_before is not None

                fail_over(replica_pair)

                eventually(lambda: lock.lost, "the keeper to report the failover", LOSS_BOUND)
                assert lock.loss is not None
                assert lock.loss.reason == "connection-lost"
                assert found == [lock.loss]

                with connect(dsn) as again:
                    assert again.info.port == replica_pair.standby_port
                    assert again.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
                    with pgsolo.session_lock(again, key, fencing=True) as next_lock:
                        assert next_lock.acquired
                        assert next_lock.token is not None
                        assert next_lock.token > token_before
                block_ended = True
        except LockLostError as exc:
            at_exit = exc
        else:
            pytest.fail("the block of a lock lost in a failover ended without LockLostError")
    assert block_ended  # the block ran to its end; only its exit raised
    assert at_exit.reason == "connection-lost"
    assert found == [lock.loss]  # reported once, and the keeper is gone with the block


def test_pgsolo_run_under_a_failover_exits_70_and_the_next_run_reaches_the_new_primary(
    replica_pair: ReplicaPair, key: Key, tmp_path: Path
) -> None:
    """``pgsolo run`` through the read-write multi-host DSN loses its lock in the
    failover: COMMAND is stopped and pgsolo exits 70 (lost). The next ``pgsolo run`` with
    the same DSN reaches the promoted standby and runs its COMMAND (exit 0)."""
    dsn = replica_pair.multi_host_dsn()
    ready = tmp_path / "ready"
    waits = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(120)"
    options = ["--check-interval", "0.2", "--check-timeout", "2", "--grace", "2"]
    with pgsolo_in_background(
        "run", "--dsn", dsn, "--key", key.text, *options, "--json", "--",
        sys.executable, "-c", waits, str(ready),
    ) as first:  # fmt: skip
        eventually(ready.exists, "COMMAND to start under the lock", RUN_BOUND)
        fail_over(replica_pair)
        _, stderr = first.communicate(timeout=RUN_BOUND)
    assert first.returncode == 70, stderr
    assert json.loads(stderr.splitlines()[-1])["outcome"] == "lost"
    marker = tmp_path / "ran"
    second = pgsolo_cli("run", "--dsn", dsn, "--key", key.text, "--", *touching(marker))
    assert second.returncode == 0, second.stderr
    assert marker.exists()
