"""The ``Registry`` of named keys: register and resolve, collisions (in code, in the
constructor, with derived keys), namespaces, ``as_key`` through the registry, and
``Registry.from_toml`` with the errors that name the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _support import INT32_MAX, INT32_MIN, INT64_MIN
from pgsolo.errors import InvalidArgumentError, InvalidKeyError, KeyCollisionError, UsageError
from pgsolo.keys import (
    Key,
    Registry,
    as_key,
    decode_pg_lock,
    derive_int32,
    derive_int64,
)


def test_registry_register_and_resolve() -> None:
    registry = Registry()
    key = registry.register("daily-settlement", (42, 1001))
    assert key == Key((42, 1001))
    assert key.name == "daily-settlement"
    resolved = registry.resolve("daily-settlement")
    assert resolved.value == (42, 1001)
    assert resolved.name == "daily-settlement"
    assert "daily-settlement" in registry
    assert len(registry) == 1
    assert registry.items() == [("daily-settlement", Key((42, 1001)))]


def test_registry_registered_name_wins_over_derivation_and_namespace() -> None:
    registry = Registry({"daily-settlement": 7})
    assert registry.resolve("daily-settlement").value == 7
    assert registry.resolve("daily-settlement", namespace=42).value == 7


def test_registry_accepts_a_key_object() -> None:
    registry = Registry()
    key = registry.register("cache-refresh", Key(7, "other-label"))
    assert key.value == 7
    assert key.name == "cache-refresh"
    assert registry.name_of(Key(7)) == "cache-refresh"


def test_registry_registering_the_same_name_and_key_twice_is_harmless() -> None:
    registry = Registry()
    first = registry.register("job", (42, 1))
    second = registry.register("job", (42, 1))
    assert first == second == Key((42, 1))
    assert len(registry) == 1


def test_registry_refuses_a_list_as_a_pair_in_code() -> None:
    """A TOML array is read as a pair (TOML has no tuples); in code a pair is a tuple."""
    with pytest.raises(InvalidKeyError, match=r"tuple\(value\)"):
        Registry().register("job", [42, 1])  # type: ignore[arg-type]


def test_registry_one_name_on_two_keys_is_a_collision() -> None:
    registry = Registry({"job": 1})
    with pytest.raises(KeyCollisionError, match="job"):
        registry.register("job", 2)
    assert registry.resolve("job").value == 1


def test_registry_two_names_on_one_key_is_a_collision() -> None:
    registry = Registry({"first": (42, 1)})
    with pytest.raises(KeyCollisionError, match="first"):
        registry.register("second", (42, 1))
    assert "second" not in registry


def test_registry_collision_detected_in_constructor() -> None:
    with pytest.raises(KeyCollisionError):
        Registry({"a": 5, "b": 5})


def test_registry_int64_and_pair_with_same_numbers_do_not_collide() -> None:
    registry = Registry({"int64": 1, "pair": (0, 1)})
    assert registry.name_of(Key(1)) == "int64"
    assert registry.name_of(Key((0, 1))) == "pair"


def test_registry_derived_key_equal_to_a_registered_key_is_a_collision() -> None:
    registry = Registry()
    registry.register("squatter", derive_int64("daily-settlement"))
    with pytest.raises(KeyCollisionError, match="squatter"):
        registry.resolve("daily-settlement")
    with pytest.raises(KeyCollisionError):
        as_key("daily-settlement", registry=registry)


def test_registry_derived_pair_equal_to_a_registered_pair_is_a_collision() -> None:
    registry = Registry({"squatter": (42, derive_int32("tenant-export"))})
    with pytest.raises(KeyCollisionError):
        registry.resolve("tenant-export", namespace=42)
    # The same name in another namespace, or as an int64, derives a free key.
    assert registry.resolve("tenant-export", namespace=43).value == (43, -1101663339)
    assert registry.resolve("tenant-export").value == -4731608009049143110


def test_registry_unregistered_name_resolves_to_its_derived_key() -> None:
    registry = Registry({"other": 1})
    key = registry.resolve("expired-session-cleanup")
    assert key.value == 1464048641933150878
    assert key.name == "expired-session-cleanup"
    assert registry.resolve("expired-session-cleanup", namespace=5).value == (5, 340875387)


def test_registry_name_of() -> None:
    registry = Registry({"daily-settlement": (42, 1001), "cache-refresh": -7})
    assert registry.name_of(Key((42, 1001))) == "daily-settlement"
    assert registry.name_of(decode_pg_lock(0xFFFFFFFF, 0xFFFFFFF9, 1)) == "cache-refresh"
    assert registry.name_of(Key((42, 1002))) is None


def test_registry_rejects_invalid_names_and_keys() -> None:
    registry = Registry()
    with pytest.raises(InvalidKeyError):
        registry.register("", 1)
    with pytest.raises(InvalidKeyError):
        registry.register("job", True)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        registry.register("job", 2**63)
    with pytest.raises(InvalidKeyError):
        registry.register("job", (1, 2, 3))  # type: ignore[arg-type]
    assert len(registry) == 0


@pytest.mark.parametrize(
    ("given", "argument"),
    [("x", "locks"), ([("a", 1)], "locks"), (42, "namespaces")],
)
def test_registry_refuses_what_is_no_mapping(given: object, argument: str) -> None:
    """Regression: Registry("x") raised AttributeError ('str' object has no attribute
    'items'), where every other wrong argument of pgsolo's is a UsageError."""
    with pytest.raises(InvalidArgumentError, match=rf"Registry\({argument}=\.\.\.\)"):
        Registry(**{argument: given})  # type: ignore[arg-type]


