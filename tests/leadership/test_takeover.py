"""The leader's process dies (``kill -9``, no ``finally`` of its own runs): its session
ends with it, and a waiting candidate leads, with a larger token, only after that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _leader_child
import pgsolo
from _support import eventually, unique_name
from pgsolo.keys import leader_key

CHILD = Path(_leader_child.__file__).resolve()
DEADLINE = 20.0  # generous: a process starts, imports and connects in this time


def test_a_killed_leaders_successor_leads_after_it_is_gone(db: str, observer: Any) -> None:
    name = unique_name("leader")
    child = subprocess.Popen(
        [sys.executable, str(CHILD), db, name],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        said = child.stdout.readline().split()
        assert said[0] == "leading", said
        first_token, first_pid = int(said[1]), int(said[2])
        assert observer.holders(leader_key(name)) == {first_pid}
        led: list[int | None] = []

        def successor() -> None:
            with pgsolo.leader(db, name) as term:
                led.append(term.token)

        thread = threading.Thread(target=successor)
        thread.start()
        eventually(lambda: observer.waiters(leader_key(name)), "the successor's wait")
        time.sleep(0.3)
        assert not led  # it waits while the leader lives
        os.kill(child.pid, signal.SIGKILL)
        child.wait(DEADLINE)
        thread.join(DEADLINE)
        assert led, "no successor led"
        token = led[0]
        assert token is not None
        assert token > first_token
        gone = observer.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first_pid,)
        ).fetchone()
        assert gone == (0,)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(DEADLINE)
