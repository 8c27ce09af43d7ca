"""The command line's arguments, fuzzed in process (``pgsolo.cli.main``): any value of
``pgsolo key NAME``, ``run --key/--wait``, ``locks --key``, ``doctor --older-than``,
``history --job/--limit``, ``terminate PID`` (without ``--yes``: no terminal, so it never
ends a backend) and ``--connect-timeout`` of ``migrate`` ends with an exit code (0, 1, 75;
2 with a message for a usage error), never an exception out of ``main`` (a traceback)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from _support import HOSTILE_TEXT, fuzz, main_in_process

# What a shell can pass: no NUL, and surrogates only for undecodable bytes.
ARGUMENT = HOSTILE_TEXT.filter(
    lambda text: "\0" not in text and all(not 0xD800 <= ord(c) < 0xDC80 for c in text)
)
NUMBERS = st.one_of(ARGUMENT, st.floats().map(str), st.integers().map(str))
COMMANDS = st.one_of(
    st.builds(lambda k: ["key", k], ARGUMENT),
    st.builds(lambda k, w: ["run", "--key", k, "--wait", w, "--", "true"], ARGUMENT, NUMBERS),
    st.builds(lambda k: ["locks", "--key", k], ARGUMENT),
    st.builds(lambda s: ["doctor", "--older-than", s], NUMBERS),
    st.builds(lambda j, n: ["history", "--job", j, "--limit", n], ARGUMENT, NUMBERS),
    st.builds(lambda pid: ["terminate", pid], NUMBERS),
    st.builds(lambda s: ["migrate", "--connect-timeout", s], NUMBERS),
)


@fuzz(80)
@given(COMMANDS)
# An undecodable byte of a command line, echoed back on stdout: was a UnicodeEncodeError.
@example(["history", "--job", "\udc80", "--limit", "1"])
def test_any_argument_ends_with_an_exit_code_never_a_traceback(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: Any
) -> None:
    monkeypatch.setenv("PGSOLO_DSN", db)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    code = main_in_process(argv)
    _, err = capsys.readouterr()
    assert code in (0, 1, 2, 75), err
    assert "Traceback" not in err
    if code == 2:
        assert err.strip(), "a usage error says why"