def test_registry_rejects_a_str_as_the_key_of_a_name() -> None:
    # "42:1001" as a key must not silently become the hash of the string "42:1001".
    registry = Registry()
    with pytest.raises(InvalidKeyError):
        registry.register("job", "42:1001")  # type: ignore[arg-type]
    assert "job" not in registry


def test_registry_namespaces() -> None:
    registry = Registry(namespaces={"jobs": 42, "tenants": -3})
    assert registry.namespace_name(42) == "jobs"
    assert registry.namespace_name(-3) == "tenants"
    assert registry.namespace_name(7) is None
    registry.register_namespace("jobs", 42)  # same again is harmless
    assert registry.namespace_name(42) == "jobs"


def test_registry_namespace_collisions() -> None:
    registry = Registry(namespaces={"jobs": 42})
    with pytest.raises(KeyCollisionError, match="jobs"):
        registry.register_namespace("jobs", 43)
    with pytest.raises(KeyCollisionError, match="42"):
        registry.register_namespace("work", 42)
    assert registry.namespace_name(42) == "jobs"
    assert registry.namespace_name(43) is None


@pytest.mark.parametrize("number", [INT32_MAX + 1, INT32_MIN - 1, True, 1.0])
def test_registry_namespace_must_be_an_int32(number: object) -> None:
    with pytest.raises(InvalidKeyError):
        Registry(namespaces={"jobs": number})  # type: ignore[dict-item]


