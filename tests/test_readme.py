"""The examples of the README and of the documentation site (docs/*.md) are part of the API
contract: each one runs as written, and runs again: a reader tries an example twice, or
after another one, on the same database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)


EXAMPLES = [
    pytest.param(source, id=f"{page.relative_to(ROOT)}-{index}")
    for page in PAGES
    for index, source in enumerate(examples(page))
]


def test_the_pages_have_examples() -> None:
    assert len(examples(ROOT / "README.md")) >= 1
    assert len(EXAMPLES) >= 16  # the tour had 16 when it moved to docs/


def test_the_readme_keeps_the_test_command_ci_runs() -> None:
    # .ci/run runs the README's test command verbatim: the two must not drift apart.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = re.search(r'^README_TEST_CMD="(.*)"$', ci, re.MULTILINE)
    assert command is not None
    assert command.group(1) in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_api_reference_covers_the_public_api() -> None:
    import pgsolo  # noqa: PLC0415 - only its __all__ is needed

    reference = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: pgsolo\.(\w+)$", reference, re.MULTILINE))
    # imported by name
    modules = {
        *("metrics", "sqlalchemy", "django", "apscheduler", "celery", "embedded"),
        *("dashboard", "testing"),  # they were missing, where the page says "every name"
    }
    assert documented == set(pgsolo.__all__) - {"__version__"} | modules


def test_the_api_reference_shows_no_private_name() -> None:
    """Guards: the reference rendered ``pgsolo.metrics``' internals (``_BUCKETS``,
    ``_state``...), since ``members: true`` overrode the filter. A module's members are
    what its ``__all__`` says (mkdocstrings' ``public`` filter), and no entry overrides it."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^ +filters: public$", config, re.MULTILINE)
    reference = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert not re.search(r"^ +(members|filters):", reference, re.MULTILINE)


@pytest.mark.parametrize("source", EXAMPLES)
def test_example_runs_and_runs_again(source: str, dsn: str, tmp_path: Path) -> None:
    # Each example runs in a database of its own, as a reader's would on a fresh setup.
    database = f"pgsolo_readme_{os.getpid()}_{abs(hash(source)) % 10**8}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}"')
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        script = tmp_path / "example.py"
        script.write_text(source, encoding="utf-8")
        env = {**os.environ, "PGSOLO_DSN": psycopg.conninfo.make_conninfo(dsn, dbname=database)}
        for run in ("first", "again"):
            done = subprocess.run(
                [sys.executable, str(script)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, f"{run} run:\n{done.stderr}"
            if run == "first":  # the output shown is a fresh database's
                for expected in re.findall(r"#\s*(completed .*?)\s*(?:\(|$)", source, re.M):
                    assert expected.strip() in done.stdout
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_the_readme_links_are_absolute() -> None:
    # PyPI shows the README away from the repository, where a relative link leads nowhere.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)]*)\)", readme)
    assert targets
    assert [target for target in targets if not target.startswith("https://")] == []


def test_the_site_and_the_package_agree_on_the_project_addresses() -> None:
    # pyproject's [project.urls] is where the addresses live; mkdocs.yml repeats two.
    import tomllib  # noqa: PLC0415

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    site = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(rf"^site_url: {re.escape(urls['Documentation'])}$", site, re.MULTILINE)
    assert re.search(rf"^repo_url: {re.escape(urls['Source'])}$", site, re.MULTILINE)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert urls["Documentation"] in readme
    assert f"{urls['Source']}/blob/main/docs/" in readme
