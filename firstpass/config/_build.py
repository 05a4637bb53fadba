"""Raw TOML data + environment → a validated ``Config``, or the first ConfigError found.

Each section has one builder; ``[escalation.elastic]`` lives in ``_elastic``, the environment
overrides in ``_env``, the digest in ``_digest``. Cross-section rules (ladder providers exist, every
rung has a price, no model is claimed by two routes) run once the sections they need are read, so
their messages can list what *is* known.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import get_args
from urllib.parse import urlsplit

from firstpass.checks import CheckDef, field_path, parse_checks
from firstpass.config import _fields as f
from firstpass.config._checks import validate_checks
from firstpass.config._digest import config_digest
from firstpass.config._elastic import (
    ELASTIC_PATH,
    bind_licences,
    build_elastic,
    probe_output_cap,
)
from firstpass.config._env import ENV_ELASTIC_MODE, apply_env, sql_follow_up_switches
from firstpass.config._model import (
    ANY_MODEL,
    MAX_K,
    REPLICA_RE,
    REPLICA_RULE,
    REQUEST_MODES,
    BudgetsConfig,
    CacheMarks,
    ClientKey,
    Config,
    ElasticConfig,
    FsyncPolicy,
    ObservabilityConfig,
    Price,
    ProviderConfig,
    ProviderKind,
    ReceiptsConfig,
    ReceiptSinkKind,
    Revision,
    RouteChecks,
    RouteConfig,
    Rung,
    SandboxSettings,
    ServerConfig,
    WithoutChecks,
)
from firstpass.errors import CheckSpecError, ConfigError
from firstpass.receipts import load_signing_key
from firstpass.sandbox import MAX_SECONDS

_TOP_KEYS = (
    "server", "sandbox", "receipts", "provider", "route", "price", "escalation", "observability",
    "budgets",
)  # fmt: skip
_SERVER_KEYS = (
    "host", "port", "max_body_bytes", "max_concurrency", "client_keys_env", "debug", "keepalive_s",
    "workers", "request_timeout_s", "client_key", "feedback_index_size", "body_read_timeout_s",
    "idle_timeout_s",
)  # fmt: skip
_CLIENT_KEY_KEYS = ("name", "key_env", "routes", "daily_usd")
_BUDGETS_KEYS = (
    "per_request_usd", "daily_usd", "on_exhausted", "default_max_tokens", "image_tokens",
)  # fmt: skip
_SANDBOX_KEYS = (
    "concurrency", "wall_s", "cpu_s", "memory_mb", "scratch_mb", "site_packages", "max_queue",
    "slot_timeout_s",
)  # fmt: skip
_RECEIPTS_KEYS = (
    "path", "fsync", "store_content", "queue_size", "signing_key", "checkpoint_interval_s",
    "rotate_bytes", "rotate_s", "sink", "dsn_env", "replica", "spill_path", "spill_max_bytes",
)  # fmt: skip
_PROVIDER_COMMON = (
    "id", "kind", "timeout_s", "connect_timeout_s", "retries", "backoff_base_s", "backoff_max_s",
    "honours_n", "max_concurrency",
)  # fmt: skip
_PROVIDER_ONLY: dict[ProviderKind, tuple[str, ...]] = {
    "openai": ("base_url", "api_key_env", "cache_marks"),
    "anthropic": ("base_url", "api_key_env"),
    "replay": ("samples", "seed"),
}
_ROUTE_KEYS = (
    "name", "models", "ladder", "temperature", "on_exhausted", "without_checks", "checks",
    "client_modes", "visible_checks", "gate_checks", "revision", "tool_turns",
)  # fmt: skip
_REVISION_KEYS = ("max_revisions", "max_cost_usd", "feedback_chars", "gate_reasons")
_CHECKS_KEYS = ("visible", "hidden", "setup", "entry_point")
_PRICE_KEYS = (
    "model", "input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
)  # fmt: skip
_OBSERVABILITY_KEYS = ("metrics", "request_log")

#: where an anthropic provider without a ``base_url`` goes
_ANTHROPIC_BASE_URL = "https://api.anthropic.com"
_PROVIDER_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def config_from_dict(
    data: Mapping[str, object],
    *,
    base_dir: Path,
    env: Mapping[str, str],
    source: Path | None = None,
) -> Config:
    """Validate parsed TOML: relative paths resolve against ``base_dir``, secrets come from ``env``.

    Tests call this directly; ``load_config`` calls it after reading the file.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a table at the top level, got {f.describe(data)}")
    f.check_keys(data, "", _TOP_KEYS)
    base_dir = Path(base_dir)
    server = _server(f.get_table(data, "server", "", {}), env)
    sandbox = _sandbox(f.get_table(data, "sandbox", "", {}))
    receipts = _receipts(f.get_table(data, "receipts", "", {}), base_dir)
    providers = _providers(f.get_tables(data, "provider", ""), base_dir, env)
    prices = _prices(f.get_tables(data, "price", ""), providers)
    route_tables = sql_follow_up_switches(env, f.get_tables(data, "route", ""))
    routes = _routes(route_tables, providers, prices, base_dir)
    _check_judges(routes, providers, prices)
    _check_key_routes(server, routes)
    elastic = build_elastic(f.get_table(data, "escalation", "", {}), base_dir)
    server, receipts, elastic = apply_env(env, server, receipts, elastic)
    if receipts.sink == "postgresql":  # fail at load naming the key, not at the first request
        _env_secret(env, receipts.dsn_env, "receipts.dsn_env")
    mode_key = ENV_ELASTIC_MODE if ENV_ELASTIC_MODE in env else f"{ELASTIC_PATH}.mode"
    budgets = _budgets(f.get_table(data, "budgets", "", None))
    elastic = bind_licences(
        elastic,
        routes,
        mode_key,
        receipts_key=receipts.signing_key,
        providers=providers,
        output_cap=probe_output_cap(budgets, server.client_key),
    )
    _check_sandbox_room(sandbox, server, routes, elastic)
    config = Config(
        server=server,
        sandbox=sandbox,
        receipts=receipts,
        providers=providers,
        routes=routes,
        prices=MappingProxyType(prices),
        elastic=elastic,
        budgets=budgets,
        observability=_observability(f.get_table(data, "observability", "", {})),
        source=source,
    )
    return dataclasses.replace(config, digest=config_digest(config))


