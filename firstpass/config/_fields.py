"""Typed reads from raw TOML tables, each failure a ConfigError naming the key path.

The builder calls these instead of indexing dicts, so every message has the same shape:
``server.port: expected an integer, got "80"``. ``bool`` is never accepted as a number.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final, TypeVar, overload

from firstpass.errors import ConfigError

#: a number checked against bounds (``int`` or ``float``)
N = TypeVar("N", bound=float)
#: the type of a getter's default: what it returns when the key is absent
D = TypeVar("D")
#: one of a getter's choices (a ``Literal`` when the caller's field is one)
C = TypeVar("C", bound=str)


class _Missing:
    def __repr__(self) -> str:
        return "REQUIRED"


#: marks a key that has no default: a getter given it (or no default) returns the checked type;
#: given any other default it returns the checked type or the default's
REQUIRED: Final = _Missing()


def join(path: str, key: str) -> str:
    """``server`` + ``port`` → ``server.port``; an empty parent gives just the key."""
    return f"{path}.{key}" if path else key


def describe(value: object) -> str:
    """A value as a user wrote it in TOML, for "got ..." in messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def check_keys(table: Mapping[str, object], path: str, allowed: Collection[str]) -> None:
    """Reject any key not in ``allowed``, suggesting the closest known one."""
    for key in table:
        if key in allowed:
            continue
        close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        raise ConfigError(join(path, key), f"unknown key{hint}")


def _take(table: Mapping[str, object], key: str, path: str, default: object) -> object:
    if key in table:
        return table[key]
    if default is REQUIRED:
        raise ConfigError(join(path, key), "missing required key")
    return default


def get_any(table: Mapping[str, object], key: str, path: str, default: object = REQUIRED) -> object:
    """The raw value, for shapes the caller checks itself."""
    return _take(table, key, path, default)


@overload
def get_str(table: Mapping[str, object], key: str, path: str, default: _Missing = ...) -> str: ...
@overload
def get_str(table: Mapping[str, object], key: str, path: str, default: D) -> str | D: ...
def get_str(table: Mapping[str, object], key: str, path: str, default: object = REQUIRED) -> object:
    """A non-empty string (or the default when absent)."""
    value = _take(table, key, path, default)
    if key not in table:
        return value
    if not isinstance(value, str):
        raise ConfigError(join(path, key), f"expected a string, got {describe(value)}")
    if not value.strip():
        raise ConfigError(join(path, key), "must not be empty")
    return value


@overload
def get_bool(table: Mapping[str, object], key: str, path: str, default: _Missing = ...) -> bool: ...
@overload
def get_bool(table: Mapping[str, object], key: str, path: str, default: D) -> bool | D: ...
def get_bool(
    table: Mapping[str, object], key: str, path: str, default: object = REQUIRED
) -> object:
    """``true`` or ``false``."""
    value = _take(table, key, path, default)
    if key in table and not isinstance(value, bool):
        raise ConfigError(join(path, key), f"expected true or false, got {describe(value)}")
    return value


@overload
def get_int(
    table: Mapping[str, object],
    key: str,
    path: str,
    default: _Missing = ...,
    *,
    lo: int | None = None,
    hi: int | None = None,
) -> int: ...
@overload
def get_int(
    table: Mapping[str, object],
    key: str,
    path: str,
    default: D,
    *,
    lo: int | None = None,
    hi: int | None = None,
) -> int | D: ...
def get_int(
    table: Mapping[str, object],
    key: str,
    path: str,
    default: object = REQUIRED,
    *,
    lo: int | None = None,
    hi: int | None = None,
) -> object:
    """An integer within ``[lo, hi]`` (``true`` is not an integer here)."""
    value = _take(table, key, path, default)
    if key not in table:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(join(path, key), f"expected an integer, got {describe(value)}")
    return check_range(value, join(path, key), lo=lo, hi=hi)


