"""The verification library: every kind of check behind one interface and one result type.

    from firstpass.checks import CheckRequest, JsonSchemaCheck, Options

    check = JsonSchemaCheck(options=Options(name="order"), schema={"type": "object"})
    result = await check.run('{"id": 1}', CheckRequest(prompt="..."))
    result.passed, result.score, result.reasons, result.category

Kinds: ``tests`` (the sandbox), ``basic``, ``regex``, ``context``, ``json_schema``, ``command``
(config only), ``judge`` (config only), ``composite``. docs/checks.md describes each, the
result type, the failure taxonomy and the revision loop.
"""

from firstpass.checks._base import Check, CheckRequest, Options
from firstpass.checks._build import (
    CONFIG_KINDS,
    REQUEST_KINDS,
    CheckDef,
    JudgeBinding,
    build_check,
    checks_digest,
    field_path,
    parse_check,
    parse_checks,
)
from firstpass.checks._command import CommandCheck
from firstpass.checks._composite import Composite, run_all
from firstpass.checks._context import ContextCheck, content_words
from firstpass.checks._judge import JUDGE_SYSTEM, Grader, JudgeCheck, judge_messages
from firstpass.checks._offload import off_loop
from firstpass.checks._patterns import pattern_cost_problem, request_patterns_problem
from firstpass.checks._result import CheckResult, OnAbstain, Severity, Verdict, combine
from firstpass.checks._schema import JsonSchemaCheck, extract_json
from firstpass.checks._taxonomy import (
    categories,
    category_of_test_run,
    describe,
    is_category,
    register_category,
)
from firstpass.checks._tests import TestsCheck, tests_result
from firstpass.checks._text import BasicCheck, RegexCheck

__all__ = [
    "CONFIG_KINDS",
    "JUDGE_SYSTEM",
    "REQUEST_KINDS",
    "BasicCheck",
    "Check",
    "CheckDef",
    "CheckRequest",
    "CheckResult",
    "CommandCheck",
    "Composite",
    "ContextCheck",
    "Grader",
    "JsonSchemaCheck",
    "JudgeBinding",
    "JudgeCheck",
    "OnAbstain",
    "Options",
    "RegexCheck",
    "Severity",
    "TestsCheck",
    "Verdict",
    "build_check",
    "categories",
    "category_of_test_run",
    "checks_digest",
    "combine",
    "content_words",
    "describe",
    "extract_json",
    "field_path",
    "is_category",
    "judge_messages",
    "off_loop",
    "parse_check",
    "parse_checks",
    "pattern_cost_problem",
    "register_category",
    "request_patterns_problem",
    "run_all",
    "tests_result",
]
