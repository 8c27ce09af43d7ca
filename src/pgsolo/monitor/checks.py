"""``pgsolo doctor``: the production checklist against a live database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from .. import sql
from .._types import DAY, check_seconds
from ..drivers import SyncDriver, adapt_sync
from ..errors import UnsafeConnectionError
from ..locking import check_route, drive

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike
from ._sync.holders import advisory_locks
from .leaders import Leadership, leaders_of
from .snapshot import fetch_json, format_seconds, parse_time

__all__ = [
    "DEFAULT_OLDER_THAN",
    "DEFAULT_SNAPSHOT_OLDER_THAN",
    "MAX_OLDER_THAN",
    "Check",
    "Status",
    "doctor",
]

CAPACITY_WARN, CAPACITY_FAIL = 0.5, 0.9  # share of the shared lock table used by advisory locks

_LISTED = 5  # sessions named in one check's detail; the rest are counted

Status = Literal["ok", "warn", "fail"]


DEFAULT_OLDER_THAN = (
    300.0  # seconds: an idle session or open transaction older than this is suspect
)


MAX_OLDER_THAN = 30 * DAY


# seconds: a transaction or snapshot older than this holds back VACUUM for too long (pgsolo's
# own waits never hold one for more than a slice of 2 s)
DEFAULT_SNAPSHOT_OLDER_THAN = 60.0


@dataclass(frozen=True, slots=True)
class Check:
    """One item of ``pgsolo doctor``: ``advice`` is one line an on-call engineer can act on
    (empty when there is nothing to do)."""

    name: str
    status: Status
    detail: str
    advice: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "advice": self.advice,
        }


def doctor(
    conn: SyncConnectionLike,
    *,
    older_than: float = DEFAULT_OLDER_THAN,
    snapshot_older_than: float = DEFAULT_SNAPSHOT_OLDER_THAN,
) -> list[Check]:
    """Check the production checklist against the connection's database.

    ``older_than`` (seconds) is when an idle session holding a lock, an open transaction
    holding one, or a wait becomes suspect; ``snapshot_older_than`` when a session's
    transaction that holds a snapshot or a transaction id (or sits idle) holds back
    VACUUM for too long, whether it takes advisory locks or not. Each from 0 to 2592000
    (30 days), else :class:`~pgsolo.InvalidArgumentError` before any SQL. Sessions are
    those of this database only; the lock table's capacity is the whole server's. Reads
    only: a second read names the leaders and their candidates (``leaders``).
    """
    seconds = check_seconds("older_than", older_than, 0, MAX_OLDER_THAN)
    horizon = check_seconds("snapshot_older_than", snapshot_older_than, 0, MAX_OLDER_THAN)
    driver = adapt_sync(conn)
    snapshot = fetch_json(driver, [sql.CLEAR_ACTIVITY_SNAPSHOT, sql.DOCTOR])
    checks = _diagnose(snapshot, seconds, horizon, proxy=_proxy_check(driver))
    return [*checks, _leaders_check(leaders_of(advisory_locks(conn)), snapshot)]


def _diagnose(
    snapshot: Mapping[str, Any], older_than: float, snapshot_older_than: float, *, proxy: Check
) -> list[Check]:
    now = _now(snapshot)
    sessions = [_Session.read(row, now) for row in snapshot["sessions"]]
    settings: Mapping[str, Mapping[str, Any]] = snapshot["settings"]
    role_settings: list[Mapping[str, str]] = snapshot["role_settings"]
    return [
        _primary_check(bool(snapshot["in_recovery"])),
        _idle_session_check(sessions, older_than),
        _transaction_check(sessions, older_than),
        _vacuum_horizon_check(snapshot["horizon"], now, snapshot_older_than),
        _capacity_check(snapshot["capacity"]),
        _application_name_check(sessions),
        _idle_timeout_check(settings, role_settings),
        _lock_timeout_check(settings, role_settings, sessions, older_than),
        proxy,
        _public_execute_check(snapshot["public_execute"], str(snapshot["user"])),
        _visibility_check(sessions, str(snapshot["user"])),
    ]


def _now(snapshot: Mapping[str, Any]) -> datetime:
    now = parse_time(snapshot["now"])
    assert now is not None  # noqa: S101 - the query always sets it
    return now


@dataclass(frozen=True, slots=True)
class _Session:
    """A backend of this database that holds or waits for advisory locks."""

    pid: int
    held: int
    waiting: int
    waited: float | None  # seconds since its wait began
    application_name: str | None
    client_addr: str | None
    state: str | None
    idle: float | None  # seconds since its state last changed
    in_transaction: float | None  # seconds since its transaction began
    bounded_wait: bool  # its current statement sets lock_timeout

    @classmethod
    def read(cls, row: Mapping[str, Any], now: datetime) -> _Session:
        def age(field: str) -> float | None:
            moment = parse_time(row.get(field))
            return None if moment is None else (now - moment).total_seconds()

        return cls(
            pid=int(row["pid"]),
            held=int(row["held"]),
            waiting=int(row["waiting"]),
            waited=age("waiting_since"),
            application_name=row.get("application_name"),
            client_addr=row.get("client_addr"),
            state=row.get("state"),
            idle=age("state_change"),
            in_transaction=age("xact_start"),
            bounded_wait=bool(row.get("bounded_wait")),
        )

    def describe(self) -> str:
        app = repr(self.application_name) if self.application_name else "no application_name"
        client = f" from {self.client_addr}" if self.client_addr else ""
        return f"pid {self.pid} ({app}{client}, {self.held} held)"


def _idle_session_check(sessions: Sequence[_Session], older_than: float) -> Check:
    idle = [s for s in sessions if s.held and s.state == "idle" and s.in_transaction is None]
    suspects = [s for s in idle if s.idle is not None and s.idle > older_than]
    if not suspects:
        return Check(
            "idle-session-locks",
            "ok",
            f"{len(idle)} session(s) hold advisory locks while idle, none for over"
            f" {format_seconds(older_than)}",
        )
    return Check(
        "idle-session-locks",
        "warn",
        f"{len(suspects)} session(s) idle for over {format_seconds(older_than)} while holding"
        " session-level advisory locks (leak suspects): "
        + "; ".join(f"{s.describe()} idle {format_seconds(s.idle)}" for s in suspects[:_LISTED])
        + _more(suspects),
        "find the code path that returned the connection without unlocking; `pgsolo terminate"
        " PID` ends that session, which releases all its locks at once (the next worker may"
        " start the same job, so make sure its client is not still doing the work)",
    )


def _more(items: Sequence[object]) -> str:
    return f"; and {len(items) - _LISTED} more" if len(items) > _LISTED else ""


def _transaction_check(sessions: Sequence[_Session], older_than: float) -> Check:
    holders = [s for s in sessions if s.held and s.in_transaction is not None]
    stuck = [
        s
        for s in holders
        if (s.state or "").startswith("idle in transaction") and (s.idle or 0) > older_than
    ]
    long = [s for s in holders if s not in stuck and (s.in_transaction or 0) > older_than]
    advice = (
        "a transaction left open keeps its locks and holds back VACUUM: end it in the"
        " application (keep lock-holding transactions short), or `pgsolo terminate PID`"
    )
    if stuck:
        return Check(
            "transaction-locks",
            "fail",
            f"{len(stuck)} session(s) idle in transaction for over {format_seconds(older_than)}"
            " while holding advisory locks: "
            + "; ".join(
                f"{s.describe()} idle in transaction {format_seconds(s.idle)}"
                for s in stuck[:_LISTED]
            )
            + _more(stuck),
            advice,
        )
    if long:
        return Check(
            "transaction-locks",
            "warn",
            f"{len(long)} session(s) hold advisory locks in a transaction open for over"
            f" {format_seconds(older_than)}: "
            + "; ".join(
                f"{s.describe()} in a transaction for {format_seconds(s.in_transaction)}"
                for s in long[:_LISTED]
            )
            + _more(long),
            advice,
        )
    return Check(
        "transaction-locks",
        "ok",
        f"no session holds advisory locks in a transaction open (or idle) for over"
        f" {format_seconds(older_than)}",
    )


def _vacuum_horizon_check(
    rows: Sequence[Mapping[str, Any]], now: datetime, older_than: float
) -> Check:
    """Sessions whose transaction has held a snapshot or a transaction id (or sat idle in
    it) for over ``older_than``: VACUUM keeps every row version deleted or updated since,
    in the whole database, for as long as they do."""
    old = []
    for row in rows:
        started = parse_time(row["xact_start"])
        age = None if started is None else (now - started).total_seconds()
        if age is not None and age > older_than:
            old.append((row, age))
    if not old:
        return Check(
            "vacuum-horizon",
            "ok",
            "no session holds a snapshot or a transaction id, or sits idle in a transaction,"
            f" for over {format_seconds(older_than)}",
        )
    return Check(
        "vacuum-horizon",
        "warn",
        f"{len(old)} session(s) have had a transaction open for over"
        f" {format_seconds(older_than)}, holding back VACUUM in the whole database (or"
        " ready to, idle in it): "
        + "; ".join(_holding_back(row, age) for row, age in old[:_LISTED])
        + _more(old),
        "VACUUM cannot remove a row version that such a transaction might still see, so"
        " tables and indexes bloat: end it in the application (short transactions; no"
        " transaction left open while waiting for something else), set"
        " idle_in_transaction_session_timeout, or `pgsolo terminate PID` (pgsolo's own waits"
        " hold none: they wait in slices of 2 s)",
    )


def _holding_back(row: Mapping[str, Any], age: float) -> str:
    app = repr(row["application_name"]) if row.get("application_name") else "no application_name"
    client = f" from {row['client_addr']}" if row.get("client_addr") else ""
    holds = row.get("holds") or "no snapshot yet"
    query = " ".join(str(row.get("query") or "").split())
    return (
        f"pid {row['pid']} ({app}{client}) {row.get('state') or '?'} for"
        f" {format_seconds(age)}, holding {holds}, query {query!r}"
    )


def _capacity_check(capacity: Mapping[str, int]) -> Check:
    slots = capacity["max_locks_per_transaction"] * (
        capacity["max_connections"] + capacity["max_prepared_transactions"]
    )
    used = capacity["advisory"]
    share = used / slots if slots else 1.0
    detail = (
        f"{used} advisory locks on the whole server ({capacity['all']} locks in all) against"
        f" a shared lock table of about {slots} (max_locks_per_transaction"
        f" {capacity['max_locks_per_transaction']} x (max_connections"
        f" {capacity['max_connections']} + max_prepared_transactions"
        f" {capacity['max_prepared_transactions']})): {share:.0%}"
    )
    advice = (
        "lock the smallest meaningful scope, not one key per row; find who holds many with"
        " `pgsolo locks`; raise max_locks_per_transaction (restart) only if that many are"
        " meant to be held"
    )
    if share >= CAPACITY_FAIL:
        return Check(
            "lock-table-capacity",
            "fail",
            detail + "; a full table fails every lock with 'out of shared memory'",
            advice,
        )
    if share >= CAPACITY_WARN:
        return Check("lock-table-capacity", "warn", detail, advice)
    return Check("lock-table-capacity", "ok", detail)


def _application_name_check(sessions: Sequence[_Session]) -> Check:
    # PostgreSQL shows every session's application_name to every role, with its state
    # hidden or not: a session shown without one has none.
    unnamed = [s for s in sessions if not s.application_name]
    if not unnamed:
        return Check(
            "application-name",
            "ok",
            f"all {len(sessions)} session(s) holding or waiting for advisory locks have an"
            " application_name",
        )
    return Check(
        "application-name",
        "warn",
        f"{len(unnamed)} session(s) hold or wait for advisory locks without an"
        " application_name: " + "; ".join(s.describe() for s in unnamed[:_LISTED]) + _more(unnamed),
        "set application_name in every worker's connection string"
        " (application_name=billing-worker), so a lock key leads to a deployment;"
        " pgsolo names its own connections pgsolo:<job>",
    )


def _is_zero(value: str) -> bool:
    number = value.strip().strip("'\"").rstrip("abcdefghijklmnopqrstuvwxyz ")
    try:
        return float(number) == 0
    except ValueError:
        return False


def _role_values(role_settings: Sequence[Mapping[str, str]], setting: str) -> list[str]:
    found = []
    for row in role_settings:
        name, _, value = row["setting"].partition("=")
        if name == setting and not _is_zero(value):
            found.append(f"{setting}={value} for {row['role']} in {row['database']}")
    return found


def _own_value(settings: Mapping[str, Mapping[str, Any]], setting: str) -> str | None:
    ms = int(settings[setting]["ms"])
    if ms == 0:
        return None
    source = settings[setting]["source"]
    return f"{setting}={format_seconds(ms / 1000)} for this session (from {source})"


def _idle_timeout_check(
    settings: Mapping[str, Mapping[str, Any]], role_settings: Sequence[Mapping[str, str]]
) -> Check:
    idle = [
        v
        for v in [
            _own_value(settings, "idle_session_timeout"),
            *_role_values(role_settings, "idle_session_timeout"),
        ]
        if v
    ]
    in_xact = [
        v
        for v in [
            _own_value(settings, "idle_in_transaction_session_timeout"),
            *_role_values(role_settings, "idle_in_transaction_session_timeout"),
        ]
        if v
    ]
    if idle:
        return Check(
            "idle-timeouts",
            "fail",
            "; ".join(idle + in_xact)
            + ": the server ends a session idle that long, silently releasing its session locks",
            "set idle_session_timeout = 0 for the roles that hold session locks (ALTER ROLE"
            " app SET idle_session_timeout = 0), or keep their connections busy more often"
            " than the timeout (pgsolo run checks its lock every --check-interval)",
        )
    if in_xact:
        return Check(
            "idle-timeouts",
            "warn",
            "; ".join(in_xact)
            + ": a transaction idle that long is ended with its session, releasing every"
            " lock it holds (a transaction-level job that waits outside the database loses"
            " its lock)",
            "make it longer than any lock-holding transaction may sit idle, or do the outside"
            " work before the transaction; pgsolo refuses to commit work whose lock is gone",
        )
    return Check(
        "idle-timeouts",
        "ok",
        "idle_session_timeout and idle_in_transaction_session_timeout are off",
    )


def _lock_timeout_check(
    settings: Mapping[str, Mapping[str, Any]],
    role_settings: Sequence[Mapping[str, str]],
    sessions: Sequence[_Session],
    older_than: float,
) -> Check:
    configured = [
        v
        for v in [
            _own_value(settings, "lock_timeout"),
            *_role_values(role_settings, "lock_timeout"),
        ]
        if v
    ]
    if configured:
        return Check("lock-timeout", "ok", "; ".join(configured))
    # pgsolo's own waits (and any whose statement sets lock_timeout) are bounded.
    waiters = [s for s in sessions if s.waiting and not s.bounded_wait]
    advice = (
        "bound blocking waits: ALTER ROLE app SET lock_timeout = '10s' (pgsolo's own waits"
        " bound each slice with a lock_timeout for their transaction; others call pg_try_*"
        " or SET LOCAL lock_timeout before pg_advisory_lock)"
    )
    long = [s for s in waiters if (s.waited or 0) > older_than]
    if long:
        return Check(
            "lock-timeout",
            "fail",
            f"lock_timeout is not set for this role or database, and {len(long)} session(s)"
            f" have waited for an advisory lock for over {format_seconds(older_than)}: "
            + "; ".join(
                f"{s.describe()} waiting {format_seconds(s.waited)}" for s in long[:_LISTED]
            )
            + _more(long)
            + " (a job that hangs rather than skips)",
            advice,
        )
    if waiters:
        return Check(
            "lock-timeout",
            "warn",
            f"lock_timeout is not set for this role or database, and {len(waiters)} session(s)"
            " are waiting for an advisory lock: unless they set it themselves, they may wait"
            " forever",
            advice,
        )
    return Check(
        "lock-timeout",
        "ok",
        "lock_timeout is not set for this role or database, and no session waits for an"
        " advisory lock now (pgsolo's waits set their own)",
    )


def _public_execute_check(functions: Sequence[str], user: str) -> Check:
    if not functions:
        return Check(
            "public-execute",
            "ok",
            "PUBLIC may not call the advisory-lock functions in this database",
        )
    listed = ", ".join(functions)
    return Check(
        "public-execute",
        "warn",
        f"every role that can connect may call {len(functions)} advisory-lock functions"
        " (PUBLIC has EXECUTE), so any of them can hold any key and starve a job",
        f"in this database: REVOKE EXECUTE ON FUNCTION {listed} FROM PUBLIC; then GRANT"
        " EXECUTE ON FUNCTION <the ones it uses> TO <application role> (pgsolo uses"
        " pg_try_advisory_xact_lock, pg_advisory_xact_lock and their _shared and session"
        " forms as asked; unlocks stay open to PUBLIC; superusers are not affected;"
        f" connected as {user})",
    )


def _visibility_check(sessions: Sequence[_Session], user: str) -> Check:
    # pg_locks shows every lock to every role, but pg_stat_activity hides the state,
    # times and query of other roles' backends (NULL, and '<insufficient privilege>')
    # from a role that is neither a member of theirs nor of pg_read_all_stats: the idle
    # and transaction checks cannot judge those sessions, so "ok" would be a guess.
    hidden = [s for s in sessions if s.state is None]
    if not hidden:
        return Check(
            "visibility",
            "ok",
            f"the activity of all {len(sessions)} session(s) holding or waiting for advisory"
            " locks is visible to this role",
        )
    return Check(
        "visibility",
        "warn",
        f"{len(hidden)} session(s) holding or waiting for advisory locks belong to roles whose"
        f" activity (state, transaction start, query) {user!r} may not read, so the idle and"
        " transaction checks could not judge them: "
        + "; ".join(s.describe() for s in hidden[:_LISTED])
        + _more(hidden),
        f"run doctor as a role that may read them: GRANT pg_read_all_stats TO"
        f" {sql.quote_name(user)}",
    )


def _primary_check(in_recovery: bool) -> Check:
    if not in_recovery:
        return Check("primary", "ok", "the server is a primary (not in recovery)")
    return Check(
        "primary",
        "fail",
        "the server is in recovery (a hot standby): it grants advisory locks locally, unseen"
        " by the primary and every other standby, so a job coordinated here runs"
        " everywhere at once (pgsolo refuses every lock on it)",
        "point pgsolo at the primary: its own address, or a multi-host connection string"
        " with target_session_attrs=read-write, which libpq uses to skip standbys",
    )


def _proxy_check(driver: SyncDriver) -> Check:
    """Is there a proxy between this client and the server, and does it pool
    transactions? The same detection as a session lock's (:mod:`pgsolo.locking.routing`)."""
    advice = (
        "session locks need the same server connection for the whole hold: use a direct"
        " connection or PgBouncer pool_mode=session for them; transaction-level locks"
        " (pgsolo.xact_lock, run_job(lifetime='xact')) are safe behind any pooler"
    )
    try:
        route = drive(check_route(driver, driver.transaction_status()), driver)
    except UnsafeConnectionError as exc:
        if exc.reason == "server-in-recovery":  # the primary check says it
            return Check("proxy", "warn", "not checked: the server is a standby", advice)
        return Check("proxy", "fail", str(exc).split(" Use xact_lock()")[0], advice)
    if route.direct:
        return Check("proxy", "ok", f"a direct connection to backend {route.server_pid}")
    return Check(
        "proxy",
        "ok",
        "a proxy or NAT sits between this client and the server, and it keeps the client"
        f" on one server session (backend {route.server_pid}): session locks are safe here",
        advice,
    )


