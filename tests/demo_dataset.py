"""Write the bundled demo data set: ``tasks.jsonl`` and ``samples.jsonl`` in firstpass/demo/.

DEMO DATA WRITTEN BY FIRSTPASS, NOT A BENCHMARK. Twelve small Python tasks, each with the
visible assert its prompt shows, hidden input/output cases with edge cases, and eight recorded
chat answers from each of two made-up models, ``demo-cheap`` and ``demo-strong``. The answers
were written by hand to behave a known way, and every one carries a label here:

    correct        passes the visible assert and every hidden case
    hidden_fail    passes the visible assert, fails at least one hidden case
    visible_fail   has code that fails the visible assert (and the hidden cases, which include it)
    no_code        prose only

The labels per task are arranged so that one run with the ladder demo-cheap → demo-strong shows
every decision (see each task's ``demo_note``). With eight cheap answers per task, a k = 5 probe
drawn without replacement from a fresh replay provider gets a pass count that the labels fix:
8/8 passing → 5/5, 0/8 → 0/5, and exactly 4/8 → between 1/5 and 4/5 (the middle regime).

The reference solutions below are never sent to a model; tests/test_demo_dataset.py runs them
(and every answer) in a plain subprocess to check that each expected value and each label is
true. Regenerate the shipped files with ``python -m tests.demo_dataset --write``. This source
lives with the tests, not in the package: an installed Firstpass carries only the two files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from firstpass.demo import SAMPLES_PATH, TASKS_PATH

__all__ = [
    "CHEAP",
    "LABELS",
    "SAMPLES_PATH",
    "STRONG",
    "TASKS",
    "TASKS_PATH",
    "DemoSample",
    "DemoTask",
    "main",
    "read_tasks",
    "render_samples",
    "render_tasks",
]

CHEAP = "demo-cheap"
STRONG = "demo-strong"

Label = Literal["correct", "hidden_fail", "visible_fail", "no_code"]
LABELS: tuple[Label, ...] = ("correct", "hidden_fail", "visible_fail", "no_code")

#: what one run of the demo shows for each arrangement of labels
_NOTES = {
    "serve": (
        "cascade: every demo-cheap answer is correct, so demo-cheap is served at once. "
        "elastic k=5: 5/5 pass the visible test, regime serve (no gate)."
    ),
    "escalate_visible": (
        "cascade: every demo-cheap answer fails the visible test (or has no code), so it "
        "escalates to demo-strong, which passes. elastic k=5: 0/5, regime escalate."
    ),
    "escalate_gate": (
        "cascade: every demo-cheap answer passes the visible test but fails hidden edge cases, "
        "so the gate fails and it escalates to demo-strong. elastic k=5: 5/5, regime serve: "
        "elastic serves a wrong answer without the gate (shadow records gate_label false) - "
        "why λ must be calibrated."
    ),
    "mixed_gate_pass": (
        "cascade: half of the demo-cheap answers are correct, half fail the visible test: served "
        "at once or escalated, depending on the draw. elastic k=5: 1/5 to 4/5, regime gate (for "
        "λ above 0.8), the gate passes and demo-cheap is served."
    ),
    "mixed_gate_fail": (
        "cascade: half of the demo-cheap answers fail the visible test, half pass it but fail "
        "hidden cases: escalates to demo-strong either way. elastic k=5: 1/5 to 4/5, regime "
        "gate (for λ above 0.8), the gate fails and it escalates."
    ),
    "exhausted": (
        "cascade: demo-cheap fails, and every demo-strong answer passes the visible test but "
        "fails hidden edge cases: the ladder is exhausted (served unverified, or an error, per "
        "on_exhausted). elastic k=5: 1/5 to 4/5, regime gate (for λ above 0.8), the gate "
        "fails, it escalates, and the ladder is exhausted."
    ),
}
Intent = Literal[
    "serve", "escalate_visible", "escalate_gate", "mixed_gate_pass", "mixed_gate_fail", "exhausted"
]


@dataclass(frozen=True, kw_only=True)
class DemoSample:
    """One recorded chat answer and how it behaves on the task's tests."""

    label: Label
    text: str


@dataclass(frozen=True, kw_only=True)
class DemoTask:
    """One demo task: what the model is asked, the tests, our reference, and recorded answers."""

    number: int
    signature: str
    statement: str
    entry_point: str
    visible_tests: tuple[str, ...]
    cases: tuple[tuple[list[Any], Any], ...]
    reference: str
    intent: Intent
    cheap: tuple[DemoSample, ...]
    strong: tuple[DemoSample, ...]
    setup: str | None = None

    @property
    def task_id(self) -> str:
        return f"demo/{self.number}"

    @property
    def prompt(self) -> str:
        """The user message the demo client sends: statement, the visible asserts, the format."""
        shown = "\n".join(f"    {line}" for line in self.visible_tests)
        tests = "this test" if len(self.visible_tests) == 1 else "these tests"
        return (
            f"Write a Python function `{self.signature}`. {self.statement}\n\n"
            f"Your code should pass {tests}:\n\n{shown}\n\n"
            "Answer with a ```python block."
        )

    @property
    def hidden_tests(self) -> dict[str, Any]:
        """The hidden cases as a sandbox test spec."""
        return {
            "entry_point": self.entry_point,
            "cases": [{"args": args, "expected": expected} for args, expected in self.cases],
            "atol": 0,
        }

    def task_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "task_id": self.task_id,
            "prompt": self.prompt,
            "entry_point": self.entry_point,
            "visible_tests": list(self.visible_tests),
            "hidden_tests": self.hidden_tests,
        }
        if self.setup is not None:
            row["setup"] = self.setup
        row["demo_note"] = _NOTES[self.intent]
        return row

    def sample_rows(self) -> list[dict[str, Any]]:
        digest = hashlib.sha256(self.prompt.strip().encode("utf-8")).hexdigest()
        return [
            {
                "task_id": self.task_id,
                "model": model,
                "prompt_sha256": digest,
                "samples": [s.text for s in samples],
            }
            for model, samples in ((CHEAP, self.cheap), (STRONG, self.strong))
        ]


def _answer(intro: str, code: str, outro: str = "") -> str:
    """A chat answer: prose, one ```python fence, optional prose after."""
    text = f"{intro}\n\n```python\n{code.strip()}\n```"
    return f"{text}\n\n{outro}" if outro else text


