"""``pgsolo.lead_in_background()``: an asyncio app's candidacy in a task of its own. One
replica's work runs while it leads and the other's waits; a lost term cancels the work
and the replica stands again; the block's end (the app shutting down) ends the term, so
another replica leads; what ends the candidacy early is logged at once and raised at the
end; each step is said on ``pgsolo.leaders``. Run in a real Starlette app's lifespan too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import pgsolo
from _support import aeventually, eventually, terminate, unique_name
from pgsolo.keys import leader_key

Observer = Any


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    """What ``pgsolo.leaders`` said of the leader ``name``, in order."""
    return [
        record.pgsolo["event"]  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "pgsolo.leaders" and getattr(record, "pgsolo", {}).get("name") == name
    ]


async def test_one_replica_works_while_it_leads_and_the_other_takes_over_at_shutdown(
    db: str, observer: Observer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgsolo.leaders")
    name = unique_name("background")
    working: list[str] = []
    overlaps: list[list[str]] = []

    def work_of(replica: str) -> Any:
        async def lead(term: pgsolo.AsyncTerm) -> None:
            working.append(replica)
            if len(working) > 1:
                overlaps.append(list(working))
            try:
                await asyncio.sleep(60)  # the scheduler's loop, until the term ends
            finally:
                working.remove(replica)

        return lead

    first_app = pgsolo.lead_in_background(db, name, work_of("first"))
    first = await first_app.__aenter__()
    try:
        await aeventually(lambda: first.leading, "the first replica to lead")
        async with pgsolo.lead_in_background(db, name, work_of("second")) as second:
            await asyncio.sleep(0.5)  # the second stands, and must not lead meanwhile
            assert (first.leading, second.leading) == (True, False)
            assert working == ["first"]
            assert first.term is not None
            assert observer.holders(leader_key(name)) == {first.term.backend_pid}
            assert observer.waiters(leader_key(name)) != set()
            first_token = first.term.token
            await first_app.__aexit__(None, None, None)  # the first app shuts down
            assert not first.leading
            await aeventually(lambda: second.leading, "the second replica to lead")
            assert working == ["second"]
            assert second.term is not None
            assert first_token is not None
            assert second.term.token is not None
            assert second.term.token > first_token
        assert observer.holders(leader_key(name)) == set()
    finally:
        if first.term is not None:  # a failed test still shuts the first app down
            await first_app.__aexit__(None, None, None)
    assert overlaps == []
    assert working == []
    assert events(caplog, name).count("leading") == 2
    assert events(caplog, name).count("stopped") == 2


async def test_a_lost_term_cancels_the_work_and_the_replica_stands_again(
    db: str, observer: Observer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgsolo.leaders")
    name = unique_name("background")
    cancelled: list[int | None] = []
    terms: list[pgsolo.AsyncTerm] = []

    async def lead(term: pgsolo.AsyncTerm) -> None:
        terms.append(term)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(term.token)
            raise

    async with pgsolo.lead_in_background(
        db, name, lead, keep=pgsolo.Keep(interval=0.1, cancel=True)
    ) as me:
        await aeventually(lambda: me.leading, "the first term")
        first = terms[0]
        assert first.backend_pid is not None
        terminate(observer, first.backend_pid)  # its backend ends: the term is lost
        await aeventually(lambda: len(terms) == 2 and me.leading, "a second term")
        assert cancelled == [first.token]  # the first term's work was stopped
        assert first.lost
        assert observer.holders(leader_key(name)) == {terms[1].backend_pid}
    assert observer.holders(leader_key(name)) == set()
    said = events(caplog, name)
    assert said[: said.index("lost") + 2] == ["leading", "lost", "leading"]


async def test_a_candidacy_that_ends_early_is_logged_at_once_and_raised_at_the_end(
    db: str, observer: Observer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgsolo.leaders")
    name = unique_name("background")

    async def lead(term: pgsolo.AsyncTerm) -> None:
        raise RuntimeError("the scheduler could not start")

    with pytest.raises(RuntimeError, match="the scheduler could not start"):
        async with pgsolo.lead_in_background(db, name, lead):
            await aeventually(
                lambda: any(r.levelno == logging.ERROR for r in caplog.records),
                "the candidacy's end to be logged",
            )
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"the candidacy for leader {name!r} ended" in errors[0].getMessage()
    assert observer.holders(leader_key(name)) == set()


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"name": "", "lead": print}, pgsolo.InvalidKeyError, "must not be empty"),
        ({"name": "x", "lead": 42}, pgsolo.InvalidArgumentError, "lead must be callable"),
        ({"name": "x", "lead": print, "keep": "yes"}, pgsolo.PgsoloError, "keep"),
    ],
)
async def test_bad_arguments_are_refused_before_the_task_starts(
    arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    before = set(asyncio.all_tasks())
    with pytest.raises(error, match=says):
        async with pgsolo.lead_in_background("postgresql://u:pw@127.0.0.1:1/db", **arguments):
            pytest.fail("entered with bad arguments")
    assert set(asyncio.all_tasks()) == before  # no candidacy was started


def test_in_a_starlette_lifespan_the_leader_says_so_and_shutdown_hands_over(
    db: str, observer: Observer
) -> None:
    name = unique_name("background")

    def app_of() -> Starlette:
        async def scheduler(term: pgsolo.AsyncTerm) -> None:
            await asyncio.sleep(60)

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with pgsolo.lead_in_background(db, name, scheduler) as standing:
                app.state.leadership = standing
                yield

        async def status(request: Request) -> JSONResponse:
            return JSONResponse({"leading": request.app.state.leadership.leading})

        return Starlette(routes=[Route("/leader", status)], lifespan=lifespan)

    first = TestClient(app_of()).__enter__()  # runs the lifespan as a server does
    try:
        eventually(lambda: first.get("/leader").json()["leading"], "the first app to lead")
        with TestClient(app_of()) as second:
            assert second.get("/leader").json() == {"leading": False}
            first.__exit__(None, None, None)  # the first app shuts down
            eventually(lambda: second.get("/leader").json()["leading"], "the second to lead")
    except BaseException:
        first.__exit__(None, None, None)
        raise
    assert observer.holders(leader_key(name)) == set()
