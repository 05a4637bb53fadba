"""Regular expressions a client may write: refused when too costly to compile, searched with a
time limit. Used by ``regex`` checks and by every pattern a JSON Schema holds.

Two costs, two guards. Compiling expands bounded repeats (``(?:(?:a{1000}){1000}){10}`` takes
ten seconds and gigabytes), and no engine can stop a compile, which holds the GIL: a pattern
whose cost (``pattern_cost``) passes ``MAX_PATTERN_COST``, or a request whose patterns together
pass ``MAX_REQUEST_PATTERN_COST``, is refused before anything is compiled, and so is syntax the
cost scan cannot follow (verbose mode, inline comments). Matching can backtrack
exponentially (``^(a|aa)+$``), so every search runs on the ``regex`` engine with
``REGEX_TIMEOUT_S``, raising ``TimeoutError`` past it.

jsonschema matches patterns with Python's ``re`` in several places (``pattern``,
``patternProperties``, and inside ``additionalProperties`` and ``unevaluatedProperties``) and
offers no hook for the engine, so ``install_in_jsonschema`` gives those modules this module's
``re`` instead: the same searches, time-limited and cost-checked. tests/test_checks_kinds.py
pins the modules it patches, so a jsonschema release that moves them fails a test, not quietly.
"""

from __future__ import annotations

import functools
import re
from types import ModuleType

import regex

__all__ = [
    "MAX_PATTERN_CHARS",
    "MAX_PATTERN_COST",
    "MAX_REQUEST_PATTERN_COST",
    "REGEX_TIMEOUT_S",
    "compile_pattern",
    "install_in_jsonschema",
    "pattern_cost",
    "pattern_cost_problem",
    "patterns_in",
    "request_patterns_problem",
    "timed_search",
]

#: the longest one pattern may search one string
REGEX_TIMEOUT_S = 0.5
#: the most characters a pattern may have
MAX_PATTERN_CHARS = 4096
#: the largest compile cost a pattern may have, in the units ``pattern_cost`` counts (each
#: atom 1, times every repeat bound around it, summed): compiling costs ~0.5 µs and ~270 bytes
#: a unit, so 10,000 is ~5 ms and ~3 MB
MAX_PATTERN_COST = 10_000
#: the largest compile cost all the patterns of one request may have together
MAX_REQUEST_PATTERN_COST = 50_000

_REPEAT = re.compile(r"\{(\d*)(?:,(\d*))?\}")
#: syntax the cost scan cannot follow, refused in patterns: verbose mode (whitespace and
#: comments inside bounds), inline comments, the engine's version flags
_OPAQUE = re.compile(r"\(\?#|\(\?[A-Za-z^-]*[xV]")


