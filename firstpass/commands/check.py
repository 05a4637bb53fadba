"""``firstpass check``: run one check on one answer, for users debugging a gate.

    firstpass check --code solution.py --tests tests.json [--json]       # tests, the default kind
    cat answer.md | firstpass check --answer - --tests tests.json --json
    firstpass check --kind json_schema --schema order.schema.json --answer answer.json
    firstpass check --kind regex --must-match '^def ' --must-not-match TODO --answer answer.md
    firstpass check --check gate.json --answer answer.md              # any config kind, as JSON
    firstpass check --kind judge --config firstpass.toml --judge openai/gpt-4o-mini \\
        --rubric "Answers the task in one sentence" --prompt task.txt --answer answer.md
    firstpass check --kind sql_evidence --db shop.sqlite --question "How many orders?" \\
        --answer answer.md --evidence queries.json --json

The flags become a check definition that ``firstpass.checks.parse_check`` validates exactly as a
config's ``[[route.gate_checks]]`` entry, so what passes here passes in the gate. The output is
one line per sub-check (a test, a schema violation, a composite's part) and a verdict line, or
with ``--json`` one object: the result's fields plus ``checks``. For ``sql_evidence`` the
sub-checks are its ten named checks, every one listed (a skipped one passes, saying why);
``--evidence`` is a JSON list of ``{sql, columns, rows, elapsed_ms, truncated}`` or a
conversation ``{"messages": [...]}`` whose tool calls to ``sql`` are read.

Exit status: 0 when the check passes, 1 when it fails (an abstention counts as its
``on_abstain`` says), 2 on a usage or spec error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shlex
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from firstpass._json import JSON
from firstpass.commands import Subparsers
from firstpass.errors import CheckSpecError, SpecError

if TYPE_CHECKING:
    from firstpass.checks import CheckDef, CheckRequest, CheckResult, JudgeBinding
    from firstpass.sandbox import Limits, SampleResult, TestSpec

#: ``--kind`` values: the sandbox's tests and every kind a config may use
KINDS = (
    "tests",
    "basic",
    "regex",
    "context",
    "json_schema",
    "command",
    "judge",
    "sql_evidence",
    "composite",
)

#: option (argparse dest) → the flag a message names
_FLAGS = {
    "tests": "--tests",
    "entry_point": "--entry-point",
    "timeout": "--timeout",
    "schema": "--schema",
    "min_length": "--min-length",
    "must_match": "--must-match",
    "must_not_match": "--must-not-match",
    "ignore_case": "--ignore-case",
    "context": "--context",
    "min_overlap": "--min-overlap",
    "argv": "--command",  # not "command": the top-level parser's dest for the subcommand
    "config": "--config",
    "judge": "--judge",
    "rubric": "--rubric",
    "min_score": "--min-score",
    "check": "--check",
    "prompt": "--prompt",
    "db": "--db",
    "question": "--question",
    "evidence": "--evidence",
    "rerun_ms": "--rerun-ms",
}

#: what each kind takes besides the answer and --json (``check``: a ``--check FILE`` definition,
#: which may hold any kind, so it takes what any of them reads from the request)
_KIND_OPTIONS: dict[str, tuple[str, ...]] = {
    "tests": ("tests", "entry_point", "timeout"),
    "basic": ("min_length",),
    "regex": ("must_match", "must_not_match", "ignore_case"),
    "context": ("context", "min_overlap"),
    "json_schema": ("schema",),
    "command": ("argv", "timeout", "prompt", "context"),
    "judge": ("config", "judge", "rubric", "min_score", "prompt"),
    "sql_evidence": ("db", "question", "evidence", "rerun_ms", "prompt"),
    "check": ("check", "config", "prompt", "context", "question", "evidence"),
}

#: a definition's option → the flag that set it, so a spec error names what the user typed
_FIELD_FLAGS = {
    "schema": "--schema",
    "min_length": "--min-length",
    "must_match": "--must-match",
    "must_not_match": "--must-not-match",
    "ignore_case": "--ignore-case",
    "min_overlap": "--min-overlap",
    "argv": "--command",
    "timeout_s": "--timeout",
    "model": "--judge",
    "rubric": "--rubric",
    "min_score": "--min-score",
    "database": "--db",
    "rerun_ms": "--rerun-ms",
}

#: a violation reason's JSON path as ``jsonschema`` writes it (``$.a[0]['odd: key']``), so the
#: path and the message split unambiguously even when a key holds ": "
_VIOLATION = re.compile(
    r"^(\$(?:\.[A-Za-z][A-Za-z0-9_]*|\[\d+\]|\['(?:[^'\\]|\\.)*'\])*): (.*)$", re.DOTALL
)


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="run one check (tests, a schema, a pattern, a judge...) on one answer",
        description="Run one check on one answer, as a gate would, and print each sub-check "
        "(a test, a schema violation, a composite's part) and the verdict. Exit status: 0 "
        "pass, 1 fail, 2 usage or spec error.",
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        default=None,
        help="the kind of check (default: tests; with --check, the file's kind)",
    )
    parser.add_argument(
        "--answer", metavar="FILE|-", help="the model answer to check; - reads standard input"
    )
    parser.add_argument("--code", metavar="FILE|-", help="the same as --answer")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--prompt", metavar="FILE", help="the task the answer is for (command, judge, --check)"
    )
    tests = parser.add_argument_group("tests (the default kind)")
    tests.add_argument(
        "--tests",
        metavar="FILE",
        help='test spec JSON: a list of asserts, {"asserts": [...]} or {"cases": [...]}',
    )
    tests.add_argument(
        "--entry-point", default=None, help="function the cases call, if the spec does not say"
    )
    tests.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="wall-clock limit per sample (tests) or for the command (command)",
    )
    other = parser.add_argument_group("the other kinds")
    other.add_argument("--schema", metavar="FILE", help="json_schema: a JSON Schema file")
    other.add_argument(
        "--min-length", type=int, metavar="N", help="basic: at least N characters (default 1)"
    )
    other.add_argument(
        "--must-match",
        action="append",
        metavar="P",
        help="regex: a pattern that must be found; repeatable",
    )
    other.add_argument(
        "--must-not-match",
        action="append",
        metavar="P",
        help="regex: a pattern that must not be found; repeatable",
    )
    other.add_argument(
        "--ignore-case", action="store_true", default=None, help="regex: match case-insensitively"
    )
    other.add_argument(
        "--context",
        action="append",
        metavar="FILE",
        help="context (and command, --check): one retrieved passage per file; repeatable",
    )
    other.add_argument(
        "--min-overlap",
        type=float,
        metavar="X",
        help="context: least share of content words in the context (default 0.5)",
    )
    other.add_argument(
        "--command",
        dest="argv",
        action="append",
        metavar="ARG",
        help="command: the argv, one --command per argument, or one string split like a shell",
    )
    other.add_argument(
        "--config",
        metavar="FILE",
        help="judge (and a --check with one): the config whose providers and prices it uses "
        "(default: $FIRSTPASS_CONFIG, else ./firstpass.toml)",
    )
    other.add_argument("--judge", metavar="PROVIDER/MODEL", help="judge: the grading model")
    other.add_argument("--rubric", metavar="TEXT", help="judge: what the answer must do")
    other.add_argument(
        "--min-score", type=float, metavar="X", help="judge: least passing grade (default 0.7)"
    )
    other.add_argument(
        "--check",
        metavar="FILE",
        help="a check definition as JSON, of any config kind (a composite, say)",
    )
    sql = parser.add_argument_group("sql_evidence")
    sql.add_argument("--db", metavar="FILE", help="sql_evidence: the SQLite database (read-only)")
    sql.add_argument(
        "--question",
        metavar="TEXT",
        help="sql_evidence (and --check): the question the answer is for (or --prompt FILE)",
    )
    sql.add_argument(
        "--evidence",
        metavar="FILE|-",
        help="sql_evidence (and --check): the SQL work, a JSON list of {sql, columns, rows, "
        'elapsed_ms, truncated}, or a conversation {"messages": [...]} with its tool calls',
    )
    sql.add_argument(
        "--rerun-ms",
        type=float,
        metavar="MS",
        help="sql_evidence: rerun queries recorded at most this long (default 500)",
    )
    parser.set_defaults(func=run)


# -- inputs ----------------------------------------------------------------------------------


#: the largest file (or standard input) a check reads, in bytes: an answer, a spec, a schema
MAX_INPUT_BYTES = 64 * 1024 * 1024


def _read(path: str, what: str) -> str:
    """The file's text (UTF-8, at most ``MAX_INPUT_BYTES``: ``/dev/zero`` is a one-line error,
    not a MemoryError)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise SpecError(what, f"{path} is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MB")
        return data.decode("utf-8")
    except OSError as exc:
        raise SpecError(what, f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(what, f"{path} is not UTF-8 text ({exc.reason})") from exc


def _read_json(
    path: str, what: str, noun: str, error: Callable[[str, str], Exception] = CheckSpecError
) -> JSON:
    """The file's JSON; ``error(flag, message)`` (one line, exit 2) when it is not."""
    try:
        value: JSON = json.loads(_read(path, what))
        return value
    except json.JSONDecodeError as exc:
        raise error(what, f"{path} is not JSON: {exc}") from exc
    except RecursionError:
        raise error(what, f"{path} is nested too deeply to be {noun}") from None


def _given(args: argparse.Namespace) -> list[str]:
    """The kind-specific options the user gave, in the order ``--help`` lists them."""
    return [dest for dest in _FLAGS if getattr(args, dest, None) not in (None, [], False)]


def _mode(args: argparse.Namespace) -> str:
    """``tests``, one flag-built kind, or ``check`` (a ``--check FILE`` definition)."""
    if args.check is not None:
        return "check"
    kind = args.kind or "tests"
    if kind == "composite":
        raise CheckSpecError("--check", "required with --kind composite (a JSON definition)")
    return str(kind)


def _refuse_foreign_options(args: argparse.Namespace, mode: str) -> None:
    """An option of another kind is a mistake worth naming (``--schema`` with ``regex``)."""
    allowed = _KIND_OPTIONS[mode]
    for dest in _given(args):
        if dest not in allowed:
            takes = ", ".join(_FLAGS[d] for d in allowed)
            what = "--check" if mode == "check" else f"--kind {mode}"
            raise CheckSpecError(_FLAGS[dest], f"does not apply to {what} (it takes {takes})")


def _answer_path(args: argparse.Namespace) -> tuple[str, str]:
    """``(path, flag)`` of the answer, from ``--answer`` or its synonym ``--code``."""
    if args.answer is not None and args.code is not None:
        raise CheckSpecError("--answer", "give --answer or --code (the same option), not both")
    if args.answer is not None:
        return args.answer, "--answer"
    if args.code is not None:
        return args.code, "--code"
    raise CheckSpecError("--answer", "required: the answer file, or - for standard input")


def _one_stdin(paths: list[tuple[str, str]]) -> None:
    """Standard input can be read once: two inputs on ``-`` would give the second nothing."""
    on_stdin = [flag for path, flag in paths if path == "-"]
    if len(on_stdin) > 1:
        raise CheckSpecError(on_stdin[1], f"only one input can be - ({on_stdin[0]} is)")


@dataclass(frozen=True)
class _Work:
    """What ``--evidence`` holds: an explicit list, or a conversation's messages."""

    evidence: tuple[Mapping[str, JSON], ...] = ()
    messages: tuple[Mapping[str, JSON], ...] = ()


def _objects(value: JSON) -> TypeGuard[list[dict[str, JSON]]]:
    """A list of JSON objects."""
    return isinstance(value, list) and all(isinstance(m, dict) for m in value)


def _evidence(args: argparse.Namespace) -> _Work:
    """``--evidence``, validated before anything runs: a list of evidence items, or an object
    ``{"messages": [...], "evidence": [...]}`` (either key may be left out)."""
    if args.evidence is None:
        return _Work()
    from firstpass.checks._sql import evidence_from_list

    raw = _read_json(args.evidence, "--evidence", "SQL evidence")
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - {"messages", "evidence"})
        if unknown:
            raise CheckSpecError(
                "--evidence", f"unknown key {unknown[0]!r} (an object takes messages, evidence)"
            )
        items, listed = raw.get("evidence", []), raw.get("messages", [])
        if not _objects(listed):
            raise CheckSpecError("--evidence", "messages: expected a list of message objects")
        messages = listed
    else:
        items, messages = raw, []
    try:
        evidence_from_list(items)
    except CheckSpecError as exc:
        where = f"{exc.field}: " if exc.field else ""
        raise CheckSpecError("--evidence", f"{where}{exc.message}") from exc
    assert _objects(items)  # what evidence_from_list has just checked, item by item
    return _Work(evidence=tuple(items), messages=tuple(messages))


