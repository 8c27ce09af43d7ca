"""What each page of the dashboard reads, through the monitor (locks, doctor), the ledger
(jobs) and pgsolo's operations table; each answer as the data its HTML page and its JSON
share. Each read takes its connection from a :data:`Connect`: the ASGI app's opens one of
its own per read, named ``pgsolo:dashboard``; the Django include's lends Django's.

Every read only reads: a role that may ``SELECT`` nothing of pgsolo's still gets the
locks and doctor pages, and a notice where the ledger or the operations would be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, get_args

from .. import sql
from .._types import Outcome
from ..cli.common import where
from ..cli.history import attempt_as_json
from ..cli.output import document
from ..drivers import adapt_sync
from ..errors import InsufficientPrivilegeError, InvalidArgumentError, NotMigratedError
from ..jobs.record import history, periods, skip_warning
from ..keys import Registry
from ..locking import outside_transaction
from ..monitor import (
    AdvisoryLock,
    Check,
    SemaphoreUse,
    advisory_locks,
    doctor,
    semaphore_uses,
    terminate_backend,
    wait_chains,
)
from ..monitor.checks import DEFAULT_OLDER_THAN, DEFAULT_SNAPSHOT_OLDER_THAN
from ..monitor.leaders import Leadership, leaders_of
from ..monitor.locks import LocksQuery
from ..monitor.snapshot import parse_time

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike

__all__ = [
    "APPLICATION_NAME",
    "JOB_ROWS",
    "OUTCOMES",
    "Connect",
    "DoctorView",
    "JobSummary",
    "JobsView",
    "LocksView",
    "Naming",
    "Operation",
    "OperationsView",
    "read_doctor",
    "read_jobs",
    "read_locks",
    "read_operations",
    "read_session",
    "terminate",
]

APPLICATION_NAME = "pgsolo:dashboard"

JOB_ROWS = 500  # the ledger's latest attempts the jobs page summarises

Connect: TypeAlias = Callable[[], AbstractContextManager["SyncConnectionLike"]]
"""How a read gets its connection: a context manager for the read, which gives the
connection back afterwards as its owner wants it (closed, or as it was found)."""


@dataclass(frozen=True, slots=True)
class Naming:
    """What names the keys besides pgsolo's own records (holders' ``application_name``,
    the ledger): ``pgsolo locks``'s ``--registry``, ``--name`` and ``--semaphore``."""

    registry: Registry | None = None
    names: tuple[str, ...] = ()
    semaphores: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        registry: Registry | None = None,
        names: Iterable[str] = (),
        semaphores: Mapping[str, int] | None = None,
    ) -> Naming:
        """Checked as :func:`~pgsolo.advisory_locks` checks them, before any SQL:
        :class:`~pgsolo.InvalidArgumentError` (or InvalidKeyError for a name)."""
        if registry is not None and not isinstance(registry, Registry):
            raise InvalidArgumentError(
                f"registry= takes a pgsolo.Registry (Registry.from_toml(path)), got {registry!r}"
            )
        if isinstance(names, str):  # else its characters, each taken for a name
            raise InvalidArgumentError(f"names= takes a list of names, not one str ({names!r})")
        naming = cls(registry, tuple(names), dict(semaphores or {}))
        LocksQuery.of(naming.registry, naming.names, None, None, semaphores=naming.semaphores)
        return naming

    def locks(self, conn: SyncConnectionLike, *, pid: int | None = None) -> list[AdvisoryLock]:
        """The advisory locks (``pid``'s only, if given), named."""
        return advisory_locks(
            conn,
            registry=self.registry,
            names=self.names,
            pid=pid,
            from_ledger=True,
            semaphores=self.semaphores,
        )


def idle_in_transaction(lock: AdvisoryLock) -> bool:
    """Its session sits in a transaction doing nothing: it keeps every lock it holds."""
    return (lock.state or "").startswith("idle in transaction")


def holds_back_vacuum(lock: AdvisoryLock) -> bool:
    """Past the threshold ``pgsolo locks`` marks with ``*`` and ``pgsolo doctor`` warns at."""
    held = lock.holds_back_vacuum_seconds
    return held is not None and held > DEFAULT_SNAPSHOT_OLDER_THAN


def leak_suspect(lock: AdvisoryLock) -> bool:
    """A held lock whose session has been idle, outside any transaction, for longer than
    ``pgsolo doctor``'s idle-session check allows: the code returned the connection
    without unlocking (``state_change`` is the last statement's end)."""
    age = lock.age_seconds
    return (
        lock.granted
        and lock.state == "idle"
        and lock.since_source == "state_change"
        and age is not None
        and age > DEFAULT_OLDER_THAN
    )


@dataclass(frozen=True, slots=True)
class SemaphoreRow:
    """A semaphore's slot locks as one row: ``K of N held``."""

    use: SemaphoreUse
    locks: tuple[AdvisoryLock, ...]


