"""COMMAND as the work of ``pgsolo run``'s job attempt: started once the lock is held,
watched with the keeper while it runs, and stopped if the lock is lost.

The job plan (:mod:`pgsolo.jobs.plan`) calls :class:`Command` where a job's function
would run. COMMAND that exits 0 is work done; one that exits non-zero, is killed by a
signal or cannot be started is a :class:`~pgsolo.jobs.definition.Failure`; a lost lock
is the plan's to judge (the keeper marked it on the lock). A signal to pgsolo that came
before COMMAND could start keeps it from starting (:class:`Interrupted`).
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from ..._logging import cli_logger as logger
from ...drivers import SyncDriver
from ...errors import LockLostError
from ...jobs.definition import Failure, Job
from ...keys import LEADER_PREFIX
from ...leadership.terms import record_term_plan
from ...locking import Keep, Keeper, LockCore, Watch, drive
from ...reasons import FailReason, LostReason
from .child import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, Child, not_found, stdin_is_terminal
from .signals import Interrupted, RunSignals, signal_name

__all__ = ["LOST_DETAIL", "Command", "CommandFailed", "Lost", "Ran"]


# The longest the loop waits before it looks again (forwarded signals to log, the grace
# period's end). COMMAND's exit (a pidfd on Linux) and the keeper's verdict (a self-pipe
# written by on_lost) wake it at once, so neither waits for this.
POLL_SECONDS = 0.05


class CommandFailed(Exception):
    """What the ledger's ``error`` column says about a command killed by a signal."""