def _check_sandbox_room(
    sandbox: SandboxSettings,
    server: ServerConfig,
    routes: Sequence[RouteConfig],
    elastic: ElasticConfig | None,
) -> None:
    """A probe's k samples go to the sandbox at once: if they cannot all be running or queued
    (a worker's slots plus ``max_queue``), every probe would answer 503 on an idle server."""
    if elastic is None:
        return
    slots = max(1, sandbox.resolved_concurrency // server.workers)
    room = slots + sandbox.max_queue
    for i, route in enumerate(routes):
        for j, rung in enumerate(route.ladder):
            if j > 0 and not rung.k:  # probed: rung 0, and a higher rung with its own k
                continue
            k = rung.k or elastic.k
            if k > room:
                raise ConfigError(
                    "sandbox.max_queue",
                    f"route[{i}].ladder[{j}] probes k = {k} samples at once, but the sandbox "
                    f"holds {slots} running + {sandbox.max_queue} queued per worker: every "
                    f"probe would be refused. Raise max_queue to at least {k - slots}, or "
                    "lower k",
                )


def check_replica(value: str, key_path: str) -> str:
    """A replica id as the table and an exported file name can hold it, or ``ConfigError``."""
    if not REPLICA_RE.fullmatch(value):
        raise ConfigError(key_path, f"{value!r} is not a replica id: {REPLICA_RULE}")
    return value


def _env_secret(env: Mapping[str, str], name: str, key_path: str) -> str:
    if not _ENV_NAME.match(name):
        raise ConfigError(key_path, f'"{name}" is not an environment variable name')
    value = env.get(name, "").strip()  # a secret file's newline: HTTP strips it from headers
    if not value:
        raise ConfigError(key_path, f"environment variable {name} is not set")
    return value


def _server(table: Mapping[str, object], env: Mapping[str, str]) -> ServerConfig:
    p = "server"
    f.check_keys(table, p, _SERVER_KEYS)
    names = f.get_str_list(table, "client_keys_env", p, ())
    accepted = [
        ClientKey(
            name=name, key_env=name, secret=_env_secret(env, name, f"{p}.client_keys_env[{i}]")
        )
        for i, name in enumerate(names)
    ]
    accepted += _client_keys(f.get_tables(table, "client_key", p), env, {k.name for k in accepted})
    _check_distinct_secrets(accepted, len(names))
    keys = frozenset(k.secret for k in accepted)
    return ServerConfig(
        host=f.get_str(table, "host", p, "127.0.0.1"),
        port=f.get_int(table, "port", p, 8787, lo=0, hi=65535),
        max_body_bytes=f.get_int(table, "max_body_bytes", p, 1_048_576, lo=1),
        max_concurrency=f.get_int(table, "max_concurrency", p, 256, lo=1),
        client_keys_env=names,
        client_keys=keys,
        client_key=tuple(accepted),
        debug=f.get_bool(table, "debug", p, False),
        keepalive_s=f.get_float(table, "keepalive_s", p, 5.0, lo=0.0, lo_open=True),
        body_read_timeout_s=f.get_float(
            table,
            "body_read_timeout_s",
            p,
            ServerConfig.body_read_timeout_s,
            lo=0.0,
            lo_open=True,
            hi=MAX_SECONDS,
        ),
        idle_timeout_s=f.get_float(
            table,
            "idle_timeout_s",
            p,
            ServerConfig.idle_timeout_s,
            lo=0.0,
            lo_open=True,
            hi=MAX_SECONDS,
        ),
        workers=f.get_int(table, "workers", p, 1, lo=1, hi=64),
        request_timeout_s=f.get_float(
            table,
            "request_timeout_s",
            p,
            ServerConfig.request_timeout_s,
            lo=0.0,
            lo_open=True,
            hi=MAX_SECONDS,
        ),
        feedback_index_size=f.get_int(
            table, "feedback_index_size", p, ServerConfig.feedback_index_size, lo=1
        ),
    )


def _client_keys(
    tables: list[Mapping[str, object]], env: Mapping[str, str], taken: set[str]
) -> list[ClientKey]:
    """``[[server.client_key]]``: a named key, its routes (checked once routes are read) and its
    own daily cap. Names must be unique: receipts tell keys apart by name alone."""
    out: list[ClientKey] = []
    for i, table in enumerate(tables):
        p = f"server.client_key[{i}]"
        f.check_keys(table, p, _CLIENT_KEY_KEYS)
        name = f.get_str(table, "name", p)
        if name in taken:
            raise ConfigError(f"{p}.name", f'duplicate key name "{name}": receipts name keys')
        taken.add(name)
        key_env = f.get_str(table, "key_env", p)
        routes = f.get_str_list(table, "routes", p, None)
        out.append(
            ClientKey(
                name=name,
                key_env=key_env,
                routes=None if routes is None else tuple(routes),
                daily_usd=f.get_float(table, "daily_usd", p, None, lo=0.0),
                secret=_env_secret(env, key_env, f"{p}.key_env"),
            )
        )
    return out


def _check_distinct_secrets(accepted: list[ClientKey], from_env: int) -> None:
    """Every accepted key holds its own secret: a request is one key's, and two keys with one
    secret would make the second's name, routes and daily cap silently never apply."""
    seen: dict[str, str] = {}
    for i, key in enumerate(accepted):
        where = (
            f"server.client_keys_env[{i}]"
            if i < from_env
            else f"server.client_key[{i - from_env}].key_env"
        )
        first = seen.setdefault(key.secret, key.name)
        if len(seen) <= i:  # this secret was already taken by an earlier key
            raise ConfigError(
                where,
                f'{key.key_env} holds the same key as "{first}": each key must be its own '
                "(requests are told apart by their key alone)",
            )


def _check_key_routes(server: ServerConfig, routes: tuple[RouteConfig, ...]) -> None:
    """A key's ``routes`` name configured routes (a typo would lock the key out silently)."""
    known = [r.name for r in routes]
    named = server.client_key[len(server.client_keys_env) :]
    for i, key in enumerate(named):
        for j, name in enumerate(key.routes or ()):
            if name not in known:
                raise ConfigError(
                    f"server.client_key[{i}].routes[{j}]",
                    f'no route named "{name}" (routes: {", ".join(known)})',
                )


def _budgets(table: Mapping[str, object] | None) -> BudgetsConfig | None:
    if table is None:
        return None
    p = "budgets"
    f.check_keys(table, p, _BUDGETS_KEYS)
    d = BudgetsConfig()
    return BudgetsConfig(
        per_request_usd=f.get_float(table, "per_request_usd", p, None, lo=0.0),
        daily_usd=f.get_float(table, "daily_usd", p, None, lo=0.0),
        on_exhausted=f.get_choice(
            table, "on_exhausted", p, ("serve_best_verified", "error"), d.on_exhausted
        ),
        default_max_tokens=f.get_int(
            table, "default_max_tokens", p, d.default_max_tokens, lo=1, hi=10_000_000
        ),
        image_tokens=f.get_int(table, "image_tokens", p, d.image_tokens, lo=0, hi=10_000_000),
    )


def _sandbox(table: Mapping[str, object]) -> SandboxSettings:
    p = "sandbox"
    f.check_keys(table, p, _SANDBOX_KEYS)
    d = SandboxSettings()
    settings = SandboxSettings(
        concurrency=f.get_int(table, "concurrency", p, 0, lo=0, hi=1024),
        max_queue=f.get_int(table, "max_queue", p, d.max_queue, lo=0),
        slot_timeout_s=f.get_float(
            table, "slot_timeout_s", p, d.slot_timeout_s, lo=0.0, lo_open=True, hi=MAX_SECONDS
        ),
        wall_s=f.get_float(table, "wall_s", p, d.wall_s, lo=0.0, lo_open=True, hi=MAX_SECONDS),
        cpu_s=f.get_float(table, "cpu_s", p, d.cpu_s, lo=0.0, lo_open=True, hi=MAX_SECONDS),
        memory_mb=f.get_int(table, "memory_mb", p, d.memory_mb, lo=1),
        scratch_mb=f.get_int(table, "scratch_mb", p, d.scratch_mb, lo=1),
        site_packages=f.get_bool(table, "site_packages", p, d.site_packages),
    )
    try:  # the sandbox's own rules, checked here so a bad value fails at load, named as typed
        settings.limits()
    except ConfigError as exc:
        raise ConfigError(
            exc.key_path.replace("limits.", f"{p}.", 1), str(exc).split(": ", 1)[-1]
        ) from None
    return settings


def _receipts(table: Mapping[str, object], base_dir: Path) -> ReceiptsConfig:
    p = "receipts"
    f.check_keys(table, p, _RECEIPTS_KEYS)
    signing_key = f.get_path(table, "signing_key", p, base_dir, None)
    if signing_key is not None:
        load_signing_key(signing_key)  # missing, not private, not Ed25519: fail at load
    sink = f.get_choice(table, "sink", p, get_args(ReceiptSinkKind), ReceiptsConfig.sink)
    dsn_env = f.get_str(table, "dsn_env", p, ReceiptsConfig.dsn_env)
    if not _ENV_NAME.match(dsn_env):
        raise ConfigError(
            f"{p}.dsn_env",
            "must be the NAME of the environment variable that holds the DSN (e.g. "
            '"FIRSTPASS_DSN"), never the DSN itself',
        )
    replica = f.get_str(table, "replica", p, None)
    if replica is not None:
        replica = check_replica(replica, f"{p}.replica")
    if sink == "file":
        for key in ("dsn_env", "replica", "spill_path", "spill_max_bytes"):
            if key in table:
                raise ConfigError(f"{p}.{key}", 'only means something with sink = "postgresql"')
    else:
        for key in ("rotate_bytes", "rotate_s"):
            if key in table:
                raise ConfigError(
                    f"{p}.{key}", "rotation applies to the file sink; the table needs none"
                )
    return ReceiptsConfig(
        sink=sink,
        dsn_env=dsn_env,
        replica=replica,
        spill_path=f.get_path(table, "spill_path", p, base_dir, None),
        spill_max_bytes=f.get_int(
            table, "spill_max_bytes", p, ReceiptsConfig.spill_max_bytes, lo=1 << 16
        ),
        path=f.get_path(table, "path", p, base_dir, "receipts.jsonl"),
        fsync=f.get_choice(table, "fsync", p, get_args(FsyncPolicy), ReceiptsConfig.fsync),
        store_content=f.get_bool(table, "store_content", p, False),
        queue_size=f.get_int(table, "queue_size", p, 10_000, lo=1),
        rotate_bytes=f.get_int(table, "rotate_bytes", p, ReceiptsConfig.rotate_bytes, lo=4096),
        rotate_s=f.get_float(table, "rotate_s", p, ReceiptsConfig.rotate_s, lo=1.0),
        signing_key=signing_key,
        checkpoint_interval_s=f.get_float(
            table,
            "checkpoint_interval_s",
            p,
            ReceiptsConfig.checkpoint_interval_s,
            lo=0.0,
            lo_open=True,
            hi=MAX_SECONDS,
        ),
    )


def _observability(table: Mapping[str, object]) -> ObservabilityConfig:
    p = "observability"
    f.check_keys(table, p, _OBSERVABILITY_KEYS)
    d = ObservabilityConfig()
    return ObservabilityConfig(
        metrics=f.get_bool(table, "metrics", p, d.metrics),
        request_log=f.get_bool(table, "request_log", p, d.request_log),
    )


def _providers(
    tables: list[Mapping[str, object]], base_dir: Path, env: Mapping[str, str]
) -> tuple[ProviderConfig, ...]:
    if not tables:
        raise ConfigError("provider", "at least one [[provider]] is required")
    seen: dict[str, int] = {}
    out = []
    for i, table in enumerate(tables):
        p = f"provider[{i}]"
        kind = f.get_choice(table, "kind", p, tuple(_PROVIDER_ONLY))
        f.check_keys(table, p, (*_PROVIDER_COMMON, *_PROVIDER_ONLY[kind]))
        pid = f.get_str(table, "id", p)
        if not _PROVIDER_ID.match(pid):
            raise ConfigError(f"{p}.id", f'"{pid}" may hold only letters, digits, "_", "-" and "."')
        if pid in seen:
            raise ConfigError(
                f"{p}.id", f'duplicate provider id "{pid}" (also provider[{seen[pid]}])'
            )
        seen[pid] = i
        base_url = api_key_env = api_key = samples = None
        cache_marks: CacheMarks = "forward"
        seed = 0
        honours_n = f.get_bool(table, "honours_n", p, kind != "anthropic")
        if kind in ("openai", "anthropic"):
            # anthropic: the API root (``/v1/messages`` is added; ``.../v1`` is accepted too)
            if kind == "anthropic":
                base_url = f.get_str(table, "base_url", p, _ANTHROPIC_BASE_URL)
            else:
                base_url = f.get_str(table, "base_url", p)
            if not base_url.startswith(("http://", "https://")):
                raise ConfigError(f"{p}.base_url", f'expected an http(s) URL, got "{base_url}"')
            if kind == "anthropic":
                _check_anthropic_root(base_url, f"{p}.base_url")
            api_key_env = f.get_str(table, "api_key_env", p, None)
            if api_key_env is not None:
                api_key = _env_secret(env, api_key_env, f"{p}.api_key_env")
            if kind == "openai":
                cache_marks = f.get_choice(
                    table, "cache_marks", p, get_args(CacheMarks), _cache_marks_default(base_url)
                )
            if kind == "anthropic" and honours_n:
                raise ConfigError(
                    f"{p}.honours_n",
                    "the Messages API has no `n`: an anthropic provider makes one call per "
                    "choice; leave honours_n out (it is false)",
                )
        else:
            samples = f.get_path(table, "samples", p, base_dir, f.REQUIRED)
            if not samples.is_file():
                raise ConfigError(f"{p}.samples", f"sample file {samples} does not exist")
            seed = f.get_int(table, "seed", p, 0)
        backoff_base = f.get_float(table, "backoff_base_s", p, 0.25, lo=0.0)
        out.append(
            ProviderConfig(
                id=pid,
                kind=kind,
                base_url=base_url,
                api_key_env=api_key_env,
                api_key=api_key,
                timeout_s=f.get_float(table, "timeout_s", p, 60.0, lo=0.0, lo_open=True),
                connect_timeout_s=f.get_float(
                    table, "connect_timeout_s", p, 5.0, lo=0.0, lo_open=True
                ),
                retries=f.get_int(table, "retries", p, 2, lo=0, hi=20),
                backoff_base_s=backoff_base,
                backoff_max_s=f.get_float(
                    table, "backoff_max_s", p, max(8.0, backoff_base), lo=backoff_base
                ),
                honours_n=honours_n,
                max_concurrency=f.get_int(table, "max_concurrency", p, 64, lo=1),
                samples=samples,
                seed=seed,
                cache_marks=cache_marks,
            )
        )
    return tuple(out)


#: hosts that refuse ``cache_control`` in a chat body (OpenAI's own API and Azure OpenAI:
#: their caching is automatic, and newer models answer a mark with 400 "Unknown parameter")
_MARKLESS_HOSTS = ("api.openai.com", ".openai.azure.com")


def _cache_marks_default(base_url: str) -> CacheMarks:
    """``drop`` for OpenAI's own hosts, ``forward`` for the rest (OpenRouter, LiteLLM and
    Anthropic-compatible gateways honour the marks)."""
    host = (urlsplit(base_url).hostname or "").lower()
    markless = any(host == h or (h.startswith(".") and host.endswith(h)) for h in _MARKLESS_HOSTS)
    return "drop" if markless else "forward"


def _check_anthropic_root(base_url: str, key_path: str) -> None:
    """An anthropic ``base_url`` is the API root ``/v1/messages`` is appended to: a query or
    fragment would end up before that path, and a URL of the endpoint itself would get it twice."""
    parts = urlsplit(base_url)
    if parts.query or parts.fragment or "?" in base_url or "#" in base_url:
        raise ConfigError(
            key_path,
            f'"{base_url}" carries a query or fragment: give the API root alone '
            '("https://api.anthropic.com"); /v1/messages is appended to it',
        )
    if parts.path.rstrip("/").endswith("/messages"):
        raise ConfigError(
            key_path,
            f'"{base_url}" is the Messages endpoint itself: give the API root '
            '("https://api.anthropic.com" or ".../v1"); /v1/messages is appended to it',
        )


def _known(providers: tuple[ProviderConfig, ...]) -> str:
    return ", ".join(p.id for p in providers)


def _rung_provider(text: str, key_path: str, providers: tuple[ProviderConfig, ...]) -> Rung:
    try:
        rung = Rung.parse(text)
    except ValueError as exc:
        raise ConfigError(key_path, str(exc)) from exc
    if rung.provider not in {p.id for p in providers}:
        raise ConfigError(
            key_path, f'unknown provider "{rung.provider}" (known: {_known(providers)})'
        )
    return rung


def _prices(
    tables: list[Mapping[str, object]], providers: tuple[ProviderConfig, ...]
) -> dict[str, Price]:
    prices: dict[str, Price] = {}
    for i, table in enumerate(tables):
        p = f"price[{i}]"
        f.check_keys(table, p, _PRICE_KEYS)
        name = _rung_provider(f.get_str(table, "model", p), f"{p}.model", providers).name
        if name in prices:
            raise ConfigError(f"{p}.model", f'duplicate [[price]] for "{name}"')
        prices[name] = Price(
            model=name,
            input_per_mtok=f.get_float(table, "input_per_mtok", p, lo=0.0),
            output_per_mtok=f.get_float(table, "output_per_mtok", p, lo=0.0),
            cache_read_per_mtok=_optional_price(table, "cache_read_per_mtok", p),
            cache_write_per_mtok=_optional_price(table, "cache_write_per_mtok", p),
            cache_write_1h_per_mtok=_optional_price(table, "cache_write_1h_per_mtok", p),
        )
    return prices


def _optional_price(table: Mapping[str, object], key: str, p: str) -> float | None:
    """A cache price, or None (absent: its default applies, see ``Price``)."""
    return f.get_float(table, key, p, lo=0.0) if key in table else None


def _ladder(
    raw: object, p: str, providers: tuple[ProviderConfig, ...], prices: Mapping[str, Price]
) -> tuple[Rung, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            p, f'expected a non-empty array of "provider/model" rungs, got {f.describe(raw)}'
        )
    rungs: list[Rung] = []
    for j, item in enumerate(raw):
        where = f"{p}[{j}]"
        k = None
        if isinstance(item, Mapping):
            f.check_keys(item, where, ("rung", "k"))
            text = f.get_str(item, "rung", where)
            k = f.get_int(item, "k", where, None, lo=1, hi=MAX_K)
        elif isinstance(item, str):
            text = item
        else:
            raise ConfigError(
                where,
                'expected "provider/model" or a table {rung = ..., k = ...}, '
                f"got {f.describe(item)}",
            )
        rung = dataclasses.replace(_rung_provider(text, where, providers), k=k)
        if rung.name not in prices:
            raise ConfigError(where, f'no [[price]] for "{rung.name}"')
        for earlier, other in enumerate(rungs):
            if other.name == rung.name:
                raise ConfigError(where, f'"{rung.name}" is already rung {earlier}')
        rungs.append(rung)
    return tuple(rungs)


def _routes(
    tables: list[Mapping[str, object]],
    providers: tuple[ProviderConfig, ...],
    prices: Mapping[str, Price],
    base_dir: Path = Path("."),
) -> tuple[RouteConfig, ...]:
    if not tables:
        raise ConfigError("route", "at least one [[route]] is required")
    names: dict[str, int] = {}
    claimed: dict[str, int] = {}
    out = []
    for i, table in enumerate(tables):
        p = f"route[{i}]"
        f.check_keys(table, p, _ROUTE_KEYS)
        name = f.get_str(table, "name", p)
        if name in names:
            raise ConfigError(
                f"{p}.name", f'duplicate route name "{name}" (also route[{names[name]}])'
            )
        names[name] = i
        models = f.get_str_list(table, "models", p, (name,))
        if not models:
            raise ConfigError(f"{p}.models", 'must list at least one model (or "*")')
        for j, model in enumerate(models):
            if model in claimed:
                what = "the catch-all" if model == ANY_MODEL else f'model "{model}"'
                raise ConfigError(
                    f"{p}.models[{j}]", f"{what} is already matched by route[{claimed[model]}]"
                )
            claimed[model] = i
        checks = _route_checks(table, p)
        default_without: WithoutChecks = "route_checks" if checks is not None else "passthrough"
        without: WithoutChecks = f.get_choice(
            table, "without_checks", p, ("passthrough", "reject", "route_checks"), default_without
        )
        if without == "route_checks" and checks is None:
            raise ConfigError(f"{p}.without_checks", '"route_checks" needs a [route.checks] table')
        if checks is not None and without != "route_checks":
            raise ConfigError(
                f"{p}.checks", f'never used: without_checks = "{without}" (use "route_checks")'
            )
        gate_checks = _check_list(table, "gate_checks", p, base_dir)
        out.append(
            RouteConfig(
                name=name,
                models=models,
                client_modes=_client_modes(table, p, without, gated=bool(gate_checks)),
                ladder=_ladder(f.get_any(table, "ladder", p), f"{p}.ladder", providers, prices),
                temperature=f.get_float(table, "temperature", p, 0.8, lo=0.0, hi=2.0),
                on_exhausted=f.get_choice(
                    table, "on_exhausted", p, ("unverified", "error"), "unverified"
                ),
                without_checks=without,
                checks=checks,
                visible_checks=_check_list(table, "visible_checks", p, base_dir),
                gate_checks=gate_checks,
                revision=_revision(table, p),
                tool_turns=f.get_choice(table, "tool_turns", p, ("pass", "verify"), "pass"),
            )
        )
    return tuple(out)


def _check_list(
    table: Mapping[str, object], key: str, p: str, base_dir: Path
) -> tuple[CheckDef, ...]:
    """``[[route.visible_checks]]`` / ``[[route.gate_checks]]``: validated now, built by the
    server (a judge needs its provider). Paths (a ``sql_evidence`` database) resolve against the
    config file's directory, like every other path in it."""
    raw = table.get(key)
    if raw is None:
        return ()
    try:
        return parse_checks(_with_paths(_plain(raw), base_dir), origin="config")
    except CheckSpecError as exc:
        raise ConfigError(field_path(f"{p}.{key}", exc.field), exc.message) from exc


def _with_paths(raw: object, base_dir: Path) -> object:
    """``database`` of every ``sql_evidence`` check (composites included) made absolute."""
    if isinstance(raw, list):
        return [_with_paths(item, base_dir) for item in raw]
    if isinstance(raw, dict):
        out = {k: _with_paths(v, base_dir) if k == "checks" else v for k, v in raw.items()}
        db = out.get("database")
        if out.get("kind") == "sql_evidence" and isinstance(db, str) and db:
            out["database"] = str((base_dir / Path(db).expanduser()).resolve())
        return out
    return raw


def _revision(table: Mapping[str, object], p: str) -> Revision | None:
    raw = f.get_table(table, "revision", p, None)
    if raw is None:
        return None
    where = f"{p}.revision"
    f.check_keys(raw, where, _REVISION_KEYS)
    default = Revision()
    cost = f.get_float(raw, "max_cost_usd", where, None, lo=0.0)
    return Revision(
        max_revisions=f.get_int(raw, "max_revisions", where, default.max_revisions, lo=0, hi=10),
        max_cost_usd=cost,
        feedback_chars=f.get_int(
            raw, "feedback_chars", where, default.feedback_chars, lo=200, hi=100_000
        ),
        gate_reasons=f.get_bool(raw, "gate_reasons", where, default.gate_reasons),
    )


def _model_key(name: str) -> tuple[str, str]:
    """``provider/model`` as a provider would most likely resolve it: case, surrounding spaces
    and stray slashes do not make another model (``stub/Strong/`` is ``stub/strong``)."""
    provider, _, model = name.partition("/")
    return provider.strip().casefold(), model.strip().strip("/").strip().casefold()


def _check_judges(
    routes: tuple[RouteConfig, ...],
    providers: tuple[ProviderConfig, ...],
    prices: Mapping[str, Price],
) -> None:
    """A judge is a configured provider's model with a price, and never a rung of the ladder
    it judges: maker is not checker."""
    ids = {prov.id for prov in providers}
    for i, route in enumerate(routes):
        rungs = {_model_key(rung.name) for rung in route.ladder}
        for key in ("visible_checks", "gate_checks"):
            for j, defn in enumerate(getattr(route, key)):
                where = f"route[{i}].{key}[{j}].model"
                if defn.judges and key == "visible_checks":
                    raise ConfigError(
                        where,
                        "a judge is a gate check (visible checks run on every probe sample and "
                        "must be cheap and deterministic): move it to [[route.gate_checks]]",
                    )
                for judge in defn.judges:
                    provider = judge.split("/", 1)[0]
                    if provider not in ids:
                        raise ConfigError(
                            where,
                            f'no [[provider]] with id "{provider}" '
                            f"(known: {', '.join(sorted(ids))})",
                        )
                    if _model_key(judge) in rungs:
                        raise ConfigError(
                            where,
                            f'"{judge}" is a rung of this route\'s ladder: a model may not judge '
                            "its own ladder's answers; pick a judge outside the ladder",
                        )
                    if judge not in prices:
                        raise ConfigError(
                            where,
                            f'no [[price]] for the judge "{judge}" (its cost goes on receipts)',
                        )


def _client_modes(
    table: Mapping[str, object], p: str, without: str, *, gated: bool = False
) -> tuple[str, ...]:
    """``client_modes``: what a request may ask for besides the configured mode. By default a
    client may pick ``cascade`` or ``shadow`` (both gate every served answer) and, only on a
    route that serves unchecked requests anyway (``without_checks = "passthrough"``) and has
    no operator gate checks (``gated``: the operator wants every answer judged by them),
    ``passthrough``. ``enforce`` must be listed, and even then needs a certificate; so must
    ``passthrough`` on a gated route."""
    open_door = without == "passthrough" and not gated
    default = ("cascade", "shadow") + (("passthrough",) if open_door else ())
    modes = f.get_str_list(table, "client_modes", p, default)
    for i, mode in enumerate(modes):
        if mode not in REQUEST_MODES:
            raise ConfigError(
                f"{p}.client_modes[{i}]",
                f'unknown mode "{mode}" (use any of {", ".join(REQUEST_MODES)})',
            )
    return tuple(dict.fromkeys(modes))


def _route_checks(table: Mapping[str, object], p: str) -> RouteChecks | None:
    raw = f.get_table(table, "checks", p, None)
    if raw is None:
        return None
    where = f"{p}.checks"
    f.check_keys(raw, where, _CHECKS_KEYS)
    if "visible" not in raw and "hidden" not in raw:
        raise ConfigError(where, 'needs "visible" or "hidden" tests (or both)')
    checks = RouteChecks(
        visible=_plain(raw.get("visible")),
        hidden=_plain(raw.get("hidden")),
        setup=f.get_str(raw, "setup", where, None),
        entry_point=f.get_str(raw, "entry_point", where, None),
    )
    validate_checks(checks, where)
    return checks


def _plain(value: object) -> object:
    """A deep copy as plain dicts and lists, so the frozen config shares nothing with the caller."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
