"""Regular expressions a client may write: refused when too costly to compile, searched with a
time limit. Used by ``regex`` checks and by every pattern a JSON Schema holds.

Two costs, two guards. Compiling expands nested bounded repeats (``(?:(?:a{1000}){1000}){10}``
takes ten seconds), and no engine can stop a compile, so a pattern whose nested repeat counts
multiply past ``MAX_REPEAT_PRODUCT`` is refused before it is compiled. Matching can backtrack
exponentially (``^(a|aa)+$``), so every search runs on the ``regex`` engine with
``REGEX_TIMEOUT_S``, raising ``TimeoutError`` past it.

jsonschema matches patterns with Python's ``re`` in several places (``pattern``,
``patternProperties``, and inside ``additionalProperties`` and ``unevaluatedProperties``) and
offers no hook for the engine, so ``install_in_jsonschema`` gives those modules this module's
``re`` instead: the same searches, time-limited and cost-checked. tests/test_checks_kinds.py
pins the modules it patches, so a jsonschema release that moves them fails a test, not quietly.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import regex

__all__ = [
    "MAX_PATTERN_CHARS",
    "MAX_REPEAT_PRODUCT",
    "REGEX_TIMEOUT_S",
    "compile_pattern",
    "install_in_jsonschema",
    "pattern_cost_problem",
    "timed_search",
]

#: the longest one pattern may search one string
REGEX_TIMEOUT_S = 0.5
#: the most characters a pattern may have
MAX_PATTERN_CHARS = 4096
#: the largest product of nested repeat bounds (``(a{100}){100}`` is 10,000); compiling costs
#: about 0.4 s per million
MAX_REPEAT_PRODUCT = 100_000

_REPEAT = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def pattern_cost_problem(pattern: str) -> str | None:
    """Why ``pattern`` is too costly to compile, or None.

    A scan, not a parse: groups nest on ``(``/``)``, escapes and character classes are skipped,
    and a ``{m}``/``{m,n}`` after an atom multiplies that atom's cost by its bound (``*``, ``+``
    and ``{m,}`` are not expanded when compiled, so they cost nothing here).
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    stack: list[int] = [1]  # the largest product inside each open group
    last = 1  # the product of the atom just closed (1 for a plain character)
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            last = 1
            continue
        if c == "[":  # a character class: skip to its closing bracket
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i, last = j + 1, 1
            continue
        if c == "(":
            stack.append(1)
            i += 1
            continue
        if c == ")" and len(stack) > 1:
            last = stack.pop()
            stack[-1] = max(stack[-1], last)
            i += 1
            continue
        if c == "{":
            m = _REPEAT.match(pattern, i)
            if m:
                low, high = m.group(1), m.group(2)
                bound = max(int(low) if low else 0, int(high) if high else 0)
                if bound:
                    product = last * bound
                    if product > MAX_REPEAT_PRODUCT:
                        return (
                            f"its nested repeat counts multiply to over {MAX_REPEAT_PRODUCT:,} "
                            "(too costly to compile)"
                        )
                    stack[-1] = max(stack[-1], product)
                    last = product
                i = m.end()
                continue
        last = 1
        i += 1
    return None


def compile_pattern(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """``regex.compile`` after the cost check; ``regex.error`` says why it is refused."""
    problem = pattern_cost_problem(pattern)
    if problem is not None:
        raise regex.error(problem)
    return regex.compile(pattern, flags | regex.VERSION0)


def timed_search(pattern: str, text: str, flags: int = 0) -> regex.Match[str] | None:
    """``re.search`` on the ``regex`` engine, cost-checked and time-limited
    (``TimeoutError`` past ``REGEX_TIMEOUT_S``)."""
    return compile_pattern(pattern, flags).search(text, timeout=REGEX_TIMEOUT_S)


class _TimedRe:
    """What jsonschema's modules see as ``re``: ``search`` and ``compile`` go through the
    guards above (their errors as ``re.error``, which jsonschema catches where it expects one);
    everything else is ``re``'s own."""

    error = re.error

    def search(self, pattern: str, string: str, flags: int = 0) -> Any:
        try:
            return timed_search(pattern, string, flags)
        except regex.error as exc:
            raise re.error(str(exc)) from exc

    def compile(self, pattern: str, flags: int = 0) -> Any:
        try:
            return compile_pattern(pattern, flags)
        except regex.error as exc:
            raise re.error(str(exc)) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


#: the jsonschema modules that call ``re.search``/``re.compile`` on schema patterns or data
JSONSCHEMA_MODULES = (
    "jsonschema._keywords",
    "jsonschema._legacy_keywords",
    "jsonschema._utils",
    "jsonschema._format",
)


def install_in_jsonschema() -> None:
    """Give jsonschema's pattern-matching modules the guarded ``re`` (idempotent)."""
    import importlib

    timed = _TimedRe()
    for name in JSONSCHEMA_MODULES:
        module: ModuleType = importlib.import_module(name)
        if not hasattr(module, "re"):
            raise RuntimeError(f"{name} no longer imports re: review firstpass/checks/_patterns.py")
        module.re = timed  # type: ignore[attr-defined]
