"""``scripts/unasync.py``, which writes every ``_sync/`` twin from its ``_async/`` source:
its table of substitutions holds only rules that the sources use."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "unasync.py"


def _unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_rule_of_the_table_changes_some_async_source() -> None:
    """Guards against dead renames: six of them (``__aiter__``, ``AsyncCursor``...) matched
    nothing and said nothing true of the code; ``unasync.py --check`` now fails on one."""
    unasync = _unasync()
    assert unasync.unused_rules(source.read_text() for source, _ in unasync.pairs()) == []


def test_a_rule_that_matches_nothing_is_named() -> None:
    unasync = _unasync()
    text = "async def f() -> None:\n    await g()\n"
    dead = unasync.unused_rules([text])
    assert r"\basync def\b" not in dead
    assert r"\bAsyncLock\b" in dead
