"""``firstpass demo``: the offline demo on the bundled demo set (see firstpass/demo/runner.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from firstpass.commands import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "demo",
        help="run the real proxy offline on the bundled demo set and print each decision",
        description="Starts the proxy on a free loopback port with a replay upstream on demo data "
        "that Firstpass wrote itself, sends every demo task through it over HTTP, prints each "
        "decision and verifies the receipt chain. No network, no API keys.",
    )
    p.add_argument(
        "--receipts",
        type=Path,
        default=None,
        help="where receipts go (default: a fresh file whose path is printed)",
    )
    p.add_argument(
        "--mode",
        choices=("cascade", "shadow", "enforce"),
        default="cascade",
        help="cascade (default): plain verified cascade; shadow/enforce: the elastic policy",
    )
    p.add_argument(
        "--api",
        choices=("chat", "responses", "messages"),
        default="chat",
        help="the API the demo speaks: chat (POST /v1/chat/completions, default), responses "
        "(OpenAI Responses, POST /v1/responses), messages (Anthropic Messages, POST "
        "/v1/messages); the same tasks give the same decisions through each",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from firstpass.demo.runner import run_demo

    mode = None if args.mode == "cascade" else args.mode
    return run_demo(receipts=args.receipts, mode=mode, api=args.api)
