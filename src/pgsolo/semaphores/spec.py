"""What a call of :func:`~pgsolo.semaphore` asks for, validated before any SQL is sent:
the name and its slots' keys (DESIGN §2, Semaphore keys), the wait, the keeper and
fencing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from ..errors import InvalidArgumentError
from ..keys import Key, semaphore_keys, text_of
from ..locking import Keep, as_keep, wait_ms_of

__all__ = ["SemaphoreSpec"]


@dataclass(frozen=True)
class SemaphoreSpec:
    name: str
    limit: int
    keys: tuple[Key, ...]
    wait: float | None
    keep: Keep | None
    fencing: bool

    @classmethod
    def define(
        cls,
        name: object,
        *,
        limit: object,
        wait: float | None,
        keep: bool | Keep | None,
        fencing: bool,
    ) -> SemaphoreSpec:
        keys = semaphore_keys(name, limit)
        wait_ms_of(wait)  # the range of a lock's wait, refused the same way
        if not isinstance(fencing, bool):
            raise InvalidArgumentError(f"fencing must be True or False, got {fencing!r}")
        return cls(text_of(cast(str, name)), len(keys), keys, wait, as_keep(keep), fencing)
