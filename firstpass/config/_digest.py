"""The config digest receipts carry: SHA-256 over canonical JSON of the config minus secrets."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from firstpass.checks import CheckDef
from firstpass.config._model import Config, ReceiptsConfig, RouteConfig, SandboxSettings


def config_digest(config: Config) -> str:
    """``sha256:`` + hex over the canonical JSON of the effective config, secrets left out."""
    body = public_dict(config)
    canonical = json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def public_dict(config: Config) -> dict[str, object]:
    """The effective config as JSON-ready data without secrets (``api_key``, ``client_keys``)."""

    def plain(value: object) -> object:
        if isinstance(value, Path):
            return value.as_posix()
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, frozenset | set):
            return [plain(v) for v in sorted(value)]  # str members: plain() keeps them
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    server = dataclasses.asdict(config.server)
    del server["client_keys"]
    # named keys by their public part (never the secret); keys from client_keys_env alone are
    # already there by variable name, so a config without named keys keeps its digest
    named = config.server.client_key[len(config.server.client_keys_env) :]
    server["client_key"] = [
        {"name": k.name, "key_env": k.key_env, "routes": k.routes, "daily_usd": k.daily_usd}
        for k in named
    ]
    if not named:
        del server["client_key"]
    sandbox = dataclasses.asdict(config.sandbox)
    for key in ("max_queue", "slot_timeout_s"):  # left out at their defaults, as above
        if sandbox[key] == getattr(SandboxSettings, key):
            del sandbox[key]
    receipts = dataclasses.asdict(config.receipts)
    for key in ("rotate_bytes", "rotate_s", "signing_key", "checkpoint_interval_s"):
        if receipts[key] == getattr(ReceiptsConfig, key):  # left out at their defaults, as above
            del receipts[key]
    providers = []
    for provider in config.providers:
        row = dataclasses.asdict(provider)
        del row["api_key"]
        providers.append(row)
    sections: dict[str, object] = {
        "server": server,
        "sandbox": sandbox,
        "receipts": receipts,
        "providers": providers,
        "routes": [_route(r) for r in config.routes],
        "prices": {k: dataclasses.asdict(v) for k, v in config.prices.items()},
        "elastic": None if config.elastic is None else _elastic(config),
    }
    body = {key: plain(value) for key, value in sections.items()}
    if config.budgets is not None:
        body["budgets"] = plain(dataclasses.asdict(config.budgets))
    return body


def _route(route: RouteConfig) -> dict[str, object]:
    """A route; the check lists and the revision loop only when set, so a route without them
    keeps the digest it had before they existed."""
    body = dataclasses.asdict(dataclasses.replace(route, visible_checks=(), gate_checks=()))
    for key in ("visible_checks", "gate_checks"):
        defs = getattr(route, key)
        if defs:
            body[key] = [_check_def(d) for d in defs]
        else:
            del body[key]
    if body["revision"] is None:
        del body["revision"]
    return body


def _check_def(defn: CheckDef) -> dict[str, object]:
    """A check as written (not the object built from it)."""
    return {
        "kind": defn.kind,
        "name": defn.name,
        "raw": defn.raw,
        "parts": [_check_def(p) for p in defn.parts],
    }


def _elastic(config: Config) -> dict[str, object]:
    """The elastic block; keys added later are left out at their defaults, so a config that does
    not use them keeps the digest it had before they existed (receipts stay comparable)."""
    assert config.elastic is not None
    e = config.elastic
    body: dict[str, object] = {
        field.name: getattr(e, field.name)
        for field in dataclasses.fields(e)
        if field.compare  # the files and licences are summarised below, not dumped
    }
    if body["score"] == "pass_share":
        del body["score"]
    if not body["lambda_set"]:
        del body["lambda_set"]
    if body["method"] == "ltt":
        del body["method"]
    # which certificate each probed (route, rung) runs under: part of what the config does
    body["licences"] = {
        f"{route}/{rung}": None
        if lic.certificate is None
        else {"id": lic.certificate.id, "lambda": lic.certificate.lambda_}
        for (route, rung), lic in sorted(e.licences.items())
    }
    return body
