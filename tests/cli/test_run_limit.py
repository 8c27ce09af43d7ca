"""``pgsolo run --limit N``: up to N runs of COMMAND at once, each holding one slot of the
semaphore named by --key, on a session named ``pgsolo:semaphore:KEY/N``; a skip only
when every slot is held; bad combinations refused before connecting."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import pgsolo
from _support import MARK, Connect, json_document, pgsolo_cli, script
from pgsolo.keys import semaphore_keys


def test_a_run_takes_a_free_slot_and_skips_when_all_are_held(
    migrated: str, connect: Connect, tmp_path: Path
) -> None:
    name = f"limited-{uuid.uuid4().hex[:8]}"
    slots = semaphore_keys(name, 2)
    with pgsolo.semaphore(connect(), name, limit=2) as held:
        done = pgsolo_cli(
            "run", "--key", name, "--limit", "2", "--dsn", migrated, "--json", "--",
            *script(MARK, tmp_path, 0),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json_document(done.stderr)
        assert report["outcome"] == "completed"
        free = slots[1 - (held.slot or 0)]
        assert (report["key"], report["key_name"]) == (free.text, free.name)
        assert report["application_name"] == f"pgsolo:semaphore:{name}/2"
        assert (tmp_path / "ran").read_text().count("\n") == 1
        with pgsolo.semaphore(connect(), name, limit=2) as other:
            assert other.acquired
            busy = pgsolo_cli(
                "run", "--key", name, "--limit", "2", "--dsn", migrated, "--json", "--",
                *script(MARK, tmp_path, 0),
            )  # fmt: skip
    assert busy.returncode == 75, busy.stderr
    assert (json_document(busy.stderr)["outcome"], json_document(busy.stderr)["reason"]) == (
        "skipped",
        "busy",
    )
    assert f"skipped: all 2 slots of '{name}' are busy, held by pid" in busy.stderr
    assert (tmp_path / "ran").read_text().count("\n") == 1  # COMMAND did not run again


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--key", "x", "--limit", "0"], "0 is not from 1 to 1024"),
        (["--key", "x", "--limit", "two"], "not a whole number"),
        (["--leader", "x", "--limit", "2"], "--limit and --leader do not go together"),
        (["--key", "123", "--limit", "2"], "--limit needs a --key that is a name"),
        (["--key", "x", "--limit", "2", "--once-per", "day"], "once per period is one run"),
        (["--key", "x", "--limit", "2", "--namespace", "3"], "--limit and --namespace"),
    ],
)
def test_a_bad_limit_is_a_usage_error_before_connecting(options: list[str], says: str) -> None:
    nowhere = "postgresql://u:secret-pw-6@127.0.0.1:1/db?connect_timeout=2"
    done = pgsolo_cli("run", *options, "--dsn", nowhere, "--", "true")
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "secret-pw-6" not in done.stderr