@dataclass(frozen=True, slots=True)
class LocksView:
    """``pgsolo locks`` as one page: the locks, each semaphore as one row, the wait
    chains and the leaders."""

    database: str
    server: str
    locks: list[AdvisoryLock]
    semaphores: list[SemaphoreUse]
    chains: list[tuple[int, ...]]
    leaders: list[Leadership]

    @property
    def rows(self) -> list[AdvisoryLock | SemaphoreRow]:
        """The table's rows: every lock, but a semaphore's slots on one row, where its
        first slot's would be."""
        slots: dict[tuple[str, int], list[AdvisoryLock]] = {}
        rows: list[AdvisoryLock | tuple[str, int]] = []
        known = {(use.name, use.limit) for use in self.semaphores}
        for lock in self.locks:
            slot = lock.semaphore
            group = (slot.name, slot.limit) if slot is not None else None
            if group is None or group not in known:
                rows.append(lock)
                continue
            if group not in slots:
                rows.append(group)
            slots.setdefault(group, []).append(lock)
        uses = {(use.name, use.limit): use for use in self.semaphores}
        return [
            row if isinstance(row, AdvisoryLock) else SemaphoreRow(uses[row], tuple(slots[row]))
            for row in rows
        ]

    @property
    def held(self) -> int:
        return sum(1 for lock in self.locks if lock.granted)

    def document(self) -> dict[str, Any]:
        """The document of ``pgsolo locks --json``, field for field."""
        return document(
            "locks",
            {
                "database": self.database,
                "server": self.server,
                "locks": [lock.as_dict() for lock in self.locks],
                "semaphores": [use.as_dict() for use in self.semaphores],
                "wait_chains": [list(chain) for chain in self.chains],
            },
        )


def read_locks(connect: Connect, naming: Naming) -> LocksView:
    with connect() as conn:
        locks = naming.locks(conn)
        name, server = where(conn)
    return LocksView(
        database=name,
        server=server,
        locks=locks,
        semaphores=semaphore_uses(locks),
        chains=wait_chains(locks),
        leaders=leaders_of(locks),
    )


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job as its latest attempts in the ledger and its periods marked done show it
    (``last`` is None for a job with periods but no recorded attempt)."""

    job: str
    last: Mapping[str, Any] | None
    attempts: int
    skipped: int
    warning: str | None
    periods: tuple[Mapping[str, Any], ...] = ()

    @property
    def skip_ratio(self) -> float | None:
        return self.skipped / self.attempts if self.attempts else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "last": None if self.last is None else attempt_as_json(dict(self.last)),
            "attempts": self.attempts,
            "skipped": self.skipped,
            "skip_ratio": self.skip_ratio,
            "warning": self.warning,
            "periods": [dict(mark) for mark in self.periods],
        }


@dataclass(frozen=True, slots=True)
class JobsView:
    """The ledger's latest attempts (at most :data:`JOB_ROWS`; of ``job`` only, if given)
    and the periods marked done, per job, and the history of one ``outcome`` (None:
    every one); ``notice`` says why there are no attempts to read (not migrated, or a
    privilege missing), ``periods_notice`` why there are no periods."""

    database: str
    server: str
    job: str | None
    outcome: str | None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notice: str | None = None
    periods: list[dict[str, Any]] = field(default_factory=list)
    periods_notice: str | None = None

    @property
    def history(self) -> list[dict[str, Any]]:
        """The attempts of the history table: of :attr:`outcome` only, if given (the
        summaries weigh every attempt read)."""
        return [row for row in self.attempts if self.outcome in (None, row["outcome"])]

    @property
    def jobs(self) -> list[JobSummary]:
        by_job: dict[str, list[dict[str, Any]]] = {}
        for row in self.attempts:  # newest first
            by_job.setdefault(str(row["job"]), []).append(row)
        marks: dict[str, list[dict[str, Any]]] = {}
        for mark in self.periods:
            marks.setdefault(str(mark["job"]), []).append(mark)
        summaries = []
        for job in sorted(by_job.keys() | marks.keys()):
            rows = by_job.get(job, [])
            summaries.append(
                JobSummary(
                    job=job,
                    last=rows[0] if rows else None,
                    attempts=len(rows),
                    skipped=sum(1 for row in rows if row["outcome"] == "skipped"),
                    warning=next((w for w in self.warnings if w.startswith(f"job {job}: ")), None),
                    periods=tuple(marks.get(job, ())),
                )
            )
        return summaries

    def document(self) -> dict[str, Any]:
        return document(
            "dashboard.jobs",
            {
                "database": self.database,
                "server": self.server,
                "job": self.job,
                "outcome": self.outcome,
                "notice": self.notice,
                "periods_notice": self.periods_notice,
                "jobs": [summary.as_dict() for summary in self.jobs],
                "attempts": [attempt_as_json(row) for row in self.history],
                "warnings": self.warnings,
            },
        )


OUTCOMES: tuple[str, ...] = get_args(Outcome)  # a job's, as the ledger checks them


def read_jobs(connect: Connect, job: str | None = None, outcome: str | None = None) -> JobsView:
    """The jobs page: every job's summary from the latest attempts (of ``job`` only, if
    given), and their history, of one ``outcome`` only if given (one of
    :data:`OUTCOMES`, else :class:`~pgsolo.InvalidArgumentError` before connecting)."""
    if outcome is not None and outcome not in OUTCOMES:
        raise InvalidArgumentError(
            f"outcome is one of {', '.join(OUTCOMES)} (or none for all), got {outcome!r}"
        )
    with connect() as conn:
        name, server = where(conn)
        try:
            rows = history(conn, job=job, limit=JOB_ROWS)
        except NotMigratedError:
            notice = "no ledger in this database: run `pgsolo migrate`, then record jobs"
            return JobsView(name, server, job, outcome, notice=notice)
        except InsufficientPrivilegeError as exc:
            return JobsView(name, server, job, outcome, notice=str(exc))
        try:
            marks, marks_notice = periods(conn, job=job), None
        except InsufficientPrivilegeError as exc:
            marks, marks_notice = [], str(exc)
    return JobsView(name, server, job, outcome, rows, skip_warning(rows), None, marks, marks_notice)


@dataclass(frozen=True, slots=True)
class Operation:
    """A ``run_once`` operation, with whether its lock is held now: a ``started`` one
    whose lock nobody holds was left by a holder that died (the next call takes it
    over); one held for longer than doctor's threshold is running long."""

    row: Mapping[str, Any]
    alive: bool
    age_seconds: float | None

    @property
    def state(self) -> str:
        return str(self.row["state"])

    @property
    def dead(self) -> bool:
        return self.state == "started" and not self.alive

    @property
    def running_long(self) -> bool:
        return (
            self.state == "started"
            and self.alive
            and self.age_seconds is not None
            and self.age_seconds > DEFAULT_OLDER_THAN
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.row,
            "holder_alive": self.alive if self.state == "started" else None,
            "age_seconds": self.age_seconds,
            "running_long": self.running_long,
        }


