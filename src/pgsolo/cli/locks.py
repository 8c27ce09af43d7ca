"""``pgsolo locks``: who holds which advisory lock, and who waits behind whom."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..keys import Key
from ..monitor.checks import DEFAULT_SNAPSHOT_OLDER_THAN
from .exit_codes import (
    EXIT_OK,
    EXIT_USAGE,
)
from .output import emit_json

if TYPE_CHECKING:
    from ..keys import Registry
    from ..monitor import AdvisoryLock, SemaphoreUse
from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    add_key_is_name_argument,
    connection,
    database,
    print_table,
    where,
)


def add_locks_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "locks",
        description="List every advisory lock of the database, held and waiting: the key"
        " (int64 or N:R), its name (from --registry, a --name whose key spec v1 key"
        " matches, a pgsolo holder's application_name, or the ledger's job that last ran"
        " with it), exclusive or shared, lifetime where the server proves it, the backend"
        " (pid, application_name, client, state), how long it has been held (a bound:"
        " PostgreSQL records no grant time) or waited for, its current query (never"
        " pgsolo's keeper beat), a session whose old transaction or snapshot holds back"
        " VACUUM (marked *), and the wait chains (pg_blocking_pids). The slots of a"
        " semaphore (from --semaphore, or told by its sessions' application_name"
        " pgsolo:semaphore:NAME/N) are one row, NAME (semaphore), 'K of N held'. The"
        " table fits the terminal; --wide shows every column. Exit code 0.",
    )
    add_naming_arguments(parser)
    parser.add_argument("--key", metavar="KEY", help="only this key: a name, an int64 or N:R")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every column (mode, lifetime, client, state, blockers) and longer queries;"
        " by default the table fits the terminal's width",
    )
    add_key_is_name_argument(parser)
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_locks)


def add_naming_arguments(parser: argparse.ArgumentParser) -> None:
    """``--registry``, ``--name`` and ``--semaphore``: what names the keys besides
    pgsolo's own records (``pgsolo locks``, ``pgsolo dashboard``)."""
    parser.add_argument(
        "--registry",
        metavar="FILE",
        help="a TOML registry of names ([locks]; its [namespaces] are checked)",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="NAME",
        help="label the key NAME derives to (an int64, or N:<its int32> in any namespace);"
        " repeatable",
    )
    parser.add_argument(
        "--semaphore",
        action="append",
        default=[],
        metavar="NAME=N",
        help="the semaphore NAME of N slots (pgsolo.semaphore(conn, NAME, limit=N)): its"
        " slots are shown as one row, its holders out of N; repeatable",
    )


def naming_arguments(args: argparse.Namespace) -> tuple[Registry | None, list[str], dict[str, int]]:
    """The registry, names and semaphores :func:`add_naming_arguments` took, checked
    before anything connects (a usage error, exit 2)."""
    semaphores = parse_semaphores(args.semaphore)
    registry = load_registry(args.registry) if args.registry else None
    return registry, list(args.name), semaphores


WIDE_COLUMNS = (
    "KEY",
    "NAME",
    "MODE",
    "LIFETIME",
    "STATUS",
    "PID",
    "APPLICATION",
    "CLIENT",
    "STATE",
    "FOR",
    "BLOCKED BY",
    "VACUUM",
    "QUERY",
)


# What fits a terminal: the wait chains are printed below the table, the rest is --wide's.
# LOCK is the key's name when known, else the key (--wide and --json have both).
COLUMNS = ("LOCK", "STATUS", "PID", "APPLICATION", "FOR", "QUERY")
NARROW_WIDTHS = {"LOCK": 22, "APPLICATION": 14}  # longer cells are cut, ending with ~
MIN_QUERY = 10  # below this many characters the query column is left out
QUERY_WIDTH = 60  # characters of the current query with --wide (--json has more)
KEEPER_QUERY = "(pgsolo keeper)"  # the holder's last statement is the keeper's beat


SEMAPHORE_MARK = " (semaphore)"  # after a semaphore's name in LOCK (NAME with --wide)
PID_LIST_WIDTH = 22  # a semaphore's holders' pids in the table, then +N for the rest


def cmd_locks(args: argparse.Namespace) -> int:
    from ..monitor import advisory_locks, semaphore_uses, wait_chains  # noqa: PLC0415

    registry, names, semaphores = naming_arguments(args)  # before connecting, as every one
    key = Key.parse(args.key, name=args.key_is_name) if args.key is not None else None
    if key is not None and key.name is not None:
        names.append(key.name)  # the rows --key NAME selects are labelled with it
    if registry is not None and key is not None and key.name is not None:
        key = registry.resolve(key.name)
    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:locks") as conn,
    ):
        locks = advisory_locks(
            conn,
            registry=registry,
            names=names,
            key=key,
            from_ledger=True,
            semaphores=semaphores,
        )
        name, server = where(conn)
    chains = wait_chains(locks)
    uses = semaphore_uses(locks)
    if args.json:
        emit_json(
            "locks",
            {
                "database": name,
                "server": server,
                "locks": [lock.as_dict() for lock in locks],
                "semaphores": [use.as_dict() for use in uses],
                "wait_chains": [list(chain) for chain in chains],
            },
        )
        return EXIT_OK
    # Locks, not rows: a semaphore's row stands for each slot held and each wait.
    held = sum(1 for lock in locks if lock.granted)
    print(f"{held} held, {len(locks) - held} waiting: advisory locks in")
    print(f"  {db.label}")
    if locks:
        print_table(lock_table(locks, wide=args.wide, semaphores=uses))
    if any(_holds_back_vacuum(lock) for lock in locks):
        print(
            f"* holds back VACUUM: a transaction holding a snapshot or a transaction id for"
            f" over {DEFAULT_SNAPSHOT_OLDER_THAN:g}s (pgsolo doctor names it)"
        )
    if chains:
        print("wait chains (each pid waits for the next; the last one holds the lock):")
        for chain in chains:
            print("  " + " -> ".join(pid_text(pid) for pid in chain))
    return EXIT_OK


