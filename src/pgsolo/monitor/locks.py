"""Who holds which advisory lock and who waits: the query of ``pgsolo locks`` and
:func:`~pgsolo.advisory_locks` (:class:`LocksQuery`, whose plan ``_async/holders.py``
drives), the rows it reads (:class:`AdvisoryLock`), :func:`wait_chains`, and
:func:`semaphore_uses` (each semaphore's slots as one :class:`SemaphoreUse`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from .. import sql
from ..drivers import DriverBase
from ..drivers.conninfo import DEFAULT_APP_PREFIX
from ..errors import InvalidArgumentError, PgsoloError, UsageError
from ..keys import (
    LEADER_PREFIX,
    MAX_SEMAPHORE_LIMIT,
    SEMAPHORE_PREFIX,
    Key,
    KeyLike,
    Registry,
    as_key,
    decode_pg_lock,
    derive_int32,
    derive_int64,
    leader_key,
    semaphore_keys,
)
from ..locking.plans import Plan
from .snapshot import check_positive, parse_time, snapshot_plan

__all__ = [
    "AdvisoryLock",
    "LocksQuery",
    "SemaphoreSlot",
    "SemaphoreUse",
    "check_semaphores",
    "holders_query",
    "semaphore_uses",
    "wait_chains",
]


SinceSource = Literal[
    "waitstart", "query_start", "state_change", "xact_start", "backend_start", "term_start"
]

# PostgreSQL keeps an application_name to NAMEDATALEN - 1 bytes and cuts a longer one: a
# semaphore's session name that long may have lost digits of its limit.
_APPLICATION_NAME_BYTES = 63


@dataclass(frozen=True, slots=True)
class SemaphoreSlot:
    """The semaphore (:func:`~pgsolo.semaphore`) an advisory lock is a slot of: its
    ``name``, its ``limit`` (how many may hold it at once) and the ``slot`` (0 to
    ``limit - 1``) whose key the lock is (DESIGN §2, Semaphore keys)."""

    name: str
    limit: int
    slot: int


@dataclass(frozen=True, slots=True)
class SemaphoreUse:
    """One semaphore as :func:`semaphore_uses` reads it from the rows of
    :func:`~pgsolo.advisory_locks`: its ``name`` and ``limit``, who holds its slots
    (``holders``, ``(pid, slot)`` pairs by slot; the pid is ``None`` for a prepared
    transaction) and the pids that wait for one (``waiting``, longest waiting first),
    as of ``observed_at`` (the server's clock)."""

    name: str
    limit: int
    holders: tuple[tuple[int | None, int], ...]
    waiting: tuple[int, ...]
    observed_at: datetime

    @property
    def held(self) -> int:
        """How many of its ``limit`` slots are held."""
        return len({slot for _pid, slot in self.holders})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: an entry of ``semaphores`` in ``pgsolo locks --json``."""
        return {
            "name": self.name,
            "limit": self.limit,
            "held": self.held,
            "holders": [{"pid": pid, "slot": slot} for pid, slot in self.holders],
            "waiting": list(self.waiting),
        }


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
    which. PostgreSQL records no grant time for a held lock, and a session that pgsolo's
    keeper watches runs a beat every few seconds, which moves ``state_change``: for such
    a session (``keeper`` true: its last statement is the beat of one of its keys)
    ``since`` is ``backend_start``, held *at most* since then (``pgsolo run`` opens its
    connection for the run, just before it takes the lock), and ``query`` is ``None``:
    the beat is not the holder's work. A leader's term on a connection pgsolo opened
    (``leader()`` from a connection string, ``campaign()``) is recorded as it begins
    (``pgsolo.leader_terms``, ``pgsolo migrate``): while the session that recorded it
    holds the key, ``since`` is that start (``"term_start"``), not its session's, which
    may have waited as a candidate for days.

    ``holds_back_vacuum_since`` is the start of the session's transaction when the
    session holds a snapshot (``backend_xmin``) or a transaction id (``backend_xid``): for
    that long at most it has held back VACUUM in the whole database (``pgsolo doctor``
    judges it); ``None`` when it holds neither.

    ``name`` comes from the registry, the given names, or else from the holder itself:
    a session whose ``application_name`` is pgsolo's (``pgsolo:<name>``) is named when
    ``<name>`` derives to the key (a hash, so never a wrong guess), and a leader's or a
    candidate's (``pgsolo:leader:<name>``) by that whole name, its key's; with
    ``from_ledger=True``, a key that is still unnamed gets the name of the job of
    pgsolo's ledger that last ran with it. A name found for one row of a key names its
    every row (a waiter's session may say nothing of the key it waits for). Fields of
    ``pg_stat_activity`` are ``None`` when the server hides another
    role's session (without ``pg_read_all_stats``) or the backend just ended.

    ``semaphore`` says which semaphore's slot the key is, when the semaphore is known:
    given (``semaphores=``), or told by the ``application_name`` of a session that holds
    or waits for one of its slots (``pgsolo:semaphore:<name>/<limit>``, trusted only when
    that slot's key derives from ``<name>``). Such a lock is named after its slot,
    ``pgsolo:semaphore:<name>:<slot>``, unless the registry or the given names name it;
    :func:`semaphore_uses` groups the slots of each semaphore.
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
    keeper: bool = False
    holds_back_vacuum_since: datetime | None = None
    semaphore: SemaphoreSlot | None = None

    @property
    def age_seconds(self) -> float | None:
        """How long it has been held or waited for, by the server's clock."""
        return None if self.since is None else (self.observed_at - self.since).total_seconds()

    @property
    def holds_back_vacuum_seconds(self) -> float | None:
        """How long its session has held back VACUUM at most, by the server's clock."""
        since = self.holds_back_vacuum_since
        return None if since is None else (self.observed_at - since).total_seconds()

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
            "keeper": self.keeper,
            "holds_back_vacuum_seconds": self.holds_back_vacuum_seconds,
            "blocked_by": list(self.blocked_by),
        }


