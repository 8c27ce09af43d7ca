"""pgsolo._weakmap: the books of connections hold them weakly, by identity."""

from __future__ import annotations

import gc
import sys
from types import FrameType

from pgsolo._weakmap import IdentityWeakMap


class _Conn:
    """Equal to every other: the map must tell them apart by identity all the same."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


def test_an_entry_is_found_by_its_own_key_only() -> None:
    books: IdentityWeakMap[_Conn, str] = IdentityWeakMap()
    first, second = _Conn(), _Conn()
    books[first] = "first"
    assert books.get(first) == "first"
    assert books.get(second) is None  # equal, but another connection
    books[first] = "again"
    assert books.get(first) == "again"
    assert books.pop(first) == "again"
    assert books.get(first) is None
    assert books.pop(first) is None


def test_an_entry_goes_with_its_key_and_a_new_object_never_inherits_it() -> None:
    books: IdentityWeakMap[_Conn, str] = IdentityWeakMap()
    for _ in range(50):  # ids of dead objects are reused at once, often
        conn = _Conn()
        assert books.get(conn) is None
        books[conn] = "held"
        del conn
        gc.collect()
    assert not books._entries  # what the weak references promise


def test_a_replaced_entry_keeps_the_new_value_when_the_old_reference_dies() -> None:
    books: IdentityWeakMap[_Conn, int] = IdentityWeakMap()
    conn = _Conn()
    books[conn] = 1
    books[conn] = 2  # the first reference is dropped; its callback must not remove this
    gc.collect()
    assert books.get(conn) == 2


def test_an_entry_goes_with_its_key_even_if_its_death_is_interrupted() -> None:
    # What lets a lookup trust the entry under an id without asking its reference: no
    # Python runs as the key dies, so a Ctrl-C (which lands on a line of Python) cannot
    # leave the entry behind for a new object to find by the same id.
    books: IdentityWeakMap[_Conn, str] = IdentityWeakMap()
    conn = _Conn()
    books[conn] = "held"

    def interrupt_every_call(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            raise KeyboardInterrupt

    sys.setprofile(interrupt_every_call)
    try:
        del conn
    finally:
        sys.setprofile(None)
    assert not books._entries