def _ok(intro: str, code: str, outro: str = "") -> DemoSample:
    return DemoSample(label="correct", text=_answer(intro, code, outro))


def _hidden(intro: str, code: str, outro: str = "") -> DemoSample:
    return DemoSample(label="hidden_fail", text=_answer(intro, code, outro))


def _visible(intro: str, code: str, outro: str = "") -> DemoSample:
    return DemoSample(label="visible_fail", text=_answer(intro, code, outro))


def _prose(text: str) -> DemoSample:
    return DemoSample(label="no_code", text=text)


# --- 1. is_palindrome: demo-cheap always right ---------------------------------------------

_PAL_JOIN = """
def is_palindrome(s: str) -> bool:
    cleaned = "".join(ch.lower() for ch in s if ch.isalnum())
    return cleaned == cleaned[::-1]
"""
_PAL_POINTERS = """
def is_palindrome(s: str) -> bool:
    i, j = 0, len(s) - 1
    while i < j:
        if not s[i].isalnum():
            i += 1
        elif not s[j].isalnum():
            j -= 1
        elif s[i].lower() != s[j].lower():
            return False
        else:
            i += 1
            j -= 1
    return True
"""
_PAL_FILTER = """
def is_palindrome(s):
    chars = [c.lower() for c in s if c.isalnum()]
    return chars == list(reversed(chars))
"""

_PALINDROME = DemoTask(
    number=1,
    signature="is_palindrome(s: str) -> bool",
    statement=(
        "It returns True when `s` reads the same forwards and backwards, ignoring case and "
        "every character that is not a letter or a digit."
    ),
    entry_point="is_palindrome",
    visible_tests=('assert is_palindrome("Racecar") == True',),
    cases=(
        (["Racecar"], True),
        ([""], True),
        (["a"], True),
        (["ab"], False),
        (["A man, a plan, a canal: Panama"], True),
        (["No 'x' in Nixon"], True),
        (["hello"], False),
        (["12 3 21"], True),
        (["ab!ba?c"], False),
        (["0P"], False),
    ),
    reference=_PAL_FILTER,
    intent="serve",
    cheap=(
        _ok(
            "Here's a compact version: keep only letters and digits, lowercase them, and compare "
            "the result with its reverse.",
            _PAL_JOIN,
        ),
        _ok(
            "You can do it with two pointers that skip anything that isn't alphanumeric:",
            _PAL_POINTERS,
            "This uses O(1) extra space.",
        ),
        _ok("Sure!", _PAL_JOIN, "`str.isalnum()` filters out spaces and punctuation."),
        _ok("Filter the characters first, then compare the list with its reverse:", _PAL_FILTER),
        _ok("A two-pointer scan avoids building a new string:", _PAL_POINTERS),
        _ok(
            "Here is a simple solution:",
            _PAL_JOIN,
            'For "Racecar" the cleaned string is "racecar", which is its own reverse.',
        ),
        _ok("Normalize, then compare:", _PAL_FILTER, "Runs in O(n) time."),
        _ok(
            "Sure, here it is.",
            _PAL_POINTERS,
            "Non-alphanumeric characters are skipped on both sides before comparing.",
        ),
    ),
    strong=(
        _ok("Normalize the string, then compare it with its reverse:", _PAL_JOIN),
        _ok("A two-pointer approach that needs no extra string:", _PAL_POINTERS),
        _ok(
            "Here's a straightforward implementation.",
            _PAL_JOIN,
            "Case is ignored via `lower()`, punctuation and spaces via `isalnum()`.",
        ),
        _ok("Sure:", _PAL_FILTER),
        _ok("One way to write it:", _PAL_POINTERS, "Empty strings count as palindromes."),
        _ok("Here you go:", _PAL_JOIN),
        _ok("Keep the alphanumeric characters, lowercased, and check symmetry:", _PAL_FILTER),
        _ok("This works for any mix of punctuation and case:", _PAL_JOIN),
    ),
)

# --- 2. fizzbuzz: demo-cheap always right ---------------------------------------------------

_FB_IF = """
def fizzbuzz(n: int) -> list[str]:
    result = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            result.append("FizzBuzz")
        elif i % 3 == 0:
            result.append("Fizz")
        elif i % 5 == 0:
            result.append("Buzz")
        else:
            result.append(str(i))
    return result
"""
_FB_CONCAT = """
def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        word = ""
        if i % 3 == 0:
            word += "Fizz"
        if i % 5 == 0:
            word += "Buzz"
        out.append(word or str(i))
    return out
"""
_FB_COMP = """
def fizzbuzz(n):
    return ["Fizz" * (i % 3 == 0) + "Buzz" * (i % 5 == 0) or str(i) for i in range(1, n + 1)]
"""

_FIZZ_15 = [
    "1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz",
    "11", "Fizz", "13", "14", "FizzBuzz",
]  # fmt: skip

_FIZZBUZZ = DemoTask(
    number=2,
    signature="fizzbuzz(n: int) -> list[str]",
    statement=(
        'It returns the FizzBuzz sequence for 1..n as strings: "Fizz" for multiples of 3, '
        '"Buzz" for multiples of 5, "FizzBuzz" for multiples of both, otherwise the number.'
    ),
    entry_point="fizzbuzz",
    visible_tests=('assert fizzbuzz(5) == ["1", "2", "Fizz", "4", "Buzz"]',),
    cases=(
        ([5], _FIZZ_15[:5]),
        ([0], []),
        ([1], ["1"]),
        ([3], ["1", "2", "Fizz"]),
        ([10], _FIZZ_15[:10]),
        ([15], _FIZZ_15),
        ([16], [*_FIZZ_15, "16"]),
    ),
    reference=_FB_IF,
    intent="serve",
    cheap=(
        _ok("Classic FizzBuzz, collecting into a list:", _FB_IF),
        _ok("Build each word by concatenation, falling back to the number:", _FB_CONCAT),
        _ok(
            "A one-liner with a list comprehension:",
            _FB_COMP,
            "String repetition by a boolean gives either the word or an empty string.",
        ),
        _ok("Sure!", _FB_IF, "Checking 15 first makes sure multiples of both get FizzBuzz."),
        _ok("Here's a version without a special case for 15:", _FB_CONCAT),
        _ok("Here you go:", _FB_IF),
        _ok("Compact version:", _FB_COMP),
        _ok("Straightforward loop:", _FB_CONCAT, "For n = 0 it returns an empty list."),
    ),
    strong=(
        _ok("A clear loop that checks 15 first:", _FB_IF),
        _ok("Concatenate the words, use the number when neither applies:", _FB_CONCAT),
        _ok("Sure:", _FB_IF, "Returns [] for n = 0."),
        _ok("As a comprehension:", _FB_COMP),
        _ok("Here is an implementation:", _FB_CONCAT),
        _ok("Here's FizzBuzz returning a list of strings:", _FB_IF),
        _ok("Short version:", _FB_COMP, "Each element is a string, as the test expects."),
        _ok("This builds the list in one pass:", _FB_IF),
    ),
)

