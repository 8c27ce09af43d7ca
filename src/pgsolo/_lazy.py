"""A package's re-exports imported on first use (PEP 562), not with the package.

Importing any module of a package runs its ``__init__`` first, so a package that imports
everything it re-exports makes each of its modules cost what all of them cost: ``pgsolo
run`` took a sync session lock and loaded the async lock, both Lockers, every leader and
campaign with it (108 modules of pgsolo's, where it needs 81), and a cron job pays that
on every run. A package that re-exports through :func:`on_first_use` loads a module
when one of its names is first asked for (``from pgsolo.locking import Locker`` as
before), and a type checker still sees the names, imported ``if TYPE_CHECKING:``
(``tests/test_api.py`` checks that the two lists agree).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["on_first_use"]


def on_first_use(
    namespace: dict[str, Any], where: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the module (a package's ``__init__``, or
    any) whose ``globals()`` is ``namespace``: each name of ``where`` is imported from its
    module (relative to the module's package) the first time it is asked for, then kept
    in ``namespace``, so that the next access does not come here."""
    module_name, package = namespace["__name__"], namespace["__package__"]

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
