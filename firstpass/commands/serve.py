"""``firstpass serve``: run the proxy with a config file (see docs/config.md)."""

from __future__ import annotations

import argparse
import os

from firstpass.commands import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible proxy",
        description="Loads the config (--config, else $FIRSTPASS_CONFIG, else ./firstpass.toml), "
        "validates it, and serves POST /v1/chat/completions, GET /v1/models, /healthz, /readyz.",
    )
    p.add_argument("--config", default=None, help="path to firstpass.toml")
    p.add_argument("--host", default=None, help="override server.host")
    p.add_argument("--port", type=int, default=None, help="override server.port")
    p.set_defaults(func=_run)


def _no_config_found(path: str | None, env: dict[str, str]) -> bool:
    """True when nothing names a config and ./firstpass.toml does not exist either."""
    from firstpass.config import ENV_CONFIG, resolve_config_path

    if path is not None or env.get(ENV_CONFIG, "").strip():
        return False
    return not resolve_config_path(None, env).exists()


def _run(args: argparse.Namespace) -> int:
    from firstpass.config import DEFAULT_CONFIG, ENV_CONFIG, ENV_HOST, ENV_PORT, load_config
    from firstpass.errors import ConfigError
    from firstpass.server import run_server

    # flags go through the same overrides as the environment, so they are validated alike and
    # the config digest on every receipt reflects them
    env = dict(os.environ)
    flags = {}
    if args.host is not None:
        env[ENV_HOST] = args.host
        flags[ENV_HOST] = "--host"
    if args.port is not None:
        env[ENV_PORT] = str(args.port)
        flags[ENV_PORT] = "--port"
    if _no_config_found(args.config, env):
        raise ConfigError(
            "",
            f"no config: no --config, no {ENV_CONFIG}, and no ./{DEFAULT_CONFIG} here; "
            f"run `firstpass init` to write a starter {DEFAULT_CONFIG} here "
            "(it serves the bundled demo offline), or pass --config PATH",
        )
    try:
        config = load_config(args.config, env=env)
    except ConfigError as exc:  # name the flag the user typed, not the variable it went through
        for var, flag in flags.items():
            if var in exc.key_path or var in str(exc):
                raise ConfigError(flag, str(exc).split(": ", 1)[-1]) from None
        raise
    run_server(config)
    return 0
