"""Ending a lock holder: :func:`terminate_backend` (``pgsolo terminate`` asks first)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import sql
from .._types import DAY
from ..drivers import adapt_sync
from ..errors import InsufficientPrivilegeError, InvalidArgumentError
from ..locking import outside_transaction

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike
from .snapshot import check_positive

__all__ = ["terminate_backend"]


def terminate_backend(
    conn: SyncConnectionLike, pid: int, *, wait_ms: int = 5000, only_holding: bool = False
) -> bool:
    """End backend ``pid`` (its session, its transaction and every lock it holds) and wait
    up to ``wait_ms`` (at most a day) for it to be gone: True if it is. ``only_holding``:
    only if it holds an advisory lock in this database at that moment (asked in the same
    statement), else nothing is done and the answer is False. Shows nothing and asks
    nothing; ``pgsolo terminate`` is the careful way."""
    check_positive(pid, "pid")
    check_positive(wait_ms, "wait_ms", int(DAY * 1000))
    if not isinstance(only_holding, bool):
        raise InvalidArgumentError(f"only_holding takes True or False, got {only_holding!r}")
    driver = adapt_sync(conn)
    if pid == driver.backend_pid():
        raise InvalidArgumentError(f"pid {pid} is this connection's own backend")
    statement = sql.terminate_backend(pid, wait_ms=wait_ms, only_holding=only_holding)
    try:
        ended = driver.fetch_value(outside_transaction(driver, [statement]))
    except Exception as exc:
        if sql.meaning(driver.sqlstate(exc)) is not sql.Meaning.NO_PRIVILEGE:
            raise
        user = driver.server_info().user
        needs = (f"GRANT pg_signal_backend TO {sql.quote_name(user)}",)
        raise InsufficientPrivilegeError(
            f"role {user!r} may not terminate backend {pid} (permission denied, SQLSTATE"
            " 42501): pg_terminate_backend ends only the backends of the same role, or,"
            f" for members of pg_signal_backend ({needs[0]}), those of any role that is not"
            " a superuser; a superuser's backend, only a superuser. Nothing was terminated.",
            needs=needs,
        ) from exc
    return ended is True
