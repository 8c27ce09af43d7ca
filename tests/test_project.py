"""The project's habits hold together: the tasks of noxfile.py are what CI and the git hooks
run, CONTRIBUTING.md names files that exist, the GitHub workflows mirror .ci/run, the
CHANGELOG keeps its standard form, and every extra is documented in one table.

These read files only. Running the tools themselves is CI's part (.ci/run's stages, each a
nox session: the workflows' schema check, the package build and twine check)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
TASKS = {"tests", "lint", "types", "imports", "twins", "docs", "bench", "chaos"}
CI_CHECKS = {"lint", "types", "imports", "twins", "docs", "workflows", "package"}
MYPY = "mypy --strict src tests/typing benchmarks chaos"


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def nox_sessions() -> dict[str, ast.FunctionDef]:
    """The functions of noxfile.py decorated with ``@nox.session(...)``, by name (read, not
    imported: nox is a dev tool, and the suite runs without it)."""
    sessions = {}
    for node in ast.parse(read("noxfile.py")).body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                if call is not None and ast.unparse(call.func) == "nox.session":
                    sessions[node.name] = node
    return sessions


def test_every_task_is_a_nox_session_in_the_development_environment() -> None:
    sessions = nox_sessions()
    assert set(sessions) >= TASKS | CI_CHECKS
    for name, node in sessions.items():
        call = node.decorator_list[0]
        assert isinstance(call, ast.Call)
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        if name == "lowest":  # its point is other versions than the development environment's
            assert keywords == {"venv_backend": "'venv'"}
            continue
        # CI's .venv holds every tool already: a virtualenv per session would only cost time
        assert keywords.get("python") == "False", name
    assert "nox" in " ".join(PYPROJECT["project"]["optional-dependencies"]["dev"])


def test_ci_runs_its_checks_through_the_same_sessions() -> None:
    ci = read(".ci/run")
    staged = set(re.findall(r'^nox_stage "[^"]+" (\w+)', ci, re.MULTILINE))
    assert staged == CI_CHECKS
    # no second copy of a session's command in .ci/run
    for tool in ("ruff", "mypy", "lint-imports", "mkdocs", "twine"):
        assert f"/bin/{tool}" not in ci, tool
    assert "unasync.py --check" not in ci
    assert MYPY in read("noxfile.py").replace('", "', " ")


def test_every_driver_library_has_a_tested_range_and_ci_tests_both_ends() -> None:
    """Each driver library and framework is bounded on both sides in pyproject.toml: CI's
    suites test the newest version below the bound (what pip installs), and `nox -s lowest`
    (which .ci/run runs) the lowest, with the tests that go through every driver."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - pytest's dependency

    from pgsolo.drivers.registry import LIBRARIES  # noqa: PLC0415

    assignments = {
        target.id: node.value
        for node in ast.parse(read("noxfile.py")).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    driver_extras = ast.literal_eval(assignments["DRIVER_EXTRAS"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    registered = {library.extra for library in LIBRARIES if library.extra is not None}
    assert {*registered, "pool"} <= set(driver_extras)
    for line in [
        *PYPROJECT["project"]["dependencies"],
        *(r for e in driver_extras for r in extras[e]),
    ]:
        operators = {spec.operator for spec in Requirement(line).specifier}
        assert operators == {">=", "<"}, line
    assert "tests/drivers" in ast.literal_eval(assignments["DRIVER_TESTS"])
    assert re.search(r'^\s*timeout .*/bin/nox"? -s lowest ', read(".ci/run"), re.MULTILINE)


def test_the_git_hooks_run_the_tools_of_the_development_environment() -> None:
    config = read(".pre-commit-config.yaml")
    hooks = dict(re.findall(r"- id: ([\w-]+)\n(?:\s+(?:name: |# ).*\n)*\s+entry: (.*)", config))
    assert set(hooks) == {"ruff", "ruff-format", "mypy", "twins"}
    assert hooks["mypy"] == MYPY  # the same program as `nox -s types` checks
    assert hooks["twins"] == "python scripts/unasync.py --check"
    # local hooks only: the versions nox and CI run, and no clone from GitHub
    assert re.findall(r"^\s+- repo: (\S+)", config, re.MULTILINE) == ["local"]
    assert set(re.findall(r"language: (\w+)", config)) == {"system"}


def test_contributing_names_files_that_exist_and_is_linked() -> None:
    text = read("CONTRIBUTING.md")
    for topic in ("Set up", "one test against one server", "driver", "migration", "benchmark"):
        assert re.search(rf"^## .*{topic}", text, re.MULTILINE | re.IGNORECASE), topic
    assert "PGSOLO_TEST_DSN" in text
    assert "chaos" in text
    paths = {
        token
        for token in re.findall(r"`([^`\s]+)`", text)
        if re.match(r"(src|tests|benchmarks|chaos|docs|scripts|\.ci|\.github)/", token)
        or re.fullmatch(r"[\w.-]+\.(md|toml|py|yaml)", token)
    }
    placeholders = {p for p in paths if re.search(r"yourlib|what\.|0004", p)}
    assert "tests/drivers/_async/test_conformance.py" in paths
    assert [p for p in sorted(paths - placeholders) if not (ROOT / p).exists()] == []
    assert set(re.findall(r"nox -s (\w+)", text)) <= set(nox_sessions())
    link = "https://github.com/pgsolo/pgsolo/blob/main/CONTRIBUTING.md"
    assert link in read("README.md")
    assert link in read("docs/development.md")


def test_every_extra_is_in_the_one_table() -> None:
    """Each extra once: a driver library's in the drivers table of docs/connections.md
    (tests/drivers/test_registry.py holds it to the registry), the others in index.md's."""
    from pgsolo.drivers.registry import LIBRARIES  # noqa: PLC0415

    extras = set(PYPROJECT["project"]["optional-dependencies"])
    index = read("docs/index.md")
    rows = re.findall(r"^\| `([\w-]+)` \|", index, re.MULTILINE)
    drivers = [library.extra for library in LIBRARIES if library.extra is not None]
    assert sorted(rows + drivers) == sorted(extras)
    assert "docs/index.md#install" in read("README.md")


def test_the_version_is_in_one_place() -> None:
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "src/pgsolo/__init__.py"
    assert re.search(r'^__version__ = "\d+\.\d+\.\d+"$', read("src/pgsolo/__init__.py"), re.M)


def test_the_changelog_keeps_a_changelog() -> None:
    text = read("CHANGELOG.md")
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    assert "https://semver.org/spec/v2.0.0.html" in text
    releases = re.findall(r"^## (.*)$", text, re.MULTILINE)
    assert releases[0] == "[Unreleased]"
    for release in releases[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", release), release
    for release in releases:  # every version heading links somewhere
        name = release.split("]")[0] + "]"
        assert re.search(rf"^{re.escape(name)}: https://\S+$", text, re.MULTILINE), name
    kinds = set(re.findall(r"^### (.*)$", text, re.MULTILINE))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_release_policy_covers_the_contracts() -> None:
    policy = read("docs/releases.md")
    for contract in ("DESIGN.md", "key spec", "exit code", "JSON", "Metric names", "Deprecated"):
        assert contract in policy, contract
    assert "releases.md" in read("mkdocs.yml")
    assert "releases/" in read("CHANGELOG.md")


def workflow(name: str) -> Any:
    # PyYAML reads the key `on` as True (YAML 1.1): BaseLoader keeps every scalar a string
    return yaml.load(read(f".github/workflows/{name}"), Loader=yaml.BaseLoader)  # noqa: S506 - BaseLoader builds only strings, lists and maps


def test_the_public_ci_mirrors_ci_run_over_the_supported_versions() -> None:
    ci = workflow("ci.yml")
    jobs = ci["jobs"]
    classifiers = PYPROJECT["project"]["classifiers"]
    pythons = sorted(
        c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)
    )
    matrix = jobs["postgres"]["strategy"]["matrix"]
    assert (
        sorted(matrix["python"])
        == pythons
        == sorted(jobs["readme"]["strategy"]["matrix"]["python"])
    )
    assert {"14", "15", "16", "17", "18"} <= set(matrix["postgres"])
    steps = " ".join(str(step) for step in jobs["postgres"]["steps"])
    for piece in ("pgbouncer", "pg_basebackup", "--write-recovery-conf", "PGSOLO_TEST_STANDBY_DSN"):
        assert piece in steps, piece
    readme_steps = " ".join(str(step) for step in jobs["readme"]["steps"])
    command = re.search(r'^README_TEST_CMD="(.*)"$', read(".ci/run"), re.MULTILINE)
    assert command is not None
    assert command.group(1) in readme_steps
    checks = " ".join(str(step) for step in jobs["checks"]["steps"])
    for session in CI_CHECKS:
        assert re.search(rf"nox -s [\w ]*\b{session}\b", checks), session


def test_a_tag_releases_by_trusted_publishing() -> None:
    release = workflow("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    build = " ".join(str(step) for step in release["jobs"]["build"]["steps"])
    assert "nox -s package" in build  # python -m build and twine check, as CI runs them
    assert "GITHUB_REF_NAME" in build  # the tag names the version built
    publish = release["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    assert publish["needs"] == "build"
    uses = [step.get("uses", "") for step in publish["steps"]]
    assert any(use.startswith("pypa/gh-action-pypi-publish@") for use in uses)
    assert "password" not in str(publish)  # no stored token


def _design_map() -> list[str]:
    """The lines of DESIGN.md §3's map of ``src/pgsolo/``."""
    design = (ROOT / "DESIGN.md").read_text(encoding="utf-8")
    section = design.split("\n## 3. Layers\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\nsrc/pgsolo/\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def _entry(lines: list[str], package: str) -> str:
    """The text of ``package``'s entry in the map: the (last, deepest) line that starts
    with ``package/`` and the lines indented under it."""
    starts = [i for i, line in enumerate(lines) if line.split()[:1] == [f"{package}/"]]
    assert starts, f"DESIGN.md §3's map has no entry for {package}/"
    start = starts[-1]
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and len(lines[end]) - len(lines[end].lstrip()) > indent:
        end += 1
    return "\n".join(lines[start:end])


def test_the_design_map_names_every_module() -> None:
    """Guards DESIGN.md §3's map against the tree: it missed ``cli/run/publish.py`` and
    ``pgsolo.sqlalchemy``. Every module is named in the entry of its package (a top-level
    one on a top-level line); an ``_async/`` package is named as a directory (its modules
    are the twins' sources, and ``_sync/`` is generated)."""
    lines = _design_map()
    top = "\n".join(line for line in lines if len(line) - len(line.lstrip()) == 2)
    missing = []
    src = ROOT / "src" / "pgsolo"
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).parts
        if path.name == "__init__.py" or "_sync" in parts:
            continue
        if len(parts) == 1:
            entry, name = top, path.name
        elif "_async" in parts:
            entry, name = _entry(lines, parts[parts.index("_async") - 1]), "_async/"
        else:
            entry, name = _entry(lines, parts[-2]), path.name
        if not re.search(rf"(?<![\w/]){re.escape(name)}", entry):
            missing.append("/".join(parts))
    assert missing == []


def test_only_metrics_imports_prometheus_client() -> None:
    """Guards DESIGN.md §3's "metrics.py is the only prometheus_client import" (``pgsolo
    run``'s publishing imported it too): everything else counts through pgsolo.metrics."""
    importers = []
    for path in sorted((ROOT / "src" / "pgsolo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name.partition(".")[0] == "prometheus_client" for name in names):
                importers.append(path.relative_to(ROOT / "src").as_posix())
                break
    assert importers == ["pgsolo/metrics.py"]


def test_no_module_keeps_an_empty_type_checking_block() -> None:
    """Guards against ``if TYPE_CHECKING: pass``, the shell an edit leaves when it moves
    the last type-only import out (seven modules held one)."""
    empty = []
    for path in sorted((ROOT / "src" / "pgsolo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.If)
                and ast.unparse(node.test) == "TYPE_CHECKING"
                and all(isinstance(statement, ast.Pass) for statement in node.body)
            ):
                empty.append(path.relative_to(ROOT / "src").as_posix())
    assert empty == []


def test_the_tests_readme_names_every_folder_and_root_file() -> None:
    """Guards tests/README.md against the tree: it promised a ``tests/sql/`` and named
    neither ``test_api.py``, ``test_logging.py`` nor ``test_embedded.py``. Each folder
    has its row, no row names a folder that does not exist, and every test file and
    helper at the root is named."""
    tests = ROOT / "tests"
    readme = (tests / "README.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)/` \|", readme, re.MULTILINE))
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert rows == folders
    unnamed = [p.name for p in sorted(tests.glob("*.py")) if f"`{p.name}`" not in readme]
    assert unnamed == []


def test_every_sql_name_is_listed_once_where_it_is_written() -> None:
    """Guards the one place of each statement (DESIGN §3): ``pgsolo.sql`` re-exports its
    subject modules' ``__all__`` (a statement was written four times, in its module and in
    the package's 71 re-exports), and no two modules name the same thing, which a star
    import would let one shadow silently. (A name missing from its module's ``__all__`` is
    mypy's error where it is used.)"""
    import pgsolo.sql  # noqa: PLC0415 - only its names are read

    names = pgsolo.sql.__all__
    assert sorted(names) == sorted(set(names))
    modules = [p.stem for p in (ROOT / "src" / "pgsolo" / "sql").glob("[!_]*.py")]
    assert sorted(names) == sorted(n for m in modules for n in getattr(pgsolo.sql, m).__all__)