@overload
def get_float(
    table: Mapping[str, object],
    key: str,
    path: str,
    default: _Missing = ...,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> float: ...
@overload
def get_float(
    table: Mapping[str, object],
    key: str,
    path: str,
    default: D,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> float | D: ...
def get_float(
    table: Mapping[str, object],
    key: str,
    path: str,
    default: object = REQUIRED,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> object:
    """A finite number within the bounds; integers are accepted and become floats."""
    value = _take(table, key, path, default)
    if key not in table:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(join(path, key), f"expected a number, got {describe(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(join(path, key), f"must be a finite number, got {describe(value)}")
    if lo_open and lo is not None and number <= lo:
        raise ConfigError(join(path, key), f"must be greater than {lo:g}, got {describe(value)}")
    check_range(value, join(path, key), lo=lo, hi=hi)  # the message shows the value as written
    return number


def check_range(value: N, key_path: str, *, lo: float | None = None, hi: float | None = None) -> N:
    """``value`` itself, or a ConfigError saying which bound it breaks."""
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ConfigError(key_path, f"must be between {lo:g} and {hi:g}, got {describe(value)}")
    if lo is not None and value < lo:
        raise ConfigError(key_path, f"must be at least {lo:g}, got {describe(value)}")
    if hi is not None and value > hi:
        raise ConfigError(key_path, f"must be at most {hi:g}, got {describe(value)}")
    return value


@overload
def get_choice(
    table: Mapping[str, object],
    key: str,
    path: str,
    choices: Collection[C],
    default: _Missing = ...,
) -> C: ...
@overload
def get_choice(
    table: Mapping[str, object],
    key: str,
    path: str,
    choices: Collection[C],
    default: D,
) -> C | D: ...
def get_choice(
    table: Mapping[str, object],
    key: str,
    path: str,
    choices: Collection[str],
    default: object = REQUIRED,
) -> object:
    """One of ``choices``, spelled exactly."""
    value = _take(table, key, path, default)
    if key not in table:
        return value
    return check_choice(value, join(path, key), choices)


def check_choice(value: object, key_path: str, choices: Collection[C]) -> C:
    """``value`` when it is one of ``choices``; the message lists them all."""
    options = ", ".join(f'"{c}"' for c in choices)
    if not isinstance(value, str):
        raise ConfigError(key_path, f"expected one of {options}, got {describe(value)}")
    for choice in choices:  # the choice itself: it is the value, typed as the caller's choices
        if value == choice:
            return choice
    raise ConfigError(key_path, f"expected one of {options}, got {describe(value)}")


@overload
def get_str_list(
    table: Mapping[str, object], key: str, path: str, default: _Missing = ...
) -> tuple[str, ...]: ...
@overload
def get_str_list(
    table: Mapping[str, object], key: str, path: str, default: D
) -> tuple[str, ...] | D: ...
def get_str_list(
    table: Mapping[str, object], key: str, path: str, default: object = REQUIRED
) -> object:
    """An array of non-empty strings, returned as a tuple."""
    value = _take(table, key, path, default)
    if key not in table:
        return value
    if not isinstance(value, list):
        raise ConfigError(join(path, key), f"expected an array of strings, got {describe(value)}")
    items: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                f"{join(path, key)}[{i}]", f"expected a non-empty string, got {describe(item)}"
            )
        items.append(item)
    return tuple(items)


@overload
def get_table(
    table: Mapping[str, object], key: str, path: str, default: _Missing = ...
) -> Mapping[str, object]: ...
@overload
def get_table(
    table: Mapping[str, object], key: str, path: str, default: D
) -> Mapping[str, object] | D: ...
def get_table(
    table: Mapping[str, object], key: str, path: str, default: object = REQUIRED
) -> object:
    """A sub-table (``[server]``)."""
    value = _take(table, key, path, default)
    if key not in table:
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            join(path, key), f"expected a table [{join(path, key)}], got {describe(value)}"
        )
    return value


def get_tables(table: Mapping[str, object], key: str, path: str) -> list[Mapping[str, object]]:
    """An array of tables (``[[provider]]``); absent → empty."""
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConfigError(
            join(path, key), f"expected an array of tables [[{key}]], got {describe(value)}"
        )
    return value


@overload
def get_path(
    table: Mapping[str, object], key: str, p: str, base_dir: Path, default: str | _Missing
) -> Path: ...
@overload
def get_path(
    table: Mapping[str, object], key: str, p: str, base_dir: Path, default: None
) -> Path | None: ...
def get_path(
    table: Mapping[str, object], key: str, p: str, base_dir: Path, default: str | _Missing | None
) -> Path | None:
    """A path string, resolved against ``base_dir`` (the config file's directory)."""
    raw = get_str(table, key, p, default)
    if raw is None:
        return None
    return base_dir / Path(raw).expanduser()