class _Namer:
    """Names for keys: the registry first, then the v1 derivation of the given names
    (an int64 key, or a pair in any namespace whose resource half is the name's int32),
    then the slots of the semaphores known (:meth:`slots`)."""

    def __init__(
        self,
        registry: Registry | None,
        names: Iterable[str],
        semaphores: Mapping[str, int] | None = None,
    ) -> None:
        if isinstance(names, str):
            raise InvalidArgumentError(f"names= takes a list of names, not one str ({names!r})")
        if not isinstance(names, Iterable):
            raise InvalidArgumentError(f"names= takes a list of names, got {names!r}")
        if registry is not None and not isinstance(registry, Registry):
            raise InvalidArgumentError(f"registry must be a pgsolo.Registry, got {registry!r}")
        self._registry = registry
        self._int64: dict[int, str] = {}
        self._int32: dict[int, str] = {}
        for name in names:
            self._int64.setdefault(derive_int64(name), name)  # InvalidKeyError first
            self._int32.setdefault(derive_int32(name), name)
        self._semaphores = check_semaphores({} if semaphores is None else semaphores)

    def name_of(
        self, key: Key, claims: tuple[_Claim, ...] = (), slot: SemaphoreSlot | None = None
    ) -> str | None:
        if self._registry is not None and (registered := self._registry.name_of(key)):
            return registered
        if isinstance(key.value, tuple):
            given = self._int32.get(key.value[1])
            own = (c.name for c in claims if c.int32 == key.value[1])
        else:
            given = self._int64.get(key.value)
            own = (c.name for c in claims if c.int64 == key.value)
        if given is None and slot is not None:
            given = f"{SEMAPHORE_PREFIX}{slot.name}:{slot.slot}"
        return given or next(own, None)

    def slots(
        self, rows: Iterable[Sequence[Any]], sessions: Mapping[str, Mapping[str, Any]]
    ) -> dict[int, SemaphoreSlot]:
        """The int64 keys of the slots of every semaphore known, each to its slot: the
        semaphores given (with their limits, whatever a session says), and those a
        session holding or waiting for one of their slots names in its
        ``application_name``, ``pgsolo:semaphore:<name>/<limit>`` (the largest limit any
        such session says). A session's word counts only when the key it holds or waits
        for is a slot of that name below that limit: a hash, so never a wrong guess."""
        slot_keys = _SlotKeys()
        told: dict[str, int] = {}
        said: dict[int, tuple[str, int] | None] = {}
        for pid, classid, objid, objsubid, *_ in rows:
            if pid is None or objsubid != 1:  # a slot is an int64 key
                continue
            if pid not in said:
                said[pid] = _semaphore_said(sessions.get(str(pid), {}).get("application_name"))
            if (claim := said[pid]) is None:
                continue
            name, limit = claim
            if name in self._semaphores or told.get(name, 0) >= limit:
                continue  # nothing to learn: its slots are known already
            value = decode_pg_lock(int(classid), int(objid), 1).value
            if isinstance(value, int) and slot_keys.is_slot(name, limit, value):
                told[name] = limit
        found: dict[int, SemaphoreSlot] = {}
        for name, values in self._semaphores.items():
            for slot, value in enumerate(values):
                found.setdefault(value, SemaphoreSlot(name, len(values), slot))
        for name, limit in told.items():
            for value, slot in slot_keys.of(name, limit).items():
                if slot < limit:
                    found.setdefault(value, SemaphoreSlot(name, limit, slot))
        return found