# --- 3. running_max: demo-cheap never passes the visible test ------------------------------

_RM_REF = """
def running_max(nums):
    out = []
    best = None
    for x in nums:
        best = x if best is None or x > best else best
        out.append(best)
    return out
"""
_RM_ACCUMULATE = """
from itertools import accumulate


def running_max(nums):
    return list(accumulate(nums, max))
"""
_RM_LOOP = """
def running_max(nums: list[int]) -> list[int]:
    result = []
    for i, x in enumerate(nums):
        result.append(x if i == 0 else max(x, result[-1]))
    return result
"""
_RM_ALL_MAX = """
def running_max(nums):
    m = max(nums)
    return [m for _ in nums]
"""
_RM_NEIGHBOUR = """
def running_max(nums):
    result = []
    for i in range(len(nums)):
        result.append(max(nums[i], nums[i - 1]))
    return result
"""
_RM_MIN = """
def running_max(nums):
    result = []
    current = nums[0]
    for x in nums:
        current = min(current, x)
        result.append(current)
    return result
"""
_RM_OFF_BY_ONE = """
def running_max(nums):
    return [max(nums[:i]) for i in range(1, len(nums))]
"""
_RM_ITERATOR = """
from itertools import accumulate


def running_max(nums):
    return accumulate(nums, max)
"""

_RUNNING_MAX = DemoTask(
    number=3,
    signature="running_max(nums: list[int]) -> list[int]",
    statement="Element i of the result is the largest of nums[0..i]; an empty list gives [].",
    entry_point="running_max",
    visible_tests=("assert running_max([2, 5, 1, 1, 3]) == [2, 5, 5, 5, 5]",),
    cases=(
        ([[2, 5, 1, 1, 3]], [2, 5, 5, 5, 5]),
        ([[]], []),
        ([[7]], [7]),
        ([[1, 2, 3]], [1, 2, 3]),
        ([[3, 2, 1]], [3, 3, 3]),
        ([[-5, -2, -7]], [-5, -2, -2]),
        ([[0, 0]], [0, 0]),
        ([[2, 7, 1, 8, 2, 8]], [2, 7, 7, 8, 8, 8]),
    ),
    reference=_RM_REF,
    intent="escalate_visible",
    cheap=(
        _visible("Take the maximum and repeat it for every position:", _RM_ALL_MAX),
        _visible("Compare each element with the one before it:", _RM_NEIGHBOUR, "This is O(n)."),
        _visible("Track the current extreme as you go:", _RM_MIN),
        _visible("Use slices of the prefix:", _RM_OFF_BY_ONE),
        _prose(
            "To compute a running maximum, walk through the list once and keep the largest "
            "value you have seen so far. At each position, append that value to the output "
            "list. For [2, 5, 1, 1, 3] this gives [2, 5, 5, 5, 5]. The whole thing runs in "
            "linear time and needs only one extra variable besides the output."
        ),
        _visible(
            "`itertools.accumulate` does exactly this:",
            _RM_ITERATOR,
            "It yields the running maximum lazily.",
        ),
        _prose(
            "Sure! The idea: keep a variable `best` initialised to the first element, then "
            "for every element update `best = max(best, x)` and record it. Return the "
            "recorded values. Let me know if you'd like me to write it out in full."
        ),
        _visible("Here's a simple approach:", _RM_NEIGHBOUR),
    ),
    strong=(
        _ok(
            "`itertools.accumulate` with `max` gives the prefix maxima directly:",
            _RM_ACCUMULATE,
            "An empty input gives an empty list.",
        ),
        _ok("Keep the best value so far and append it at each step:", _RM_LOOP),
        _ok("Here's a version with no imports:", _RM_REF),
        _ok("Sure:", _RM_ACCUMULATE),
        _ok("A single pass:", _RM_LOOP, "O(n) time, O(n) output."),
        _ok("Here you go.", _RM_REF),
        _ok(
            "Using the standard library:",
            _RM_ACCUMULATE,
            "`list(...)` matters: `accumulate` returns an iterator.",
        ),
        _ok("Straightforward loop:", _RM_LOOP),
    ),
)

# --- 4. merge_sorted: demo-cheap passes the visible test, fails edge cases ------------------

_MS_REF = """
def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result
"""
_MS_SORTED = """
def merge_sorted(a: list[int], b: list[int]) -> list[int]:
    return sorted(a + b)
"""
_MS_HEAPQ = """
import heapq


def merge_sorted(a, b):
    return list(heapq.merge(a, b))
"""
_MS_SET = """
def merge_sorted(a, b):
    return sorted(set(a + b))
"""
_MS_FORGETS_B = """
def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    return result + a[i:]
"""
_MS_DEDUPES = """
def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] < b[j]:
            result.append(a[i])
            i += 1
        elif a[i] > b[j]:
            result.append(b[j])
            j += 1
        else:
            result.append(a[i])
            i += 1
            j += 1
    return result + a[i:] + b[j:]
"""
_MS_EMPTY_GUARD = """
def merge_sorted(a, b):
    if not a:
        return a
    if not b:
        return b
    merged = []
    while a and b:
        merged.append(a.pop(0) if a[0] <= b[0] else b.pop(0))
    return merged + a + b
"""

