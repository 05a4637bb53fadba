"""The scripted task the elastic tests share: ``add(a, b)``, its tests, and answers to it.

GOOD and GOOD2 are correct (different code, same behaviour); WRONG fails the visible test;
VISIBLE_ONLY passes the visible test and fails the hidden one.
"""

from __future__ import annotations

from typing import Any

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
GOOD2 = "```python\ndef add(x, y):\n    total = x + y\n    return total\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
VISIBLE_ONLY = "```python\ndef add(a, b):\n    return 3\n```"

TESTS: dict[str, Any] = {
    "tests": {
        "visible": ["assert add(1, 2) == 3"],
        "hidden": {
            "entry_point": "add",
            "cases": [{"args": [1, 2], "expected": 3}, {"args": [-1, 1], "expected": 0}],
        },
    },
    "entry_point": "add",
}