def _request(args: argparse.Namespace, work: _Work = _Work()) -> CheckRequest:
    from firstpass.checks import CheckRequest

    if args.question is not None and args.prompt is not None:
        raise CheckSpecError("--question", "give --question or --prompt (the same input), not both")
    if args.question is not None:
        prompt = args.question
    else:
        prompt = _read(args.prompt, "--prompt") if args.prompt is not None else ""
    passages = tuple(_read(path, "--context") for path in args.context or ())
    if not prompt and work.messages:  # the question is the conversation's last user turn
        return CheckRequest.from_messages(work.messages, passages, work.evidence)
    messages: tuple[Mapping[str, object], ...] = work.messages
    if prompt:
        messages = (*messages, {"role": "user", "content": prompt})
    return CheckRequest(prompt=prompt, messages=messages, context=passages, evidence=work.evidence)


# -- definitions -----------------------------------------------------------------------------


def _argv(given: list[str]) -> list[str]:
    """Several ``--command`` are the argv as is; one is split as a shell would."""
    if len(given) > 1:
        return given
    try:
        return shlex.split(given[0])
    except ValueError as exc:
        raise CheckSpecError("--command", f"cannot split {given[0]!r}: {exc}") from exc


def _flag_error(exc: CheckSpecError) -> CheckSpecError:
    """A definition's error, naming the flag that set the option (``--min-length: ...``)."""
    head = re.split(r"[.\[]", exc.field, maxsplit=1)[0]
    flag = _FIELD_FLAGS.get(head)
    if flag is None:
        return exc
    return CheckSpecError(flag, exc.message if exc.field == head else f"{exc.field}: {exc.message}")