_MERGE = DemoTask(
    number=4,
    signature="merge_sorted(a: list[int], b: list[int]) -> list[int]",
    statement=(
        "Both inputs are sorted ascending; return one sorted list with every element of both, "
        "duplicates included."
    ),
    entry_point="merge_sorted",
    visible_tests=("assert merge_sorted([1, 4, 9], [2, 3, 5]) == [1, 2, 3, 4, 5, 9]",),
    cases=(
        ([[1, 4, 9], [2, 3, 5]], [1, 2, 3, 4, 5, 9]),
        ([[], []], []),
        ([[], [1, 2]], [1, 2]),
        ([[1, 2], []], [1, 2]),
        ([[1, 1, 3], [1, 2]], [1, 1, 1, 2, 3]),
        ([[1], [2, 3, 4]], [1, 2, 3, 4]),
        ([[5, 6], [1, 2]], [1, 2, 5, 6]),
        ([[-3, 0], [-2, 0]], [-3, -2, 0, 0]),
    ),
    reference=_MS_REF,
    intent="escalate_gate",
    cheap=(
        _hidden(
            "Combine the lists and sort the unique values:",
            _MS_SET,
            "Sorting makes the order right regardless of the inputs.",
        ),
        _hidden(
            "Two pointers, taking the smaller head each time:",
            _MS_FORGETS_B,
            "This is O(len(a) + len(b)).",
        ),
        _hidden("A merge step like in merge sort:", _MS_DEDUPES),
        _hidden(
            "Pop from the front of whichever list has the smaller head:",
            _MS_EMPTY_GUARD,
            "The early returns handle empty inputs.",
        ),
        _hidden("Sure!", _MS_SET),
        _hidden("Here's the standard two-pointer merge:", _MS_FORGETS_B),
        _hidden("Walk both lists at once:", _MS_DEDUPES, "Linear time, no sorting needed."),
        _hidden("Here you go:", _MS_EMPTY_GUARD),
    ),
    strong=(
        _ok("The merge step of merge sort, with both leftovers appended:", _MS_REF),
        _ok("`heapq.merge` already merges sorted iterables lazily:", _MS_HEAPQ),
        _ok(
            "Simplest correct version (O(n log n), fine for small lists):",
            _MS_SORTED,
            "Duplicates are kept because nothing is deduplicated.",
        ),
        _ok("Two pointers; don't forget what is left in either list:", _MS_REF),
        _ok("Sure:", _MS_HEAPQ),
        _ok("Here's a linear-time merge:", _MS_REF, "Handles empty inputs and duplicates."),
        _ok("Concatenate and sort:", _MS_SORTED),
        _ok("Using the standard library:", _MS_HEAPQ),
    ),
)

# --- 5. to_roman: half right, half fail the visible test -----------------------------------

_ROMAN_GREEDY = """
def to_roman(n: int) -> str:
    values = [
        (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
        (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
        (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
    ]
    out = []
    for value, symbol in values:
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)
"""
_ROMAN_DIGITS = """
def to_roman(n):
    thousands = ["", "M", "MM", "MMM"]
    hundreds = ["", "C", "CC", "CCC", "CD", "D", "DC", "DCC", "DCCC", "CM"]
    tens = ["", "X", "XX", "XXX", "XL", "L", "LX", "LXX", "LXXX", "XC"]
    ones = ["", "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX"]
    return thousands[n // 1000] + hundreds[n % 1000 // 100] + tens[n % 100 // 10] + ones[n % 10]
"""
_ROMAN_NO_SUBTRACT = """
def to_roman(n):
    symbols = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
    result = ""
    for value, symbol in symbols:
        count, n = divmod(n, value)
        result += symbol * count
    return result
"""
_ROMAN_ASCENDING = """
def to_roman(n):
    table = {1: "I", 4: "IV", 5: "V", 9: "IX", 10: "X", 40: "XL", 50: "L",
             90: "XC", 100: "C", 400: "CD", 500: "D", 900: "CM", 1000: "M"}
    result = ""
    for value in sorted(table):
        while n >= value:
            result += table[value]
            n -= value
    return result
"""
_ROMAN_MISSING = """
def to_roman(n):
    pairs = [(1000, "M"), (500, "D"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
             (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    s = ""
    for v, r in pairs:
        while n >= v:
            s += r
            n -= v
    return s
"""

_ROMAN = DemoTask(
    number=5,
    signature="to_roman(n: int) -> str",
    statement="It converts 1 <= n <= 3999 to a Roman numeral, using subtractive forms (IV, CM).",
    entry_point="to_roman",
    visible_tests=('assert to_roman(1994) == "MCMXCIV"',),
    cases=(
        ([1994], "MCMXCIV"),
        ([1], "I"),
        ([4], "IV"),
        ([9], "IX"),
        ([14], "XIV"),
        ([40], "XL"),
        ([58], "LVIII"),
        ([90], "XC"),
        ([400], "CD"),
        ([944], "CMXLIV"),
        ([2024], "MMXXIV"),
        ([3999], "MMMCMXCIX"),
    ),
    reference=_ROMAN_GREEDY,
    intent="mixed_gate_pass",
    cheap=(
        _ok("Greedy over a value table that includes the subtractive pairs:", _ROMAN_GREEDY),
        _visible(
            "Greedy conversion with divmod:",
            _ROMAN_NO_SUBTRACT,
            "Each symbol is repeated as many times as it fits.",
        ),
        _ok(
            "Look up each decimal digit in its own table:",
            _ROMAN_DIGITS,
            "No loops needed: one lookup per digit.",
        ),
        _visible("Walk the table and subtract as long as the value fits:", _ROMAN_ASCENDING),
        _prose(
            "Roman numerals are built from the symbols I, V, X, L, C, D and M. Write the "
            "thousands first, then hundreds, tens and ones, and use the subtractive forms "
            "IV, IX, XL, XC, CD and CM where a digit is 4 or 9. So 1994 becomes M + CM + "
            "XC + IV = MCMXCIV."
        ),
        _ok("Sure!", _ROMAN_GREEDY, "For 1994: M, CM, XC, IV."),
        _visible("Here's a greedy approach:", _ROMAN_MISSING),
        _ok("Here you go:", _ROMAN_DIGITS),
    ),
    strong=(
        _ok("Greedy over the thirteen values, largest first:", _ROMAN_GREEDY),
        _ok("A digit-table version:", _ROMAN_DIGITS),
        _ok("Sure:", _ROMAN_GREEDY, "The subtractive pairs sit in the table, so 4 → IV."),
        _ok("Per-digit lookup tables:", _ROMAN_DIGITS, "Valid for 1..3999."),
        _ok("Here's the standard greedy algorithm:", _ROMAN_GREEDY),
        _ok("Here you go.", _ROMAN_DIGITS),
        _ok("Subtract the largest value that fits, repeatedly:", _ROMAN_GREEDY),
        _ok("Table lookup per decimal place:", _ROMAN_DIGITS),
    ),
)

