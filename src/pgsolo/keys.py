"""Lock keys: key spec v1 (DESIGN.md §2).

PostgreSQL advisory locks take either one signed 64-bit integer or two signed 32-bit
integers, and the two key spaces never overlap. Names are turned into keys with SHA-256,
never with Python's ``hash()``, which is randomised per process. Everything here is pure:
a bad key raises :class:`~pgsolo.errors.InvalidKeyError` before any SQL exists.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import TypeAlias

from .errors import InvalidArgumentError, InvalidKeyError, KeyCollisionError, UsageError

__all__ = [
    "LEADER_PREFIX",
    "MAX_LEADER_NAME_BYTES",
    "MAX_SEMAPHORE_LIMIT",
    "MAX_SEMAPHORE_NAME_BYTES",
    "ONCE_PREFIX",
    "SEMAPHORE_PREFIX",
    "Key",
    "KeyLike",
    "Registry",
    "advisory_keys_in",
    "as_key",
    "checked_text",
    "decode_pg_lock",
    "derive_int32",
    "derive_int64",
    "encode_pg_lock",
    "from_name",
    "leader_key",
    "semaphore_keys",
    "semaphore_session_name",
    "text_of",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_NAME_BYTES = 1024
# The leader of a name holds the key of LEADER_PREFIX + name (DESIGN §2, Leader keys); the
# sessions pgsolo opens for it carry that whole name as their application_name.
LEADER_PREFIX = "pgsolo:leader:"
MAX_LEADER_NAME_BYTES = 512
# Slot I of the semaphore NAME is the key of SEMAPHORE_PREFIX + NAME + ":" + I (DESIGN §2,
# Semaphore keys), for I from 0 to its limit - 1.
SEMAPHORE_PREFIX = "pgsolo:semaphore:"
# A live attempt at run_once's operation OP_KEY holds the key of ONCE_PREFIX + OP_KEY.
ONCE_PREFIX = "pgsolo:once:"
MAX_SEMAPHORE_NAME_BYTES = 512
MAX_SEMAPHORE_LIMIT = 1024


def _exact(number: object) -> object:
    """The plain int an int subclass (an ``IntEnum``) holds, whatever its methods say, so
    that the value checked is the one the SQL and the books use; anything else as it is
    (the checks that follow refuse it)."""
    if isinstance(number, int) and not isinstance(number, bool):
        return int.__index__(number)
    return number


@dataclass(frozen=True, slots=True)
class Key:
    """A validated advisory-lock key: an int64, or a (namespace, resource) pair of int32.

    ``name`` is the human name the key came from, when there is one; it is carried for
    logs and errors and plays no part in equality.
    """

    value: int | tuple[int, int]
    name: str | None = field(default=None, compare=False)
    # Hashed once: a lock looks its key up in several books on each acquisition.
    _hash: int = field(init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return self._hash

    def __post_init__(self) -> None:
        if isinstance(self.value, tuple):
            if len(self.value) != 2:
                raise InvalidKeyError(f"a pair key has exactly two parts, got {self.value!r}")
            if type(self.value) is not tuple or any(type(p) is not int for p in self.value):
                object.__setattr__(self, "value", tuple(_exact(p) for p in self.value))
            for part in self.value:
                _check_int(part, INT32_MIN, INT32_MAX, "each half of a pair key")
        elif isinstance(self.value, bool) or not isinstance(self.value, int):
            raise InvalidKeyError(_not_a_key(self.value))
        else:
            if type(self.value) is not int:
                object.__setattr__(self, "value", _exact(self.value))
            _check_int(self.value, INT64_MIN, INT64_MAX, "an int64 key")
        if self.name is not None:
            _check_name(self.name)
        object.__setattr__(self, "_hash", hash(self.value))

    @property
    def is_pair(self) -> bool:
        return isinstance(self.value, tuple)

    @property
    def sql_args(self) -> str:
        """The key as the argument list of an advisory-lock function, e.g. ``42, 1001``.

        Safe to splice into SQL: both forms are validated Python ints.
        """
        if isinstance(self.value, tuple):
            return f"{int(self.value[0])}, {int(self.value[1])}"
        return str(int(self.value))

    @property
    def text(self) -> str:
        """The command-line form of the key: ``123`` or ``42:1001``."""
        if isinstance(self.value, tuple):
            return f"{self.value[0]}:{self.value[1]}"
        return str(self.value)

    def __str__(self) -> str:
        return f"{self.name} ({self.text})" if self.name else self.text

    @classmethod
    def parse(cls, text: str, *, namespace: int | None = None, name: bool = False) -> Key:
        """Read a key from its command-line form (DESIGN §5).

        ``123`` is an int64, ``42:1001`` a pair, any other text a name, derived as an
        int64 key or, with ``namespace``, as a pair in that namespace. Text that reads as
        neither only by mistake is refused (:class:`~pgsolo.InvalidKeyError`), since as a
        name it would lock a key nobody meant: blanks around it (`` daily ``), or a
        number and a colon that do not make a pair (``42:abc``, ``42:1001:3``). With
        ``name=True`` the text is a name, exactly as given (``--key-is-name``); in
        Python, a ``str`` given as a key is always a name (:func:`as_key`).
        """
        if not isinstance(text, str):
            raise InvalidKeyError(f"a key's text form must be a str, got {type(text).__name__}")
        if name:
            return from_name(text, namespace=namespace)
        parts = text.split(":")
        numeric = len(parts) == 2 and all(_is_int_literal(p) for p in parts)
        if numeric or _is_int_literal(text):
            if namespace is not None:
                raise InvalidKeyError(
                    f"namespace= applies to names only; {text!r} is a numeric key"
                )
            return cls((int(parts[0]), int(parts[1]))) if numeric else cls(int(text))
        _refuse_a_mistaken_name(text, parts)
        return from_name(text, namespace=namespace)


def _refuse_a_mistaken_name(text: str, parts: list[str]) -> None:
    """:class:`~pgsolo.InvalidKeyError` for the text of a key that is a name only by
    mistake, saying what would be accepted."""
    as_name = (
        f"to lock the text {text!r} as a name, exactly as given, add --key-is-name"
        " (in Python, pass the str itself: a str key is always a name)"
    )
    if text != text.strip():
        raise InvalidKeyError(
            f"the key {text!r} has blanks around it; a key is an int64 (123), a pair"
            f" N:R (42:1001) or a name, and {text.strip()!r} would be another key than"
            f" {text!r}: write {text.strip()!r}, or {as_name}"
        )
    if len(parts) > 1 and _is_int_literal(parts[0].strip()):
        pair = (
            f"{parts[0].strip()}:{parts[1].strip()}"
            if len(parts) == 2 and _is_int_literal(parts[1].strip())
            else f"{parts[0].strip()}:1001"
        )
        raise InvalidKeyError(
            f"the key {text!r} starts like a pair but is not one: a pair is two integers"
            f" N:R, each from {INT32_MIN} to {INT32_MAX}, such as {pair}; {as_name}"
        )


KeyLike: TypeAlias = Key | int | tuple[int, int] | str
"""What every pgsolo call accepts as a key."""


def _is_int_literal(text: str) -> bool:
    body = text[1:] if text[:1] in "+-" else text
    return body.isascii() and body.isdigit()


def _check_int(value: object, low: int, high: int, what: str) -> None:
    # bool is an int subclass; True as a lock key is always a bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidKeyError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise InvalidKeyError(f"{what} must be in [{low}, {high}], got {value}")


def text_of(value: str) -> str:
    """The characters ``value`` holds, as a plain ``str``: a ``str`` subclass (a member of
    a ``(str, Enum)``, a class with a ``__str__`` of its own) is named by its value, as it
    compares, never by what its methods say, so that every key and record made of it is
    the one its value makes."""
    return str.__str__(value)


def checked_text(
    value: object, what: str, max_bytes: int, error: type[UsageError] = InvalidKeyError
) -> str:
    """``value`` as a plain ``str`` (:func:`text_of`) if it is a name pgsolo takes
    (``what``: "a key name", "an operation key"...): a non-empty ``str`` without NUL of at
    most ``max_bytes`` UTF-8 bytes; else ``error`` saying which rule it broke."""
    if not isinstance(value, str):
        raise error(f"{what} must be a str, got {type(value).__name__} {value!r}")
    text = text_of(value)
    if not text:
        raise error(f"{what} must not be empty")
    if "\0" in text:
        raise error(f"{what} must not contain a NUL character")
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} must be valid Unicode text: {exc}") from None
    if len(encoded) > max_bytes:
        raise error(f"{what} must be at most {max_bytes} UTF-8 bytes, got {len(encoded)}")
    return text


def _check_name(name: object) -> str:
    return checked_text(name, "a key name", MAX_NAME_BYTES)


def _digest(name: str) -> bytes:
    return hashlib.sha256(_check_name(name).encode("utf-8")).digest()


def derive_int64(name: str) -> int:
    """The int64 key of ``name``: the first 8 bytes of SHA-256, big-endian, signed."""
    return int.from_bytes(_digest(name)[:8], "big", signed=True)


def derive_int32(name: str) -> int:
    """The resource half of a pair key: the first 4 bytes of SHA-256, big-endian, signed."""
    return int.from_bytes(_digest(name)[:4], "big", signed=True)


def from_name(name: str, *, namespace: int | None = None) -> Key:
    """The key derived from ``name`` (an int64, or a pair within ``namespace``)."""
    if type(name) is not str:
        name = _check_name(name)  # raises, or the plain str a subclass holds
    if namespace is not None:
        _check_int(namespace, INT32_MIN, INT32_MAX, "a namespace")
    return _derived(name, namespace)


# A program locks the same few names over and over: each is validated and hashed once.
# Only plain strs reach it (from_name); a bad name raises, and nothing is kept of it.
@functools.lru_cache(maxsize=512, typed=True)
def _derived(name: str, namespace: int | None) -> Key:
    if namespace is None:
        return Key(derive_int64(name), name)
    return Key((namespace, derive_int32(name)), name)


def leader_key(name: object) -> Key:
    """The session advisory lock the leader named ``name`` holds while it leads."""
    return from_name(LEADER_PREFIX + checked_text(name, "a leader name", MAX_LEADER_NAME_BYTES))


def semaphore_keys(name: object, limit: object) -> tuple[Key, ...]:
    """The keys of the ``limit`` slots of the semaphore named ``name``, slot 0 first."""
    text = checked_text(name, "a semaphore name", MAX_SEMAPHORE_NAME_BYTES)
    if type(limit) is not int or not 1 <= limit <= MAX_SEMAPHORE_LIMIT:
        raise InvalidArgumentError(
            f"limit must be an int from 1 to {MAX_SEMAPHORE_LIMIT} (how many may hold the"
            f" semaphore at once), got {limit!r}"
        )
    return tuple(from_name(f"{SEMAPHORE_PREFIX}{text}:{slot}") for slot in range(limit))


def semaphore_session_name(name: str, limit: int) -> str:
    """The ``application_name`` of a session pgsolo opens to hold a slot of the semaphore
    ``name`` of ``limit`` slots: ``pgsolo:semaphore:<name>/<limit>``. ``pgsolo locks``
    reads it back (checking that the slot held derives from it) to show the semaphore
    as one row, its holders out of ``limit``."""
    return f"{SEMAPHORE_PREFIX}{name}/{limit}"


def as_key(key: KeyLike, *, namespace: int | None = None, registry: Registry | None = None) -> Key:
    """Validate anything pgsolo accepts as a key and return a :class:`Key`.

    A ``str`` is a name: looked up in ``registry`` first, derived otherwise (and then
    checked against the registry's keys, so a derived key can never silently collide
    with a registered one).
    """
    return key_of(key, namespace, registry)


def key_of(key: KeyLike, namespace: int | None, registry: Registry | None, /) -> Key:
    """:func:`as_key`, with positional arguments: every lock comes here, and keywords bind
    at twice the cost."""
    if registry is not None and not isinstance(registry, Registry):
        raise InvalidArgumentError(
            f"registry must be a pgsolo.Registry (Registry.from_toml(path)), got {registry!r}"
        )
    # The common keys first: an exact int or pair of ints (a Key, a bool, a subclass of
    # int or a name is none of them).
    if namespace is None and (
        type(key) is int
        or (type(key) is tuple and len(key) == 2 and type(key[0]) is int and type(key[1]) is int)
    ):
        return _numeric(key)
    if isinstance(key, Key):
        if namespace is not None:
            raise InvalidKeyError("namespace= applies to names only; a Key is used as given")
        return key
    if isinstance(key, str):
        if registry is not None:
            return registry.resolve(key, namespace=namespace)
        return from_name(key, namespace=namespace)
    if namespace is not None:
        raise InvalidKeyError("namespace= applies to names only; a numeric key is used as given")
    if isinstance(key, tuple):
        if len(key) != 2:
            raise InvalidKeyError(f"a pair key has exactly two parts, got {key!r}")
        return Key((key[0], key[1]))
    if isinstance(key, bool) or not isinstance(key, int):
        raise InvalidKeyError(_not_a_key(key))
    return Key(key)


# The same few numeric keys come back as often as names do, and validating one costs a lock
# more than looking it up. Only exact ints reach this cache (True == 1 would find 1's Key),
# and a key out of range raises and is not kept.
@functools.lru_cache(maxsize=512)
def _numeric(value: int | tuple[int, int]) -> Key:
    return Key(value)


def _not_a_key(value: object) -> str:
    """Why ``value`` is no key; a list (or any other sequence) is told to be a tuple."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return (
            "a pair key is a tuple (namespace, resource), never a"
            f" {type(value).__name__} ({value!r}): pass tuple(value)"
        )
    return (
        "a key is an int (int64), a tuple of two ints (int32, int32) or a name (str); "
        f"got {type(value).__name__} {value!r}"
    )