def _definition(args: argparse.Namespace, mode: str) -> CheckDef:
    """The check the flags (or the ``--check`` file) describe, validated as a config's is."""
    from firstpass.checks import parse_check

    if mode == "check":
        written = _read_json(args.check, "--check", "a check definition")
        if isinstance(written, dict) and written.get("kind") == "tests":
            raise CheckSpecError("--check", "tests run with --tests FILE, not as a --check")
        try:
            defn = parse_check(written, origin="config")
        except CheckSpecError as exc:
            raise CheckSpecError(f"--check {args.check}", str(exc)) from exc
        if args.kind is not None and args.kind != defn.kind:
            raise CheckSpecError(
                "--kind", f"{args.kind} given, but {args.check} defines a {defn.kind} check"
            )
        return defn
    raw: dict[str, object] = {"kind": mode}
    if mode == "basic" and args.min_length is not None:
        raw["min_length"] = args.min_length
    elif mode == "regex":
        if not args.must_match and not args.must_not_match:
            raise CheckSpecError("--must-match", "give --must-match or --must-not-match (or both)")
        raw.update(must_match=args.must_match or [], must_not_match=args.must_not_match or [])
        if args.ignore_case:
            raw["ignore_case"] = True
    elif mode == "context":
        if not args.context:
            raise CheckSpecError("--context", "required with --kind context (one file per passage)")
        if args.min_overlap is not None:
            raw["min_overlap"] = args.min_overlap
    elif mode == "json_schema":
        if args.schema is None:
            raise CheckSpecError("--schema", "required with --kind json_schema (a schema file)")
        raw["schema"] = _read_json(args.schema, "--schema", "a JSON Schema")
    elif mode == "command":
        if args.argv:
            raw["argv"] = _argv(args.argv)
        if args.timeout is not None:
            raw["timeout_s"] = args.timeout
    elif mode == "judge":
        for key, value in (("model", args.judge), ("rubric", args.rubric)):
            if value is not None:
                raw[key] = value
        if args.min_score is not None:
            raw["min_score"] = args.min_score
    elif mode == "sql_evidence":
        if args.db is None:
            raise CheckSpecError("--db", "required with --kind sql_evidence (a SQLite file)")
        if args.evidence is None:
            raise CheckSpecError(
                "--evidence", "required with --kind sql_evidence (the SQL work, as JSON)"
            )
        raw["database"] = args.db
        if args.rerun_ms is not None:
            raw["rerun_ms"] = args.rerun_ms
    try:
        return parse_check(raw, origin="config")
    except CheckSpecError as exc:
        raise _flag_error(exc) from exc