# --- 6. word_count: half fail the visible test, half fail hidden edge cases ----------------

_WC_REF = """
def word_count(text):
    counts = {}
    for raw in text.split():
        word = raw.strip(".,!?;:\\"'").lower()
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
"""
_WC_COUNTER = """
from collections import Counter


def word_count(text: str) -> dict[str, int]:
    words = (w.strip(".,!?;:\\"'").lower() for w in text.split())
    return dict(Counter(w for w in words if w))
"""
_WC_NO_STRIP = """
from collections import Counter


def word_count(text):
    return dict(Counter(text.lower().split()))
"""
_WC_CASE = """
def word_count(text):
    counts = {}
    for word in text.split():
        word = word.strip(".,!?;:\\"'")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
"""
_WC_SPLIT_SPACE = """
def word_count(text):
    counts = {}
    for word in text.lower().split(" "):
        word = word.strip(".,!?;:\\"'")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
"""
_WC_REGEX = """
import re


def word_count(text):
    counts = {}
    for word in re.findall(r"\\w+", text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts
"""
_WC_LEN = """
def word_count(text):
    return len(text.split())
"""
_WC_CHARS = """
from collections import Counter


def word_count(text):
    return dict(Counter(text.lower().replace(" ", "")))
"""
_WC_PAIRS = """
from collections import Counter


def word_count(text):
    return sorted(Counter(text.lower().split()).items())
"""

_WORD_COUNT = DemoTask(
    number=6,
    signature="word_count(text: str) -> dict[str, int]",
    statement=(
        "It maps each word of `text` to how often it occurs. Split on whitespace, strip the "
        "characters . , ! ? ; : and quotes (\" ') from both ends of each word, compare "
        "case-insensitively (keys in lowercase) and skip anything left empty."
    ),
    entry_point="word_count",
    visible_tests=(
        'assert word_count("the cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}',
    ),
    cases=(
        (["the cat and the hat"], {"the": 2, "cat": 1, "and": 1, "hat": 1}),
        ([""], {}),
        (["Hello, hello!"], {"hello": 2}),
        (["The the THE"], {"the": 3}),
        (["  spaced   out  "], {"spaced": 1, "out": 1}),
        (["It's fine."], {"it's": 1, "fine": 1}),
        (['"Quoted" words'], {"quoted": 1, "words": 1}),
        (["a\nb\ta"], {"a": 2, "b": 1}),
        (["!!! ?"], {}),
    ),
    reference=_WC_REF,
    intent="mixed_gate_fail",
    cheap=(
        _hidden(
            "`collections.Counter` does the counting:",
            _WC_NO_STRIP,
            "Lowercasing first makes the count case-insensitive.",
        ),
        _visible("Just split and count:", _WC_LEN),
        _hidden("Strip punctuation from each word and count with a dict:", _WC_CASE),
        _visible("Count with a Counter after removing spaces:", _WC_CHARS),
        _hidden("Split on spaces, strip punctuation, lowercase:", _WC_SPLIT_SPACE),
        _visible(
            "Here's a version that returns the counts sorted by word:",
            _WC_PAIRS,
            "Sorting makes the output deterministic.",
        ),
        _hidden(
            "A regular expression finds the words:",
            _WC_REGEX,
            "`\\w+` matches runs of letters, digits and underscores.",
        ),
        _prose(
            "You can solve this with a dictionary: split the text on whitespace, strip the "
            "punctuation characters from each end of every word with `str.strip`, lowercase "
            "it, skip empty strings, and increment `counts[word]`. A `collections.Counter` "
            "makes the counting a one-liner."
        ),
    ),
    strong=(
        _ok("Strip the listed punctuation, lowercase, and count:", _WC_REF),
        _ok(
            "With `collections.Counter`:",
            _WC_COUNTER,
            "Returning a plain dict keeps the type the test compares against.",
        ),
        _ok("Sure:", _WC_REF, "Words that are only punctuation are skipped."),
        _ok("Here's a Counter-based version:", _WC_COUNTER),
        _ok(
            "`str.split()` with no argument splits on any whitespace, including newlines:", _WC_REF
        ),
        _ok("Here you go.", _WC_COUNTER),
        _ok("A plain-dict implementation:", _WC_REF),
        _ok("Count normalized words:", _WC_COUNTER, "Keys are lowercase, as required."),
    ),
)

# --- 7. flatten: demo-cheap never passes the visible test ----------------------------------

_FL_REF = """
def flatten(nested):
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
"""
_FL_STACK = """
def flatten(nested: list) -> list:
    result = []
    stack = [iter(nested)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            result.append(item)
        else:
            stack.pop()
    return result
"""
_FL_ONE_LEVEL = """
def flatten(nested):
    return [x for sub in nested for x in (sub if isinstance(sub, list) else [sub])]
"""
_FL_GENERATOR = """
def flatten(nested):
    for item in nested:
        if isinstance(item, list):
            yield from flatten(item)
        else:
            yield item
"""
_FL_SUM = """
def flatten(nested):
    return sum(nested, [])
"""
_FL_APPEND = """
def flatten(nested):
    result = []
    for item in nested:
        if isinstance(item, list):
            result.append(flatten(item))
        else:
            result.append(item)
    return result
"""