def parse_semaphores(given: Sequence[str]) -> dict[str, int]:
    """The semaphores of ``--semaphore NAME=N`` (split at the last ``=``), checked as
    ``pgsolo.semaphore`` checks a name and a limit: else a usage error, exit 2."""
    from ..monitor.locks import check_semaphores  # noqa: PLC0415

    semaphores: dict[str, int] = {}
    for text in given:
        name, equals, limit = text.rpartition("=")
        if not (equals and limit.isascii() and limit.isdigit() and len(limit) <= 9):
            raise CliError(
                "--semaphore takes NAME=N, a semaphore's name and its limit (such as"
                f" exports=3), got {text!r}",
                EXIT_USAGE,
            )
        if semaphores.setdefault(name, int(limit)) != int(limit):
            raise CliError(
                f"--semaphore gives {name!r} two limits, {semaphores[name]} and {int(limit)}",
                EXIT_USAGE,
            )
    check_semaphores(semaphores, "--semaphore")
    return semaphores


def load_registry(path: str) -> Registry:
    from ..keys import Registry  # noqa: PLC0415

    try:
        return Registry.from_toml(path)
    except OSError as exc:
        raise CliError(f"cannot read the registry {path}: {exc.strerror}", EXIT_USAGE) from exc


def lock_table(
    locks: list[AdvisoryLock],
    *,
    wide: bool,
    width: int | None = None,
    semaphores: Sequence[SemaphoreUse] = (),
) -> list[tuple[str, ...]]:
    """The table's lines, headers first: every column with ``wide``, else the ones that
    fit ``width`` characters (default: the terminal's, 80 when not a terminal). The slot
    locks of each of ``semaphores`` (:func:`~pgsolo.semaphore_uses` of ``locks``) are one
    line, where its first slot's would be."""
    entries = _entries(locks, semaphores)
    if wide:
        return [WIDE_COLUMNS, *(_wide_line(entry) for entry in entries)]
    rows = [_narrow_line(entry) for entry in entries]
    headers = COLUMNS[:-1]
    widths = [max(len(line[i]) for line in (headers, *rows)) for i in range(len(headers))]
    width = width or shutil.get_terminal_size((80, 24)).columns
    room = width - sum(widths) - 2 * len(widths)
    if room < MIN_QUERY:
        return [headers, *rows]
    queries = [_query_cell(entry, room) for entry in entries]
    return [COLUMNS, *((*row, query) for row, query in zip(rows, queries, strict=True))]


class _SemaphoreEntry:
    """A semaphore's line: its use, and the slot locks it stands for."""

    def __init__(self, use: SemaphoreUse) -> None:
        self.use = use
        self.locks: list[AdvisoryLock] = []

    @property
    def holders(self) -> list[AdvisoryLock]:
        return sorted(
            (lock for lock in self.locks if lock.granted),
            key=lambda lock: (lock.semaphore.slot if lock.semaphore else 0, lock.pid or 0),
        )

    @property
    def status(self) -> str:
        use = self.use
        waiting = f", {len(use.waiting)} waiting" if use.waiting else ""
        return f"{use.held} of {use.limit} held{waiting}"

    def pids(self, width: int | None) -> str:
        """The holders' pids, each marked * when it holds back VACUUM; within ``width``
        characters, those that fit and ``+N`` for the rest."""
        cells = [
            (str(lock.pid) if lock.pid is not None else "(prepared)")
            + ("*" if _holds_back_vacuum(lock) else "")
            for lock in self.holders
        ]
        shown = ",".join(cells)
        count = len(cells)
        while width is not None and len(shown) > width and count > 1:
            count -= 1
            shown = ",".join(cells[:count]) + f" +{len(cells) - count}"
        return shown

    def common(self, cell: Callable[[AdvisoryLock], str]) -> str:
        """What every holder has in common for ``cell``, else nothing."""
        values = {cell(lock) for lock in self.holders}
        return values.pop() if len(values) == 1 else ""


