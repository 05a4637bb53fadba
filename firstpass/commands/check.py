"""``firstpass check``: run one program against a test spec, for users debugging their tests.

    firstpass check --code solution.py --tests tests.json [--json]
    cat answer.md | firstpass check --code - --tests tests.json

Exit status: 0 when every test passes, 1 when the sample fails, 2 on a usage or spec error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from firstpass.errors import SpecError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="run a program against a test spec in the sandbox",
        description="Run a program (or a model answer with code in it) against a test spec "
        "in the sandbox and print per-test results, the failure category and the isolation level.",
    )
    parser.add_argument(
        "--code",
        required=True,
        metavar="FILE|-",
        help="the program or model answer; - reads standard input",
    )
    parser.add_argument(
        "--tests",
        required=True,
        metavar="FILE",
        help='test spec JSON: a list of asserts, {"asserts": [...]} or {"cases": [...]}',
    )
    parser.add_argument(
        "--entry-point", default=None, help="function the cases call, if the spec does not say"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="wall-clock limit per sample"
    )
    parser.set_defaults(func=run)


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise SpecError(what, f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(what, f"{path} is not UTF-8 text ({exc.reason})") from exc


def run(args: argparse.Namespace) -> int:
    from firstpass.sandbox import Limits, Sandbox, parse_spec
    from firstpass.sandbox._limits import MAX_SECONDS

    answer = _read(args.code, "--code")
    try:
        raw = json.loads(_read(args.tests, "--tests"))
    except json.JSONDecodeError as exc:
        raise SpecError("--tests", f"{args.tests} is not JSON: {exc}") from exc
    except RecursionError:
        raise SpecError("--tests", f"{args.tests} is nested too deeply to be a test spec") from None
    spec = parse_spec(raw, entry_point=args.entry_point)
    if args.timeout is not None and not 0 < args.timeout <= MAX_SECONDS:
        raise SpecError("--timeout", f"must be a number of seconds in (0, {MAX_SECONDS:g}]")
    limits = Limits() if args.timeout is None else Limits(wall_s=args.timeout, cpu_s=args.timeout)

    async def check() -> Any:
        async with Sandbox(concurrency=1, limits=limits) as sb:
            return await sb.run(answer, spec)

    result = asyncio.run(check())
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        for test in result.tests:
            mark = "PASS" if test.passed else f"FAIL {test.error_type}"
            print(f"test {test.index}: {mark}" + (f" - {test.message}" if test.message else ""))
        verdict = "passed" if result.passed else f"failed ({result.category})"
        print(
            f"{result.n_passed}/{result.n_total} passed: {verdict}; isolation {result.isolation}; "
            f"code found by rule {result.extraction}; {result.wall_ms:.1f} ms"
        )
    return 0 if result.passed else 1