def decode_pg_lock(classid: int, objid: int, objsubid: int) -> Key:
    """The key of an advisory row of ``pg_locks`` (DESIGN §2, normative).

    ``classid`` and ``objid`` are unsigned oids there, so negative keys show up as large
    numbers: ``objsubid = 1`` is an int64 key ``(classid << 32) | objid``, ``objsubid = 2``
    a pair ``(int32(classid), int32(objid))``.
    """
    for part in (classid, objid):
        if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < 2**32:
            raise InvalidKeyError(f"pg_locks oids are unsigned 32-bit integers, got {part!r}")
    if isinstance(objsubid, bool):
        raise InvalidKeyError(f"objsubid {objsubid!r} is not an advisory key (expected 1 or 2)")
    if objsubid == 1:
        return Key(_signed((classid << 32) | objid, 64))
    if objsubid == 2:
        return Key((_signed(classid, 32), _signed(objid, 32)))
    raise InvalidKeyError(f"objsubid {objsubid!r} is not an advisory key (expected 1 or 2)")


# How PostgreSQL names an advisory lock in a deadlock report (DescribeLockTag):
# "advisory lock [database oid, classid, objid, objsubid]".
_ADVISORY_TAG = re.compile(r"advisory lock \[(\d+),(\d+),(\d+),([12])\]")