@dataclass
class _Judges:
    """How the run's judges were bound: ``unpriced`` lists those without a ``[[price]]``."""

    resolve: Callable[[str], JudgeBinding] | None = None
    unpriced: tuple[str, ...] = ()


@contextlib.asynccontextmanager
async def _bound_judges(defn: CheckDef, config_path: str | None) -> AsyncIterator[_Judges]:
    """The config's providers for the definition's judges, started and closed as the server
    does (one shared aiohttp session); nothing is opened when there is no judge."""
    if not defn.judges:
        yield _Judges()
        return
    import aiohttp

    from firstpass.checks import JudgeBinding
    from firstpass.config import load_config
    from firstpass.providers import Provider, build_provider

    config = load_config(config_path)
    known = {p.id: p for p in config.providers}
    for label in defn.judges:
        provider_id = label.split("/", 1)[0]
        if provider_id not in known:
            raise CheckSpecError(
                "--judge",
                f'{label}: no [[provider]] "{provider_id}" in {config.source} '
                f"(known: {', '.join(known)})",
            )
    ids = sorted({label.split("/", 1)[0] for label in defn.judges})
    async with aiohttp.ClientSession() as session:
        providers: dict[str, Provider] = {
            pid: build_provider(known[pid], session=session) for pid in ids
        }
        try:
            await asyncio.gather(*(p.start() for p in providers.values()))

            def resolve(label: str) -> JudgeBinding:
                provider_id, model = label.split("/", 1)
                return JudgeBinding(
                    grader=providers[provider_id], model=model, price=config.prices.get(label)
                )

            unpriced = tuple(j for j in defn.judges if j not in config.prices)
            yield _Judges(resolve=resolve, unpriced=unpriced)
        finally:
            await asyncio.gather(*(p.aclose() for p in providers.values()), return_exceptions=True)


