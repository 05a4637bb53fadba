"""Environment overrides, applied after the file is validated; a bad value names the variable."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from firstpass.config import _fields as f
from firstpass.config._model import (
    REPLICA_RE,
    REPLICA_RULE,
    ElasticConfig,
    ReceiptsConfig,
    ServerConfig,
)
from firstpass.errors import ConfigError

ENV_CONFIG = "FIRSTPASS_CONFIG"
ENV_HOST = "FIRSTPASS_HOST"
ENV_PORT = "FIRSTPASS_PORT"
ENV_RECEIPTS = "FIRSTPASS_RECEIPTS"
ENV_ELASTIC_MODE = "FIRSTPASS_ELASTIC_MODE"
ENV_REPLICA = "FIRSTPASS_REPLICA"
ENV_SQL_REASK = "FIRSTPASS_SQL_REASK"
ENV_SQL_SELF_CHECK = "FIRSTPASS_SQL_SELF_CHECK"


def apply_env(
    env: Mapping[str, str],
    server: ServerConfig,
    receipts: ReceiptsConfig,
    elastic: ElasticConfig | None,
) -> tuple[ServerConfig, ReceiptsConfig, ElasticConfig | None]:
    """FIRSTPASS_HOST / _PORT / _RECEIPTS / _REPLICA / _ELASTIC_MODE; a bad value names the
    variable."""
    if ENV_HOST in env:
        host = env[ENV_HOST].strip()
        if not host:
            raise ConfigError(ENV_HOST, "must not be empty")
        server = dataclasses.replace(server, host=host)
    if ENV_PORT in env:
        raw = env[ENV_PORT].strip()
        if not raw.isdigit():
            raise ConfigError(ENV_PORT, f"expected an integer, got {f.describe(env[ENV_PORT])}")
        server = dataclasses.replace(server, port=f.check_range(int(raw), ENV_PORT, lo=0, hi=65535))
    if ENV_RECEIPTS in env:
        raw = env[ENV_RECEIPTS].strip()
        if not raw:
            raise ConfigError(ENV_RECEIPTS, "must not be empty")
        receipts = dataclasses.replace(receipts, path=Path(raw).expanduser())
    if ENV_REPLICA in env and receipts.sink == "postgresql":
        replica = env[ENV_REPLICA].strip()
        if not REPLICA_RE.fullmatch(replica):
            raise ConfigError(ENV_REPLICA, f"{replica!r} is not a replica id: {REPLICA_RULE}")
        receipts = dataclasses.replace(receipts, replica=replica)
    if ENV_ELASTIC_MODE in env:
        mode: Literal["shadow", "enforce", "off"] = f.check_choice(
            env[ENV_ELASTIC_MODE].strip(), ENV_ELASTIC_MODE, ("shadow", "enforce", "off")
        )
        if mode == "off":
            elastic = None
        else:
            elastic = dataclasses.replace(elastic or ElasticConfig(), mode=mode)
    return server, receipts, elastic


def sql_follow_up_switches(
    env: Mapping[str, str], routes: list[Mapping[str, object]]
) -> list[Mapping[str, object]]:
    """FIRSTPASS_SQL_REASK / _SQL_SELF_CHECK = ``0`` turn that follow-up off in every
    ``sql_evidence`` check of every route (composites included), as if each said
    ``reask = false`` / ``self_check = false``; ``1`` leaves the file's choice. Applied to the
    raw route tables, so the digest reflects it."""
    off: dict[str, bool] = {}
    for name, key in ((ENV_SQL_REASK, "reask"), (ENV_SQL_SELF_CHECK, "self_check")):
        if name not in env:
            continue
        raw = env[name].strip().lower()
        if raw in ("0", "false", "off", "no"):
            off[key] = False
        elif raw not in ("1", "true", "on", "yes"):
            raise ConfigError(name, f"expected 0 (off) or 1, got {f.describe(env[name])}")
    if not off:
        return routes
    return [
        {
            k: [_switched(c, off) for c in v]
            if k in ("visible_checks", "gate_checks") and isinstance(v, list)
            else v
            for k, v in table.items()
        }
        for table in routes
    ]


def _switched(check: object, off: Mapping[str, bool]) -> object:
    if not isinstance(check, Mapping):
        return check  # the check list's own validation names it
    out = dict(check)
    if out.get("kind") == "sql_evidence":
        out.update(off)
    parts = out.get("checks")
    if isinstance(parts, list):
        out["checks"] = [_switched(p, off) for p in parts]
    return out
