"""COMMAND as the work of ``pgsolo run``'s job attempt: started once the lock is held,
watched with the keeper while it runs, and stopped if the lock is lost.

The job plan (:mod:`pgsolo.jobs.plan`) calls :class:`Command` where a job's function
would run. COMMAND that exits 0 is work done; one that exits non-zero, is killed by a
signal or cannot be started is a :class:`~pgsolo.jobs.definition.Failure`; a lost lock
is the plan's to judge (the keeper marked it on the lock). A signal to pgsolo that came
before COMMAND could start keeps it from starting (:class:`Interrupted`).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..._logging import cli_logger as logger
from ...drivers import SyncDriver
from ...jobs.definition import Failure, Job
from ...locking.core import LockCore
from ...locking.keeper import Keep, Keeper
from ...reasons import FailReason, LostReason
from .child import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, Child, not_found, stdin_is_terminal
from .signals import Interrupted, RunSignals, signal_name

__all__ = ["LOST_DETAIL", "Command", "CommandFailed", "Lost", "Ran"]


POLL_SECONDS = 0.05  # how often pgsolo looks at COMMAND and at what the keeper found


class CommandFailed(Exception):
    """What the ledger's ``error`` column says about a command killed by a signal."""


LOST_DETAIL = {
    "connection-unresponsive": "the database did not answer the lock check within {timeout:g}s"
    " (--check-timeout), so pgsolo dropped the connection",
    "lock-released": "pg_locks no longer shows it on pgsolo's connection",
    "connection-moved": "the connection now reaches another server backend: a"
    " transaction-pooling proxy is in between, where session locks cannot work",
    "server-in-recovery": "the server is now in recovery (a standby), where an advisory"
    " lock coordinates nothing",
}


@dataclass(frozen=True, slots=True)
class Lost:
    """How the lock went while COMMAND ran, as the keeper found it."""

    reason: LostReason
    detail: str
    stopped: bool  # COMMAND was still running when pgsolo sent SIGTERM


@dataclass(frozen=True, slots=True)
class Ran:
    """How COMMAND ended, once started."""

    returncode: int  # negative: killed by that signal
    lost: Lost | None  # the lock went while it ran

    @property
    def status(self) -> int:
        """Its exit status as a shell says it: 128+N when killed by signal N."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode


@dataclass
class Command:
    """COMMAND, as the work the job plan calls once it holds the lock."""

    job: Job
    argv: list[str]
    core: LockCore
    driver: SyncDriver
    keep: Keep
    grace: float
    signals: RunSignals
    scrub: Callable[[BaseException], str]
    started: bool = False  # the plan got as far as COMMAND
    ran: Ran | None = None
    status: int | None = None  # its exit status (127/126 when it could not be started)

    def __call__(self) -> Failure | None:
        self.started = True
        child = Child(self.argv, own_group=not stdin_is_terminal())
        with self.signals.forwarding(child):
            if (signum := self.signals.first) is not None:
                # Someone asked pgsolo to stop before COMMAND existed: do not start it.
                raise Interrupted(signum)
            try:
                proc = child.start()
            except OSError as exc:
                self.status = EXIT_NOT_FOUND if not_found(exc) else EXIT_CANNOT_EXECUTE
                reason: FailReason = (
                    "command-not-found" if self.status == EXIT_NOT_FOUND else "cannot-execute"
                )
                return Failure(reason, exc)
            keeper = Keeper(self.core, self.driver, self.keep)
            keeper.start()
            try:
                self.ran = ran = self._watch(child, proc)
            finally:
                keeper.stop()
        self.status = ran.status
        if ran.lost is not None or ran.returncode == 0:
            return None
        if ran.returncode < 0:
            name = signal_name(-ran.returncode)
            killed = CommandFailed(f"killed by signal {-ran.returncode} ({name})")
            return Failure("killed-by-signal", killed)
        return Failure()

    def _watch(self, child: Child, proc: subprocess.Popen[bytes]) -> Ran:
        """Wait for COMMAND; stop it if the keeper finds the lock gone."""
        lost: Lost | None = None
        kill_at: float | None = None
        while True:
            timeout = POLL_SECONDS
            if kill_at is not None:
                timeout = max(0.0, min(timeout, kill_at - time.monotonic()))
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            else:
                child.log_forwarded()
                if lost is not None:
                    child.drain_group(kill_at)
                return Ran(returncode, lost)
            child.log_forwarded()
            if lost is None and (loss := self.core.lost) is not None:
                lost = self._stop(child, loss.reason, self.scrub(loss))
                kill_at = time.monotonic() + self.grace
            elif kill_at is not None and time.monotonic() >= kill_at:
                logger.error(
                    "pgsolo: the command (%s) outlived the %gs grace period: SIGKILL",
                    child.target,
                    self.grace,
                )
                child.signal(signal.SIGKILL)
                kill_at = None

    def _stop(self, child: Child, reason: LostReason, error: str) -> Lost:
        """The lock is gone: SIGTERM to COMMAND (SIGKILL after the grace period)."""
        detail = LOST_DETAIL.get(reason, "").format(timeout=self.keep.timeout) or error
        logger.error(
            "pgsolo: lock %s of job %s lost while the command ran (%s):"
            " sending SIGTERM to %s, SIGKILL in %gs if it is still running",
            self.job.key,
            self.job.name,
            detail,
            child.target,
            self.grace,
        )
        return Lost(reason, detail, stopped=child.stop())
