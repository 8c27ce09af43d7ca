"""The public API of ``pgsolo``: what ``__init__.py`` re-exports, and what importing it
costs."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

import pytest

import pgsolo


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