async def _run_check(
    defn: CheckDef, answer: str, request: CheckRequest, config_path: str | None
) -> tuple[CheckResult, _Judges]:
    from firstpass.checks import build_check

    async with _bound_judges(defn, config_path) as judges:
        check = build_check(defn, judges.resolve)
        return await check.run(answer, request), judges


def _tests_spec(args: argparse.Namespace) -> tuple[TestSpec, Limits]:
    from firstpass.sandbox import MAX_SECONDS, Limits, parse_spec

    if args.tests is None:
        raise CheckSpecError("--tests", "required with --kind tests (a test spec JSON file)")
    raw = _read_json(args.tests, "--tests", "a test spec", SpecError)
    spec = parse_spec(raw, entry_point=args.entry_point)
    if args.timeout is not None and not 0 < args.timeout <= MAX_SECONDS:
        raise SpecError("--timeout", f"must be a number of seconds in (0, {MAX_SECONDS:g}]")
    limits = Limits() if args.timeout is None else Limits(wall_s=args.timeout, cpu_s=args.timeout)
    return spec, limits


def _run_tests(answer: str, spec: TestSpec, limits: Limits) -> tuple[CheckResult, SampleResult]:
    from firstpass.checks import Options, tests_result
    from firstpass.sandbox import Sandbox

    async def check() -> SampleResult:
        async with Sandbox(concurrency=1, limits=limits) as sb:
            return await sb.run(answer, spec)

    sample = asyncio.run(check())
    return tests_result(sample, options=Options(name="tests"), spec=spec), sample


# -- output ----------------------------------------------------------------------------------


def _entry(name: str, passed: bool, severity: str, reason: str) -> dict[str, object]:
    return {"name": name, "passed": passed, "severity": severity, "reason": reason}


def _schema_entries(result: CheckResult) -> list[dict[str, object]]:
    """``parse`` (the answer is JSON), then one entry per violation named by its JSON path,
    or one ``schema`` entry when there is none to name (valid, or the check abstained)."""
    sev = result.severity
    if result.category == "invalid_format":
        return [_entry("parse", False, sev, result.reason)]
    entries = [_entry("parse", True, sev, "")]
    if result.category != "schema_violation":
        return [*entries, _entry("schema", result.passed, sev, result.reason)]
    for reason in result.reasons:
        match = _VIOLATION.match(reason)
        if match is None:  # "... and 12 more": the result keeps the first REASONS_MAX
            entries.append(_entry("schema", False, sev, reason))
        else:
            entries.append(_entry(match.group(1), False, sev, match.group(2)))
    return entries