def pattern_cost(pattern: str) -> int:
    """What compiling ``pattern`` costs, in units: every atom (a character, an escape, a class,
    a group) counts 1, or its content's cost for a group, times the bound of a ``{m}``/``{m,n}``
    after it; siblings and alternatives add up. ``*``, ``+`` and ``?`` are not expanded by a
    compile, so they multiply nothing. A scan, not a parse: it over-counts (an escape's
    letters count as atoms), never under-counts the syntax ``pattern_cost_problem`` lets
    through.
    """
    stack: list[int] = [0]  # the summed cost inside each open group
    last = 0  # the cost of the atom just read, not yet added (a quantifier may multiply it)
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "{" and (m := _REPEAT.match(pattern, i)) is not None:
            low, high = m.group(1), m.group(2)
            bound = max(int(low) if low else 0, int(high) if high else 0, 1)
            last *= bound
            i = m.end()
            continue
        stack[-1] += last
        if c == "\\":
            last, i = 1, i + 2
        elif c == "[":
            last, i = 1, _class_end(pattern, i)
        elif c == "(":
            stack.append(0)
            last, i = 0, i + 1
        elif c == ")" and len(stack) > 1:
            last, i = max(stack.pop(), 1), i + 1
        else:
            last, i = 1, i + 1
    stack[-1] += last
    return sum(stack)


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at ``i`` (``[:alpha:]`` inside it too)."""
    j, n = i + 1, len(pattern)
    if j < n and pattern[j] == "^":
        j += 1
    if j < n and pattern[j] == "]":
        j += 1
    while j < n and pattern[j] != "]":
        if pattern[j] == "\\":
            j += 2
        elif pattern.startswith("[:", j) and (close := pattern.find(":]", j + 2)) != -1:
            j = close + 2
        else:
            j += 1
    return j + 1


def pattern_cost_problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be compiled here, or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    if _OPAQUE.search(pattern):
        return "verbose mode (?x), inline comments (?#...) and (?V0)/(?V1) are not accepted"
    cost = pattern_cost(pattern)
    if cost > MAX_PATTERN_COST:
        return (
            f"too costly to compile (its repeat counts add up to {cost:,} units; at most "
            f"{MAX_PATTERN_COST:,})"
        )
    return None


def compile_pattern(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """The compiled pattern, after the cost check; ``regex.error`` says why it is refused.
    Compiled patterns are kept in a small cache of this module's own (the ``regex`` module's
    holds 500, which hostile patterns at the cost cap could make gigabytes)."""
    return _compiled(pattern, flags)


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str, flags: int) -> regex.Pattern[str]:
    problem = pattern_cost_problem(pattern)
    if problem is not None:
        raise regex.error(problem)
    try:
        return regex.compile(pattern, flags | regex.VERSION0, cache_pattern=False)
    except (ValueError, TypeError, OverflowError) as exc:  # what regex raises besides its error
        raise regex.error(str(exc)) from exc


def timed_search(pattern: str, text: str, flags: int = 0) -> regex.Match[str] | None:
    """``re.search`` on the ``regex`` engine, cost-checked and time-limited
    (``TimeoutError`` past ``REGEX_TIMEOUT_S``)."""
    return compile_pattern(pattern, flags).search(text, timeout=REGEX_TIMEOUT_S)


def patterns_in(raw: object) -> list[str]:
    """Every pattern a check definition holds (a regex check's, a schema's ``pattern`` values
    and ``patternProperties`` keys), found without recursion; over-inclusive on purpose (a
    property named ``pattern`` counts too)."""
    found: list[str] = []
    stack: list[tuple[object, int]] = [(raw, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > 64:
            continue
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("pattern", "must_match", "must_not_match"):
                    values = [value] if isinstance(value, str) else value
                    if isinstance(values, list):
                        found.extend(v for v in values if isinstance(v, str))
                if key == "patternProperties" and isinstance(value, dict):
                    found.extend(k for k in value if isinstance(k, str))
                stack.append((value, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return found


def request_patterns_problem(raw: object) -> str | None:
    """Why a request's checks hold too costly patterns together, or None."""
    total = 0
    for pattern in patterns_in(raw):
        if len(pattern) > MAX_PATTERN_CHARS:
            return f"a pattern is longer than {MAX_PATTERN_CHARS} characters"
        total += pattern_cost(pattern)
        if total > MAX_REQUEST_PATTERN_COST:
            return (
                f"its patterns together are too costly to compile (over "
                f"{MAX_REQUEST_PATTERN_COST:,} units)"
            )
    return None


class _TimedRe:
    """What jsonschema's modules see as ``re``: ``search`` and ``compile`` go through the
    guards above (their errors as ``re.error``, which jsonschema catches where it expects one);
    everything else is ``re``'s own."""

    error = re.error

    def search(self, pattern: str, string: str, flags: int = 0) -> regex.Match[str] | None:
        try:
            return timed_search(pattern, string, flags)
        except regex.error as exc:
            raise re.error(str(exc)) from exc

    def compile(self, pattern: str, flags: int = 0) -> regex.Pattern[str]:
        try:
            return compile_pattern(pattern, flags)
        except regex.error as exc:
            raise re.error(str(exc)) from exc

    def __getattr__(self, name: str) -> object:
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
