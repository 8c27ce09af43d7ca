"""The attempt behind ``pgsolo run`` (DESIGN §5): COMMAND as the work of a job attempt.

``pgsolo run`` drives the same job plan as ``run_job`` (:mod:`pgsolo.jobs.plan`), with
COMMAND as the work (:mod:`.watch`), and records through the same ledger code
(:mod:`pgsolo.jobs.record`). One attempt, start to end:

1. connect on one pinned connection named ``pgsolo:<job>`` (failure: exit 69);
2. the plan: with ``--record`` or ``--once-per``, check pgsolo's schema version (too old:
   "run pgsolo migrate first", exit 2, before any lock is taken or anything runs); take
   the session lock, trying once or waiting up to ``--wait`` seconds (busy or timed out:
   ``skipped``/``busy``, exit 75 or ``--conflict-exit-code``; on a standby, or behind a
   transaction-pooling proxy where a session lock cannot work, nothing is taken:
   ``failed`` with that reason, exit 78); with ``--once-per``, skip a period already
   done, by the database's clock and with the lock held
   (``skipped``/``already-done-this-period``, exit 75 or ``--already-done-exit-code``);
3. its work: start COMMAND (no shell; stdio inherited) and wait for it, while the keeper
   asks every ``--check-interval`` seconds, on the pinned connection, whether the lock
   is still held there; if the connection died, did not answer within
   ``--check-timeout`` seconds, or the lock is gone, COMMAND gets SIGTERM, then SIGKILL
   after ``--grace`` seconds: ``lost``, exit 70 (78 when a transaction-pooling proxy
   moved the connection to another backend); with ``--on-lost=warn`` COMMAND is left to
   finish (one WARNING), and the attempt is still ``lost``: exit 70, or COMMAND's own
   code when it failed;
4. the plan again: after COMMAND exited 0, record the period (could not: ``failed``/
   ``period-not-recorded``, exit 1), then release the lock (found gone: ``lost``, 70);
   COMMAND that exited otherwise is ``failed`` with its exit code passed through (128+N
   when killed by signal N; 127/126 when it cannot be started, as a shell does);
5. log and count the outcome and, with ``--record``, write one ledger row (over a fresh
   connection when the pinned one died). :mod:`.outcome` says what each ending means
   on the command line.

Signals (:mod:`.signals`). SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 (each
of which would kill pgsolo by default) are handled from before pgsolo connects
until it is done: one that arrives while pgsolo connects, or while the plan works before
COMMAND starts (waiting for the lock included), ends that (psycopg cancels the
statement), and one that arrives before COMMAND exists keeps it from being started;
either way the outcome is ``failed``/``interrupted``, exit 128+N, with the lock released
and the attempt recorded. While COMMAND runs they are forwarded to it.

Process groups (:mod:`.child`). When stdin is not a terminal (cron, systemd,
Kubernetes), COMMAND leads a process group of its own and every signal pgsolo sends
(SIGTERM/SIGKILL after a lost lock, a forwarded signal) goes to the whole
group, so what COMMAND started stops with it; after a lost lock the group gets the same
``--grace`` as COMMAND, then SIGKILL. When stdin is a terminal, COMMAND stays in
pgsolo's group, the terminal's foreground group, so that it can read the terminal and a
Ctrl-C reaches all of it directly; pgsolo then signals COMMAND's own process only, and
forwards a SIGINT or SIGQUIT only when COMMAND is not in the terminal's foreground group, so it
never sees one keystroke twice (``kill -INT`` aimed at a pgsolo in the foreground of a
terminal is therefore not forwarded). The parent-death signal that kills COMMAND if
pgsolo itself is killed reaches COMMAND's own process only.

What COMMAND leaves running (:mod:`.child`, :mod:`.watch`). The attempt's work ends when
COMMAND and every process it started have exited: on Linux pgsolo is a child subreaper
while they run, so orphans (a background job, a ``setsid`` or double-forking daemon) come
back to it, are waited for with the lock held and watched, signalled after a lost lock,
and reaped; ``--kill-on-exit`` stops them (SIGTERM, SIGKILL after ``--grace``) once
COMMAND exits instead. Elsewhere COMMAND's process group stands for them.

Deadlines. Connecting is bounded by ``--connect-timeout`` (each host of a multi-host
DSN; a ``connect_timeout`` in the DSN wins, then ``PGCONNECT_TIMEOUT``). Every exchange
on the pinned connection has a hard deadline, ``--check-timeout`` (plus ``--wait`` for
the lock itself): the keeper's beats have it built in, and for pgsolo's other statements
the driver shuts the connection's socket down if the server has not answered by then (a
half-open TCP connection, a stopped backend), so nothing blocks forever: before COMMAND
starts that is exit 69, while and after it runs the lock counts as lost
(``connection-unresponsive``). The connection also uses TCP keepalives and
``tcp_user_timeout`` sized from ``--check-timeout`` (unless the DSN sets them), so a
dead peer is noticed between checks too; a ledger row after a lost connection goes over
a fresh connection, bounded the same way.

Nothing printed or recorded here carries a password: messages from the driver go through
:func:`~pgsolo.drivers.conninfo.scrub_secrets`, and the command line of COMMAND is never
shown.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._logging import cli_logger as logger
from ...drivers import ServerInfo, SyncDriver, adapt_sync, driver_errors
from ...drivers.connect import open_connection
from ...drivers.conninfo import connection_settings, scrub_secrets
from ...errors import (
    DatabaseUnavailableError,
    InsufficientPrivilegeError,
    NotMigratedError,
    PgsoloError,
    UnsafeConnectionError,
)
from ...jobs._sync.record import record_result
from ...jobs.definition import Job, JobResult, job_result
from ...jobs.plan import attempt_plan, core_for
from ...jobs.report import report
from ...locking import Keep, LockCore, drive, keepalive_basis
from ...reasons import Reason
from ..common import CliError
from ..exit_codes import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_UNSAFE, EXIT_USAGE
from . import outcome
from .report import RunReport
from .signals import Interrupted, RunSignals
from .watch import Command

if TYPE_CHECKING:
    from ...drivers.kinds import SyncConnectionLike

__all__ = ["DEFAULT_CHECK_TIMEOUT", "supervise"]

# What a statement on the pinned connection raises when the database fails it or is gone.
_DATABASE_ERRORS: tuple[type[Exception], ...] = (*driver_errors(), DatabaseUnavailableError)
_ANY_ERRORS: tuple[type[Exception], ...] = (*driver_errors(), PgsoloError)


DEFAULT_CHECK_TIMEOUT = 10.0  # seconds the server has to answer on the pinned connection


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
    on_lost: str = "terminate",
    kill_on_exit: bool = False,
    skip_codes: outcome.SkipCodes | None = None,
) -> RunReport:
    """Run ``command`` as one attempt at ``job`` (see the module docstring).

    ``job`` comes from :meth:`Job.define` with ``lifetime="session"``; ``dsn`` is already
    resolved (``database()`` in :mod:`pgsolo.cli`), ``label`` is its printable form.
    ``connect_timeout``: seconds to connect (None: the DSN's, ``PGCONNECT_TIMEOUT``, or
    pgsolo's default). ``signals``: SIGTERM/SIGINT handling the caller installed earlier
    (so that a signal while the embedded server starts is not lost); by default supervise
    installs its own. ``on_lost``: ``"terminate"`` or ``"warn"`` (``--on-lost``).
    ``kill_on_exit``: stop what COMMAND left running when it exits, rather than wait for
    it with the lock held (``--kill-on-exit``).
    ``skip_codes``: the exit codes of a skip (default: 75 for both).
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
            on_lost,
            kill_on_exit,
            skip_codes or outcome.SkipCodes(),
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
    on_lost: str
    kill_on_exit: bool
    skip_codes: outcome.SkipCodes
    report: RunReport = field(init=False)
    info: ServerInfo | None = None
    started: float = 0.0  # when the plan began (the lock wait of an attempt it did not end)

    def __post_init__(self) -> None:
        self.report = RunReport(
            exit_code=EXIT_UNAVAILABLE,
            outcome=None,
            reason=None,
            job=self.job.name,
            key=self.job.key.text,
            key_name=self.job.key.name,
            application_name=self.job.application_name_for(self.dsn),
        )

    def run(self) -> RunReport:
        with ExitStack() as stack:
            try:
                with self.signals.interruptible():
                    conn = stack.enter_context(
                        open_connection(
                            self.dsn,
                            application_name=self.job.application_name_for(self.dsn),
                            defaults=self._settings(),
                            answer_timeout=self.check_timeout,
                            # A host cut off has killed COMMAND before the server
                            # lets another take the key: SIGTERM, --grace, SIGKILL.
                            check_timeout=keepalive_basis(self._keep(), stopping=self.grace),
                        )
                    )
            except Interrupted as exc:  # nothing to log against, and no sign of a ledger
                self.report.outcome, self.report.reason = "failed", "interrupted"
                self.report.exit_code = 128 + exc.signum
                self.report.error = outcome.not_started(exc.signum)
                return self.report
            except _DATABASE_ERRORS as exc:
                return self._unavailable(exc)
            return self._connected(conn, adapt_sync(conn))

    def _connected(self, conn: SyncConnectionLike, driver: SyncDriver) -> RunReport:
        """Drive the job plan with COMMAND as its work, and say how it ended."""
        self.info = info = driver.server_info()
        self.report.backend_pid = driver.backend_pid()
        self.report.database, self.report.server = info.database, info.address
        self.report.application_name = info.application_name
        core = core_for(self.job, driver)
        keep = self._keep()
        command = Command(
            self.job,
            self.command,
            core,
            driver,
            keep,
            self.grace,
            self.signals,
            self._scrub,
            on_lost=self.on_lost,
            kill_on_exit=self.kill_on_exit,
        )
        self.started = time.perf_counter()
        try:
            with self.signals.interruptible():  # until COMMAND starts; then it gets them
                result = drive(attempt_plan(self.job, core), driver, command)
        except Interrupted as exc:
            self._let_go(core, driver)  # a lock granted as the signal came
            self.report.error = outcome.not_started(exc.signum)
            interrupted = self._failed("interrupted", exc)
            return self._finish(interrupted, driver, 128 + exc.signum)
        except (NotMigratedError, InsufficientPrivilegeError) as exc:
            return self._refused(exc)
        except _DATABASE_ERRORS as exc:
            self.report.lock_wait = time.perf_counter() - self.started  # lost as it waited
            return self._unavailable(exc)
        except UnsafeConnectionError as exc:  # a standby, or a transaction pooler
            self.report.error = str(exc)
            unsafe = self._failed(exc.reason or "connection-moved", exc)
            return self._finish(unsafe, driver, EXIT_UNSAFE)
        if not command.started and result.outcome in ("failed", "lost"):
            # The database failed the period check before COMMAND could start (the plan
            # let the lock go): unavailable, as before the lock.
            self.report.lock_wait = result.lock_wait
            return self._unavailable(result.error)
        verdict = outcome.verdict(result, command, self._scrub, self.skip_codes)
        self.report.error = verdict.error
        if result.outcome == "skipped" and result.reason == "busy":
            self.report.notice = self._who_holds(conn)
        self.report.command_exit_code = verdict.command_exit_code
        self.report.lingering_processes = command.ran.lingered if command.ran else 0
        return self._finish(verdict.result, driver, verdict.exit_code)

    def _refused(self, exc: NotMigratedError | InsufficientPrivilegeError) -> RunReport:
        """pgsolo's tables cannot serve --record or --once-per: too old or missing (exit 2),
        or out of the role's reach (exit 1); checked before the lock, so nothing is held."""
        if isinstance(exc, NotMigratedError):
            self.report.exit_code, self.report.reason = EXIT_USAGE, "not-migrated"
            self.report.error = outcome.not_migrated(exc, self.job, self.label)
        else:
            self.report.exit_code, self.report.reason = EXIT_FAILED, "insufficient-privilege"
            self.report.error = str(exc)
        return self.report

    def _who_holds(self, conn: SyncConnectionLike) -> str:
        """The skip's line, with who holds the key. Best effort: the skip is decided, and
        a failure to read who holds it (a role that cannot see the session, a database
        gone meanwhile) only shortens the line, never changes the outcome or exit code."""
        # Imported here: only a busy skip reads the holders, and every run pays for an import.
        from ...monitor import lock_holders  # noqa: PLC0415

        try:
            holders = [
                lock
                for key in self.job.slots or (self.job.key,)
                for lock in lock_holders(conn, key)
            ]
        except Exception as exc:
            logger.debug("pgsolo: could not read who holds %s: %s", self.job.key, self._scrub(exc))
            holders = None
        return outcome.busy(self.job, holders)

    def _keep(self) -> Keep:
        """The keeper of COMMAND's lock: a beat every --check-interval, answered within
        --check-timeout."""
        return Keep(interval=self.check_interval, timeout=self.check_timeout)

    def _settings(self) -> dict[str, str]:
        return connection_settings(self.check_timeout, connect_timeout=self.connect_timeout)

    def _scrub(self, exc: BaseException) -> str:
        return scrub_secrets(str(exc).strip(), self.dsn)

    def _unavailable(self, exc: BaseException | None) -> RunReport:
        self.report.exit_code = EXIT_UNAVAILABLE
        self.report.reason = "database-unavailable"
        self.report.error = outcome.unavailable(exc, self.label, self.check_timeout, self._scrub)
        return self.report

    def _let_go(self, core: LockCore, driver: SyncDriver) -> None:
        """Release a lock the plan could not let go itself (a signal between its steps);
        a release that fails leaves it to the end of the session, right after this."""
        if core.acquired:
            drive(core.exit(failed=True), driver)

    def _failed(self, reason: Reason, error: BaseException) -> JobResult[None]:
        """An attempt the plan did not end: it raised before COMMAND started."""
        return job_result(
            "failed",
            self.job.name,
            self.job.key,
            reason=reason,
            error=error,
            lock_wait=time.perf_counter() - self.started,
            backend_pid=self.report.backend_pid,
        )

    def _finish(self, result: JobResult[Any], driver: SyncDriver, exit_code: int) -> RunReport:
        self.report.outcome = result.outcome
        self.report.reason = result.reason
        self.report.key, self.report.key_name = result.key.text, result.key.name  # --limit's slot
        self.report.lock_wait = result.lock_wait
        self.report.duration = result.duration
        self.report.exit_code = exit_code
        try:
            report(self.job, result, driver, self.info)
        except Exception as exc:  # logging must never change the outcome
            logger.warning("pgsolo: reporting the outcome failed: %s", self._scrub(exc))
        if self.job.record:
            self.report.recorded = self._record(result, driver, exit_code)
        return self.report

    def _record(self, result: JobResult[Any], driver: SyncDriver, exit_code: int) -> bool:
        """One ledger row; over a fresh connection when the pinned one is gone. Bounded:
        ``connect_timeout`` and ``--check-timeout``, whatever state the network is in."""
        try:
            record_result(
                self.job,
                result,
                driver,
                self.dsn,
                exit_code=exit_code,
                warn=_warn,
                defaults=self._settings(),
                answer_timeout=self.check_timeout,
            )
        except _ANY_ERRORS as exc:
            _warn(
                f"the {result.outcome} attempt of job {self.job.name} is not in the ledger:"
                f" {self._scrub(exc)}"
            )
            return False
        return True


def _warn(text: str) -> None:
    print(f"pgsolo run: warning: {text}", file=sys.stderr, flush=True)