_FLATTEN = DemoTask(
    number=7,
    signature="flatten(nested: list) -> list",
    statement=(
        "It returns every non-list item of an arbitrarily deep nested list, in order, as one "
        "flat list."
    ),
    entry_point="flatten",
    visible_tests=("assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]",),
    cases=(
        ([[1, [2, [3, 4]], 5]], [1, 2, 3, 4, 5]),
        ([[]], []),
        ([[[]]], []),
        ([[1, 2, 3]], [1, 2, 3]),
        ([[[[[[1]]]]]], [1]),
        ([[1, [2, [3, [4, [5]]]]]], [1, 2, 3, 4, 5]),
        ([["a", ["b"]]], ["a", "b"]),
        ([[[1, []], 2]], [1, 2]),
    ),
    reference=_FL_REF,
    intent="escalate_visible",
    cheap=(
        _visible("A nested comprehension flattens it:", _FL_ONE_LEVEL),
        _visible(
            "A recursive generator is the most elegant way:",
            _FL_GENERATOR,
            "`yield from` handles any depth.",
        ),
        _visible("`sum` with an empty list as the start value concatenates the sublists:", _FL_SUM),
        _visible("Recurse into sublists:", _FL_APPEND),
        _prose(
            "Flattening a nested list is a classic recursion exercise: for each element, if "
            "it is itself a list, flatten it and add its elements; otherwise add the element. "
            "The base case is an empty list. Would you like me to also handle tuples?"
        ),
        _prose(
            "I'd recommend a recursive approach. Iterate over the items, check each one with "
            "isinstance(item, list), and either recurse or append. This handles arbitrary "
            "depth, although Python's recursion limit caps it at roughly a thousand levels."
        ),
        _visible("Sure!", _FL_ONE_LEVEL, "Non-list items are wrapped so every element iterates."),
        _visible("Here you go:", _FL_APPEND),
    ),
    strong=(
        _ok("Recursion, extending with the flattened sublist:", _FL_REF),
        _ok("An iterative version with a stack of iterators (no recursion limit):", _FL_STACK),
        _ok("Sure:", _FL_REF, "Empty sublists contribute nothing."),
        _ok("Here's a recursive solution:", _FL_REF),
        _ok("Without recursion:", _FL_STACK),
        _ok("Here you go.", _FL_REF, "Strings are kept as items, not split into characters."),
        _ok("A stack-based flatten:", _FL_STACK),
        _ok("Recursive flatten:", _FL_REF),
    ),
)

# --- 8. gcd: demo-cheap always right --------------------------------------------------------

_GCD_LOOP = """
def gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
"""
_GCD_RECURSIVE = """
def gcd(a, b):
    if b == 0:
        return a
    return gcd(b, a % b)
"""
_GCD_MATH = """
import math


def gcd(a, b):
    return math.gcd(a, b)
"""

_GCD = DemoTask(
    number=8,
    signature="gcd(a: int, b: int) -> int",
    statement=(
        "It returns the greatest common divisor of two non-negative integers; gcd(0, 0) == 0."
    ),
    entry_point="gcd",
    visible_tests=("assert gcd(48, 18) == 6",),
    cases=(
        ([48, 18], 6),
        ([18, 48], 6),
        ([7, 13], 1),
        ([0, 5], 5),
        ([5, 0], 5),
        ([0, 0], 0),
        ([12, 12], 12),
        ([1, 1000000], 1),
        ([270, 192], 6),
        ([1071, 462], 21),
    ),
    reference=_GCD_LOOP,
    intent="serve",
    cheap=(
        _ok("Euclid's algorithm:", _GCD_LOOP),
        _ok("Recursive Euclid:", _GCD_RECURSIVE, "When b reaches 0, a is the answer."),
        _ok("The standard library has it:", _GCD_MATH),
        _ok("Sure!", _GCD_LOOP, "gcd(0, 0) returns 0 because the loop never runs."),
        _ok("Here's the iterative Euclidean algorithm:", _GCD_LOOP),
        _ok("A recursive version:", _GCD_RECURSIVE),
        _ok("Here you go:", _GCD_LOOP),
        _ok("Just wrap `math.gcd`:", _GCD_MATH, "It already handles zeros."),
    ),
    strong=(
        _ok("Euclid's algorithm, iteratively:", _GCD_LOOP),
        _ok("Using `math.gcd`:", _GCD_MATH),
        _ok("Recursive Euclid:", _GCD_RECURSIVE),
        _ok("Sure:", _GCD_LOOP, "Runs in O(log min(a, b)) steps."),
        _ok("Here you go.", _GCD_LOOP),
        _ok("The standard library version:", _GCD_MATH),
        _ok("Recursion with the remainder:", _GCD_RECURSIVE, "gcd(0, 0) gives 0."),
        _ok("Here's Euclid:", _GCD_LOOP),
    ),
)

# --- 9. second_largest: half right, half fail the visible test -----------------------------

_SL_SET = """
def second_largest(nums):
    distinct = sorted(set(nums))
    return distinct[-2] if len(distinct) >= 2 else None
"""
_SL_PASS = """
def second_largest(nums: list[int]) -> int | None:
    first = second = None
    for x in nums:
        if first is None or x > first:
            first, second = x, first
        elif x != first and (second is None or x > second):
            second = x
    return second
"""
_SL_SECOND_SMALLEST = """
def second_largest(nums):
    return sorted(nums)[1]
"""
_SL_MAX = """
def second_largest(nums):
    if not nums:
        return None
    return max(nums)
"""
_SL_OFF_BY_ONE = """
def second_largest(nums):
    ordered = sorted(nums, reverse=True)
    return ordered[2] if len(ordered) > 2 else None
"""

_SECOND_LARGEST = DemoTask(
    number=9,
    signature="second_largest(nums: list[int]) -> int | None",
    statement=(
        "It returns the second largest distinct value in `nums`, or None when there are fewer "
        "than two distinct values."
    ),
    entry_point="second_largest",
    visible_tests=("assert second_largest([3, 1, 4, 1, 5]) == 4",),
    cases=(
        ([[3, 1, 4, 1, 5]], 4),
        ([[5, 5, 4]], 4),
        ([[1]], None),
        ([[]], None),
        ([[2, 2, 2]], None),
        ([[-1, -3, -2]], -2),
        ([[10, 9]], 9),
        ([[9, 10]], 9),
        ([[1, 2, 3, 4, 5, 5]], 4),
    ),
    reference=_SL_SET,
    intent="mixed_gate_pass",
    cheap=(
        _ok("Deduplicate, sort, take the second from the end:", _SL_SET),
        _visible("Sort and index:", _SL_SECOND_SMALLEST),
        _ok(
            "One pass, tracking the two largest distinct values:",
            _SL_PASS,
            "O(n) time and O(1) space.",
        ),
        _visible("Here's a simple version:", _SL_MAX),
        _visible("Sort descending and pick the next one:", _SL_OFF_BY_ONE),
        _ok("Sure!", _SL_SET, "Returns None for [] or [2, 2, 2]."),
        _prose(
            "The cleanest approach is to turn the list into a set to drop duplicates, sort "
            "it, and return the element before the last, returning None if fewer than two "
            "distinct values remain. For [3, 1, 4, 1, 5] that is 4."
        ),
        _ok("Here you go:", _SL_PASS),
    ),
    strong=(
        _ok("Distinct values, sorted:", _SL_SET),
        _ok("Single pass with two trackers:", _SL_PASS),
        _ok("Sure:", _SL_SET, "Duplicates of the maximum are ignored by the set."),
        _ok("Linear-time version:", _SL_PASS),
        _ok("Here you go.", _SL_SET),
        _ok("Track first and second distinct maxima:", _SL_PASS, "None if no second exists."),
        _ok("Using a set:", _SL_SET),
        _ok("Here's one way:", _SL_PASS),
    ),
)

