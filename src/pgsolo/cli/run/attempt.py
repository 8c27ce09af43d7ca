"""The supervisor behind ``pgsolo run`` (DESIGN §5): a command under a session lock.

One attempt, start to end:

1. connect on one pinned connection named ``pgsolo:<job>`` (failure: exit 69);
2. with ``--record`` or ``--once-per``, check that ``pgsolo migrate`` has run (if not:
   "run pgsolo migrate first", exit 2, before any lock is taken or anything runs);
3. take the session lock, trying once or waiting up to ``--wait`` seconds (busy or timed
   out: outcome ``skipped``/``busy``, exit 75; behind a transaction-pooling proxy, where a
   session lock cannot work, nothing is taken: ``failed``/``transaction-pooling``, exit 78);
4. with ``--once-per``, ask whether this period is already done, by the database's clock
   and with the lock held (done: ``skipped``/``already-done-this-period``, exit 75);
5. start COMMAND (no shell; stdio inherited) and wait for it. The keeper
   (:mod:`pgsolo.keeper`) asks every ``--check-interval`` seconds, on the pinned
   connection, whether the lock is still held there; if the connection died, did not
   answer within ``--check-timeout`` seconds, or the lock is gone, COMMAND gets SIGTERM,
   then SIGKILL after ``--grace`` seconds, and the outcome is ``lost``, exit 70 (78 when
   a transaction-pooling proxy moved the connection to another backend). SIGTERM and
   SIGINT sent to pgsolo are forwarded to COMMAND and pgsolo keeps waiting for it;
6. COMMAND exited 0: ``completed`` (with ``--once-per`` the period is recorded now, while
   the lock is still held); anything else: ``failed`` with its exit code passed through
   (128+N when killed by signal N; 127/126 when it cannot be started, as a shell does);
7. release the lock (always, in ``finally``; a release that finds the lock gone turns the
   outcome into ``lost``), log and count the outcome, and with ``--record`` write one
   ledger row (over a fresh connection when the pinned one died).

Signals. SIGTERM and SIGINT are handled from before pgsolo connects until it is done: one
that arrives while pgsolo connects or waits for the lock ends the wait (psycopg cancels the
statement), and one that arrives before COMMAND exists keeps it from being started; either
way the outcome is ``failed``/``interrupted``, exit 128+N, with the lock released and the
attempt recorded. While COMMAND runs they are forwarded to it.

Process groups. When stdin is not a terminal (cron, systemd, Kubernetes), COMMAND leads a
process group of its own and every signal pgsolo sends (SIGTERM/SIGKILL after a lost lock,
a forwarded SIGTERM or SIGINT) goes to the whole group, so what COMMAND started stops with
it; after a lost lock the group gets the same ``--grace`` as COMMAND, then SIGKILL. When
stdin is a terminal, COMMAND stays in pgsolo's group, the terminal's foreground group, so
that it can read the terminal and a Ctrl-C reaches all of it directly; pgsolo then signals
COMMAND's own process only, and forwards a SIGINT only when COMMAND is not in the
terminal's foreground group, so it never sees one keystroke twice (``kill -INT`` aimed at
a pgsolo in the foreground of a terminal is therefore not forwarded). The parent-death
signal that kills COMMAND if pgsolo itself is killed reaches COMMAND's own process only.

Deadlines. Connecting is bounded by ``--connect-timeout`` (each host of a multi-host
DSN; a ``connect_timeout`` in the DSN wins, then ``PGCONNECT_TIMEOUT``). Every exchange
on the pinned connection has a hard deadline, ``--check-timeout`` (plus ``--wait`` for
the lock itself): the keeper's beats have it built in, and for pgsolo's other statements
the driver shuts the connection's socket down if the server has not answered by then (a
half-open TCP connection, a stopped backend), so nothing blocks forever: before the lock
is held that is exit 69, after it the lock counts as lost (``connection-unresponsive``).
The connection also uses TCP keepalives and ``tcp_user_timeout`` sized from
``--check-timeout`` (unless the DSN sets them), so a dead peer is noticed between checks
too; a ledger row after a lost connection goes over a fresh connection, bounded the same
way.

Nothing printed or recorded here carries a password: messages from the driver go through
:func:`~pgsolo.dsn.scrub_secrets`, and the command line of COMMAND is never shown.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import sql
from ..._logging import logger
from ..._types import Outcome
from ...drivers import ServerInfo, SyncDriver, adapt_sync, driver_errors
from ...drivers.connect import open_connection
from ...drivers.conninfo import connection_settings, scrub_secrets
from ...errors import (
    DatabaseUnavailableError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    PgsoloError,
    UnsafeConnectionError,
)
from ...jobs.definition import Job, JobResult
from ...jobs.record import SKIP_WARNING_WINDOW, history, ledger_statements, skip_warning
from ...jobs.report import report
from ...locking.factory import session_lock
from ...locking.keeper import Keep
from ...locking.lock import Lock
from ...reasons import FailReason, LostReason, Reason
from ...schema import LATEST_VERSION, schema_version
from ..common import CliError
from ..exit_codes import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_SKIPPED,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    import psycopg
from .child import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, Child, not_found, stdin_is_terminal
from .report import LOST_DETAIL, CommandFailed, Lost, RunReport
from .signals import Interrupted, RunSignals, signal_name

__all__ = ["DEFAULT_CHECK_TIMEOUT", "supervise"]

# What a statement on the pinned connection raises when the database fails it or is gone.
_DATABASE_ERRORS: tuple[type[Exception], ...] = (*driver_errors(), DatabaseUnavailableError)
_ANY_ERRORS: tuple[type[Exception], ...] = (*driver_errors(), PgsoloError)


DEFAULT_CHECK_TIMEOUT = 10.0  # seconds the server has to answer on the pinned connection


POLL_SECONDS = 0.05  # how often pgsolo looks at COMMAND and at what the keeper found


def supervise(
    job: Job,
    command: Sequence[str],
    *,
    dsn: str,
    label: str,
    check_interval: float = 1.0,
    check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    connect_timeout: float | None = None,
    grace: float = 10.0,
    signals: RunSignals | None = None,
) -> RunReport:
    """Run ``command`` as one attempt at ``job`` (see the module docstring).

    ``job`` comes from :meth:`Job.define` with ``lifetime="session"``; ``dsn`` is already
    resolved (``database()`` in :mod:`pgsolo.cli`), ``label`` is its printable form.
    ``connect_timeout``: seconds to connect (None: the DSN's, ``PGCONNECT_TIMEOUT``, or
    pgsolo's default). ``signals``: SIGTERM/SIGINT handling the caller installed earlier
    (so that a signal while the embedded server starts is not lost); by default supervise
    installs its own.
    Every ending is a :class:`RunReport`, "run pgsolo migrate first" (exit 2) included;
    only an empty ``command`` raises :class:`~pgsolo.cli.CliError`.
    """
    if not command:
        raise CliError("no command to run", EXIT_USAGE)
    with ExitStack() as stack:
        if signals is None:
            signals = stack.enter_context(RunSignals().installed())
        attempt = _Attempt(
            job,
            list(command),
            dsn,
            label,
            check_interval,
            check_timeout,
            connect_timeout,
            grace,
            signals,
        )
        return attempt.run()


@dataclass
class _Attempt:
    job: Job
    command: list[str]
    dsn: str
    label: str
    check_interval: float
    check_timeout: float
    connect_timeout: float | None
    grace: float
    signals: RunSignals
    application_name: str = ""
    report: RunReport = field(init=False)
    unresponsive: bool = False  # a statement's deadline shut the pinned connection down
    info: ServerInfo | None = None
    lock: Lock | None = None

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
        self._note(exc)
        self.report.exit_code = EXIT_UNAVAILABLE
        self.report.reason = "database-unavailable"
        where = f" ({self.label})"
        detail = self._scrub(exc)
        if self._unresponsive:
            detail = f"no answer within {self.check_timeout:g}s (--check-timeout)"
        elif isinstance(exc, DatabaseUnavailableError):
            where = ""  # it says where itself
        self.report.error = f"database unavailable{where}: {detail}"
        return self.report

    def _note(self, exc: BaseException) -> None:
        """Remember whether ``exc`` (or its cause) says that a deadline shut the pinned
        connection down."""
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, DatabaseUnavailableError) and cause.unresponsive:
                self.unresponsive = True
            cause = cause.__cause__

    @property
    def _unresponsive(self) -> bool:
        """Whether a deadline or the keeper had to shut the pinned connection down."""
        loss = self.lock.loss if self.lock is not None else None
        if loss is not None and loss.reason == "connection-unresponsive":
            return True
        return self.unresponsive

    def _connection_reason(self, driver: SyncDriver) -> LostReason:
        if self._unresponsive:
            return "connection-unresponsive"
        return "connection-lost" if driver.is_closed() else "lock-released"

    # -- the attempt ---------------------------------------------------------------------

    def run(self) -> RunReport:
        with ExitStack() as stack:
            try:
                return self._connected(stack)
            except CliError as exc:  # pgsolo migrate has not run; nothing was started
                self.report.exit_code = exc.code
                self.report.reason = "not-migrated"
                self.report.error = str(exc)
                return self.report

    def _connected(self, stack: ExitStack) -> RunReport:
        """Connect (closed by ``stack``), take the lock, and go on from there."""
        conn: psycopg.Connection[Any] | None = None
        lock: Lock | None = None
        try:
            with self.signals.interruptible():
                conn = stack.enter_context(
                    open_connection(
                        self.dsn,
                        application_name=self.application_name,
                        defaults=self._settings(),
                        answer_timeout=self.check_timeout,
                    )
                )
            driver = adapt_sync(conn)
            self.info = info = driver.server_info()
            self.report.backend_pid = driver.backend_pid()
            self.report.database, self.report.server = info.database, info.address
            self.report.application_name = info.application_name
            if self.job.record or self.job.period is not None:
                self._check_migrated(conn)
            keep = Keep(interval=self.check_interval, timeout=self.check_timeout)
            self.lock = lock = session_lock(conn, self.job.key, wait=self.job.wait, keep=keep)
            started = time.perf_counter()
            try:
                with self.signals.interruptible():
                    acquired = lock.acquire()
            except LockTimeoutError:
                acquired = False
            finally:
                self.report.lock_wait = time.perf_counter() - started
        except Interrupted as exc:
            return self._interrupted(exc.signum, conn, lock)
        except _DATABASE_ERRORS as exc:
            return self._unavailable(exc)
        except UnsafeConnectionError as exc:  # a standby, or a transaction pooler
            self.report.error = str(exc)
            self._finish(self._result("failed", reason=exc.reason, error=exc), driver, EXIT_UNSAFE)
            return self.report
        if not acquired:
            result = self._result("skipped", reason="busy")
            self._finish(result, driver, EXIT_SKIPPED)
            if self.job.record:
                self._warn_if_mostly_skipped(conn)
            return self.report
        return self._run_locked(conn, driver, lock)

    def _settings(self) -> dict[str, str]:
        return connection_settings(self.check_timeout, connect_timeout=self.connect_timeout)

    def _check_migrated(self, conn: psycopg.Connection[Any]) -> None:
        version = schema_version(conn)
        if version < LATEST_VERSION:
            needs = "--record" if self.job.record else "--once-per"
            raise CliError(
                f"{needs} needs pgsolo's tables, and {self.label} has schema version"
                f" {version} (this pgsolo needs {LATEST_VERSION}): run pgsolo migrate"
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
            reason = self._connection_reason(driver)
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
            except _DATABASE_ERRORS as exc:
                self._raise_if_not_migrated(driver, exc)
                self._unavailable(exc)
                return None
            if done is True:
                return self._result("skipped", reason="already-done-this-period"), EXIT_SKIPPED
        return self._run_command(driver, lock)

    def _raise_if_not_migrated(self, driver: SyncDriver, exc: BaseException) -> None:
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NOT_MIGRATED:
            raise CliError(
                f"pgsolo's tables are missing in {self.label}: run pgsolo migrate first",
                EXIT_USAGE,
            ) from exc

    def _interrupted(
        self, signum: int, conn: psycopg.Connection[Any] | None, lock: Lock | None
    ) -> RunReport:
        """A signal ended the attempt while it connected or waited for the lock: release
        what was taken, record the attempt (best effort), exit 128+N."""
        if lock is not None:
            self._release(lock)  # a lock granted as the signal came; gone with the session
        result, exit_code = self._not_started(signum)
        if conn is None:  # nothing to log against, and no sign the ledger is reachable
            self.report.outcome, self.report.reason = result.outcome, result.reason
            self.report.exit_code = exit_code
            return self.report
        self._finish(result, adapt_sync(conn), exit_code)
        return self.report

    def _not_started(self, signum: int) -> tuple[JobResult[None], int]:
        self.report.error = (
            f"interrupted by {signal_name(signum)} before the command started; it was not run"
        )
        return self._result("failed", reason="interrupted", error=Interrupted(signum)), (
            128 + signum
        )

    def _run_command(self, driver: SyncDriver, lock: Lock) -> tuple[JobResult[None], int]:
        child = Child(self.command, own_group=not stdin_is_terminal())
        self.signals.child = child  # from now on a signal is forwarded, or kept for start()
        try:
            if (signum := self.signals.first) is not None:
                # Someone asked pgsolo to stop before COMMAND existed: do not start it.
                return self._not_started(signum)
            started = time.perf_counter()
            try:
                proc = child.start()
            except OSError as exc:
                code = EXIT_NOT_FOUND if not_found(exc) else EXIT_CANNOT_EXECUTE
                reason: FailReason = (
                    "command-not-found" if code == EXIT_NOT_FOUND else "cannot-execute"
                )
                self.report.command_exit_code = code
                self.report.error = f"cannot run {self.command[0]!r}: {self._scrub(exc)}"
                return self._result("failed", reason=reason, error=exc), code
            returncode, lost = self._watch(child, proc, driver, lock)
            duration = time.perf_counter() - started
            return self._ended(driver, returncode, lost, duration)
        finally:
            self.signals.child = None

    def _ended(
        self,
        driver: SyncDriver,
        returncode: int,
        lost: Lost | None,
        duration: float,
    ) -> tuple[JobResult[None], int]:
        """The outcome of a command that ran; records the period after a success."""
        status = returncode if returncode >= 0 else 128 - returncode
        self.report.command_exit_code = status
        if lost is not None:
            if not lost.stopped:
                self.report.error = (
                    f"lock {self.job.key} was lost ({lost.detail}); the command had already"
                    f" finished by then (exit status {status})"
                )
            else:
                if returncode < 0:
                    how = f"was stopped by {signal_name(-returncode)} (exit status {status})"
                else:
                    how = f"exited with status {status} after SIGTERM"
                self.report.error = (
                    f"lock {self.job.key} was lost while the command ran ({lost.detail});"
                    f" the command {how}"
                )
            lost_error = LockLostError(self.report.error, key=self.job.key, reason=lost.reason)
            result = self._result("lost", reason=lost.reason, error=lost_error, duration=duration)
            unsafe = lost.reason in ("connection-moved", "server-in-recovery")
            return result, EXIT_UNSAFE if unsafe else EXIT_LOST
        if returncode < 0:
            killed = CommandFailed(f"killed by signal {-returncode} ({signal_name(-returncode)})")
            result = self._result(
                "failed", reason="killed-by-signal", error=killed, duration=duration
            )
            return result, status
        if returncode != 0:
            return self._result("failed", duration=duration), status
        if self.job.period is not None and (problem := self._record_period(driver)):
            if driver.is_closed() or self._unresponsive:
                reason = self._connection_reason(driver)
                result = self._result("lost", reason=reason, error=problem, duration=duration)
                return result, EXIT_LOST
            # The work is done but its period is not marked: the next run in this period
            # will do it again. Say so with a failure rather than a silent 0.
            result = self._result(
                "failed", reason="period-not-recorded", error=problem, duration=duration
            )
            return result, EXIT_FAILED
        return self._result("completed", duration=duration), EXIT_OK

    def _watch(
        self, child: Child, proc: subprocess.Popen[bytes], driver: SyncDriver, lock: Lock
    ) -> tuple[int, Lost | None]:
        """Wait for the command; stop it if the keeper finds the lock gone. Returns its
        return code and, if the lock was lost, how."""
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
                return returncode, lost
            child.log_forwarded()
            if lost is None and (loss := lock.loss) is not None:
                detail = LOST_DETAIL.get(loss.reason, "").format(timeout=self.check_timeout)
                detail = detail or self._scrub(loss)
                logger.error(
                    "pgsolo: lock %s of job %s lost while the command ran (%s):"
                    " sending SIGTERM to %s, SIGKILL in %gs if it is still running",
                    self.job.key,
                    self.job.name,
                    detail,
                    child.target,
                    self.grace,
                )
                lost = Lost(loss.reason, detail, stopped=child.stop())
                kill_at = time.monotonic() + self.grace
            elif kill_at is not None and time.monotonic() >= kill_at:
                logger.error(
                    "pgsolo: the command (%s) outlived the %gs grace period: SIGKILL",
                    child.target,
                    self.grace,
                )
                child.signal(signal.SIGKILL)
                kill_at = None

    def _record_period(self, driver: SyncDriver) -> BaseException | None:
        """Mark the period done, with the lock still held; return the error if that
        failed (the run then does not count for its period)."""
        assert self.job.period is not None  # noqa: S101 - the caller checked
        statement = sql.period_record(
            self.job.name, self.job.period, host=socket.gethostname(), pid=os.getpid()
        )
        try:
            marked = driver.fetch_value([statement])
        except _DATABASE_ERRORS as exc:
            self._note(exc)
            logger.error(
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
            self._note(exc)
            return exc
        except _ANY_ERRORS as exc:
            self._note(exc)
            # The session ends when pgsolo closes the connection right after this, and
            # the lock with it.
            logger.warning("pgsolo: releasing %s failed: %s", self.job.key, self._scrub(exc))
        return None

    # -- the outcome ---------------------------------------------------------------------

    def _result(
        self,
        outcome: Outcome,
        *,
        reason: Reason | None = None,
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
            report(self.job, result, driver, self.info)
        except Exception as exc:  # logging must never change the outcome
            logger.warning("pgsolo: reporting the outcome failed: %s", self._scrub(exc))
        if self.job.record:
            self.report.recorded = self._record(result, driver, exit_code)

    def _record(self, result: JobResult[None], driver: SyncDriver, exit_code: int) -> bool:
        """One ledger row; over a fresh connection when the pinned one is gone. Bounded:
        ``connect_timeout`` and ``--check-timeout``, whatever state the network is in."""
        try:
            if not driver.is_closed() and not self._unresponsive:
                driver.fetch_value(ledger_statements(self.job, result, driver, exit_code=exit_code))
            else:
                with open_connection(
                    self.dsn,
                    application_name=self.application_name,
                    defaults=self._settings(),
                    answer_timeout=self.check_timeout,
                ) as spare:
                    spare_driver = adapt_sync(spare)
                    spare_driver.fetch_value(
                        ledger_statements(self.job, result, spare_driver, exit_code=exit_code)
                    )
        except _ANY_ERRORS as exc:
            _warn(
                f"the {result.outcome} attempt of job {self.job.name} is not in the ledger:"
                f" {self._scrub(exc)}"
            )
            return False
        return True

    def _warn_if_mostly_skipped(self, conn: psycopg.Connection[Any]) -> None:
        try:
            rows = history(conn, job=self.job.name, limit=SKIP_WARNING_WINDOW)
        except _ANY_ERRORS as exc:
            logger.debug("pgsolo: reading the ledger for skip warnings failed: %r", exc)
            return
        for line in skip_warning(rows):
            _warn(line)


def _warn(text: str) -> None:
    print(f"pgsolo run: warning: {text}", file=sys.stderr, flush=True)
