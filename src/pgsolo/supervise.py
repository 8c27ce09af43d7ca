"""The supervisor behind ``pgsolo run`` (DESIGN §5): a command under a session lock.

One attempt, start to end:

1. connect on one pinned connection named ``pgsolo:<job>`` (failure: exit 69);
2. with ``--record`` or ``--once-per``, check that ``pgsolo migrate`` has run (if not:
   "run pgsolo migrate first", exit 2, before any lock is taken or anything runs);
3. take the session lock, trying once or waiting up to ``--wait`` seconds (busy or timed
   out: outcome ``skipped``/``busy``, exit 75);
4. with ``--once-per``, ask whether this period is already done, by the database's clock
   and with the lock held (done: ``skipped``/``already-done-this-period``, exit 75);
5. start COMMAND (no shell; stdio inherited) and wait for it. Every ``--check-interval``
   seconds ask ``pg_locks`` whether the lock is still held on the pinned connection; if
   the connection died (or the lock is gone), COMMAND gets SIGTERM, then SIGKILL after
   ``--grace`` seconds, and the outcome is ``lost``, exit 70. SIGTERM and SIGINT sent to
   pgsolo are forwarded to COMMAND and pgsolo keeps waiting for it;
6. COMMAND exited 0: ``completed`` (with ``--once-per`` the period is recorded now, while
   the lock is still held); anything else: ``failed`` with its exit code passed through
   (128+N when killed by signal N; 127/126 when it cannot be started, as a shell does);
7. release the lock (always, in ``finally``; a release that finds the lock gone turns the
   outcome into ``lost``), log and count the outcome, and with ``--record`` write one
   ledger row (over a fresh connection when the pinned one died).

A Ctrl-C typed in a terminal reaches COMMAND directly (it is in the terminal's foreground
process group), so pgsolo forwards a SIGINT only when COMMAND is not in that group: the
command never sees one keystroke twice. ``kill -INT`` aimed at a pgsolo that runs in the
foreground of a terminal is therefore not forwarded.

Nothing printed or recorded here carries a password: messages from the driver go through
:func:`~pgsolo.dsn.scrub_secrets`, and the command line of COMMAND is never shown.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import psycopg

from . import ledger, sql
from .cli import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_SKIPPED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
)
from .connect import open_connection
from .drivers import SyncDriver, adapt_sync
from .dsn import scrub_secrets
from .errors import LockLostError, LockNotHeldError, LockTimeoutError, PgsoloError
from .jobs import Job, JobResult, Outcome, ledger_statements, report
from .locks import Lock, session_lock

__all__ = ["EXIT_CANNOT_EXECUTE", "EXIT_NOT_FOUND", "RunReport", "supervise"]

logger = logging.getLogger("pgsolo")

EXIT_NOT_FOUND = 127  # as a shell: the command does not exist
EXIT_CANNOT_EXECUTE = 126  # as a shell: it exists but cannot be executed
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SQLSTATES_NOT_MIGRATED = frozenset({"42P01", "3F000"})  # undefined table / schema


class CommandFailed(Exception):
    """What the ledger's ``error`` column says about a command killed by a signal."""


@dataclass(slots=True)
class RunReport:
    """How one ``pgsolo run`` ended; :meth:`as_dict` is the ``--json`` object."""

    exit_code: int
    outcome: Outcome | None  # None: the attempt never got as far as the lock
    reason: str | None
    job: str
    key: str
    key_name: str | None
    lock_wait: float = 0.0
    duration: float = 0.0
    backend_pid: int | None = None
    database: str | None = None
    server: str | None = None
    application_name: str | None = None
    command_exit_code: int | None = None
    error: str | None = None
    """A one-line explanation for a person (never a password)."""
    recorded: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "job": self.job,
            "key": self.key,
            "key_name": self.key_name,
            "exit_code": self.exit_code,
            "command_exit_code": self.command_exit_code,
            "lock_wait_seconds": round(self.lock_wait, 6),
            "duration_seconds": round(self.duration, 6),
            "backend_pid": self.backend_pid,
            "database": self.database,
            "server": self.server,
            "application_name": self.application_name,
            "recorded": self.recorded,
            "error": self.error,
        }


def supervise(
    job: Job,
    command: Sequence[str],
    *,
    dsn: str,
    label: str,
    check_interval: float = 1.0,
    grace: float = 10.0,
) -> RunReport:
    """Run ``command`` as one attempt at ``job`` (see the module docstring).

    ``job`` comes from :meth:`Job.define` with ``lifetime="session"``; ``dsn`` is already
    resolved (``database()`` in :mod:`pgsolo.cli`), ``label`` is its printable form.
    Raises :class:`~pgsolo.cli.CliError` (exit 2) when the ledger tables are needed and
    missing; every other ending is a :class:`RunReport`.
    """
    if not command:
        raise CliError("no command to run", EXIT_USAGE)
    return _Attempt(job, list(command), dsn, label, check_interval, grace).run()