def check_semaphores(
    semaphores: Mapping[str, int], what: str = "semaphores="
) -> dict[str, tuple[int, ...]]:
    """The int64 keys of the slots of each semaphore of ``semaphores`` (name -> limit),
    slot 0 first, checked as :func:`~pgsolo.semaphore` checks its name and limit: else
    :class:`~pgsolo.InvalidArgumentError` naming ``what`` was given, before any SQL."""
    if isinstance(semaphores, str | bytes) or not isinstance(semaphores, Mapping):
        raise InvalidArgumentError(
            f"{what} takes a mapping of semaphore names to their limits, such as"
            f" {{'exports': 3}}, got {type(semaphores).__name__} {semaphores!r}"
        )
    checked: dict[str, tuple[int, ...]] = {}
    for name, limit in semaphores.items():
        try:
            keys = semaphore_keys(name, limit)
        except UsageError as exc:
            raise InvalidArgumentError(f"{what} {name!r}: {exc}") from None
        checked[name] = tuple(key.value for key in keys if isinstance(key.value, int))
    return checked


class _SlotKeys:
    """The int64 keys of a semaphore's slots, each derived once (within one call)."""

    def __init__(self) -> None:
        self._slots: dict[str, dict[int, int]] = {}  # name -> key -> slot

    def of(self, name: str, limit: int) -> dict[int, int]:
        """The keys of slots 0 to at least ``limit - 1`` of ``name``, each to its slot."""
        slots = self._slots.setdefault(name, {})
        for slot in range(len(slots), limit):
            slots.setdefault(derive_int64(f"{SEMAPHORE_PREFIX}{name}:{slot}"), slot)
        return slots

    def is_slot(self, name: str, limit: int, value: int) -> bool:
        """Whether ``value`` is the key of a slot of ``name`` below ``limit``."""
        slot = self.of(name, limit).get(value)
        return slot is not None and slot < limit


def _semaphore_said(application_name: object) -> tuple[str, int] | None:
    """The semaphore and limit that ``pgsolo:semaphore:<name>/<limit>`` says
    (:func:`~pgsolo.keys.semaphore_session_name`), or None: not such a name, or one so
    long that the server may have cut it."""
    if not isinstance(application_name, str) or not application_name.startswith(SEMAPHORE_PREFIX):
        return None
    if len(application_name.encode("utf-8", "replace")) >= _APPLICATION_NAME_BYTES:
        return None
    name, slash, limit = application_name.removeprefix(SEMAPHORE_PREFIX).rpartition("/")
    # The limit as pgsolo writes it: decimal digits, no sign, no leading zero.
    if not (slash and name and limit.isascii() and limit.isdigit()) or limit != str(int(limit)):
        return None
    if not 1 <= int(limit) <= MAX_SEMAPHORE_LIMIT:
        return None
    return name, int(limit)


