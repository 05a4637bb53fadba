"""Find and parse ``firstpass.toml``; everything after parsing is ``_build``'s job.

Reading happens once at start, before the event loop serves requests, so plain file I/O is fine
here; a caller already inside a loop should use ``asyncio.to_thread(load_config, ...)``.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path

from firstpass.config._build import config_from_dict
from firstpass.config._env import ENV_CONFIG
from firstpass.config._model import Config
from firstpass.errors import ConfigError

#: the file looked for in the working directory when no path and no FIRSTPASS_CONFIG is given
DEFAULT_CONFIG = "firstpass.toml"

_WHERE = re.compile(r"\(at line (\d+), column (\d+)\)")


def resolve_config_path(path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path:
    """``path``, else ``$FIRSTPASS_CONFIG``, else ``./firstpass.toml``."""
    if path is not None:
        return Path(path)
    if env.get(ENV_CONFIG, "").strip():
        return Path(env[ENV_CONFIG].strip()).expanduser()
    return Path(DEFAULT_CONFIG)


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Read, validate and freeze the config; ConfigError names the file or the key path."""
    env = os.environ if env is None else env
    file = resolve_config_path(path, env).absolute()
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        via = f" (from {ENV_CONFIG})" if path is None and env.get(ENV_CONFIG) else ""
        raise ConfigError(
            str(file),
            f"config file not found{via}; check the path, or write a starter config there "
            f"with `firstpass init --path {shlex.quote(str(file))}`",
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(file), f"cannot read config file: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(file), f"invalid TOML: {_toml_message(exc)}") from exc
    except RecursionError as exc:  # tomllib recurses once per nested array or inline table
        raise ConfigError(str(file), _TOO_DEEP) from exc
    try:
        return config_from_dict(data, base_dir=file.parent, env=env, source=file)
    except RecursionError as exc:  # valid TOML (dotted keys, [a.b.c…] headers) nested deeper
        raise ConfigError(str(file), _TOO_DEEP_VALUES) from exc


_TOO_DEEP = (
    "invalid TOML: arrays or inline tables are nested too deeply to read; no key of a "
    "Firstpass config nests more than a few levels, so look for a runaway '[' or '{'"
)
_TOO_DEEP_VALUES = (
    "tables or values are nested too deeply to check (dotted keys or [a.b.c...] headers "
    "thousands of levels deep); no key of a Firstpass config nests more than a few levels"
)


def _toml_message(exc: tomllib.TOMLDecodeError) -> str:
    """tomllib's message reworded to lead with ``line L, column C``."""
    message = str(exc)
    match = _WHERE.search(message)
    if not match:
        return message
    reason = message[: match.start()].strip()
    return f"line {match.group(1)}, column {match.group(2)}: {reason}"