@dataclass
class _Attempt:
    job: Job
    command: list[str]
    dsn: str
    label: str
    check_interval: float
    grace: float
    application_name: str = ""
    report: RunReport = field(init=False)

    def __post_init__(self) -> None:
        self.application_name = self.job.application_name_for(self.dsn)
        self.report = RunReport(
            exit_code=EXIT_UNAVAILABLE,
            outcome=None,
            reason=None,
            job=self.job.name,
            key=self.job.key.text,
            key_name=self.job.key.name,
            application_name=self.application_name,
        )

    def _scrub(self, exc: BaseException | str) -> str:
        return scrub_secrets(str(exc).strip(), self.dsn)

    def _unavailable(self, exc: BaseException) -> RunReport:
        self.report.exit_code = EXIT_UNAVAILABLE
        self.report.reason = "database-unavailable"
        self.report.error = f"database unavailable ({self.label}): {self._scrub(exc)}"
        return self.report

    # -- the attempt ---------------------------------------------------------------------

    def run(self) -> RunReport:
        with ExitStack() as stack:
            report = self._connected(stack)
        return report

    def _connected(self, stack: ExitStack) -> RunReport:
        """Connect (closed by ``stack``), take the lock, and go on from there."""
        try:
            conn = stack.enter_context(
                open_connection(self.dsn, application_name=self.application_name)
            )
            driver = adapt_sync(conn)
            info = driver.server_info()
            self.report.backend_pid = driver.backend_pid()
            self.report.database, self.report.server = info.database, info.address
            self.report.application_name = info.application_name
            if self.job.record or self.job.period is not None:
                self._check_migrated(conn)
            lock = session_lock(conn, self.job.key, wait=self.job.wait)
            started = time.perf_counter()
            try:
                acquired = lock.acquire()
            except LockTimeoutError:
                acquired = False
            self.report.lock_wait = time.perf_counter() - started
        except psycopg.Error as exc:
            return self._unavailable(exc)
        if not acquired:
            result = self._result("skipped", reason="busy")
            self._finish(result, driver, EXIT_SKIPPED)
            if self.job.record:
                self._warn_if_mostly_skipped(conn)
            return self.report
        return self._run_locked(conn, driver, lock)

    def _check_migrated(self, conn: psycopg.Connection[Any]) -> None:
        version = ledger.schema_version(conn)
        if version < ledger.LATEST_VERSION:
            needs = "--record" if self.job.record else "--once-per"
            raise CliError(
                f"{needs} needs pgsolo's tables, and {self.label} has schema version"
                f" {version} (this pgsolo needs {ledger.LATEST_VERSION}): run pgsolo migrate"
                " first",
                EXIT_USAGE,
            )

    def _run_locked(
        self, conn: psycopg.Connection[Any], driver: SyncDriver, lock: Lock
    ) -> RunReport:
        try:
            ended = self._locked(driver, lock)
        finally:
            problem = self._release(lock)
        if ended is None:  # the database went away before the command started
            return self.report
        result, exit_code = ended
        if problem is not None and result.outcome in ("completed", "failed"):
            # The lock was gone by the time the command ended: at most once is not
            # guaranteed for this run, whatever the command said.
            detail = self._scrub(problem)
            logger.error(
                "pgsolo: lock %s was no longer held when job %s ended: %s",
                self.job.key,
                self.job.name,
                detail,
            )
            reason = "connection-lost" if driver.is_closed() else "lock-released"
            result = self._result("lost", reason=reason, error=problem, duration=result.duration)
            exit_code = EXIT_LOST
            self.report.error = f"lock {self.job.key} was lost while the command ran: {detail}"
        self._finish(result, driver, exit_code)
        return self.report

    def _locked(self, driver: SyncDriver, lock: Lock) -> tuple[JobResult[None], int] | None:
        """Everything that happens with the lock held; None if the database went away."""
        if self.job.period is not None:
            try:
                done = driver.fetch_value([sql.period_done(self.job.name, self.job.period)])
            except psycopg.Error as exc:
                self._raise_if_not_migrated(driver, exc)
                self._unavailable(exc)
                return None
            if done is True:
                return self._result("skipped", reason="already-done-this-period"), EXIT_SKIPPED
        return self._run_command(driver, lock)

    def _raise_if_not_migrated(self, driver: SyncDriver, exc: BaseException) -> None:
        if driver.sqlstate(exc) in SQLSTATES_NOT_MIGRATED:
            raise CliError(
                f"pgsolo's tables are missing in {self.label}: run pgsolo migrate first",
                EXIT_USAGE,
            ) from exc

    def _run_command(self, driver: SyncDriver, lock: Lock) -> tuple[JobResult[None], int]:
        child = _Child(self.command)
        started = time.perf_counter()
        with child.forwarding_signals():
            try:
                proc = child.start()
            except OSError as exc:
                code = EXIT_NOT_FOUND if _not_found(exc) else EXIT_CANNOT_EXECUTE
                reason = "command-not-found" if code == EXIT_NOT_FOUND else "cannot-execute"
                self.report.command_exit_code = code
                self.report.error = f"cannot run {self.command[0]!r}: {self._scrub(exc)}"
                return self._result("failed", reason=reason, error=exc), code
            returncode, lost = self._watch(child, proc, driver, lock)
            duration = time.perf_counter() - started
            return self._ended(driver, returncode, lost, duration)

    def _ended(
        self,
        driver: SyncDriver,
        returncode: int,
        lost: tuple[str, str] | None,
        duration: float,
    ) -> tuple[JobResult[None], int]:
        """The outcome of a command that ran; records the period after a success."""
        status = returncode if returncode >= 0 else 128 - returncode
        self.report.command_exit_code = status
        if lost is not None:
            reason, detail = lost
            self.report.error = (
                f"lock {self.job.key} was lost while the command ran ({detail});"
                f" the command was stopped (exit status {status})"
            )
            lost_error = LockLostError(self.report.error, key=self.job.key)
            return self._result("lost", reason=reason, error=lost_error, duration=duration), (
                EXIT_LOST
            )
        if returncode < 0:
            killed = CommandFailed(f"killed by signal {-returncode} ({_signal_name(-returncode)})")
            result = self._result(
                "failed", reason="killed-by-signal", error=killed, duration=duration
            )
            return result, status
        if returncode != 0:
            return self._result("failed", duration=duration), status
        if self.job.period is not None and (problem := self._record_period(driver)):
            if driver.is_closed():
                result = self._result(
                    "lost", reason="connection-lost", error=problem, duration=duration
                )
                return result, EXIT_LOST
            # The work is done but its period is not marked: the next run in this period
            # will do it again. Say so with a failure rather than a silent 0.
            result = self._result(
                "failed", reason="period-not-recorded", error=problem, duration=duration
            )
            return result, EXIT_FAILED
        return self._result("completed", duration=duration), EXIT_OK

    def _watch(
        self, child: _Child, proc: subprocess.Popen[bytes], driver: SyncDriver, lock: Lock
    ) -> tuple[int, tuple[str, str] | None]:
        """Wait for the command; stop it if the lock goes. Returns its return code and,
        if the lock was lost, (reason, detail)."""
        lost: tuple[str, str] | None = None
        kill_at: float | None = None
        while True:
            timeout = self.check_interval
            if kill_at is not None:
                timeout = max(0.0, min(timeout, kill_at - time.monotonic()))
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            else:
                child.log_forwarded()
                return returncode, lost
            child.log_forwarded()
            if lost is None:
                lost = self._check(driver, lock)
                if lost is not None:
                    logger.error(
                        "pgsolo: lock %s of job %s lost while the command ran (%s):"
                        " sending SIGTERM to pid %d, SIGKILL in %gs if it is still running",
                        self.job.key,
                        self.job.name,
                        lost[1],
                        proc.pid,
                        self.grace,
                    )
                    _send(proc, signal.SIGTERM)
                    kill_at = time.monotonic() + self.grace
            elif kill_at is not None and time.monotonic() >= kill_at:
                logger.error(
                    "pgsolo: the command (pid %d) outlived the %gs grace period: SIGKILL",
                    proc.pid,
                    self.grace,
                )
                _send(proc, signal.SIGKILL)
                kill_at = None

    def _check(self, driver: SyncDriver, lock: Lock) -> tuple[str, str] | None:
        """None while the lock is held; (reason, detail) once it is not."""
        try:
            if lock.is_held():
                return None
        except (psycopg.Error, PgsoloError) as exc:
            if not driver.is_closed():
                # The session is alive, so its session lock is too: a failed check on a
                # live connection says nothing about the lock. Check again next tick.
                logger.warning("pgsolo: checking lock %s failed: %r", self.job.key, exc)
                return None
            return "connection-lost", f"the database connection failed: {self._scrub(exc)}"
        if driver.is_closed():
            return "connection-lost", "the database connection is closed"
        return "lock-released", "pg_locks no longer shows it on pgsolo's connection"

    def _record_period(self, driver: SyncDriver) -> BaseException | None:
        """Mark the period done, with the lock still held; return the error if that
        failed (the run then does not count for its period)."""
        assert self.job.period is not None  # noqa: S101 - the caller checked
        statement = sql.period_record(
            self.job.name, self.job.period, host=socket.gethostname(), pid=os.getpid()
        )
        try:
            marked = driver.fetch_value([statement])
        except psycopg.Error as exc:
            logger.error(  # noqa: TRY400 - the message is the point, not a traceback
                "pgsolo: job %s completed but its period could not be recorded: %s",
                self.job.name,
                self._scrub(exc),
            )
            self.report.error = f"the period could not be recorded: {self._scrub(exc)}"
            return exc
        if marked is not True:
            logger.error(
                "pgsolo: job %s completed but period %s was already recorded by another run:"
                " the work ran twice in this period (do all its runs use the same key?)",
                self.job.name,
                self.job.period,
            )
        return None

    def _release(self, lock: Lock) -> BaseException | None:
        """Release the lock; return what went wrong instead of raising it."""
        if not lock.acquired:
            return None
        try:
            lock.release()
        except (LockLostError, LockNotHeldError) as exc:
            return exc
        except (psycopg.Error, PgsoloError) as exc:
            # The session ends when pgsolo closes the connection right after this, and
            # the lock with it.
            logger.warning("pgsolo: releasing %s failed: %s", self.job.key, self._scrub(exc))
        return None

    # -- the outcome ---------------------------------------------------------------------

    def _result(
        self,
        outcome: Outcome,
        *,
        reason: str | None = None,
        error: BaseException | None = None,
        duration: float = 0.0,
    ) -> JobResult[None]:
        return JobResult(
            outcome,
            self.job.name,
            self.job.key,
            reason=reason,
            error=error,
            lock_wait=self.report.lock_wait,
            duration=duration,
            backend_pid=self.report.backend_pid,
        )

    def _finish(self, result: JobResult[None], driver: SyncDriver, exit_code: int) -> None:
        self.report.outcome = result.outcome
        self.report.reason = result.reason
        self.report.duration = result.duration
        self.report.exit_code = exit_code
        try:
            report(self.job, result, driver)
        except Exception as exc:  # logging must never change the outcome
            logger.warning("pgsolo: reporting the outcome failed: %s", self._scrub(exc))
        if self.job.record:
            self.report.recorded = self._record(result, driver, exit_code)

    def _record(self, result: JobResult[None], driver: SyncDriver, exit_code: int) -> bool:
        """One ledger row; over a fresh connection when the pinned one is gone."""
        try:
            if not driver.is_closed():
                driver.fetch_value(ledger_statements(self.job, result, driver, exit_code=exit_code))
            else:
                with open_connection(self.dsn, application_name=self.application_name) as spare:
                    spare_driver = adapt_sync(spare)
                    spare_driver.fetch_value(
                        ledger_statements(self.job, result, spare_driver, exit_code=exit_code)
                    )
        except (psycopg.Error, PgsoloError) as exc:
            _warn(
                f"the {result.outcome} attempt of job {self.job.name} is not in the ledger:"
                f" {self._scrub(exc)}"
            )
            return False
        return True

    def _warn_if_mostly_skipped(self, conn: psycopg.Connection[Any]) -> None:
        try:
            rows = ledger.history(conn, job=self.job.name, limit=ledger.SKIP_WARNING_WINDOW)
        except (psycopg.Error, PgsoloError) as exc:
            logger.debug("pgsolo: reading the ledger for skip warnings failed: %r", exc)
            return
        for line in ledger.skip_warning(rows):
            _warn(line)


