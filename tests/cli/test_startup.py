"""What the command loads before it needs it: ``pgsolo --version`` and ``pgsolo --help`` load
no database driver, and a host where the driver cannot find libpq gets a hint (install
``pgsolo[binary]``) and exit 69 from every command that connects, never an ImportError.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _support import cli_env, json_document
from pgsolo.cli import COMMANDS, build_parser


def _imported_by(*args: str) -> set[str]:
    """The modules ``python -m pgsolo ARGS`` imports, as ``-X importtime`` lists them."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pgsolo", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode in (0, 2), done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.rpartition("|")[2].strip() for line in lines}


@pytest.mark.parametrize(
    "args", [["--version"], ["-v", "--version"], ["--help"], [], ["key", "daily-settlement"]]
)
def test_version_help_and_key_load_no_driver(args: list[str]) -> None:
    modules = _imported_by(*args)
    assert "pgsolo.cli" in modules  # the listing is real
    drivers = {"psycopg", "psycopg2", "asyncpg", "sqlalchemy"}
    assert not {m.partition(".")[0] for m in modules} & drivers, sorted(modules)
    # Only the command that runs is imported: `--version` not even the options' module.
    assert not {f"pgsolo.cli.{name}" for name in COMMANDS} - {"pgsolo.cli.key"} & modules


def test_run_help_loads_no_driver() -> None:
    """Guards what `pgsolo run --help` loads: its options' module reads connection strings
    with libpq, which it imports only once one is read, never to show the help; nor the
    metrics (only a run publishes them), the TOML parser (only a key registry file needs
    it) or subprocess (only a run and the embedded server). How long the command takes is
    benchmark item 7's."""
    modules = _imported_by("run", "--help")
    assert "pgsolo.cli.run.arguments" in modules  # the listing is real
    drivers = {"psycopg", "psycopg_binary", "psycopg_c", "psycopg2", "asyncpg", "sqlalchemy"}
    assert not {m.partition(".")[0] for m in modules} & drivers, sorted(modules)
    assert not modules & {"pgsolo.metrics", "tomllib", "subprocess"}, sorted(modules)


def test_a_run_that_publishes_no_metrics_loads_no_prometheus_client(db: str) -> None:
    """Guards what a `pgsolo run` loads: one without --metrics-textfile or --pushgateway
    counts nothing (nobody would read the counts), so its first lock does not import
    prometheus_client; and one that is not skipped as busy never reads who holds the key,
    so it does not import pgsolo.monitor either (how long the run takes is benchmark item
    7's)."""
    modules = _imported_by("run", "--dsn", db, "--key", "pgsolo-test:startup", "--", "true")
    assert "pgsolo.cli.run.attempt" in modules  # the listing is real: it ran
    assert not {m for m in modules if m.partition(".")[0] == "prometheus_client"}
    assert not {m for m in modules if m.startswith("pgsolo.monitor")}, sorted(modules)


def test_the_help_line_of_each_command_is_its_modules_own() -> None:
    """`pgsolo --help` lists the commands from :data:`COMMANDS` without importing them: it
    reads exactly as it would with every command's module loaded."""
    assert build_parser(None).format_help() == build_parser().format_help()


def _without_libpq() -> list[str]:
    """A command prefix that runs its command where psycopg finds no libpq, for real: in a
    user and mount namespace (``unshare``), every libpq shared object and the
    ``psycopg_binary`` package (which brings its own libpq) are covered by empty mounts.
    Skips the test where that cannot be done."""
    unshare = shutil.which("unshare")
    libpq = ctypes.util.find_library("pq")
    if unshare is None or sys.platform != "linux":
        pytest.skip("needs unshare(1) on Linux")
    covers: list[str] = []
    if libpq is not None:
        found = [p for d in ("/lib", "/usr/lib", "/usr/local/lib") for p in Path(d).rglob(libpq)]
        for path in found:
            covers += [str(q.resolve()) for q in path.parent.glob("libpq.so*")]
    binary = importlib.util.find_spec("psycopg_binary")
    empty = Path(os.environ.get("TMPDIR", "/tmp")) / "pgsolo-test-empty"  # noqa: S108
    empty.mkdir(exist_ok=True)
    mounts = [f"mount --bind /dev/null {path}" for path in sorted(set(covers))]
    if binary is not None and binary.submodule_search_locations:
        mounts += [f"mount --bind {empty} {d}" for d in binary.submodule_search_locations]
    probe = subprocess.run(
        [
            unshare,
            "-rm",
            "sh",
            "-c",
            " && ".join([*mounts, f"{sys.executable} -c 'import psycopg'"]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "no pq wrapper available" not in probe.stderr:
        pytest.skip(f"cannot hide libpq here (unshare: {probe.stderr.strip()[-200:]})")
    return [unshare, "-rm", "sh", "-c", " && ".join([*mounts, 'exec "$@"']), "sh"]


def test_without_libpq_every_command_says_what_to_install(tmp_path: Path) -> None:
    prefix = _without_libpq()

    def pgsolo(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "pgsolo", *args],
            capture_output=True,
            text=True,
            env={**cli_env(), "PGSOLO_DSN": "host=127.0.0.1 port=1"},
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    assert pgsolo("--version").returncode == 0
    assert pgsolo("--help").returncode == 0
    assert pgsolo("key", "daily-settlement").returncode == 0  # needs no database
    for args in (["locks"], ["migrate"], ["run", "--key", "k", "--", "true"]):
        done = pgsolo(*args)
        assert done.returncode == 69, done.stderr
        assert "pgsolo[binary]" in done.stderr
        assert "Traceback" not in done.stderr
    # --json says it as a document too, as every failure after the arguments is said:
    # where the command's document goes (pgsolo run's: stderr, never COMMAND's stdout)
    for args in (["locks", "--json"], ["run", "--json", "--key", "k", "--", "true"]):
        done = pgsolo(*args)
        assert done.returncode == 69, done.stderr
        error = json_document(done.stderr if args[0] == "run" else done.stdout)
        assert (error["command"], error["exit_code"]) == (args[0], 69)
        assert error["error"]["code"] == "driver-unavailable"
        assert "pgsolo[binary]" in error["error"]["message"]
    # and to pgsolo run's own destination, read without the parser that needs the driver
    done = pgsolo("run", "--json-file", str(tmp_path / "run.json"), "--key", "k", "--", "true")
    assert done.returncode == 69, done.stderr
    error = json_document((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert error["error"]["code"] == "driver-unavailable"
    # COMMAND's own --json is COMMAND's
    assert not pgsolo("run", "--key", "k", "--", "true", "--json").stdout