@dataclass(frozen=True, slots=True)
class _Claim:
    """A name a pgsolo session's ``application_name`` says, with the keys it derives to: a
    lock of the session is named by it only if its key matches. ``pgsolo:<name>`` says
    ``<name>`` (a job's); a leader's, ``pgsolo:leader:<name>``, is its key's name itself."""

    name: str
    int64: int
    int32: int

    @classmethod
    def of(cls, application_name: object) -> tuple[_Claim, ...]:
        if not isinstance(application_name, str):
            return ()
        name = application_name.removeprefix(DEFAULT_APP_PREFIX)
        if name == application_name or not name or name != name.strip():
            return ()
        names = [application_name, name] if application_name.startswith(LEADER_PREFIX) else [name]
        claims = []
        for each in names:
            # One that is not a name pgsolo could have derived a key from claims nothing.
            with contextlib.suppress(PgsoloError):
                claims.append(cls(each, derive_int64(each), derive_int32(each)))
        return tuple(claims)


@dataclass(frozen=True)
class LocksQuery:
    """The arguments of :func:`~pgsolo.advisory_locks`, checked before any SQL is sent,
    and the plan that reads the locks (driven in ``_async/holders.py`` and its twin)."""

    namer: _Namer
    statements: list[str]
    from_ledger: bool

    @classmethod
    def of(
        cls,
        registry: Registry | None,
        names: Iterable[str],
        key: KeyLike | None,
        pid: int | None,
        from_ledger: bool = False,
        semaphores: Mapping[str, int] | None = None,
    ) -> LocksQuery:
        namer = _Namer(registry, names, semaphores)
        wanted = as_key(key, registry=registry) if key is not None else None
        if pid is not None:
            check_positive(pid, "pid")
        statements = [sql.CLEAR_ACTIVITY_SNAPSHOT, sql.advisory_locks(key=wanted, pid=pid)]
        return cls(namer, statements, from_ledger)

    def plan(self, driver: DriverBase) -> Plan[list[AdvisoryLock]]:
        snapshot = yield from snapshot_plan(driver, self.statements)
        locks = yield from _terms_plan(driver, snapshot, _locks_from(snapshot, self.namer))
        unnamed = any(lock.name is None for lock in locks)
        if not (self.from_ledger and unnamed and snapshot.get("ledger")):
            return locks
        jobs = yield from snapshot_plan(driver, [sql.LEDGER_KEYS])
        return [_named_by(lock, jobs) for lock in locks]

    def holders_plan(self, driver: DriverBase) -> Plan[list[AdvisoryLock]]:
        """The sessions (or prepared transactions) that hold the key; not waiters."""
        locks = yield from self.plan(driver)
        return [lock for lock in locks if lock.granted]


def _terms_plan(
    driver: DriverBase, snapshot: Mapping[str, Any], locks: list[AdvisoryLock]
) -> Plan[list[AdvisoryLock]]:
    """``locks`` with each leader's ``since`` moved to its term's recorded start
    (``since_source`` ``"term_start"``), and the rows of a leader's key that no session
    could name (an ``application_name`` keeps ASCII only, and 63 bytes: a longer name, or
    one of other letters) named from the term its holder recorded. In a second round trip,
    made only when the snapshot found the record readable and a held key is a leader's or
    has no name; otherwise ``locks`` as they are, each with the bound its session gives."""
    if not (
        snapshot.get("leader_terms")
        and any(_leads(lock) or (lock.granted and lock.name is None) for lock in locks)
    ):
        return locks
    found = yield from snapshot_plan(driver, [sql.LEADER_TERMS])
    terms: dict[tuple[int | None, object], tuple[Key, datetime | None]] = {}
    for pid, name, started_at in found["terms"]:
        # A row any role with INSERT could write: one that names no leader claims nothing,
        # and one names only the key its name derives to, held by its own pid.
        with contextlib.suppress(PgsoloError):
            key = leader_key(name)
            terms[(pid, key.value)] = (key, parse_time(started_at))
    leaders = {
        lock.key.value: term[0]
        for lock in locks
        if lock.granted
        and (lock.name is None or _leads(lock))
        and (term := terms.get((lock.pid, lock.key.value))) is not None
    }
    return [_as_term(lock, leaders.get(lock.key.value), terms) for lock in locks]


