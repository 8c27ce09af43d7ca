"""A user's suite, run by pytester the way a user runs theirs: their test files, pytest,
and ``pgsolo.testing``'s plugin by its name (what ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``
users write; the others get it from the entry point). Their ``pgsolo_dsn`` is this
session's server, through ``PGSOLO_TEST_DSN``, so no inner run starts one of its own."""

from __future__ import annotations

from collections.abc import Callable

import pytest

UserSuite = Callable[..., pytest.RunResult]


@pytest.fixture
def user_suite(pytester: pytest.Pytester, dsn: str, monkeypatch: pytest.MonkeyPatch) -> UserSuite:
    """Write the user's test file (its source), run it in this process, return the result."""
    monkeypatch.setenv("PGSOLO_TEST_DSN", dsn)

    def run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_users_jobs=source)
        return pytester.runpytest_inprocess(
            "-p", "pgsolo.testing.plugin", "-p", "no:cacheprovider", "-q", *args
        )

    return run