def test_as_key_uses_the_registry() -> None:
    registry = Registry({"daily-settlement": (42, 1001)})
    key = as_key("daily-settlement", registry=registry)
    assert key.value == (42, 1001)
    assert key.name == "daily-settlement"
    # Unregistered names are still derived.
    assert as_key("tenant-export", registry=registry).value == -4731608009049143110
    # Numeric keys bypass the registry.
    assert as_key(5, registry=registry).value == 5


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "locks.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_from_toml_loads_pairs_int64s_and_namespaces(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [namespaces]
        jobs = 42
        tenants = -1

        [locks]
        daily-settlement = [42, 1001]   # a pair
        cache-refresh = 7               # an int64
        "Grüße" = -9223372036854775808
        edge = [-2147483648, 2147483647]
        """,
    )
    registry = Registry.from_toml(path)
    assert len(registry) == 4
    assert registry.resolve("daily-settlement").value == (42, 1001)
    assert registry.resolve("cache-refresh").value == 7
    assert registry.resolve("Grüße").value == INT64_MIN
    assert registry.resolve("edge").value == (INT32_MIN, INT32_MAX)
    assert registry.name_of(Key((42, 1001))) == "daily-settlement"
    assert registry.namespace_name(42) == "jobs"
    assert registry.namespace_name(-1) == "tenants"


def test_from_toml_accepts_a_str_path_and_partial_files(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks]\nonly = 1\n")
    registry = Registry.from_toml(str(path))
    assert registry.resolve("only").value == 1
    assert registry.namespace_name(1) is None
    assert len(Registry.from_toml(write(tmp_path, ""))) == 0


def test_from_toml_registry_still_checks_derived_names(tmp_path: Path) -> None:
    path = write(tmp_path, f"[locks]\nsquatter = {derive_int64('tenant-export')}\n")
    registry = Registry.from_toml(path)
    with pytest.raises(KeyCollisionError, match="squatter"):
        as_key("tenant-export", registry=registry)


def test_from_toml_bad_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks\njob = 1\n")
    with pytest.raises(InvalidKeyError, match="not valid TOML") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


def test_from_toml_a_file_not_in_utf_8_is_bad_toml(tmp_path: Path) -> None:
    """Regression: a registry saved in Latin-1 raised tomllib's UnicodeDecodeError, a
    traceback and exit 1 from `pgsolo locks --registry`, not a usage error."""
    path = tmp_path / "latin1.toml"
    path.write_bytes("[locks]\ncaf\u00e9 = 1\n".encode("latin-1"))
    with pytest.raises(InvalidKeyError, match=r"not valid TOML.*0xe9.*not UTF-8") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


def test_from_toml_duplicate_name_is_bad_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks]\njob = 1\njob = 2\n")
    with pytest.raises(InvalidKeyError) as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


def test_from_toml_unknown_table(tmp_path: Path) -> None:
    path = write(tmp_path, "[lock]\njob = 1\n")
    with pytest.raises(InvalidKeyError, match="unknown tables") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)
    assert "lock" in str(info.value)


def test_from_toml_tables_must_be_tables(tmp_path: Path) -> None:
    path = write(tmp_path, "locks = 5\n")
    with pytest.raises(InvalidKeyError, match="must be tables") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "9223372036854775808",
        "[2147483648, 1]",
        "[1, -2147483649]",
        "[1, 2, 3]",
        "true",
        "1.5",
        '"42:1001"',
        "{ a = 1 }",
    ],
)
def test_from_toml_invalid_lock_value_names_the_file_and_lock(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[locks]\nbad-job = {value}\n")
    with pytest.raises(InvalidKeyError) as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)
    assert "bad-job" in str(info.value)


def test_from_toml_collision_in_file_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks]\nfirst = [42, 1]\nsecond = [42, 1]\n")
    with pytest.raises(KeyCollisionError) as info:
        Registry.from_toml(path)
    message = str(info.value)
    assert str(path) in message
    assert "first" in message
    assert "second" in message


@pytest.mark.parametrize(
    "namespaces", ["jobs = 2147483648", "jobs = true", 'jobs = "42"', "jobs = 1\nwork = 1"]
)
def test_from_toml_bad_namespaces_name_the_file(tmp_path: Path, namespaces: str) -> None:
    path = write(tmp_path, f"[namespaces]\n{namespaces}\n")
    with pytest.raises(UsageError) as info:
        Registry.from_toml(path)
    assert isinstance(info.value, InvalidKeyError | KeyCollisionError)
    assert str(path) in str(info.value)


def test_from_toml_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Registry.from_toml(tmp_path / "absent.toml")
