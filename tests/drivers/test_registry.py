"""One row per driver library (``pgsolo.drivers.registry``), and everything else derived
from it or checked against it: the extras, the import contract, the types of the public
signatures, the error translation, the drivers table of docs/connections.md, and the
keeper's one refusal on every driver that lacks a heartbeat."""

from __future__ import annotations

import contextlib
import importlib
import tomllib
from pathlib import Path

import pytest

import pgsolo
from _drivers import asyncpg_options
from pgsolo.drivers import Lacking, adapt, driver_errors, heartbeat_of, is_unavailable, kinds
from pgsolo.drivers.registry import LIBRARIES, Library

ROOT = Path(__file__).parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_library_has_its_extra_in_the_test_extra_and_the_import_contract() -> None:
    extras = PROJECT["project"]["optional-dependencies"]
    (contract,) = [
        c
        for c in PROJECT["tool"]["importlinter"]["contracts"]
        if c["name"] == "Only drivers/ imports a driver library"
    ]
    for library in LIBRARIES:
        assert library.package in contract["forbidden_modules"], library.package
        if library.extra is not None:
            assert library.extra in extras, library.extra
            assert library.extra in extras["test"][0], f"the test extra lacks {library.extra}"


def test_every_library_stands_in_the_public_signatures() -> None:
    """The types that pick ``Lock`` or ``AsyncLock`` name every library's connections."""
    named = f"{kinds.SyncConnectionLike} | {kinds.AsyncConnectionLike}"
    for library in LIBRARIES:
        for name in library.typing:
            assert name in named, f"{name} ({library.package}) is in no ConnectionLike"
            if name.startswith("_"):
                assert hasattr(kinds, name)


def test_every_library_is_adapted_by_its_module() -> None:
    for library in LIBRARIES:
        module = importlib.import_module(library.adapter, "pgsolo.drivers")
        assert module.adapt(object()) is None


def test_the_error_translation_knows_every_library() -> None:
    """Each library's errors are a database's errors, and its connection failures say the
    database is unavailable (before the registry, only psycopg's and psycopg2's were
    known)."""
    errors = driver_errors()
    for library in LIBRARIES:
        for name in library.errors + library.unavailable:
            module, _, attribute = name.rpartition(".")
            kind = getattr(importlib.import_module(module), attribute)
            assert issubclass(kind, errors), name
        for name in library.unavailable:
            module, _, attribute = name.rpartition(".")
            kind = getattr(importlib.import_module(module), attribute)
            assert is_unavailable(kind.__new__(kind)), name


def table(libraries: tuple[Library, ...]) -> str:
    """The drivers table of docs/connections.md, as the registry says it."""
    lines = [
        "| library | extra | takes | `keep=` | Ctrl-C or a cancelled task during a statement |",
        "| --- | --- | --- | --- | --- |",
    ]
    for library in libraries:
        extra = f"`pgsolo[{library.extra}]`" if library.extra else "(a dependency)"
        cells = [library.package, extra, library.takes, library.keeper, library.interruption]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def test_the_drivers_table_in_the_docs_is_the_registry() -> None:
    page = (ROOT / "docs" / "connections.md").read_text(encoding="utf-8")
    section = page.split("### Drivers\n", 1)[1]
    found = section.split("\n\n")[1].strip()
    assert found == table(LIBRARIES), f"docs/connections.md should say:\n{table(LIBRARIES)}"


def test_keep_is_refused_alike_on_psycopg2(dsn: str) -> None:
    """One refusal, one typed error, wherever a driver lacks a heartbeat (psycopg2's
    adapter raised BeatFailed and asyncpg's UsageError when asked to beat)."""
    import psycopg2  # noqa: PLC0415

    with contextlib.closing(psycopg2.connect(dsn)) as conn:
        found = adapt(conn).heartbeat()
        assert isinstance(found, Lacking)
        with pytest.raises(pgsolo.UsageError, match="keep= cannot watch a lock on this"):
            heartbeat_of(found)


async def test_keep_is_refused_alike_on_asyncpg(dsn: str) -> None:
    import asyncpg  # noqa: PLC0415

    conn = await asyncpg.connect(**asyncpg_options(dsn))
    try:
        found = adapt(conn).heartbeat()
        assert isinstance(found, Lacking)
        with pytest.raises(pgsolo.UsageError, match="keep= cannot watch a lock on this"):
            heartbeat_of(found)
    finally:
        await conn.close()