def sub_checks(result: CheckResult, sample: SampleResult | None = None) -> list[dict[str, object]]:
    """One ``{name, passed, severity, reason}`` per named sub-check: a test, a schema's parse
    and violations, a composite's part; for other kinds the check itself."""
    sev = result.severity
    if sample is not None:
        if not sample.tests:
            return [_entry("tests", False, sev, result.reason)]
        return [
            _entry(
                f"test {t.index}",
                t.passed,
                sev,
                "" if t.passed else f"{t.error_type}: {t.message or ''}".rstrip(": "),
            )
            for t in sample.tests
        ]
    if result.kind == "json_schema":
        return _schema_entries(result)
    if result.parts:
        return [_entry(p.name, p.passed, p.severity, p.reason) for p in result.parts]
    return [_entry(result.name, result.passed, sev, result.reason)]


def report(result: CheckResult, sample: SampleResult | None = None) -> dict[str, object]:
    """The ``--json`` object: the result's fields and ``checks``. For tests, the sandbox's
    fields too, as before (``category`` stays its finer one, ``check_category`` is the
    taxonomy's)."""
    out = result.to_dict()
    if sample is not None:
        out["check_category"] = out["category"]
        out.update(sample.to_dict())
    out["checks"] = sub_checks(result, sample)
    return out


def _mark(entry: Mapping[str, object]) -> str:
    if entry["passed"]:
        return "PASS"
    return "WARN" if entry["severity"] == "warning" else "FAIL"


def _verdict_line(result: CheckResult) -> str:
    if result.verdict == "pass":
        head = "passed"
    elif result.verdict == "fail":
        head = f"failed ({result.category})"
    else:
        counts = "a pass" if result.passed else "a fail"
        head = f"abstained ({result.category}; {result.on_abstain}, so it counts as {counts})"
    return f"{head}: {result.kind} check {result.name!r}, score {result.score:.2f}"


def printable(text: object) -> str:
    """``text`` with every character a terminal would act on escaped (``\\x1b``, ``\\r``,
    ``\\n``, bidi overrides...): messages quote what the sample printed or raised, and a
    sample must not be able to move the cursor and draw a ``PASS`` line of its own."""
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text)
    )


def _print_text(result: CheckResult, sample: SampleResult | None, judges: _Judges) -> None:
    if sample is not None:
        for test in sample.tests:
            mark = "PASS" if test.passed else f"FAIL {test.error_type}"
            message = f" - {printable(test.message)}" if test.message else ""
            print(f"test {test.index}: {mark}{message}")
        if not sample.tests:
            print(f"tests: FAIL - {printable(result.reason)}")
        verdict = "passed" if sample.passed else f"failed ({sample.category})"
        print(
            f"{sample.n_passed}/{sample.n_total} passed: {verdict}; isolation {sample.isolation}; "
            f"code found by rule {sample.extraction}; {sample.wall_ms:.1f} ms"
        )
        return
    for entry in sub_checks(result):
        text = " ".join(str(entry["reason"]).splitlines()).strip()  # one line per sub-check
        reason = f" - {printable(text)}" if text else ""
        print(f"{printable(entry['name'])}: {_mark(entry)}{reason}")
    print(printable(_verdict_line(result)))
    if judges.resolve is not None:
        unknown = f" (no [[price]] for {', '.join(judges.unpriced)})" if judges.unpriced else ""
        print(f"judge cost: ${result.cost_usd:.6f}{unknown}")


def run(args: argparse.Namespace) -> int:
    """Usage and spec problems are all found before anything runs, so a mistake costs no
    sandbox start, no command and no judge call."""
    mode = _mode(args)
    _refuse_foreign_options(args, mode)
    answer_path, answer_flag = _answer_path(args)
    inputs = [(answer_path, answer_flag), *((p, "--context") for p in args.context or ())]
    for dest in ("prompt", "tests", "schema", "check", "evidence"):
        if getattr(args, dest) is not None:
            inputs.append((getattr(args, dest), _FLAGS[dest]))
    _one_stdin(inputs)
    sample: SampleResult | None = None
    judges = _Judges()
    if mode == "tests":
        spec, limits = _tests_spec(args)
        answer = _read(answer_path, answer_flag)
        result, sample = _run_tests(answer, spec, limits)
    else:
        defn = _definition(args, mode)
        work = _evidence(args)
        answer = _read(answer_path, answer_flag)
        request = _request(args, work)
        result, judges = asyncio.run(_run_check(defn, answer, request, args.config))
    if args.json:
        print(json.dumps(report(result, sample), indent=2))
    else:
        _print_text(result, sample, judges)
    return 0 if result.passed else 1