# --- 10. rotate: everyone misses an edge case (the ladder is exhausted) ---------------------

_ROT_REF = """
def rotate(lst, k):
    if not lst:
        return []
    k %= len(lst)
    return lst[-k:] + lst[:-k] if k else list(lst)
"""
_ROT_NO_MOD = """
def rotate(lst, k):
    return lst[-k:] + lst[:-k]
"""
_ROT_MOD_EMPTY = """
def rotate(lst: list, k: int) -> list:
    k %= len(lst)
    return lst[-k:] + lst[:-k]
"""
_ROT_ABS = """
def rotate(lst, k):
    if not lst:
        return []
    k = abs(k) % len(lst)
    return lst[len(lst) - k:] + lst[:len(lst) - k]
"""
_ROT_DEQUE = """
from collections import deque


def rotate(lst, k):
    d = deque(lst)
    d.rotate(k % len(lst))
    return list(d)
"""
_ROT_LEFT = """
def rotate(lst, k):
    k %= len(lst)
    return lst[k:] + lst[:k]
"""
_ROT_IN_PLACE = """
def rotate(lst, k):
    k %= len(lst)
    lst[:] = lst[-k:] + lst[:-k]
"""
_ROT_POP = """
def rotate(lst, k):
    lst = list(lst)
    for _ in range(k):
        lst.append(lst.pop(0))
    return lst
"""

_ROTATE = DemoTask(
    number=10,
    signature="rotate(lst: list, k: int) -> list",
    statement=(
        "It returns a new list rotated right by k positions. k may be larger than the list or "
        "negative (a left rotation), and an empty list gives []."
    ),
    entry_point="rotate",
    visible_tests=("assert rotate([1, 2, 3, 4, 5], 2) == [4, 5, 1, 2, 3]",),
    cases=(
        ([[1, 2, 3, 4, 5], 2], [4, 5, 1, 2, 3]),
        ([[1, 2, 3, 4, 5], 0], [1, 2, 3, 4, 5]),
        ([[1, 2, 3, 4, 5], 5], [1, 2, 3, 4, 5]),
        ([[1, 2, 3, 4, 5], 7], [4, 5, 1, 2, 3]),
        ([[1, 2, 3, 4, 5], -1], [2, 3, 4, 5, 1]),
        ([[], 3], []),
        ([[1], 100], [1]),
        ([[1, 2], -3], [2, 1]),
    ),
    reference=_ROT_REF,
    intent="exhausted",
    cheap=(
        _hidden("Slicing does it in one line:", _ROT_NO_MOD),
        _visible("Slice at k and swap the halves:", _ROT_LEFT),
        _hidden(
            "Reduce k modulo the length first, then slice:",
            _ROT_MOD_EMPTY,
            "This handles k larger than the list.",
        ),
        _visible(
            "Rotate in place with slice assignment:",
            _ROT_IN_PLACE,
            "No extra list is allocated for the result.",
        ),
        _hidden("Normalize k, then slice:", _ROT_ABS),
        _visible("Move elements one at a time:", _ROT_POP),
        _prose(
            "Rotating right by k means the last k elements move to the front. In Python "
            "that's lst[-k:] + lst[:-k]; take k modulo len(lst) first so that large k "
            "values wrap around."
        ),
        _hidden("Sure!", _ROT_NO_MOD, "Negative k rotates left."),
    ),
    strong=(
        _hidden(
            "`collections.deque.rotate` rotates right for positive k:",
            _ROT_DEQUE,
            "Negative k rotates left, and the modulo handles large k.",
        ),
        _hidden("Take k modulo the length, then slice:", _ROT_MOD_EMPTY),
        _hidden("Normalize k and slice:", _ROT_ABS, "Returns [] for an empty list."),
        _hidden("Sure:", _ROT_DEQUE),
        _hidden("Slicing after reducing k:", _ROT_MOD_EMPTY, "O(n) time."),
        _hidden("Here you go.", _ROT_ABS),
        _hidden("Using a deque:", _ROT_DEQUE),
        _hidden("Here's a slicing solution:", _ROT_MOD_EMPTY),
    ),
)

# --- 11. chunk: demo-cheap always right -----------------------------------------------------

_CH_SLICE = """
def chunk(lst: list, size: int) -> list[list]:
    return [lst[i:i + size] for i in range(0, len(lst), size)]
"""
_CH_LOOP = """
def chunk(lst, size):
    chunks = []
    current = []
    for item in lst:
        current.append(item)
        if len(current) == size:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks
"""
_CH_ISLICE = """
from itertools import islice


def chunk(lst, size):
    it = iter(lst)
    return list(iter(lambda: list(islice(it, size)), []))
"""

_CHUNK = DemoTask(
    number=11,
    signature="chunk(lst: list, size: int) -> list[list]",
    statement=(
        "It splits `lst` into consecutive chunks of `size` items (size >= 1); the last chunk "
        "may be shorter."
    ),
    entry_point="chunk",
    visible_tests=(
        "assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
        "assert chunk([], 3) == []",
    ),
    cases=(
        ([[1, 2, 3, 4, 5], 2], [[1, 2], [3, 4], [5]]),
        ([[], 3], []),
        ([[1, 2, 3], 1], [[1], [2], [3]]),
        ([[1, 2, 3], 3], [[1, 2, 3]]),
        ([[1, 2, 3], 5], [[1, 2, 3]]),
        ([[1, 2, 3, 4], 2], [[1, 2], [3, 4]]),
        ([["a", "b", "c"], 2], [["a", "b"], ["c"]]),
    ),
    reference=_CH_SLICE,
    intent="serve",
    cheap=(
        _ok("Slice in steps of `size`:", _CH_SLICE),
        _ok("Accumulate items and flush every `size`:", _CH_LOOP),
        _ok(
            "With `itertools.islice`:",
            _CH_ISLICE,
            "`iter(callable, sentinel)` stops at the first empty chunk.",
        ),
        _ok("Sure!", _CH_SLICE, "The last slice is simply shorter."),
        _ok("Here's a loop-based version:", _CH_LOOP),
        _ok("A list comprehension over the start indices:", _CH_SLICE),
        _ok("Here you go:", _CH_SLICE),
        _ok("Build chunks as you go:", _CH_LOOP, "An empty input gives []."),
    ),
    strong=(
        _ok("Slicing by start index:", _CH_SLICE),
        _ok("Iterator-based:", _CH_ISLICE),
        _ok("Sure:", _CH_LOOP),
        _ok("A comprehension:", _CH_SLICE, "Works for any size >= 1."),
        _ok("Here you go.", _CH_SLICE),
        _ok("Accumulating version:", _CH_LOOP),
        _ok("With islice:", _CH_ISLICE),
        _ok("Slicing:", _CH_SLICE),
    ),
)