def _as_term(
    lock: AdvisoryLock,
    key: Key | None,
    terms: Mapping[tuple[int | None, object], tuple[Key, datetime | None]],
) -> AdvisoryLock:
    """``lock``, named a leader's (``key``) if it has no name, and with its term's start
    if it leads."""
    if key is not None and lock.name is None:
        lock = replace(lock, key=key, name=key.name)
    term = terms.get((lock.pid, lock.key.value))
    if _leads(lock) and term is not None and term[1] is not None:
        return replace(lock, since=term[1], since_source="term_start")
    return lock


def _leads(lock: AdvisoryLock) -> bool:
    return lock.granted and (lock.name or "").startswith(LEADER_PREFIX)


def _named_by(lock: AdvisoryLock, jobs: Mapping[str, Any]) -> AdvisoryLock:
    """``lock`` named after the ledger's job that last ran with its key, if it has no name."""
    job = jobs.get(lock.key.text)
    if lock.name is not None or not isinstance(job, str):
        return lock
    return replace(lock, key=Key(lock.key.value, job), name=job)


def holders_query(key: KeyLike, namespace: int | None, registry: Registry | None) -> LocksQuery:
    """:func:`~pgsolo.advisory_locks`'s query for one key, given as every lock call takes it (a
    name, an int, a pair, a :class:`Key`), checked before any SQL is sent; the rows come
    back named by the name given."""
    wanted = as_key(key, namespace=namespace, registry=registry)
    return LocksQuery.of(registry, () if wanted.name is None else (wanted.name,), wanted, None)


def _locks_from(snapshot: Mapping[str, Any], namer: _Namer) -> list[AdvisoryLock]:
    seen_after = parse_time(snapshot["seen_after"])
    now = parse_time(snapshot["now"])
    # The query always sets both.
    assert seen_after is not None  # noqa: S101
    assert now is not None  # noqa: S101
    sessions: Mapping[str, Mapping[str, Any]] = snapshot["sessions"]
    database = str(snapshot["database"])
    # What a holder's session says is the same for each of its locks (one session may
    # hold thousands): worked out once per pid.
    holding: dict[int | None, tuple[Any, ...]] = {}
    claims: dict[int | None, tuple[_Claim, ...]] = {}
    kept = _kept_sessions(snapshot["locks"], sessions)
    slots = namer.slots(snapshot["locks"], sessions)
    locks = []
    for pid, classid, objid, objsubid, shared, granted, waitstart, blockers in snapshot["locks"]:
        key = decode_pg_lock(int(classid), int(objid), int(objsubid))
        activity = sessions.get(str(pid), {}) if pid is not None else {}
        if pid not in claims:
            claims[pid] = _Claim.of(activity.get("application_name"))
        slot = slots.get(key.value) if slots and isinstance(key.value, int) else None
        if (name := namer.name_of(key, claims[pid], slot)) is not None:
            key = Key(key.value, name)
        if granted:
            if (facts := holding.get(pid)) is None:
                facts = holding[pid] = (
                    _lifetime(pid, True, activity, seen_after),
                    *_since(True, None, activity, kept=pid in kept),
                    None if pid in kept else _one_line(activity.get("query")),
                )
        else:
            facts = (
                None,
                *_since(False, parse_time(waitstart), activity),
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
                keeper=bool(granted) and pid in kept,
                holds_back_vacuum_since=(
                    parse_time(activity.get("xact_start"))
                    if activity.get("holds_horizon")
                    else None
                ),
                semaphore=slot,
            )
        )
    locks = _named_alike(locks)
    locks.sort(key=_display_order)
    return locks


def _named_alike(locks: list[AdvisoryLock]) -> list[AdvisoryLock]:
    """``locks`` with each unnamed one named as another row of its key is: a name that
    one session's ``application_name`` proves (it derives to the key) is the key's, so a
    waiter whose own session says nothing waits for that name too."""
    named = {lock.key.value: lock.key for lock in locks if lock.name is not None}
    return [
        replace(lock, key=key, name=key.name)
        if lock.name is None and (key := named.get(lock.key.value)) is not None
        else lock
        for lock in locks
    ]