def advisory_keys_in(text: str) -> tuple[Key, ...]:
    """The advisory keys a server message names, in order, each once."""
    found: dict[Key, None] = {}
    for match in _ADVISORY_TAG.finditer(text):
        _database, classid, objid, objsubid = (int(part) for part in match.groups())
        found.setdefault(decode_pg_lock(classid, objid, objsubid), None)
    return tuple(found)


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


class Registry:
    """An explicit map from names to keys, so that no two jobs can share a key.

    A hash can collide; a registry cannot: registering one name on two keys, or two
    names on one key, raises :class:`~pgsolo.errors.KeyCollisionError` at registration,
    and resolving an unregistered name whose derived key is already registered does too.
    Namespaces can be named as well, each name and number once (:meth:`namespace_name`
    gives a number's name, for a program's own listings); pgsolo's listings show a pair
    key by its numbers, which ``--key`` takes back as written.
    """

    def __init__(
        self,
        locks: Mapping[str, int | tuple[int, int]] | None = None,
        *,
        namespaces: Mapping[str, int] | None = None,
    ) -> None:
        for argument, given in (("locks", locks), ("namespaces", namespaces)):
            if given is not None and not isinstance(given, Mapping):
                raise InvalidArgumentError(
                    f"Registry({argument}=...) takes a mapping of names to"
                    f" {'keys' if argument == 'locks' else 'numbers'} (a dict), got"
                    f" {type(given).__name__} {given!r}"
                )
        self._by_name: dict[str, Key] = {}
        self._by_key: dict[Key, str] = {}
        self._namespaces: dict[str, int] = {}
        for ns_name, number in (namespaces or {}).items():
            self.register_namespace(ns_name, number)
        for name, value in (locks or {}).items():
            self.register(name, value)

    def register(self, name: str, key: int | tuple[int, int] | Key) -> Key:
        """Map ``name`` to ``key``; registering the same pair twice is harmless."""
        name = _check_name(name)
        if isinstance(key, str):
            # A str here is a mistake (say "42:1001" in a TOML file); deriving a key from
            # it would silently register a hash instead of the number the user meant.
            raise InvalidKeyError(
                f"the key of {name!r} must be an int or a pair of ints, got str {key!r}"
            )
        value = key.value if isinstance(key, Key) else as_key(key).value
        new = Key(value, name)
        if (existing := self._by_name.get(name)) is not None:
            if existing == new:
                return existing
            raise KeyCollisionError(
                f"name {name!r} is already registered on key {existing.text}, not {new.text}"
            )
        if (owner := self._by_key.get(new)) is not None:
            raise KeyCollisionError(f"key {new.text} is already registered to {owner!r}")
        self._by_name[name] = new
        self._by_key[new] = name
        return new

    def register_namespace(self, name: str, number: int) -> None:
        name = _check_name(name)
        _check_int(number, INT32_MIN, INT32_MAX, "a namespace")
        if self._namespaces.get(name, number) != number:
            raise KeyCollisionError(f"namespace {name!r} is already {self._namespaces[name]}")
        if any(n == number and other != name for other, n in self._namespaces.items()):
            raise KeyCollisionError(f"namespace {number} is already named")
        self._namespaces[name] = number

    def resolve(self, name: str, *, namespace: int | None = None) -> Key:
        """The key for ``name``: registered, or derived and checked against the registry."""
        name = text_of(name)  # an Enum's member hashes by its member name, not its value
        if (registered := self._by_name.get(name)) is not None:
            return registered
        derived = from_name(name, namespace=namespace)
        if (owner := self._by_key.get(derived)) is not None:
            raise KeyCollisionError(
                f"name {name!r} derives key {derived.text}, which is registered to {owner!r}"
            )
        return derived

    def name_of(self, key: Key) -> str | None:
        """The registered name of ``key``, if any (used to label ``pg_locks`` rows)."""
        return self._by_key.get(key)

    def namespace_name(self, number: int) -> str | None:
        return next((n for n, v in self._namespaces.items() if v == number), None)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    def items(self) -> list[tuple[str, Key]]:
        return list(self._by_name.items())

    @classmethod
    def from_toml(cls, path: str | PathLike[str]) -> Registry:
        """Load a registry from a TOML file::

        [namespaces]
        jobs = 42

        [locks]
        daily-settlement = [42, 1001]   # a pair
        cache-refresh = 7               # an int64
        """
        import tomllib  # noqa: PLC0415  (here: `import pgsolo` and every CLI start skip it)

        with open(path, "rb") as handle:
            try:
                data = tomllib.load(handle)
            except tomllib.TOMLDecodeError as exc:
                raise InvalidKeyError(f"{path}: not valid TOML: {exc}") from None
            except UnicodeDecodeError as exc:  # TOML is UTF-8, and tomllib says no more
                raise InvalidKeyError(
                    f"{path}: not valid TOML: byte {exc.object[exc.start]:#04x} at offset"
                    f" {exc.start} is not UTF-8, as TOML must be"
                ) from None
        unknown = set(data) - {"locks", "namespaces"}
        if unknown:
            raise InvalidKeyError(f"{path}: unknown tables {sorted(unknown)}")
        locks = data.get("locks", {})
        namespaces = data.get("namespaces", {})
        if not isinstance(locks, dict) or not isinstance(namespaces, dict):
            raise InvalidKeyError(f"{path}: [locks] and [namespaces] must be tables")
        try:
            registry = cls(namespaces=namespaces)
        except (InvalidKeyError, KeyCollisionError) as exc:
            raise type(exc)(f"{path}: [namespaces]: {exc}") from None
        for name, raw in locks.items():
            value = tuple(raw) if isinstance(raw, list) else raw
            try:
                registry.register(name, value)
            except (InvalidKeyError, KeyCollisionError) as exc:
                raise type(exc)(f"{path}: lock {name!r}: {exc}") from None
        return registry


def encode_pg_lock(key: Key) -> tuple[int, int, int]:
    """The ``(classid, objid, objsubid)`` of ``key`` in ``pg_locks``: the inverse of
    :func:`decode_pg_lock`."""
    if isinstance(key.value, tuple):
        namespace, resource = key.value
        return namespace & 0xFFFFFFFF, resource & 0xFFFFFFFF, 2
    unsigned = key.value & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF, 1
