"""Who holds which advisory lock, who waits behind it, and what looks wrong.

:func:`advisory_locks` is ``pg_locks`` joined with ``pg_stat_activity`` in one round trip,
keys decoded per DESIGN §2 and named from a registry or from names the caller gives.
:func:`doctor` checks the article's production checklist against a live database.
Both only read; ``pgsolo terminate`` (in :mod:`pgsolo.cli`) is the one that acts.

PostgreSQL does not record whether an advisory lock was taken at session or transaction
level, so :attr:`AdvisoryLock.lifetime` says only what the server proves (see there),
and is ``None`` otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from . import sql
from ._plans import drive, outside_transaction
from .drivers import SyncDriver, adapt_sync
from .durations import DAY, check_seconds
from .errors import InvalidArgumentError, UnsafeConnectionError
from .keys import Key, KeyLike, Registry, as_key, decode_pg_lock, derive_int32, derive_int64
from .proxy import check_route

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "AdvisoryLock",
    "Check",
    "Status",
    "advisory_locks",
    "doctor",
    "format_seconds",
    "terminate_backend",
    "wait_chains",
]

Status = Literal["ok", "warn", "fail"]
SinceSource = Literal["waitstart", "query_start", "state_change", "xact_start"]

DEFAULT_OLDER_THAN = (
    300.0  # seconds: an idle session or open transaction older than this is suspect
)
MAX_OLDER_THAN = 30 * DAY
CAPACITY_WARN, CAPACITY_FAIL = 0.5, 0.9  # share of the shared lock table used by advisory locks
_LISTED = 5  # sessions named in one check's detail; the rest are counted


@dataclass(frozen=True, slots=True)
class AdvisoryLock:
    """One row of ``pg_locks`` for an advisory lock, with its session.

    ``lifetime`` is ``"session"`` when the holder was idle outside any transaction from
    before this snapshot was taken (a transaction-level lock cannot outlive its
    transaction), ``"xact"`` for a lock held by a prepared transaction (no session), and
    ``None`` otherwise: PostgreSQL does not record it, and pgsolo does not guess.

    ``since`` is when the wait began (``waitstart``; ``query_start`` for the moment
    before PostgreSQL fills it in) for a waiter. For a holder it is the best bound the
    server gives: ``state_change`` for a holder idle outside a transaction (held at
    least since then), ``xact_start`` for one inside a transaction (a transaction-level
    lock was taken at or after it; a session lock may be older). ``since_source`` names
    which. Fields of ``pg_stat_activity`` are ``None`` when the server hides another
    role's session (without ``pg_read_all_stats``) or the backend just ended.
    """

    key: Key
    name: str | None
    lifetime: Literal["session", "xact"] | None
    shared: bool
    granted: bool
    pid: int | None
    database: str
    application_name: str | None
    client_addr: str | None
    client_port: int | None
    state: str | None
    since: datetime | None
    since_source: SinceSource | None
    query: str | None
    blocked_by: tuple[int, ...]
    observed_at: datetime

    @property
    def age_seconds(self) -> float | None:
        """How long it has been held or waited for, by the server's clock."""
        return None if self.since is None else (self.observed_at - self.since).total_seconds()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict. ``key`` is the command-line form, a string (an int64 does
        not survive a JSON parser that reads numbers as doubles)."""
        namespace, resource = self.key.value if isinstance(self.key.value, tuple) else (None, None)
        return {
            "key": self.key.text,
            "namespace": namespace,
            "resource": resource,
            "name": self.name,
            "lifetime": self.lifetime,
            "mode": "shared" if self.shared else "exclusive",
            "granted": self.granted,
            "pid": self.pid,
            "database": self.database,
            "application_name": self.application_name,
            "client_addr": self.client_addr,
            "client_port": self.client_port,
            "state": self.state,
            "since": self.since.isoformat() if self.since else None,
            "since_source": self.since_source,
            "age_seconds": self.age_seconds,
            "query": self.query,
            "blocked_by": list(self.blocked_by),
        }


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


# -- pgsolo locks ------------------------------------------------------------------------


class _Namer:
    """Names for keys: the registry first, then the v1 derivation of the given names
    (an int64 key, or a pair in any namespace whose resource half is the name's int32)."""

    def __init__(self, registry: Registry | None, names: Iterable[str]) -> None:
        if isinstance(names, str):
            raise InvalidArgumentError(f"names= takes a list of names, not one str ({names!r})")
        self._registry = registry
        self._int64: dict[int, str] = {}
        self._int32: dict[int, str] = {}
        for name in names:
            self._int64.setdefault(derive_int64(name), name)  # InvalidKeyError first
            self._int32.setdefault(derive_int32(name), name)

    def name_of(self, key: Key) -> str | None:
        if self._registry is not None and (registered := self._registry.name_of(key)):
            return registered
        if isinstance(key.value, tuple):
            return self._int32.get(key.value[1])
        return self._int64.get(key.value)


def advisory_locks(
    conn: psycopg.Connection[Any],
    *,
    registry: Registry | None = None,
    names: Iterable[str] = (),
    key: KeyLike | None = None,
    pid: int | None = None,
) -> list[AdvisoryLock]:
    """Every advisory lock of the connection's database, held and waiting, in one round
    trip: grouped by key, holders first, waiters in the order they started waiting.

    ``registry`` and ``names`` name the keys; ``key`` and ``pid`` keep only that key's
    or that backend's rows. Bad arguments raise before any SQL is sent.
    """
    namer = _Namer(registry, names)
    wanted = as_key(key, registry=registry) if key is not None else None
    if pid is not None:
        _check_positive(pid, "pid")
    driver = adapt_sync(conn)
    snapshot = _fetch_json(
        driver, [sql.CLEAR_ACTIVITY_SNAPSHOT, sql.advisory_locks(key=wanted, pid=pid)]
    )
    return _locks_from(snapshot, namer)


def _check_positive(value: object, what: str, high: int = 2**31 - 1) -> None:
    """A positive int of at most ``high`` (a pid is an int32 on the server)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidArgumentError(f"{what} must be an int from 1 to {high}, got {value!r}")


def _fetch_json(driver: SyncDriver, statements: list[str]) -> Mapping[str, Any]:
    value = sql.read_json(driver.fetch_value(outside_transaction(driver, statements)))
    if not isinstance(value, Mapping):
        raise TypeError(f"the monitor's query returned {type(value).__name__}, not a JSON object")
    return value


def _locks_from(snapshot: Mapping[str, Any], namer: _Namer) -> list[AdvisoryLock]:
    seen_after = _time(snapshot["seen_after"])
    now = _time(snapshot["now"])
    # The query always sets both.
    assert seen_after is not None  # noqa: S101
    assert now is not None  # noqa: S101
    sessions: Mapping[str, Mapping[str, Any]] = snapshot["sessions"]
    database = str(snapshot["database"])
    # What a holder's session says is the same for each of its locks (one session may
    # hold thousands): worked out once per pid.
    holding: dict[int | None, tuple[Any, ...]] = {}
    locks = []
    for pid, classid, objid, objsubid, shared, granted, waitstart, blockers in snapshot["locks"]:
        key = decode_pg_lock(int(classid), int(objid), int(objsubid))
        if (name := namer.name_of(key)) is not None:
            key = Key(key.value, name)
        activity = sessions.get(str(pid), {}) if pid is not None else {}
        if granted:
            if (facts := holding.get(pid)) is None:
                facts = holding[pid] = (
                    _lifetime(pid, True, activity, seen_after),
                    *_since(True, None, activity),
                    _one_line(activity.get("query")),
                )
        else:
            facts = (
                None,
                *_since(False, _time(waitstart), activity),
                _one_line(activity.get("query")),
            )
        lifetime, since, source, query = facts
        locks.append(
            AdvisoryLock(
                key=key,
                name=name,
                lifetime=lifetime,
                shared=bool(shared),
                granted=bool(granted),
                pid=pid,
                database=database,
                application_name=activity.get("application_name"),
                client_addr=activity.get("client_addr"),
                client_port=_port(activity.get("client_port")),
                state=activity.get("state"),
                since=since,
                since_source=source,
                query=query,
                blocked_by=tuple(sorted(blockers or ())),
                observed_at=now,
            )
        )
    locks.sort(key=_display_order)
    return locks


def _lifetime(
    pid: int | None, granted: bool, activity: Mapping[str, Any], seen_after: datetime
) -> Literal["session", "xact"] | None:
    if pid is None:
        return "xact"  # a prepared transaction: no session, only its transaction's locks
    if not granted:
        return None
    idle_since = _time(activity.get("state_change"))
    # Idle outside a transaction since before the lock snapshot (which is older than the
    # activity row, see sql.advisory_locks): the lock was held with no transaction open.
    if (
        activity.get("state") == "idle"
        and activity.get("xact_start") is None
        and idle_since is not None
        and idle_since < seen_after
    ):
        return "session"
    return None


def _since(
    granted: bool, waitstart: datetime | None, activity: Mapping[str, Any]
) -> tuple[datetime | None, SinceSource | None]:
    candidates: tuple[tuple[datetime | None, SinceSource], ...]
    if not granted:
        candidates = ((waitstart, "waitstart"), (_time(activity.get("query_start")), "query_start"))
    elif activity.get("xact_start") is None:
        candidates = ((_time(activity.get("state_change")), "state_change"),)
    else:
        candidates = ((_time(activity.get("xact_start")), "xact_start"),)
    for value, source in candidates:
        if value is not None:
            return value, source
    return None, None


def _display_order(lock: AdvisoryLock) -> tuple[object, ...]:
    value = lock.key.value
    key_order = (1, *value) if isinstance(value, tuple) else (0, value, 0)
    since = lock.since.timestamp() if lock.since is not None else float("inf")
    return (*key_order, not lock.granted, since, lock.pid or 0)


def _port(value: object) -> int | None:
    # PostgreSQL says -1 for a unix-socket client.
    return value if isinstance(value, int) and value >= 0 else None


def _time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _one_line(query: object) -> str | None:
    return " ".join(query.split()) if isinstance(query, str) else None


def wait_chains(locks: Sequence[AdvisoryLock]) -> list[tuple[int, ...]]:
    """Who waits on whom: each chain starts at a waiter nobody waits on and follows
    ``pg_blocking_pids`` to a backend that waits on no one (the holder at the root).

    ``(303, 302, 301)`` reads "303 waits for 302, which waits for 301". A waiter blocked
    by several backends starts one chain per blocker. A cycle (a deadlock PostgreSQL has
    not broken yet) ends where a pid would repeat.
    """
    blocked_by: dict[int, set[int]] = {}
    for lock in locks:
        if not lock.granted and lock.pid is not None and lock.blocked_by:
            blocked_by.setdefault(lock.pid, set()).update(lock.blocked_by)
    waited_on = {blocker for blockers in blocked_by.values() for blocker in blockers}
    chains: list[tuple[int, ...]] = []

    def follow(path: tuple[int, ...]) -> None:
        nexts = sorted(blocked_by.get(path[-1], ()))
        if not nexts:
            chains.append(path)
        for blocker in nexts:
            if blocker in path:
                chains.append(path)
            else:
                follow((*path, blocker))

    for tail in sorted(pid for pid in blocked_by if pid not in waited_on):
        follow((tail,))
    # In a cycle every waiter is waited on: start at its lowest pid not shown yet.
    for start in sorted(blocked_by):
        if not any(start in chain for chain in chains):
            follow((start,))
    return chains


# -- pgsolo doctor -----------------------------------------------------------------------


def doctor(conn: psycopg.Connection[Any], *, older_than: float = DEFAULT_OLDER_THAN) -> list[Check]:
    """Check the production checklist against the connection's database.

    ``older_than`` (seconds) is when an idle session holding a lock, an open transaction
    holding one, or a wait becomes suspect: from 0 to 2592000 (30 days), else
    :class:`~pgsolo.InvalidArgumentError` before any SQL. Sessions are those of this
    database only; the lock table's capacity is the whole server's. Reads only.
    """
    seconds = check_seconds("older_than", older_than, 0, MAX_OLDER_THAN)
    driver = adapt_sync(conn)
    snapshot = _fetch_json(driver, [sql.CLEAR_ACTIVITY_SNAPSHOT, sql.DOCTOR])
    return _diagnose(snapshot, seconds, proxy=_proxy_check(driver))


def _diagnose(snapshot: Mapping[str, Any], older_than: float, *, proxy: Check) -> list[Check]:
    now = _time(snapshot["now"])
    assert now is not None  # noqa: S101 - the query always sets it
    sessions = [_Session.read(row, now) for row in snapshot["sessions"]]
    settings: Mapping[str, Mapping[str, Any]] = snapshot["settings"]
    role_settings: list[Mapping[str, str]] = snapshot["role_settings"]
    return [
        _primary_check(bool(snapshot["in_recovery"])),
        _idle_session_check(sessions, older_than),
        _transaction_check(sessions, older_than),
        _capacity_check(snapshot["capacity"]),
        _application_name_check(sessions),
        _idle_timeout_check(settings, role_settings),
        _lock_timeout_check(settings, role_settings, sessions, older_than),
        proxy,
        _public_execute_check(snapshot["public_execute"], str(snapshot["user"])),
    ]


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
            moment = _time(row.get(field))
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


def format_seconds(seconds: float | None) -> str:
    """``4.2s``, ``12s``, ``3m05s``, ``2h10m``: a duration as people read it."""
    if seconds is None:
        return "?"
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


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
    unnamed = [s for s in sessions if not s.application_name and s.state is not None]
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
        " set a SET LOCAL lock_timeout; others call pg_try_* or SET LOCAL lock_timeout"
        " before pg_advisory_lock)"
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
    transactions? The same detection as a session lock's (:mod:`pgsolo.proxy`)."""
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


def terminate_backend(conn: psycopg.Connection[Any], pid: int, *, wait_ms: int = 5000) -> bool:
    """End backend ``pid`` (its session, its transaction and every lock it holds) and wait
    up to ``wait_ms`` (at most a day) for it to be gone: True if it is. Shows nothing and
    asks nothing; ``pgsolo terminate`` is the careful way."""
    _check_positive(pid, "pid")
    _check_positive(wait_ms, "wait_ms", int(DAY * 1000))
    driver = adapt_sync(conn)
    if pid == driver.backend_pid():
        raise InvalidArgumentError(f"pid {pid} is this connection's own backend")
    return (
        driver.fetch_value(
            outside_transaction(driver, [sql.terminate_backend(pid, wait_ms=wait_ms)])
        )
        is True
    )