def _leaders_check(leaderships: Sequence[Leadership], snapshot: Mapping[str, Any]) -> Check:
    """Each leader (``pgsolo.leader``, ``pgsolo run --leader``): who leads, for how long,
    and who waits to lead next. Information, unless a leader's session sits idle in a
    transaction: its candidates then wait on a session that may be stuck."""
    if not leaderships:
        return Check("leaders", "ok", "no leader's key is held or waited for in this database")
    now = _now(snapshot)
    # The session's start, for a leader whose term's start is not recorded.
    started = {
        int(row["pid"]): parse_time(row.get("backend_start")) for row in snapshot["sessions"]
    }
    stuck = [
        one
        for one in leaderships
        if one.leader is not None and (one.leader.state or "").startswith("idle in transaction")
    ]
    detail = (
        f"{len(leaderships)} leader name(s): "
        + "; ".join(_leadership(one, started, now) for one in leaderships[:_LISTED])
        + _more(leaderships)
    )
    if stuck:
        return Check(
            "leaders",
            "warn",
            detail,
            f"the leader of {', '.join(repr(one.name) for one in stuck)} sits idle in a"
            " transaction: if it is stuck, its candidates wait for it forever; end the"
            " transaction in the application, or `pgsolo terminate PID` (a candidate then"
            " leads)",
        )
    return Check("leaders", "ok", detail)


def _leadership(one: Leadership, started: Mapping[int, datetime | None], now: datetime) -> str:
    waiting = [str(c.pid) for c in one.candidates if c.pid is not None]
    candidates = (
        f"{len(waiting)} candidate(s) waiting (pid {', '.join(waiting)})"
        if waiting
        else "no candidate waiting"
    )
    leader = one.leader
    if leader is None:
        return f"{one.name!r}: no leader at this moment (between two terms), {candidates}"
    app = repr(leader.application_name) if leader.application_name else "no application_name"
    client = f" from {leader.client_addr}" if leader.client_addr else ""
    if leader.since_source == "term_start" and leader.since is not None:
        term = (
            f"leading for {format_seconds(leader.age_seconds)}"
            f" (since {leader.since.isoformat(timespec='seconds')})"
        )
    else:
        session = started.get(leader.pid) if leader.pid is not None else None
        age = None if session is None else (now - session).total_seconds()
        term = (
            f"leading for at most {format_seconds(age)} (its session's age: the term's start"
            " is not recorded)"
        )
    return f"{one.name!r}: pid {leader.pid} ({app}{client}) {term}, {candidates}"
