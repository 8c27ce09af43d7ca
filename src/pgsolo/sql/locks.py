"""The statements that take, check and release advisory locks, and that find out what
answers a connection (a proxy? a standby?)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import NamedTuple

from .._types import Lifetime
from ..keys import Key, encode_pg_lock, from_name
from .states import SQLSTATE_LOCK_GONE, UNLOCK_ANSWERS
from .text import Truth, sql_literal, utf8

__all__ = [
    "BEGIN",
    "CHANGES_NOTHING",
    "COMMIT",
    "COMMIT_CHECK_SAVEPOINT",
    "FENCING_SEQUENCE",
    "IN_RECOVERY",
    "KEEPER_BEAT_ALL",
    "ROLLBACK",
    "SAVEPOINT",
    "SAVEPOINT_RELEASE",
    "SAVEPOINT_UNDO",
    "SESSION_STAMP_SETTING",
    "STATEMENT_TIMEOUT_MS",
    "UNLOCK_ALL",
    "XACT_MARKER_SETTING",
    "GuardedCall",
    "LockCall",
    "LoneCall",
    "Prepared",
    "WaitCall",
    "acquire",
    "assert_same_transaction",
    "begin_with",
    "derived_int64",
    "held_at_commit",
    "held_here",
    "held_lock_text",
    "hold_savepoint",
    "is_session",
    "keeper_beat",
    "lock_function",
    "mark_transaction",
    "name_to_sql",
    "release_savepoint",
    "rollback_to_savepoint",
    "same_transaction",
    "savepoint",
    "session_guarded",
    "set_local_lock_timeout",
    "stamp_session",
    "still_on_session",
    "unlock",
    "unlock_keeping_failure",
    "watch_client",
    "xact_wait",
]


BEGIN = "BEGIN"


def begin_with(isolation: str | None, read_only: bool | None, deferrable: bool | None) -> str:
    """BEGIN with the transaction's characteristics (None: the session's default), as a
    driver's own transaction would begin on the caller's connection: ``isolation`` is one
    of PostgreSQL's isolation levels, spelled as in SQL (``REPEATABLE READ``)."""
    if isolation is not None and isolation not in _ISOLATION_LEVELS:
        raise ValueError(f"not an isolation level: {isolation!r}")
    parts = [BEGIN]
    if isolation is not None:
        parts.append(f"ISOLATION LEVEL {isolation}")
    if read_only is not None:
        parts.append("READ ONLY" if read_only else "READ WRITE")
    if deferrable is not None:
        parts.append("DEFERRABLE" if deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


_ISOLATION_LEVELS = ("READ UNCOMMITTED", "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"
# Changes nothing; an aborted transaction refuses it (25P02), which is what it asks.
CHANGES_NOTHING = "SELECT 1"

# The connection's statement_timeout in milliseconds (0: none), read after a wait the
# server cancelled, to tell that limit from a cancel request.
STATEMENT_TIMEOUT_MS = "SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'"

# Inside the caller's transaction, pgsolo's statements run in a savepoint: rolling back
# to it after an error or an interruption keeps the caller's transaction usable (and
# restores lock_timeout), while a session-level advisory lock survives the rollback
# (PostgreSQL: session locks ignore transaction semantics).
SAVEPOINT = "SAVEPOINT pgsolo_lock"
SAVEPOINT_UNDO = "ROLLBACK TO SAVEPOINT pgsolo_lock"
SAVEPOINT_RELEASE = "RELEASE SAVEPOINT pgsolo_lock"


# A session lock taken inside the caller's transaction keeps a savepoint of pgsolo's, its
# "hold", open for its block: if the transaction fails inside the block, rolling back to
# the hold undoes only the block's work (which the caller must roll back anyway: its own
# recovery point is outside the block) and lets the unlock run, where a ROLLBACK would end
# the caller's whole transaction. Named after the key, so that the holds of several keys
# nest: a connection holds a key once (re-entrant holds share the first one's hold).
def hold_savepoint(key: Key) -> str:
    """The name of the savepoint that holds ``key``'s session-lock block."""
    return "pgsolo_hold_" + key.sql_args.replace(", ", "_").replace("-", "m")


def _savepoint_name(name: str) -> str:
    if not name.isascii() or not name.replace("_", "").isalnum() or not name[:1].isalpha():
        raise ValueError(f"a savepoint of pgsolo's is a plain identifier, got {name!r}")
    return name


def savepoint(name: str) -> str:
    return f"SAVEPOINT {_savepoint_name(name)}"


def release_savepoint(name: str) -> str:
    return f"RELEASE SAVEPOINT {_savepoint_name(name)}"


def rollback_to_savepoint(name: str) -> str:
    return f"ROLLBACK TO SAVEPOINT {_savepoint_name(name)}"


# The connection's own lock_timeout, saved for the transaction before a wait's slice sets
# its own, and put back once the lock is granted: expressions of the statement that waits
# (xact_wait), each never NULL.
_SAVE_LOCK_TIMEOUT = (
    "set_config('pgsolo.lock_timeout_before_wait', current_setting('lock_timeout'), true)"
)
_RESTORE_LOCK_TIMEOUT = (
    "set_config('lock_timeout', current_setting('pgsolo.lock_timeout_before_wait'), true)"
)


def lock_function(lifetime: Lifetime, *, wait: bool, shared: bool) -> str:
    """The name of the advisory-lock function for these choices (the article's table)."""
    return (
        "pg_"
        + ("" if wait else "try_")
        + "advisory_"
        + ("xact_" if lifetime == "xact" else "")
        + "lock"
        + ("_shared" if shared else "")
    )


# -- standbys ------------------------------------------------------------------------
#
# Advisory locks are not WAL-logged: a hot standby grants them locally and no other
# server ever sees them, so every lock pgsolo takes is refused on a server in recovery.
# A server never goes into recovery while a session lives (only a restart does that),
# so a session lock checks once per connection, with the route (stamp_session); an xact
# lock, which a transaction pooler may send to another server each time, checks in the
# statement that takes it.

IN_RECOVERY = "pg_is_in_recovery()"


FENCING_SEQUENCE = "pgsolo.fencing_token_seq"


# -- prepared once per session ----------------------------------------------------------
#
# A session lock's try and its unlock are each one call of a lock function, sent on its own
# outside any transaction. As a simple query the server parses and plans it on every call:
# 30 µs of a session lock and unlock's 210 over a local socket. A driver that can may
# prepare the call once per session, as psycopg prepares its caller's statements, and run
# it by name with the key as parameters after that (:mod:`pgsolo.drivers.prepared`).


class Prepared(NamedTuple):
    """A lock call as a prepared statement: ``template`` with ``$1`` (and ``$2``) for the
    key, ``params`` the key as text (``values``: as numbers, for a driver that sends
    them so). ``name`` is a digest of the template: the same for
    every key of that shape, so a session prepares a handful at most, and a statement of
    that name left on a pooled session by another version of pgsolo is never taken for
    this one."""

    name: bytes
    template: bytes
    params: tuple[bytes, ...]
    values: tuple[int, ...]


class LoneCall(Truth):
    """A statement sent alone, outside any transaction, that answers at once and changes
    no transaction: a lock's try or unlock. A driver may send it by its own cheapest round
    trip, whose cancellation leaves nothing behind that pgsolo's recovery cannot find."""


class LockCall(LoneCall):
    """``SELECT <lock function>(<key>)`` of a function that answers true or false at once
    (a try, an unlock), with the form a session may prepare it in (:attr:`prepared`)."""

    prepared: Prepared


def _lock_call(function: str, key: Key) -> LockCall:
    call = LockCall(f"SELECT {function}({key.sql_args})")
    parts = key.value if isinstance(key.value, tuple) else (key.value,)
    pair = len(parts) == 2
    template = f"SELECT {function}({'$1::integer, $2::integer' if pair else '$1::bigint'})"
    digest = hashlib.blake2s(template.encode("ascii"), digest_size=8).hexdigest()
    call.prepared = Prepared(
        f"pgsolo_{digest}".encode("ascii"),
        template.encode("ascii"),
        tuple(str(part).encode("ascii") for part in parts),
        parts,
    )
    return call


# Built once per key and choice: a lock is taken again and again under the same key.
@functools.lru_cache(maxsize=1024)
def acquire(
    key: Key,
    lifetime: Lifetime,
    *,
    wait: bool,
    shared: bool,
    fencing: bool = False,
    refuse_standby: bool = False,
) -> str:
    """Take the lock: true/false for a try, true once granted for a wait. With
    ``fencing``, the lock and its token in one statement: the token (from 1 up) once
    granted, 0 for a busy try. The sequence never waits for anyone, and a statement
    that names it fails before it takes the lock when it does not exist.

    ``refuse_standby`` (tries only): NULL instead of taking the lock on a server in
    recovery. CASE tests its conditions in order, so the lock function is not called
    there; the check costs no round trip and leaves the caller's transaction usable.
    A transaction lock's wait is :func:`xact_wait`."""
    call = f"{lock_function(lifetime, wait=wait, shared=shared)}({key.sql_args})"
    token = f"nextval('{FENCING_SEQUENCE}')"
    if wait:  # the waiting functions return void: as a subquery, a row once granted
        if fencing:
            return f"SELECT (SELECT {token} FROM {call})"
        return Truth(f"SELECT (SELECT true FROM {call})")
    standby = f"WHEN {IN_RECOVERY} THEN NULL " if refuse_standby else ""
    if fencing:
        return f"SELECT CASE {standby}WHEN {call} THEN {token} ELSE 0 END"
    if refuse_standby:
        return Truth(f"SELECT CASE {standby}ELSE {call} END")
    return _lock_call(lock_function(lifetime, wait=False, shared=shared), key)


def xact_wait(
    key: Key, lock_timeout_ms: int, *, shared: bool, fencing: bool, marker: str | None = None
) -> str:
    """One slice of a transaction lock's wait, in one statement: on a server in recovery
    NULL, with nothing taken or set; otherwise (with ``marker``: the transaction marked as
    :func:`mark_transaction` marks it, a job's, which then opens with one statement, not
    two) the connection's own ``lock_timeout`` saved for the transaction, the slice's
    (``lock_timeout_ms``) set for it (``SET LOCAL``'s function, which takes effect at once,
    for the wait in this same statement), the lock, waited for, then the connection's own
    ``lock_timeout`` put back for the statements that follow in the transaction, then true
    (with ``fencing``: the token). A slice that runs out fails with SQLSTATE 55P03, and what
    it set goes with the transaction (or the savepoint) it fails. Its value is the
    message's last, which every driver reads.

    CASE tests its conditions in order, evaluates only the branch it takes, and reads
    ``pg_is_in_recovery()`` once, so a server promoted meanwhile cannot make it answer for
    a lock it did not take. Plain SQL, where a ``DO`` block raising an error of pgsolo's
    cost the server a third of the wait's round trip to compile on every acquisition; and
    one statement, where a statement each to save and to set ``lock_timeout`` cost the
    server a parse, a plan and a portal each (docs/benchmarks.md)."""
    marked = marker is not None
    before, after, form, execute = _xact_wait_around(
        key, shared=shared, fencing=fencing, marked=marked
    )
    milliseconds = _milliseconds(lock_timeout_ms)
    statement = f"{before}{milliseconds}{after}"
    arguments = f"{execute}{milliseconds}ms'"
    if marker is not None:
        literal = _token_literal(marker)
        statement = statement.replace(_MARKER_SLOT, literal, 1)
        arguments = f"{arguments}, {literal}"
    if fencing:
        return statement
    wait = WaitCall(statement)
    wait.prepared = form
    wait.executed = f"{arguments})"
    return wait


class WaitCall(Truth):
    """A slice of a transaction lock's wait (:func:`xact_wait`), with the form a session
    may prepare it in (:attr:`prepared`: the key, the slice's ``lock_timeout`` and a job's
    marker as parameters) and the ``EXECUTE`` of that form that runs it
    (:attr:`executed`). The wait goes in one message with the BEGIN it opens, so it is run
    by ``EXECUTE`` in that message, not by a message of its own: the server then parses
    and plans it once per session instead of once per acquisition, a fifth of the server's
    time for the lock's round trips (docs/benchmarks.md)."""

    prepared: Prepared
    executed: str


# Where a job's marker goes in the wait's text (never in pgsolo's SQL otherwise).
_MARKER_SLOT = "\1"


# Built once per key and choice; only the slice's milliseconds (and a job's marker) go
# between the pieces.
@functools.lru_cache(maxsize=1024)
def _xact_wait_around(
    key: Key, *, shared: bool, fencing: bool, marked: bool
) -> tuple[str, str, Prepared, str]:
    marker = _MARKER_SLOT if marked else None
    statement = _xact_wait_statement(key.sql_args, "'\0ms'", marker, shared=shared, fencing=fencing)
    before, after = statement.split("\0")
    parts = key.value if isinstance(key.value, tuple) else (key.value,)
    # The key, then the slice's lock_timeout as set_config() takes it (text, with its
    # unit), then a job's marker.
    first = len(parts) + 1
    arguments = "$1::integer, $2::integer" if len(parts) == 2 else "$1::bigint"
    template = _xact_wait_statement(
        arguments,
        f"${first}::text",
        f"${first + 1}::text" if marked else None,
        shared=shared,
        fencing=fencing,
    )
    digest = hashlib.blake2s(template.encode("ascii"), digest_size=8).hexdigest()
    form = Prepared(
        f"pgsolo_{digest}".encode("ascii"),
        template.encode("ascii"),
        tuple(str(part).encode("ascii") for part in parts),
        parts,
    )
    # The EXECUTE of the form, up to the slice's milliseconds.
    return before, after, form, f"EXECUTE {form.name.decode('ascii')}({key.sql_args}, '"


def _xact_wait_statement(
    arguments: str, lock_timeout: str, marker: str | None, *, shared: bool, fencing: bool
) -> str:
    """The wait of :func:`xact_wait`, the key as ``arguments``, its ``lock_timeout`` and a
    job's ``marker`` (None: none) as the SQL text given."""
    call = f"{lock_function('xact', wait=True, shared=shared)}({arguments})"
    granted = f"nextval('{FENCING_SEQUENCE}')" if fencing else "true"
    none = "NULL::bigint" if fencing else "NULL::boolean"  # typed: every branch is one type
    marking = (
        ""
        if marker is None
        else f" WHEN set_config('{XACT_MARKER_SETTING}', {marker}, true) IS NULL THEN {none}"
    )
    # The lock function returns void and set_config text: neither is ever NULL, so each
    # test only makes it run, in its turn.
    return (
        f"SELECT CASE WHEN {IN_RECOVERY} THEN {none}{marking}"
        f" WHEN {_SAVE_LOCK_TIMEOUT} IS NULL THEN {none}"
        f" WHEN set_config('lock_timeout', {lock_timeout}, true) IS NULL THEN {none}"
        f" WHEN {call} IS NULL THEN {none}"
        f" WHEN {_RESTORE_LOCK_TIMEOUT} IS NULL THEN {none} ELSE {granted} END"
    )


@functools.lru_cache(maxsize=1024)
def unlock(key: Key, *, shared: bool) -> str:
    # Returns true, or false (with a server warning) when the key was not held.
    return _lock_call(f"pg_advisory_unlock{'_shared' if shared else ''}", key)


def unlock_keeping_failure(unlock_statement: str) -> str:
    """``unlock_statement`` (a ``SELECT <expr>``, maybe :func:`session_guarded`), then the
    transaction failed again, as the caller's failure had left it before pgsolo rolled
    back to the lock's hold: the unlock's answer comes back as the error's SQLSTATE
    (:data:`~pgsolo.sql.states.UNLOCK_ANSWERS`), in the same round trip."""
    codes = {answer: code for code, answer in UNLOCK_ANSWERS.items()}
    expression = unlock_statement.removeprefix("SELECT ")
    return (
        f"DO $pgsolo$BEGIN RAISE EXCEPTION USING ERRCODE = CASE ({expression})"
        f" WHEN true THEN '{codes[True]}' WHEN false THEN '{codes[False]}'"
        f" ELSE '{codes[None]}' END, MESSAGE = 'pgsolo: a session lock was released after"
        " the transaction failed in its block; the transaction stays failed';"
        " END$pgsolo$"
    )


def set_local_lock_timeout(milliseconds: int) -> str:
    return f"SET LOCAL lock_timeout = '{_milliseconds(milliseconds)}ms'"


def _milliseconds(milliseconds: int) -> int:
    """A slice's ``lock_timeout``, checked before it is spliced into a statement."""
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int) or milliseconds < 1:
        raise ValueError(f"lock_timeout must be a positive number of ms, got {milliseconds!r}")
    return milliseconds


XACT_MARKER_SETTING = "pgsolo.xact_lock_marker"


def mark_transaction(marker: str) -> str:
    """Mark the transaction that takes an xact lock (a transaction-local setting, gone
    when that transaction ends, exactly like the lock)."""
    return f"SELECT set_config('{XACT_MARKER_SETTING}', {_token_literal(marker)}, true)"


def assert_same_transaction(key: Key, marker: str, *, shared: bool) -> str:
    """Fail unless this backend still holds ``key``: sent before the COMMIT of pgsolo's
    own transaction where a framework's API ends it (Django, SQLAlchemy), so that work
    which ended the locked transaction and carried on in another is rolled back, not
    committed. A transaction-level lock can only go away with its transaction, so the
    marker of that transaction (:func:`mark_transaction`) answers without reading the
    whole shared lock table; only when the marker is gone (the work ended the
    transaction, or ran RESET ALL) is ``pg_locks`` asked. A bare connection sends
    :func:`same_transaction` instead, which is cheaper."""
    return (
        # Two IFs, not one condition (AND, or a CASE): PL/pgSQL plans an expression when it
        # first runs it, so the pg_locks query is planned only when the marker is gone.
        # Planned every time, as one condition was, it cost 130 µs of the server's on
        # every job's COMMIT.
        f"DO $pgsolo$BEGIN IF current_setting('{XACT_MARKER_SETTING}', true)"
        f" IS DISTINCT FROM {_token_literal(marker)} THEN {_raise_unless_held(key, shared)}"
        " END IF; END$pgsolo$"
    )


# pgsolo's own savepoint around the marker check of same_transaction(): what the work did
# before it stays, and the transaction stays open when the check fails.
COMMIT_CHECK_SAVEPOINT = "pgsolo_commit_check"
# A setting no session can have (a custom one has a dot in its name): asking for it fails
# with SQLSTATE 42704, and only when the CASE gets there, since current_setting() is
# stable and never folded while the statement is planned.
_MARKER_GONE = "current_setting('pgsolo: the marker of the locked transaction is gone')"


def same_transaction(marker: str) -> list[str]:
    """The check of :func:`assert_same_transaction` in plain SQL, for a bare connection,
    which sends it in the same message as the COMMIT of pgsolo's own transaction: it
    fails (SQLSTATE 42704, :attr:`Meaning.UNDEFINED_OBJECT`) when the transaction's marker
    is gone, inside a savepoint of its own, so that the statements after it (the COMMIT)
    do not run and the transaction is still open for :func:`held_at_commit` to ask
    ``pg_locks``. A DO block costs the server 14 µs more per job (its body is compiled
    each time) and, under contention, holds each lock that much longer."""
    return [
        f"SAVEPOINT {COMMIT_CHECK_SAVEPOINT}",
        f"SELECT CASE WHEN current_setting('{XACT_MARKER_SETTING}', true)"
        f" IS DISTINCT FROM {_token_literal(marker)} THEN {_MARKER_GONE} END",
        f"RELEASE SAVEPOINT {COMMIT_CHECK_SAVEPOINT}",
    ]


def held_at_commit(key: Key, *, shared: bool) -> list[str]:
    """After :func:`same_transaction` found the marker gone: back out of its savepoint
    and fail unless this backend still holds ``key`` (the work ran RESET ALL, which wipes
    the marker and keeps the lock), to be followed by the COMMIT."""
    return [
        f"ROLLBACK TO SAVEPOINT {COMMIT_CHECK_SAVEPOINT}",
        f"RELEASE SAVEPOINT {COMMIT_CHECK_SAVEPOINT}",
        f"DO $pgsolo$BEGIN {_raise_unless_held(key, shared)} END$pgsolo$",
    ]


def _raise_unless_held(key: Key, shared: bool) -> str:
    """The PL/pgSQL that raises SQLSTATE PGSLG unless this backend holds ``key``."""
    return (
        f"IF NOT {_held_here_condition(key, shared=shared)} THEN"
        f" RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_LOCK_GONE}',"
        f" MESSAGE = 'pgsolo: advisory lock {key.text} is no longer held';"
        " END IF;"
    )


def held_here(key: Key, *, shared: bool) -> str:
    """Whether this backend holds ``key`` granted, according to ``pg_locks``."""
    return Truth(f"SELECT {_held_here_condition(key, shared=shared)}")


def _held_here_condition(key: Key, *, shared: bool) -> str:
    classid, objid, objsubid = encode_pg_lock(key)
    mode = "ShareLock" if shared else "ExclusiveLock"
    return (
        "EXISTS (SELECT 1 FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid}"
        f" AND mode = '{mode}')"
    )


# -- which backend answers: proxies, the keeper ----------------------------------------
#
# A transaction-pooling proxy (PgBouncer pool_mode=transaction) hands each transaction of
# a client to whichever server connection is free, so a session lock stays on a backend
# the client no longer talks to. pgsolo stamps a session with a random token (a
# session-level setting) to see whether a second connection lands on it; statements
# meant for the session that holds a lock check its pid, and so does the keeper.

SESSION_STAMP_SETTING = "pgsolo.session_token"


def _token_literal(token: str) -> str:
    if not token or not token.isascii() or not token.isalnum():
        raise ValueError(f"a session token is ASCII letters and digits, got {token!r}")
    return f"'{token}'"


def is_session(token: str) -> str:
    """Whether this statement runs on the session stamped with ``token``."""
    return Truth(f"SELECT {_on_session(token)}")


def _on_session(token: str) -> str:
    stamped = f"coalesce(current_setting('{SESSION_STAMP_SETTING}', true), '')"
    return f"{stamped} = {_token_literal(token)}"


def stamp_session(token: str) -> str:
    """Stamp this session and say who answers: ``"<pid> <client addr or -> <port or -1>
    <in recovery: t or f>"`` (:func:`utf8`), the client address and port as the server
    sees them (a proxy shows its own)."""
    answer = (
        "concat_ws(' ', pg_backend_pid(), coalesce(host(inet_client_addr()), '-'),"
        f" coalesce(inet_client_port(), -1), CASE WHEN {IN_RECOVERY} THEN 't' ELSE 'f' END,"
        f" set_config('{SESSION_STAMP_SETTING}', {_token_literal(token)}, false))"
    )
    return f"SELECT {utf8(answer)}"


def still_on_session(token: str, server_pid: int) -> str:
    return Truth(f"SELECT {_on_session(token)} AND pg_backend_pid() = {int(server_pid)}")


def session_guarded(server_pid: int, statement: str) -> str:
    """``statement`` (a ``SELECT <expr>``) run only on backend ``server_pid``, the session
    the route was checked on (a pid names one live session); NULL elsewhere. A guarded
    :class:`LockCall` is still a :class:`LoneCall` (a :class:`GuardedCall`)."""
    expression = statement.removeprefix("SELECT ")
    guarded = f"SELECT CASE WHEN pg_backend_pid() = {int(server_pid)} THEN {expression} END"
    if isinstance(statement, LockCall):
        return GuardedCall(guarded)
    return Truth(guarded) if isinstance(statement, Truth) else guarded


class GuardedCall(LoneCall):
    """A :class:`LockCall` run only on one backend (:func:`session_guarded`): never
    prepared, since the backend's pid is in its text."""


def watch_client(settings: Mapping[str, int]) -> str:
    """Size the server's keepalives for this session (``settings``: GUC name to integer,
    :func:`pgsolo.drivers.conninfo.server_keepalives`), each only where nobody set it:
    the connection string's ``options`` or the server's configuration win."""
    wanted = ", ".join(f"('{name}', '{int(value)}')" for name, value in settings.items())
    return (
        "SELECT count(set_config(s.name, w.value, false))"
        f" FROM (VALUES {wanted}) AS w(name, value) JOIN pg_settings s USING (name)"
        " WHERE s.source = 'default'"
    )


def keeper_beat(key: Key, *, shared: bool) -> str:
    """One heartbeat: which backend answers, whether it holds ``key``, and whether the
    server is in recovery (then the lock coordinates nothing)."""
    return f"SELECT pg_backend_pid(), {_held_here_condition(key, shared=shared)}, {IN_RECOVERY}"


# One heartbeat of a connection that holds many locks (pgsolo.Locker): which backend
# answers, every advisory lock it holds granted, and whether the server is in recovery.
# Each lock reads as held_lock_text says, separated by commas.
KEEPER_BEAT_ALL = (
    "SELECT pg_backend_pid(), (SELECT string_agg(classid || ':' || objid || ':' || objsubid"
    " || ':' || left(mode, 1), ',') FROM pg_locks"
    " WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),"
    f" {IN_RECOVERY}"
)


def held_lock_text(key: Key, *, shared: bool) -> str:
    """How :data:`KEEPER_BEAT_ALL` lists ``key`` held in that mode."""
    classid, objid, objsubid = encode_pg_lock(key)
    return f"{classid}:{objid}:{objsubid}:{'S' if shared else 'E'}"


# -- the ledger and once-per-period records (created by `pgsolo migrate`) ---------------


# -- operation keys (pgsolo.once; the table is migration 3) ------------------------------


# -- the monitor: `pgsolo locks`, `pgsolo doctor`, `pgsolo terminate` --------------------


def name_to_sql(name: str, *, namespace: int | None = None) -> str:
    """The SQL expression that derives the same key on the server, for use from psql."""
    from_name(name, namespace=namespace)  # the checks of the key itself
    literal = sql_literal(name)
    if namespace is None:
        return derived_int64(literal)
    return f"{namespace}, ('x' || substr({_name_digest(literal)}, 1, 8))::bit(32)::int"


def derived_int64(text: str) -> str:
    """The int64 key derived from the name that the SQL expression ``text`` gives (DESIGN
    §2), as SQL."""
    return f"('x' || substr({_name_digest(text)}, 1, 16))::bit(64)::bigint"


def _name_digest(text: str) -> str:
    return f"encode(sha256(convert_to({text}, 'UTF8')), 'hex')"