@dataclass(frozen=True, slots=True)
class OperationsView:
    database: str
    server: str
    operations: list[Operation] = field(default_factory=list)
    notice: str | None = None

    def document(self) -> dict[str, Any]:
        return document(
            "dashboard.operations",
            {
                "database": self.database,
                "server": self.server,
                "notice": self.notice,
                "operations": [operation.as_dict() for operation in self.operations],
            },
        )


def read_operations(connect: Connect) -> OperationsView:
    with connect() as conn:
        name, server = where(conn)
        driver = adapt_sync(conn)
        try:
            value = driver.fetch_value(outside_transaction(driver, [sql.operations()]))
        except Exception as exc:
            meaning = sql.meaning(driver.sqlstate(exc))
            if meaning is sql.Meaning.NOT_MIGRATED:
                notice = "no operations table in this database: run `pgsolo migrate`"
                return OperationsView(name, server, notice=notice)
            if meaning is sql.Meaning.NO_PRIVILEGE:
                error = sql.privilege_error(
                    "reading the operations", driver.server_info().user, features=("once",)
                )
                return OperationsView(name, server, notice=str(error))
            raise
    snapshot = sql.read_json(value)
    now = parse_time(snapshot["now"])
    return OperationsView(name, server, [_operation(row, now) for row in snapshot["operations"]])


def _operation(row: Mapping[str, Any], now: datetime | None) -> Operation:
    since = parse_time(row.get("updated_at"))
    age = None if since is None or now is None else (now - since).total_seconds()
    return Operation(row, row.get("holder_alive") is True, age)


@dataclass(frozen=True, slots=True)
class DoctorView:
    database: str
    server: str
    checks: list[Check]

    @property
    def exit_code(self) -> int:
        """``pgsolo doctor``'s: 1 when a check failed."""
        return 1 if any(check.status == "fail" for check in self.checks) else 0

    def document(self) -> dict[str, Any]:
        """The document of ``pgsolo doctor --json``, field for field."""
        return document(
            "doctor",
            {
                "database": self.database,
                "server": self.server,
                "exit_code": self.exit_code,
                "checks": [check.as_dict() for check in self.checks],
            },
        )


def read_doctor(connect: Connect) -> DoctorView:
    with connect() as conn:
        checks = doctor(conn)
        name, server = where(conn)
    return DoctorView(name, server, checks)


def read_session(connect: Connect, naming: Naming, pid: int) -> list[AdvisoryLock]:
    """The advisory locks backend ``pid`` holds or waits for: what a terminate confirms."""
    with connect() as conn:
        return naming.locks(conn, pid=pid)


def terminate(connect: Connect, naming: Naming, pid: int) -> tuple[bool, list[AdvisoryLock]]:
    """End backend ``pid``; whether it is gone, and what it held just before."""
    with connect() as conn:
        held = naming.locks(conn, pid=pid)
        return terminate_backend(conn, pid), held
