"""The project's tasks, one name each: ``nox -l`` lists them, ``nox -s lint`` runs one,
``nox -s tests -- tests/keys -x`` passes arguments on, ``nox`` runs the default checks.

Every session but one runs in the environment nox itself runs in (``python=False``): the
development environment, ``pip install -e '.[dev,docs]'``, which holds every tool and
extra. nox creates no virtualenvs for them, so a session starts at once, needs no network
(but ``package``, whose isolated build fetches the build backend) and runs exactly the
versions the developer and CI have installed: the newest that pyproject.toml allows. The one
exception, ``lowest``, is about versions: it builds its own virtualenv with the lowest
version of each driver library and framework that pyproject.toml allows. ``.ci/run`` runs
its check stages through these sessions, so a contributor runs what CI runs, by the same
name.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.options.default_venv_backend = "none"
# `nox` alone: the quick checks, then the test suite (bench and chaos take minutes: ask).
nox.options.sessions = ["lint", "types", "imports", "twins", "workflows", "docs", "tests"]

ROOT = Path(__file__).resolve().parent

# The libraries a connection comes from, and the frameworks around them: the extras whose
# lowest allowed versions `nox -s lowest` installs (with pgsolo's own dependencies).
DRIVER_EXTRAS = ("pool", "prometheus", "asyncpg", "psycopg2", "pg8000", "sqlalchemy", "django")
# The tests that go through every kind of connection: the conformance suite and the
# frameworks' runs of run_once and jobs (tests/README.md).
DRIVER_TESTS = ("tests/drivers", "tests/once/test_frameworks.py", "tests/jobs/test_frameworks.py")


def _python(session: nox.Session, *args: str) -> None:
    """``python ARGS`` with nox's own interpreter: the development environment's."""
    session.run(sys.executable, *args, external=True)


def _tool(session: nox.Session, name: str, *args: str) -> None:
    """A console script of the development environment, found next to its interpreter
    rather than on PATH (CI calls ``.venv/bin/nox`` without activating the venv)."""
    script = Path(sysconfig.get_path("scripts")) / name
    session.run(str(script) if script.exists() else name, *args, external=True)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The test suite, the README's ``pytest``: ``nox -s tests -- tests/keys -x``.

    Against the server in $PGSOLO_TEST_DSN, else the embedded one."""
    _python(session, "-m", "pytest", *session.posargs)


@nox.session(venv_backend="venv")
def lowest(session: nox.Session) -> None:
    """The driver tests on the lowest version of each driver library and framework that
    pyproject.toml allows, in a virtualenv of their own: ``nox -s lowest -- -x``.

    The development environment holds the newest allowed versions, so the two together
    test both ends of every supported range. Against the server in $PGSOLO_TEST_DSN, else
    the embedded one."""
    constraints = Path(session.create_tmp()) / "lowest.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in lowest_pins()), encoding="utf-8")
    session.install("-c", str(constraints), "-e", f"{ROOT}[test]")
    session.run("python", "-m", "pip", "list")  # the versions tested, in the log
    session.run("python", "-m", "pytest", *DRIVER_TESTS, *session.posargs)


def lowest_pins() -> list[str]:
    """``name==X`` for every requirement ``name>=X`` of pgsolo and of its driver extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    pins = {}
    for line in [*project["dependencies"], *(r for e in DRIVER_EXTRAS for r in extras[e])]:
        requirement = Requirement(line)
        low = [s.version for s in requirement.specifier if s.operator == ">="]
        if not low:
            raise ValueError(f"{line!r} in pyproject.toml has no lower bound")
        pins[requirement.name] = f"{requirement.name}=={low[0]}"
    return sorted(pins.values())


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff check, then ruff format --check (line length and rules: pyproject.toml)."""
    _python(session, "-m", "ruff", "check", ".")
    _python(session, "-m", "ruff", "format", "--check", ".")


@nox.session(python=False)
def types(session: nox.Session) -> None:
    """mypy --strict over the package, the public API's typing tests, benchmarks, chaos."""
    _python(session, "-m", "mypy", "--strict", "src", "tests/typing", "benchmarks", "chaos")


@nox.session(python=False)
def imports(session: nox.Session) -> None:
    """The import layers of pyproject.toml (DESIGN.md §3), by import-linter."""
    _tool(session, "lint-imports")


@nox.session(python=False)
def twins(session: nox.Session) -> None:
    """Every _sync/ module is what scripts/unasync.py makes of its _async/ source."""
    _python(session, "scripts/unasync.py", "--check")


@nox.session(python=False)
def docs(session: nox.Session) -> None:
    """The documentation site, warnings as errors: ``nox -s docs -- --site-dir DIR``."""
    _python(session, "-m", "mkdocs", "build", "--strict", *session.posargs)


@nox.session(python=False)
def workflows(session: nox.Session) -> None:
    """The GitHub Actions workflows (.github/workflows) against their JSON schema.

    The schema is the one check-jsonschema ships, so this needs no network (actionlint, a
    Go binary, would have to be downloaded from GitHub)."""
    files = sorted(str(path) for path in (ROOT / ".github" / "workflows").glob("*.yml"))
    if not files:
        session.error("no workflow in .github/workflows")
    _tool(session, "check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files)


@nox.session(python=False)
def package(session: nox.Session) -> None:
    """What a release uploads: python -m build, then twine check --strict.

    The sdist and the wheel are built in isolation, as the release workflow builds them,
    into ``.nox/package/dist`` or the directory given (``nox -s package -- DIR``)."""
    outdir = Path(session.posargs[0]) if session.posargs else ROOT / ".nox" / "package" / "dist"
    shutil.rmtree(outdir, ignore_errors=True)  # twine must see this build's files only
    _python(session, "-m", "build", "--outdir", str(outdir), str(ROOT))
    _tool(session, "twine", "check", "--strict", *sorted(str(p) for p in outdir.iterdir()))


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """The benchmark suite (the ``bench`` extra): ``nox -s bench -- --quick --only 5``."""
    _python(session, "-m", "benchmarks", *session.posargs)


@nox.session(python=False)
def chaos(session: nox.Session) -> None:
    """The chaos suite: ``nox -s chaos -- --attempts 300 --seed 1``."""
    _python(session, "-m", "chaos", *session.posargs)
