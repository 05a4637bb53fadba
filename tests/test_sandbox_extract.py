"""Finding the program in a model answer: fences, <code> tags, raw code, no code."""

from __future__ import annotations

import pytest

from firstpass.sandbox import extract_code

CASES = [
    (
        "python_fence",
        "Here you go:\n```python\ndef f(x):\n    return x\n```\nThanks.",
        "def f(x):\n    return x\n",
        "fence:only",
    ),
    ("py_fence", "```py\nx = 1\n```", "x = 1\n", "fence:only"),
    ("bare_fence", "```\nimport math\n```", "import math\n", "fence:only"),
    ("tilde_fence", "~~~python\ny = 2\n~~~", "y = 2\n", "fence:only"),
    (
        "unclosed_fence",
        "Sure:\n```python\ndef f():\n    return 1\n",
        "def f():\n    return 1\n",
        "fence:only",
    ),
    (
        "other_language_ignored",
        "```bash\npip install x\n```\n```python\nz = 3\n```",
        "z = 3\n",
        "fence:only",
    ),
    (
        "entry_point_preferred",
        "```python\nprint(f(2))\n```\nand\n```python\ndef f(x):\n    return x\n```\n```python\n# a long comment that makes this block the longest of all three\nassert f(1) == 1\n```",
        "def f(x):\n    return x\n",
        "fence:entry_point",
    ),
    (
        "longest_without_entry_point",
        "```python\na = 1\n```\n```python\nb = 22222\n```",
        "b = 22222\n",
        "fence:longest",
    ),
    (
        "code_tag",
        "<code>\ndef f(x):\n    return x\n</code>",
        "def f(x):\n    return x\n",
        "code_tag:only",
    ),
    ("raw_code", "def f(x):\n    return x\n", "def f(x):\n    return x\n", "raw"),
    (
        "prose_then_code",
        "The answer is below.\ndef f(x):\n    return x\n",
        "def f(x):\n    return x\n",
        "raw:after_prose",
    ),
    (
        "indented_fence",
        "  ```python\n  def f():\n      return 1\n  ```",
        "def f():\n    return 1\n",
        "fence:only",
    ),
]


@pytest.mark.parametrize(("name", "answer", "code", "rule"), CASES, ids=[c[0] for c in CASES])
def test_extraction_finds_the_program_and_names_the_rule(
    name: str, answer: str, code: str, rule: str
) -> None:
    """Each answer shape yields its program and the rule that found it."""
    found = extract_code(answer, entry_point="f")
    assert (found.code, found.rule) == (code, rule)


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   \n",
        "I am sorry, I cannot help with that.",
        "The function returns the sum.",
        "```bash\nls -la\n```",
        "hello",
    ],
)
def test_answers_without_code_report_rule_none(answer: str) -> None:
    """Prose, blank answers and non-Python fences give no code, not a crash."""
    found = extract_code(answer, entry_point="f")
    assert (found.code, found.rule) == ("", "none")


async def test_no_code_answer_is_a_no_code_result() -> None:
    """An answer with no code fails every test with category no_code."""
    from firstpass.sandbox import Sandbox, parse_spec

    async with Sandbox(concurrency=1) as sb:
        result = await sb.run("I don't know.", parse_spec(["assert f(1) == 1", "assert f(2) == 2"]))
    assert (result.passed, result.category, result.extraction, result.n_total) == (
        False,
        "no_code",
        "none",
        2,
    )


def test_a_long_unclosed_fence_is_found_in_linear_time() -> None:
    """The fence pattern once backtracked quadratically: 100,000 characters took seconds, on
    the event loop, for an answer any model (or client asking for it) can produce."""
    import time

    from firstpass.sandbox import extract_code

    cpu = time.process_time()  # CPU time: a loaded machine cannot trip it
    assert extract_code("```" + "x" * 200_000, None).rule == "none"
    assert time.process_time() - cpu < 0.5
