"""The fault injector: a thread of the driver that, with its own seeded random numbers,
breaks things on this machine only (loopback connections, processes we started) a
bounded number of times, and counts what it did.

Kinds: ``kill_worker`` (SIGKILL of a worker process; the driver starts it again),
``sigint_worker`` (SIGINT of a worker process: a Ctrl-C in whatever it is doing; these
come apart from the others, every 0.2-1 s, from a thread of their own),
``terminate_backend`` (``pg_terminate_backend`` of a random advisory-lock holder),
``server_restart`` (``pg_ctl restart -m fast``), ``relay_blackhole`` (the relay passes
nothing on for 1-4 s), ``relay_reset`` (the relay resets its connections) and
``server_sigstop`` (SIGSTOP of the postmaster for under 2 s, then SIGCONT). The first
faults are every available kind once, in a seeded order, and the workers go on past their
quotas until each has happened (``every_kind_done``), so that a short run sees each.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
from collections.abc import Callable
from contextlib import suppress

import psycopg

from pgsolo.testing import Relay, Server

KINDS = (
    "kill_worker",
    "sigint_worker",
    "terminate_backend",
    "server_restart",
    "relay_blackhole",
    "relay_reset",
    "server_sigstop",
)
WEIGHTS = {
    "kill_worker": 3,
    "terminate_backend": 5,
    "server_restart": 1,
    "relay_blackhole": 3,
    "relay_reset": 2,
    "server_sigstop": 2,
}
HOLDERS = """SELECT DISTINCT pid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid() ORDER BY pid"""


class Injector(threading.Thread):
    def __init__(
        self,
        *,
        seed: int,
        dsn: str,
        relay: Relay,
        server: Server | None,
        kill_worker: Callable[[random.Random], bool],
        interrupt_worker: Callable[[random.Random], bool],
        max_faults: int,
        max_restarts: int,
        max_interrupts: int,
    ) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.rng = random.Random(seed * 7919 + 1)
        self.dsn = dsn
        self.relay = relay
        self.server = server
        self.kill_worker = kill_worker
        self.interrupt_worker = interrupt_worker
        self.max_faults = max_faults
        self.max_restarts = max_restarts
        self.max_interrupts = max_interrupts
        self.interrupter = threading.Thread(
            target=self._interrupt, name="chaos-interrupts", daemon=True
        )
        self.available = [
            k
            for k in KINDS
            if k != "sigint_worker" and (server is not None or not k.startswith("server_"))
        ]
        self.counts = dict.fromkeys(KINDS, 0)
        self.errors: list[str] = []
        self.stopping = threading.Event()

    @property
    def every_kind_done(self) -> bool:
        """Every kind this run injects happened at least once (a Ctrl-C too, if any)."""
        kinds = [*self.available, "sigint_worker"] if self.max_interrupts else self.available
        return all(self.counts[k] for k in kinds)

    def _interrupt(self) -> None:
        rng = random.Random(self.rng.random())
        while not self.stopping.wait(rng.uniform(0.2, 1.0)):
            if self.counts["sigint_worker"] >= self.max_interrupts:
                return
            with suppress(OSError):
                self.counts["sigint_worker"] += self.interrupt_worker(rng)

    def run(self) -> None:
        if self.max_interrupts:
            self.interrupter.start()
        first = list(self.available)
        self.rng.shuffle(first)
        while not self.stopping.is_set() and self._faults < self.max_faults:
            # the first round quickly, so that even a short run sees every kind
            self.stopping.wait(self.rng.uniform(0.2, 0.5) if first else self.rng.uniform(0.3, 1.5))
            if self.stopping.is_set():
                return
            if first:
                kind = first.pop()
            else:
                kinds = [k for k in self.available if k != "server_restart" or self._restarts_left]
                kind = self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
            try:
                if self._inject(kind):
                    self.counts[kind] += 1
                elif kind not in first and not self.counts[kind]:
                    first.append(kind)  # nothing to do now (no holder): try again later
            except (OSError, subprocess.SubprocessError, psycopg.Error) as exc:
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")

    @property
    def _faults(self) -> int:
        return sum(n for kind, n in self.counts.items() if kind != "sigint_worker")

    @property
    def _restarts_left(self) -> bool:
        return self.counts["server_restart"] < self.max_restarts

    def _inject(self, kind: str) -> bool:
        if kind == "kill_worker":
            return self.kill_worker(self.rng)
        if kind == "terminate_backend":
            return self._terminate()
        if kind == "relay_blackhole":
            self.relay.blackhole(self.rng.uniform(1.0, 4.0))
            return True
        if kind == "relay_reset":
            self.relay.reset()
            return True
        assert self.server is not None
        if kind == "server_restart":
            self.server.restart()
        else:
            self.server.pause(self.rng.uniform(0.3, 1.9))
        return True

    def _terminate(self) -> bool:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            pids = [row[0] for row in conn.execute(HOLDERS)]
            if not pids:
                return False
            row = conn.execute(
                "SELECT pg_terminate_backend(%s)", (self.rng.choice(pids),)
            ).fetchone()
            return bool(row and row[0])

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=130)
        if self.interrupter.is_alive():
            self.interrupter.join(timeout=10)
        if self.server is not None:  # whatever happened, the server must run on
            with suppress(OSError, ValueError):
                os.kill(self.server.postmaster_pid(), signal.SIGCONT)
