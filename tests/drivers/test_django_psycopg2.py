"""Django on psycopg2: its postgresql backend takes psycopg 3 whenever it can import it, so
every Django test of the conformance suite and of the "as found" law runs again in a process
of its own whose Django binds psycopg2 (``PGSOLO_TEST_DJANGO_DRIVER``, tests/_drivers.py),
against the same server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]


@pytest.mark.timeout(600)
def test_the_django_conformance_and_as_found_tests_pass_on_psycopg2(db: str) -> None:
    env = {**os.environ, "PGSOLO_TEST_DSN": db, "PGSOLO_TEST_DJANGO_DRIVER": "psycopg2"}
    probe = (
        "import _drivers, django.db; _drivers.django_settings(__import__('os').environ"
        "['PGSOLO_TEST_DSN']); print(django.db.connection.Database.__name__)"
    )
    bound = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "PYTHONPATH": str(TESTS)},
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bound.stdout.strip() == "psycopg2"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "django",
            str(TESTS / "drivers" / "_sync" / "test_as_found.py"),
            str(TESTS / "drivers" / "_sync" / "test_conformance.py"),
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        cwd=TESTS.parent,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "django-psycopg2" in done.stdout or " passed" in done.stdout