def _lifetime(
    pid: int | None, granted: bool, activity: Mapping[str, Any], seen_after: datetime
) -> Literal["session", "xact"] | None:
    if pid is None:
        return "xact"  # a prepared transaction: no session, only its transaction's locks
    if not granted:
        return None
    idle_since = parse_time(activity.get("state_change"))
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


# What every keeper beat starts with, whatever its key.
_BEAT_START = sql.keeper_beat(Key(0), shared=False).partition(" AND classid")[0]


def _kept_sessions(rows: list[list[Any]], sessions: Mapping[str, Any]) -> set[int]:
    """The pids whose last statement is pgsolo's keeper beat for one of the keys they
    hold: the exact text :func:`pgsolo.sql.keeper_beat` sends (shorter than
    ``MONITOR_QUERY_CHARS``, so never cut), not merely a statement that looks like one."""
    # Most sessions are not kept: their locks are not looked at (10,000 stay cheap).
    looks_kept = {
        int(pid): query
        for pid, activity in sessions.items()
        if isinstance(query := activity.get("query"), str) and query.startswith(_BEAT_START)
    }
    kept: set[int] = set()
    if not looks_kept:
        return kept
    for pid, classid, objid, objsubid, shared, granted, *_ in rows:
        if granted and pid in looks_kept and pid not in kept:
            key = decode_pg_lock(int(classid), int(objid), int(objsubid))
            if sql.keeper_beat(key, shared=bool(shared)) == looks_kept[pid]:
                kept.add(pid)
    return kept


def _since(
    granted: bool, waitstart: datetime | None, activity: Mapping[str, Any], *, kept: bool = False
) -> tuple[datetime | None, SinceSource | None]:
    candidates: tuple[tuple[datetime | None, SinceSource], ...]
    if kept and activity.get("xact_start") is None:
        # Each beat moves state_change: the session's start bounds the lock from above.
        candidates = ((parse_time(activity.get("backend_start")), "backend_start"),)
    elif not granted:
        candidates = (
            (waitstart, "waitstart"),
            (parse_time(activity.get("query_start")), "query_start"),
        )
    elif activity.get("xact_start") is None:
        candidates = ((parse_time(activity.get("state_change")), "state_change"),)
    else:
        candidates = ((parse_time(activity.get("xact_start")), "xact_start"),)
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


def semaphore_uses(locks: Sequence[AdvisoryLock]) -> list[SemaphoreUse]:
    """Each semaphore that ``locks`` (the rows of :func:`~pgsolo.advisory_locks`) hold or
    wait for a slot of, as one :class:`SemaphoreUse`, by name: ``2 of 3 held, 1 waiting``
    rather than one row per slot. A semaphore is known when ``advisory_locks`` was given
    it (``semaphores=``) or one of its sessions says it (see
    :attr:`AdvisoryLock.semaphore`); the slots of one nobody made known stay rows of
    unnamed keys."""
    grouped: dict[tuple[str, int], list[AdvisoryLock]] = {}
    for lock in locks:
        if lock.semaphore is not None:
            grouped.setdefault((lock.semaphore.name, lock.semaphore.limit), []).append(lock)
    uses = []
    for (name, limit), slots in sorted(grouped.items()):
        holders = [
            (lock.pid, lock.semaphore.slot)
            for lock in slots
            if lock.granted and lock.semaphore is not None
        ]
        waiters = sorted(
            (lock for lock in slots if not lock.granted and lock.pid is not None),
            key=lambda lock: (lock.since is None, lock.since or lock.observed_at, lock.pid),
        )
        uses.append(
            SemaphoreUse(
                name=name,
                limit=limit,
                holders=tuple(sorted(holders, key=lambda held: (held[1], held[0] or 0))),
                waiting=tuple(dict.fromkeys(lock.pid for lock in waiters if lock.pid is not None)),
                observed_at=max(lock.observed_at for lock in slots),
            )
        )
    return uses
