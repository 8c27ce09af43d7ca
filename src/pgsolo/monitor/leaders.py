"""Leaders among the advisory locks: each leader with its candidates (:func:`leaders_of`,
which ``pgsolo doctor`` shows). When each term began comes with the locks themselves
(:mod:`.locks`, from pgsolo's record of it, ``pgsolo.leader_terms``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..keys import LEADER_PREFIX

if TYPE_CHECKING:
    from .locks import AdvisoryLock

__all__ = ["Leadership", "leaders_of"]


@dataclass(frozen=True, slots=True)
class Leadership:
    """A leader's key as the monitor saw it: who holds it (``leader``: None when only
    candidates were seen, in the moment between two terms) and who waits for it
    (``candidates``, in the order they began to wait)."""

    name: str  # the leader name, without pgsolo's prefix
    leader: AdvisoryLock | None
    candidates: tuple[AdvisoryLock, ...]


def leaders_of(locks: Sequence[AdvisoryLock]) -> list[Leadership]:
    """Every leader name whose key is held or waited for among ``locks``, by name. A key
    is a leader's when a row of it is named so: by the ``application_name`` of a session
    pgsolo opened for the leader (``pgsolo:leader:<name>``, checked against the key), or
    by the registry or the names given; its other rows are its holder and candidates."""
    names: dict[object, str] = {}
    for lock in locks:
        if lock.name is not None and lock.name.startswith(LEADER_PREFIX):
            names.setdefault(lock.key.value, lock.name.removeprefix(LEADER_PREFIX))
    found = []
    for value, name in names.items():
        rows = [lock for lock in locks if lock.key.value == value]
        holders = [row for row in rows if row.granted]
        found.append(
            Leadership(
                name=name,
                leader=holders[0] if holders else None,
                candidates=tuple(row for row in rows if not row.granted),
            )
        )
    return sorted(found, key=lambda leadership: leadership.name)