LOST_DETAIL = {
    "connection-lost": "the database ended pgsolo's session (its backend was terminated, or"
    " the server restarted or failed over), and the lock with it",
    "connection-unresponsive": "the database did not answer the lock check within {timeout:g}s"
    " (--check-timeout), so pgsolo dropped the connection",
    "lock-released": "pg_locks no longer shows it on pgsolo's connection",
    "keeper-failed": "the keeper watching it failed (its log line says how), so nothing"
    " vouches for the lock",
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
    warned: bool = False  # --on-lost=warn: COMMAND was left to finish
    others: int = 0  # processes COMMAND started that were running then (SIGTERM too)


@dataclass(frozen=True, slots=True)
class Ran:
    """How COMMAND ended, once started."""

    returncode: int  # negative: killed by that signal
    lost: Lost | None  # the lock went while it (or what it started) ran
    lingered: int = 0  # processes it started that still ran when it exited

    @property
    def status(self) -> int:
        """Its exit status as a shell says it: 128+N when killed by signal N."""
        return _status(self.returncode)


def _status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


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
    on_lost: str = "terminate"  # or "warn" (--on-lost)
    kill_on_exit: bool = False  # stop what COMMAND left running instead of waiting for it
    started: bool = False  # the plan got as far as COMMAND
    ran: Ran | None = None
    status: int | None = None  # its exit status (127/126 when it could not be started)

    def __call__(self) -> Failure | None:
        self.started = True
        self.job = self.job.holding(self.core.spec.key)  # with --limit, the slot held
        if (leading := self.job.key.name or "").startswith(LEADER_PREFIX):
            # A standby may have waited for days on this connection: `pgsolo doctor` and
            # `pgsolo locks` show the term from its start, recorded here.
            term = record_term_plan(self.driver, leading.removeprefix(LEADER_PREFIX), None)
            drive(term, self.driver)
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
            with _Wakeup() as wakeup:
                keep = dataclasses.replace(self.keep, on_lost=wakeup)
                keeper = Keeper(Watch(self.core, keep), self.driver)
                keeper.start()
                try:
                    self.ran = ran = self._watch(child, proc, wakeup)
                finally:
                    keeper.stop()  # joined: on_lost cannot write to a closed pipe
                    child.close()
        self.status = ran.status
        if ran.returncode == 0 or (ran.lost is not None and not ran.lost.warned):
            return None
        if ran.returncode < 0:
            name = signal_name(-ran.returncode)
            killed = CommandFailed(f"killed by signal {-ran.returncode} ({name})")
            return Failure("killed-by-signal", killed)
        return Failure()

    def _watch(self, child: Child, proc: subprocess.Popen[bytes], wakeup: _Wakeup) -> Ran:
        """Wait for COMMAND and for every process it started; stop them (or warn) if the
        keeper finds the lock gone, or (--kill-on-exit) once COMMAND has exited."""
        lost: Lost | None = None
        returncode: int | None = None
        lingered = 0  # processes COMMAND left running when it exited
        stopping = False  # SIGTERM went out: processes started since get theirs too
        kill_at: float | None = None  # when SIGTERM turns into SIGKILL
        killing = False  # past kill_at: SIGKILL to whatever is left, until nothing is
        with _exit_of(proc) as exited:
            while True:
                timeout = POLL_SECONDS
                if kill_at is not None and not killing:
                    timeout = max(0.0, min(timeout, kill_at - time.monotonic()))
                # Once COMMAND exited its pidfd stays readable, and once the loss is handled
                # so does the pipe: neither is watched any more.
                watched = [
                    fd
                    for fd in (exited if returncode is None else None, None if lost else wakeup.fd)
                    if fd is not None
                ]
                select.select(watched, [], [], timeout)
                child.reap()
                child.log_forwarded()
                if returncode is None and (returncode := proc.poll()) is not None:
                    lingered = child.lingering()
                    # After a loss they are stopped already, or (--on-lost=warn) left to
                    # finish as its warning said.
                    if lingered and lost is None:
                        stopping = self._linger(child, returncode, lingered)
                        if stopping:
                            kill_at = time.monotonic() + self.grace
                if returncode is not None:
                    if stopping:
                        child.signal_all(signal.SIGTERM)  # those started since
                    if killing:
                        child.signal_all(signal.SIGKILL)
                    if not child.lingering():
                        return Ran(returncode, lost, lingered)
                if lost is None and (loss := self.core.lost) is not None:
                    if self.on_lost == "warn":
                        lost = self._warn(child, loss)
                    else:
                        lost = self._stop(child, loss)
                        stopping, kill_at = True, time.monotonic() + self.grace
                elif kill_at is not None and not killing and time.monotonic() >= kill_at:
                    who = "processes the command started" if returncode is not None else None
                    logger.error(
                        "pgsolo: %s outlived the %gs grace period: SIGKILL",
                        who or f"the command ({child.target})",
                        self.grace,
                    )
                    killing = True
                    child.signal_all(signal.SIGKILL)

    def _linger(self, child: Child, status: int, lingered: int) -> bool:
        """COMMAND exited and left ``lingered`` processes running: say so, and whether
        they are to be stopped (--kill-on-exit) rather than waited for, lock held."""
        if self.kill_on_exit:
            logger.warning(
                "pgsolo: the command exited (status %d) and left %d processes running;"
                " --kill-on-exit: SIGTERM to them, SIGKILL in %gs if they still run",
                _status(status),
                lingered,
                self.grace,
            )
            child.signal_all(signal.SIGTERM)
            return True
        logger.warning(
            "pgsolo: the command exited (status %d) and left %d processes running; the lock"
            " of job %s stays held until they end (--kill-on-exit stops them instead)",
            _status(status),
            lingered,
            self.job.name,
        )
        return False

    def _detail(self, loss: LockLostError) -> str:
        """The loss in plain words (the keeper's log line has the driver's message)."""
        return LOST_DETAIL.get(loss.reason or "", "").format(
            timeout=self.keep.timeout
        ) or self.scrub(loss)

    def _warn(self, child: Child, loss: LockLostError) -> Lost:
        """--on-lost=warn: say it once, and let COMMAND finish."""
        logger.warning(
            "pgsolo: lock %s of job %s was lost while the command ran; --on-lost=warn: %s"
            " keeps running, no longer protected (pgsolo exits 70 when it ends, unless it"
            " fails)",
            self.job.key,
            self.job.name,
            child.target,
        )
        return Lost(
            loss.reason or "connection-lost", self._detail(loss), stopped=False, warned=True
        )

    def _stop(self, child: Child, loss: LockLostError) -> Lost:
        """The lock is gone: SIGTERM to COMMAND (SIGKILL after the grace period)."""
        logger.error(
            "pgsolo: lock %s of job %s was lost while the command ran: sending SIGTERM to"
            " %s, SIGKILL in %gs if it is still running",
            self.job.key,
            self.job.name,
            child.target,
            self.grace,
        )
        running, others = not child.exited, child.lingering()
        child.signal_all(signal.SIGTERM)
        return Lost(
            loss.reason or "connection-lost", self._detail(loss), stopped=running, others=others
        )


class _Wakeup:
    """A self-pipe: the keeper's ``on_lost`` writes to it (from the keeper's thread), and
    the loop waiting for COMMAND wakes at once instead of at its next look."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def __call__(self, error: LockLostError) -> None:
        with suppress(BlockingIOError):  # already written: once is enough
            os.write(self._write, b"!")

    def __enter__(self) -> _Wakeup:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        os.close(self._write)


@contextmanager
def _exit_of(proc: subprocess.Popen[bytes]) -> Iterator[int | None]:
    """A descriptor that turns readable when COMMAND exits (a pidfd, Linux 5.3+), or None
    where there is none: then the loop looks every POLL_SECONDS."""
    try:
        fd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, an old kernel, or already reaped
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)
