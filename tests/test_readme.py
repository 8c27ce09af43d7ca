"""The README's examples are part of the API contract: each one runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_the_readme_has_examples() -> None:
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("source", EXAMPLES, ids=[f"example-{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(source: str, dsn: str, tmp_path: Path) -> None:
    # Each example runs in a database of its own, as a reader's would on a fresh setup.
    database = f"pgsolo_readme_{os.getpid()}_{abs(hash(source)) % 10**8}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}"')
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        script = tmp_path / "example.py"
        script.write_text(source, encoding="utf-8")
        env = {**os.environ, "PGSOLO_DSN": psycopg.conninfo.make_conninfo(dsn, dbname=database)}
        done = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        for expected in re.findall(r"#\s*(completed .*?)\s*(?:\(|$)", source, re.MULTILINE):
            assert expected.strip() in done.stdout
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
