"""COMMAND as a child process: started without a shell, in a process group of its own
when stdin is not a terminal, killed with pgsolo (a parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING

from ..._logging import cli_logger as logger

if TYPE_CHECKING:
    pass
from .signals import signal_name

__all__ = ["EXIT_CANNOT_EXECUTE", "EXIT_NOT_FOUND", "Child", "not_found", "stdin_is_terminal"]


EXIT_NOT_FOUND = 127  # as a shell: the command does not exist


EXIT_CANNOT_EXECUTE = 126  # as a shell: it exists but cannot be executed


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes COMMAND die with pgsolo (Linux).

    If pgsolo itself is killed (SIGKILL, the OOM killer), its connection closes and the
    server releases the lock at once, while COMMAND would run on unprotected and a
    second host could start the same work. The kernel's parent-death signal stops it.
    """
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork

    def arm() -> None:  # runs in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # pgsolo died before the signal was armed
            os._exit(128 + signal.SIGKILL)

    return arm


_PR_SET_PDEATHSIG = 1


class Child:
    """COMMAND as a child process: started, signalled (its process group when it leads
    one, see the module docstring), and sent the signals pgsolo forwards."""

    def __init__(self, command: list[str], *, own_group: bool) -> None:
        self.command = command
        self.own_group = own_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []  # received while the child was being started
        self.forwarded: list[int] = []  # logged by the main loop, not the handler

    def start(self) -> subprocess.Popen[bytes]:
        # No shell: COMMAND's arguments reach it exactly as given. stdio is inherited.
        self.proc = subprocess.Popen(  # noqa: S603
            self.command,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 - no threads of pgsolo's run then
            process_group=0 if self.own_group else None,
        )
        pending, self.pending = self.pending, []
        for signum in pending:  # arrived while the child was being started
            self.forward(signum)
        return self.proc

    @property
    def target(self) -> str:
        """Who :meth:`signal` reaches, for log lines."""
        pid = self.proc.pid if self.proc is not None else 0
        return f"process group {pid}" if self.own_group else f"pid {pid}"

    def signal(self, signum: int) -> None:
        """Send ``signum`` to COMMAND: its whole process group when it leads one (which
        outlives COMMAND's own process while anything it started still runs)."""
        proc = self.proc
        if proc is None:
            return
        if not self.own_group:
            _send(proc, signum)
            return
        # Safe after COMMAND was reaped: a pid still in use as a process group id is never
        # given to a new process, and an empty group is an error (ESRCH).
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)

    def stop(self) -> bool:
        """SIGTERM after a lost lock; whether COMMAND was still running then."""
        running = self.proc is not None and self.proc.poll() is None
        self.signal(signal.SIGTERM)
        return running

    def group_alive(self) -> bool:
        if not self.own_group or self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def drain_group(self, kill_at: float | None) -> None:
        """After a lost lock COMMAND has exited: what it started gets the rest of the
        grace period (until ``kill_at``), then SIGKILL."""
        while self.group_alive():
            now = time.monotonic()
            if kill_at is None or now >= kill_at:
                if kill_at is not None:
                    logger.error(
                        "pgsolo: processes started by the command (%s) outlived the grace"
                        " period: SIGKILL",
                        self.target,
                    )
                self.signal(signal.SIGKILL)
                return
            time.sleep(min(0.05, kill_at - now))

    def forward(self, signum: int) -> None:
        proc = self.proc
        if proc is None:
            self.pending.append(signum)
            return
        if proc.returncode is not None:
            return
        if signum == signal.SIGINT and _terminal_sent_it_too(proc.pid):
            return
        # A signal handler must not log or print: the main thread may be halfway
        # through a write to the same stream.
        self.signal(signum)
        self.forwarded.append(signum)

    def log_forwarded(self) -> None:
        while self.forwarded and self.proc is not None:
            signum = self.forwarded.pop(0)
            logger.info("pgsolo: forwarded %s to %s", signal_name(signum), self.target)


def stdin_is_terminal() -> bool:
    return os.isatty(0)


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    with suppress(ProcessLookupError):
        proc.send_signal(signum)  # does nothing once the child has been reaped


def _terminal_sent_it_too(pid: int) -> bool:
    """Whether ``pid`` is in the foreground process group of our terminal: then a Ctrl-C
    typed there reached it already, and forwarding would deliver it twice."""
    try:
        group = os.getpgid(pid)
    except OSError:
        return False
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == group:
                return True
        except OSError:
            continue
    return False


def not_found(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError | NotADirectoryError)
