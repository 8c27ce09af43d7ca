"""The public API of ``pgsolo``: what ``__init__.py`` re-exports, and what importing it
costs."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

import pgsolo

# The modules that re-export names on first use (pgsolo._lazy).
LAZY_MODULES = (
    "pgsolo",
    "pgsolo.locking",
    "pgsolo.jobs",
    "pgsolo.leadership",
    "pgsolo.drivers.connect",
)


def test_every_public_name_resolves_to_the_object_of_its_module() -> None:
    """Guards the lazy re-exports (PEP 562): each name of ``__all__`` is the very object
    its module defines, whether it came with the package or on first use, and the list of
    names imported on first use holds nothing that is not public."""
    lazy = pgsolo._ON_FIRST_USE
    assert set(lazy) <= set(pgsolo.__all__)
    for name in pgsolo.__all__:
        value = getattr(pgsolo, name)
        if name in lazy:
            assert value is getattr(import_module(lazy[name], "pgsolo"), name), name
    assert set(pgsolo.__all__) <= set(dir(pgsolo))


def test_an_unknown_name_is_an_attribute_error() -> None:
    """``from pgsolo import nothing`` fails as for any module, naming the name."""
    with pytest.raises(AttributeError, match="no_such_name"):
        pgsolo.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_importing_pgsolo_loads_no_database_driver() -> None:
    """``import pgsolo`` (and its errors, keys and outcomes) loads no driver: the parts
    that talk to a database come on first use (and psycopg only with a connection)."""
    code = (
        "import sys, pgsolo; from pgsolo import Key, UsageError;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    code = (
        "import sys, pgsolo; before = 'pgsolo.locking' in sys.modules; pgsolo.xact_lock;"
        " print(before, 'pgsolo.locking' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False True"


def _type_checking_imports(module_name: str) -> dict[str, str]:
    """The names ``module_name`` imports ``if TYPE_CHECKING:``, each with its module as
    written (relative)."""
    module = import_module(module_name)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                if isinstance(imported, ast.ImportFrom) and imported.level:
                    where = "." * imported.level + (imported.module or "")
                    found.update((alias.asname or alias.name, where) for alias in imported.names)
    return found


@pytest.mark.parametrize("module_name", LAZY_MODULES)
def test_what_a_module_imports_on_first_use_is_what_a_type_checker_sees(
    module_name: str,
) -> None:
    """Guards the names of a module's lazy re-exports, which are written twice (imported
    for a type checker, and in ``_ON_FIRST_USE`` for the import at run time): the two
    lists agree, name by name and module by module, and each name is the very object of
    its module."""
    module = import_module(module_name)
    lazy: dict[str, str] = module._ON_FIRST_USE
    assert lazy == _type_checking_imports(module_name)
    for name, where in lazy.items():
        assert getattr(module, name) is getattr(import_module(where, module.__package__), name)
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match=f"module '{module_name}' has no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_a_sync_pgsolo_run_loads_no_async_lock_locker_or_leader() -> None:
    """Guards what a cron job pays on every ``pgsolo run`` (the performance issue's goal
    of 0.25 s for a whole run, where ``import psycopg`` alone takes most of it): the
    command's modules load the sync lock and job, and none of the async shells, the
    Lockers or the leaders, which the packages' ``__init__`` would load with them."""
    code = (
        "import sys, pgsolo.cli.run.attempt, pgsolo.cli.run.publish;"
        " print(sorted(m for m in sys.modules if m.startswith('pgsolo.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(done.stdout))
    assert {"pgsolo.locking._sync.lock", "pgsolo.jobs._sync.record"} <= loaded
    unused = {
        "pgsolo.locking._async.locker",
        "pgsolo.locking._sync.locker",
        "pgsolo.locking.multiplex",
        "pgsolo.jobs._async.run",
        "pgsolo.jobs.decorator",
        "pgsolo.leadership._async.leader",
        "pgsolo.leadership._sync.campaign",
        "pgsolo.drivers._async.connect",
    }
    assert not unused & loaded, sorted(unused & loaded)