def _entries(
    locks: list[AdvisoryLock], semaphores: Sequence[SemaphoreUse]
) -> list[AdvisoryLock | _SemaphoreEntry]:
    """The lines of the table: each lock, but the slot locks of each of ``semaphores``
    on one line, where its first slot lock would be."""
    uses = {(use.name, use.limit): _SemaphoreEntry(use) for use in semaphores}
    entries: list[AdvisoryLock | _SemaphoreEntry] = []
    for lock in locks:
        slot = lock.semaphore
        entry = uses.get((slot.name, slot.limit)) if slot is not None else None
        if entry is None:
            entries.append(lock)
            continue
        if not entry.locks:
            entries.append(entry)
        entry.locks.append(lock)
    return entries


def pid_text(pid: int) -> str:
    """A blocker's pid as shown: PostgreSQL's ``pg_blocking_pids`` says 0 for a prepared
    transaction, which has no backend (``ROLLBACK PREPARED`` ends it, not terminate)."""
    return str(pid) if pid else "(prepared)"


def client_of(lock: AdvisoryLock) -> str:
    """Where the session connects from: its address, ``local`` over a unix socket, or
    nothing where the server hides it (another role's session, without
    ``pg_read_all_stats``: its state is hidden too)."""
    return lock.client_addr or ("local" if lock.state is not None else "")


def _holds_back_vacuum(lock: AdvisoryLock) -> bool:
    """Whether the lock's session has held back VACUUM for longer than doctor allows."""
    held = lock.holds_back_vacuum_seconds
    return held is not None and held > DEFAULT_SNAPSHOT_OLDER_THAN


def _application(lock: AdvisoryLock) -> str:
    return lock.application_name or ""


def _semaphore_label(name: str, width: int | None = None) -> str:
    """``exports (semaphore)``: the name cut (never the mark) to fit ``width``."""
    if width is not None:
        name = _cut(name, max(width - len(SEMAPHORE_MARK), 2))
    return name + SEMAPHORE_MARK


def _narrow_line(lock: AdvisoryLock | _SemaphoreEntry) -> tuple[str, ...]:
    if isinstance(lock, _SemaphoreEntry):
        return (
            _semaphore_label(lock.use.name, NARROW_WIDTHS["LOCK"]),
            lock.status,
            lock.pids(PID_LIST_WIDTH),
            _cut(lock.common(_application), NARROW_WIDTHS["APPLICATION"]),
            "",
        )
    status = "held" if lock.granted else "waiting"
    pid = str(lock.pid) if lock.pid is not None else "(prepared)"
    return (
        _cut(lock.name or lock.key.text, NARROW_WIDTHS["LOCK"]),
        status + (" (sh)" if lock.shared else ""),
        pid + (" *" if _holds_back_vacuum(lock) else ""),
        _cut(lock.application_name or "", NARROW_WIDTHS["APPLICATION"]),
        _age(lock),
    )


def _age(lock: AdvisoryLock) -> str:
    """How long, marked when it is only a bound: ``>=`` held at least that long (idle
    since then), ``<=`` at most (the session is that old)."""
    from ..monitor.snapshot import format_seconds  # noqa: PLC0415

    if lock.age_seconds is None:
        return ""
    mark = {"state_change": ">=", "backend_start": "<="}.get(lock.since_source or "", "")
    return mark + format_seconds(lock.age_seconds)


def _query_cell(lock: AdvisoryLock | _SemaphoreEntry, width: int) -> str:
    if isinstance(lock, _SemaphoreEntry):
        return ""
    return _cut(KEEPER_QUERY if lock.keeper else lock.query or "", width)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _wide_line(entry: AdvisoryLock | _SemaphoreEntry) -> tuple[str, ...]:
    if not isinstance(entry, _SemaphoreEntry):
        return lock_line(entry)
    return (
        "",
        _semaphore_label(entry.use.name),
        entry.common(lambda held: "shared" if held.shared else "exclusive"),
        entry.common(lambda held: held.lifetime or "?"),
        entry.status,
        entry.pids(None),
        entry.common(_application),
        "",
        "",
        "",
        "",
        "",
        "",
    )


def lock_line(lock: AdvisoryLock) -> tuple[str, ...]:
    """A line of the ``--wide`` table."""
    from ..monitor.snapshot import format_seconds  # noqa: PLC0415

    age = lock.age_seconds
    since = f"{format_seconds(age)} ({lock.since_source})" if age is not None else ""
    query = KEEPER_QUERY if lock.keeper else lock.query or ""
    return (
        lock.key.text,
        lock.name or "",
        "shared" if lock.shared else "exclusive",
        lock.lifetime or "?",
        "held" if lock.granted else "waiting",
        str(lock.pid) if lock.pid is not None else "(prepared)",
        lock.application_name or "",
        client_of(lock),
        lock.state or "",
        since,
        ",".join(pid_text(pid) for pid in lock.blocked_by),
        _vacuum_cell(lock),
        _cut(query, QUERY_WIDTH),
    )


def _vacuum_cell(lock: AdvisoryLock) -> str:
    """How long the session has held back VACUUM, marked past doctor's threshold."""
    from ..monitor.snapshot import format_seconds  # noqa: PLC0415

    held = lock.holds_back_vacuum_seconds
    if held is None:
        return ""
    return format_seconds(held) + (" *" if _holds_back_vacuum(lock) else "")
