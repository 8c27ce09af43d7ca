"""``pgsolo.campaign()`` and ``campaign_async()``: replicas that stand for leadership for
as long as they run, lead in turn (never two at once), stand again after a term is lost
or the connection dies, and stop when asked, leaving nothing held."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import pgsolo
from _support import aeventually, eventually, terminate, unique_name
from pgsolo.keys import leader_key

Observer = Any


def test_replicas_lead_in_turn_and_stop_when_asked(db: str, observer: Observer) -> None:
    name = unique_name("campaign")
    stop = threading.Event()
    guard = threading.Lock()
    leading: list[int] = []
    terms: list[tuple[int, int | None]] = []
    overlaps: list[list[int]] = []
    errors: list[BaseException] = []

    def replica(me: int) -> None:
        def lead(term: pgsolo.Term) -> None:
            with guard:
                leading.append(me)
                terms.append((me, term.token))
                if len(leading) > 1:
                    overlaps.append(list(leading))
            time.sleep(0.05)  # a short term: then it steps down and stands again
            with guard:
                leading.remove(me)

        try:
            pgsolo.campaign(db, name, lead, stop=stop)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(me,)) for me in range(3)]
    for thread in threads:
        thread.start()
    eventually(lambda: len({me for me, _ in terms}) == 3, "every replica to lead once")
    stop.set()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)  # every campaign saw the stop
    assert not errors
    assert not overlaps
    tokens = [token for _, token in terms]
    assert tokens == sorted(tokens)  # type: ignore[type-var]
    assert len(set(tokens)) == len(tokens)
    assert observer.holders(leader_key(name)) == set()
    assert observer.waiters(leader_key(name)) == set()


def test_a_candidate_that_wins_after_its_stop_does_not_lead(
    db: str, connect: Any, observer: Observer
) -> None:
    """Guards a campaign whose wait was granted just after ``stop`` was set: it began a
    term and ran ``lead`` once more, after shutdown was asked for."""
    name = unique_name("campaign-stopped")
    key = leader_key(name)
    holder = connect(autocommit=True)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    stop = threading.Event()
    led: list[int | None] = []
    candidate = threading.Thread(
        target=pgsolo.campaign,
        args=(db, name, lambda term: led.append(term.token)),
        kwargs={"stop": stop, "fencing": False},
    )
    candidate.start()
    eventually(lambda: observer.waiters(key), "the candidate to wait on the server")
    stop.set()
    holder.execute("SELECT pg_advisory_unlock_all()")  # granted to the waiting candidate
    candidate.join(20)
    assert not candidate.is_alive()
    assert led == []
    assert observer.holders(key) == set()


def test_a_lost_term_is_followed_by_another(db: str, observer: Observer) -> None:
    name = unique_name("campaign")
    stop = threading.Event()
    terms: list[pgsolo.Term] = []

    def lead(term: pgsolo.Term) -> None:
        terms.append(term)
        if len(terms) == 1:
            assert term.backend_pid is not None
            terminate(observer, term.backend_pid)  # the term is lost under the leader
            term.wait_lost(20)
        else:
            stop.set()

    keep = pgsolo.Keep(interval=0.2, timeout=5)
    pgsolo.campaign(db, name, lead, stop=stop, keep=keep)
    assert len(terms) == 2
    assert terms[0].lost
    assert terms[0].token is not None and terms[1].token is not None  # noqa: PT018
    assert terms[1].token > terms[0].token
    assert terms[1].backend_pid != terms[0].backend_pid  # a new connection
    assert observer.holders(leader_key(name)) == set()


def test_what_lead_raises_ends_the_campaign(db: str, observer: Observer) -> None:
    name = unique_name("campaign")

    def lead(term: pgsolo.Term) -> None:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        pgsolo.campaign(db, name, lead)
    assert observer.holders(leader_key(name)) == set()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"lead": "nope"}, "lead must be callable"),
        ({"stop": "nope"}, "stop must be an event"),
        ({"name": ""}, "must not be empty"),
        ({"keep": "yes"}, "keep must be"),
        # Guards the DSN's type: bytes raised a bare TypeError from a regular expression.
        ({"dsn": b"postgresql://u@127.0.0.1:1/db"}, "takes a connection string, got bytes"),
    ],
)
def test_bad_arguments_are_refused_before_connecting(options: dict[str, Any], says: str) -> None:
    arguments: dict[str, Any] = {
        "dsn": "postgresql://u:pw@127.0.0.1:1/db?connect_timeout=2",
        "name": "scheduler",
        "lead": print,
        **options,
    }
    with pytest.raises(pgsolo.UsageError, match=says):
        pgsolo.campaign(**arguments)


async def test_an_async_campaign_ends_with_its_task_and_holds_nothing(
    db: str, observer: Observer
) -> None:
    name = unique_name("campaign")
    terms: list[pgsolo.AsyncTerm] = []

    async def lead(term: pgsolo.AsyncTerm) -> None:
        terms.append(term)
        await asyncio.sleep(60)  # the leader's work, until the service shuts down

    task = asyncio.create_task(pgsolo.campaign_async(db, name, lead))
    await aeventually(lambda: terms, "the first term")
    assert observer.holders(leader_key(name)) == {terms[0].backend_pid}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert observer.holders(leader_key(name)) == set()


async def test_an_async_campaign_stops_when_its_event_is_set(db: str, observer: Observer) -> None:
    name = unique_name("campaign")
    stop = asyncio.Event()
    terms: list[pgsolo.AsyncTerm] = []

    async def lead(term: pgsolo.AsyncTerm) -> None:
        terms.append(term)
        if len(terms) == 2:
            stop.set()

    await asyncio.wait_for(pgsolo.campaign_async(db, name, lead, stop=stop), 30)
    assert len(terms) == 2
    assert observer.holders(leader_key(name)) == set()