# -- the child process ------------------------------------------------------------------


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


class _Child:
    """COMMAND as a child process, and the signal handlers that forward to it."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []  # received before the child existed
        self.forwarded: list[int] = []  # logged by the main loop, not the handler

    def start(self) -> subprocess.Popen[bytes]:
        # No shell: COMMAND's arguments reach it exactly as given. stdio is inherited.
        self.proc = subprocess.Popen(self.command, preexec_fn=_die_with_parent())  # noqa: S603, PLW1509
        pending, self.pending = self.pending, []
        for signum in pending:  # arrived while the child was being started
            self.forward(signum)
        return self.proc

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
        _send(proc, signum)
        self.forwarded.append(signum)

    def log_forwarded(self) -> None:
        while self.forwarded and self.proc is not None:
            signum = self.forwarded.pop(0)
            logger.info(
                "pgsolo: forwarded %s to the command (pid %d)", _signal_name(signum), self.proc.pid
            )

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.forward(signum)

    @contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """Forward SIGTERM and SIGINT to the child while the block runs (main thread
        only; a signal the caller ignores stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[signal.Signals, Any] = {}
        try:
            for signum in FORWARDED_SIGNALS:
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue
                previous[signum] = signal.signal(signum, self._handle)
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


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


def _not_found(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError | NotADirectoryError)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _warn(text: str) -> None:
    print(f"pgsolo run: warning: {text}", file=sys.stderr, flush=True)