# --- 12. is_balanced: half fail the visible test, half fail hidden edge cases --------------

_BAL_REF = """
def is_balanced(s):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack
"""
_BAL_COUNTS = """
def is_balanced(s):
    return all(s.count(o) == s.count(c) for o, c in ("()", "[]", "{}"))
"""
_BAL_NO_EMPTY_CHECK = """
def is_balanced(s: str) -> bool:
    closing = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in closing and stack.pop() != closing[ch]:
            return False
    return not stack
"""
_BAL_RETURNS_TRUE = """
def is_balanced(s):
    match = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in match:
            if not stack or stack[-1] != match[ch]:
                return False
            stack.pop()
    return True
"""
_BAL_DEPTH = """
def is_balanced(s):
    depth = {"(": 0, "[": 0, "{": 0}
    opener = {")": "(", "]": "[", "}": "{"}
    for ch in s:
        if ch in depth:
            depth[ch] += 1
        elif ch in opener:
            depth[opener[ch]] -= 1
            if depth[opener[ch]] < 0:
                return False
    return all(v == 0 for v in depth.values())
"""
_BAL_REPLACE = """
def is_balanced(s):
    while "()" in s:
        s = s.replace("()", "")
    return s == ""
"""
_BAL_REVERSED_MAP = """
def is_balanced(s):
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for ch in s:
        if ch in pairs:
            stack.append(ch)
        elif ch in ")]}":
            if stack.pop() != pairs[ch]:
                return False
    return not stack
"""
_BAL_COMPARE_SAME = """
def is_balanced(s):
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack.pop() != ch:
                return False
    return not stack
"""

_BALANCED = DemoTask(
    number=12,
    signature="is_balanced(s: str) -> bool",
    statement=(
        "It returns True when the brackets (), [] and {} in `s` are balanced and properly "
        "nested; other characters are ignored."
    ),
    entry_point="is_balanced",
    visible_tests=('assert is_balanced("{[()()]}") == True',),
    cases=(
        (["{[()()]}"], True),
        ([""], True),
        (["()"], True),
        (["a(b)c[d]"], True),
        (["([)]"], False),
        (["(("], False),
        (["))"], False),
        ([")("], False),
        (["(]"], False),
        (["}"], False),
    ),
    reference=_BAL_REF,
    intent="mixed_gate_fail",
    cheap=(
        _hidden(
            "Every opening bracket needs a matching closing one, so compare counts:", _BAL_COUNTS
        ),
        _visible("Repeatedly remove matched pairs until nothing changes:", _BAL_REPLACE),
        _hidden("The classic stack solution:", _BAL_NO_EMPTY_CHECK, "O(n) time."),
        _visible("Use a stack and a map from opening to closing brackets:", _BAL_REVERSED_MAP),
        _hidden(
            "Push openers, pop on closers:",
            _BAL_RETURNS_TRUE,
            "Mismatched closers return False immediately.",
        ),
        _visible("A stack-based check:", _BAL_COMPARE_SAME),
        _hidden("Track the depth of each bracket type; it must never go negative:", _BAL_DEPTH),
        _prose(
            "Use a stack: push every opening bracket, and when you see a closing bracket, "
            "check that the stack is not empty and that its top is the matching opener, then "
            "pop. At the end the string is balanced exactly when the stack is empty."
        ),
    ),
    strong=(
        _ok("A stack of openers, checked against each closer:", _BAL_REF),
        _ok("Sure:", _BAL_REF, "An unmatched closer or a leftover opener means unbalanced."),
        _ok("Stack-based, ignoring other characters:", _BAL_REF),
        _ok("Here you go.", _BAL_REF),
        _ok("The standard approach:", _BAL_REF, "Runs in O(n)."),
        _ok("Match each closer with the most recent opener:", _BAL_REF),
        _ok("Here's an implementation:", _BAL_REF),
        _ok("Use a stack:", _BAL_REF, '"([)]" fails because ) meets [.'),
    ),
)

TASKS: tuple[DemoTask, ...] = (
    _PALINDROME,
    _FIZZBUZZ,
    _RUNNING_MAX,
    _MERGE,
    _ROMAN,
    _WORD_COUNT,
    _FLATTEN,
    _GCD,
    _SECOND_LARGEST,
    _ROTATE,
    _CHUNK,
    _BALANCED,
)


def _jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n" for row in rows)


def render_tasks(tasks: Sequence[DemoTask] = TASKS) -> str:
    """The exact text of ``tasks.jsonl``."""
    return _jsonl([task.task_row() for task in tasks])


def render_samples(tasks: Sequence[DemoTask] = TASKS) -> str:
    """The exact text of ``samples.jsonl`` (one row per task and model)."""
    return _jsonl([row for task in tasks for row in task.sample_rows()])


def read_tasks(path: Path = TASKS_PATH) -> list[dict[str, Any]]:
    """The shipped task rows, for the demo runner."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """``--write`` regenerates the shipped files; ``--check`` exits 1 if they are stale."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.demo_dataset", description=__doc__.splitlines()[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write tasks.jsonl, samples.jsonl")
    action.add_argument("--check", action="store_true", help="fail if the shipped files differ")
    args = parser.parse_args(argv)
    files = {TASKS_PATH: render_tasks(), SAMPLES_PATH: render_samples()}
    if args.write:
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({text.count(chr(10))} rows)")
        return 0
    stale = [p for p, text in files.items() if not p.exists() or p.read_text("utf-8") != text]
    for path in stale:
        print(f"stale: {path} (run python -m tests.demo_dataset --write)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
