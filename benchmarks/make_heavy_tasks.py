"""Write a small HumanEval+-like Task set and Sample set that are hard on the sandbox.

    python -m benchmarks.make_heavy_tasks [--out /tmp/heavy] [--heavy-inputs 100] [--seed 0]

HumanEval+ itself is not on this machine; this writes twelve tasks in the benchmarks' neutral
format (``benchmarks/README.md``: ``tasks.jsonl`` and ``samples.jsonl``) whose reference
solutions are adversarial for the sandbox the way real HumanEval+ tasks are. Hidden tests are
``reference`` specs (plain JSON args, no expected values), so the expected outputs are computed
by ``Sandbox.resolve`` when a study first runs them, as for any spec with a reference:

- ``Heavy/14_all_prefixes``: HumanEval/14's ``all_prefixes`` on ``--heavy-inputs`` strings of
  1,400-2,000 characters: 1-2 MB of output per input, ~150 MB in all, far over the
  sandbox's reference output allowance (``_reference.REFERENCE_ALLOWANCE``, 16 MiB as written);
- ``Heavy/chatty_sum``: a reference that prints a line per element, ~2 MB over its inputs
  (over a sample's 1 MB stdout+stderr cap, ``Limits.output_bytes``; under the 16 MB a
  reference gets, ``_reference.REFERENCE_OUTPUT_BYTES``, where that exists);
- ``Heavy/count_primes``: naive primality (every divisor below k), 0.7-1.7 s on six of its
  46 inputs (some over the per-test budget; together over the 5 s CPU limit);
- ``Heavy/unique_words``: returns ``list(set(words))``, whose order depends on the string hash
  seed (only inputs with at most one distinct word are deterministic);
- ``Heavy/checked_isqrt``: raises ``ValueError`` on the negative inputs;
- seven ordinary tasks (HumanEval/53, 48, 37, 64, 52, 8, 4: ints, strings, a tuple result,
  floats with ``atol``).

Each task has 8 samples (``model: heavy-synthetic``): 3 correct (some in Markdown fences), 3
wrong, 2 hostile (infinite loop, memory bomb, huge print, fork bomb, sleep past the wall
limit, ``os._exit(0)``, garbage on the result descriptor, a ctypes crash), so that ``--k 5``
uses every task. Then, for example:

    python -m benchmarks.probe_study --tasks /tmp/heavy/tasks.jsonl \
        --samples /tmp/heavy/samples.jsonl --k 5 --draws 50 --seed 0 \
        --json /tmp/heavy/out.json --md /tmp/heavy/out.md --cache-dir /tmp/heavy/cache
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.datasets import write_jsonl

MODEL = "heavy-synthetic"

HOSTILE = {
    "loop": "def {ep}(*args):\n    while True:\n        pass\n",
    "memory": "def {ep}(*args):\n    keep = []\n    while True:\n        keep.append(b'x' * (1 << 26))\n",
    "print": "def {ep}(*args):\n    while True:\n        print('spam' * 1000)\n",
    "fork": "import os\ndef {ep}(*args):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n",
    "sleep": "import signal, time\ndef {ep}(*args):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    signal.setitimer(signal.ITIMER_REAL, 0)\n    time.sleep(3600)\n",
    "exit": "import os\nos._exit(0)\n",
    "fd3": 'import os\nos.write(3, b\'\\x00\\x00\\x00\\x05{{"t":"load"}}garbage\')\ndef {ep}(*args):\n    return None\n',
    "ctypes": "import ctypes\ndef {ep}(*args):\n    ctypes.string_at(0)\n",
}


def fence(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}```\n"


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 7))) for _ in range(n)]


def tasks_and_samples(heavy_inputs: int, seed: int) -> list[tuple[dict[str, Any], list[str]]]:
    """(task row, samples) for every task, inputs drawn with ``seed``."""
    rng = random.Random(seed)
    out: list[tuple[dict[str, Any], list[str]]] = []

    def task(
        tid: str,
        ep: str,
        prompt: str,
        visible: list[str],
        reference: str,
        inputs: list[list[Any]],
        correct: list[str],
        wrong: list[str],
        hostile: list[str],
        atol: float = 0.0,
    ) -> None:
        row = {
            "task_id": tid,
            "prompt": prompt,
            "entry_point": ep,
            "visible_tests": visible,
            "hidden_tests": {
                "entry_point": ep,
                "cases": [{"args": a} for a in inputs],
                "reference": reference,
                "atol": atol,
            },
        }
        samples = [correct[0], fence(correct[1]), *correct[2:], *wrong]
        samples += [HOSTILE[h].format(ep=ep) for h in hostile]
        out.append((row, samples))

    # 1. HumanEval/14: 1-2 MB of output per input
    lengths = [1400 + (600 * i) // max(1, heavy_inputs - 1) for i in range(heavy_inputs)]
    rng.shuffle(lengths)
    task(
        "Heavy/14_all_prefixes",
        "all_prefixes",
        'def all_prefixes(string: str) -> list:\n    """Return list of all prefixes from shortest to longest of the input string."""\n',
        ["assert all_prefixes('abc') == ['a', 'ab', 'abc']", "assert all_prefixes('') == []"],
        "def all_prefixes(string):\n    result = []\n    for i in range(len(string)):\n        result.append(string[:i + 1])\n    return result\n",
        [["".join(rng.choices(string.ascii_letters, k=n))] for n in lengths],
        [
            "def all_prefixes(string):\n    return [string[:i + 1] for i in range(len(string))]\n",
            "def all_prefixes(string):\n    out = []\n    for i in range(1, len(string) + 1):\n        out.append(string[:i])\n    return out\n",
            "def all_prefixes(s):\n    return list(map(lambda i: s[:i], range(1, len(s) + 1)))\n",
        ],
        [
            "def all_prefixes(string):\n    return [string[:i] for i in range(len(string))]\n",
            "def all_prefixes(string):\n    return [string[:i + 1] for i in range(len(string))][::-1]\n",
            "def all_prefixes(string):\n    return [string[:i + 1] for i in range(min(len(string), 1000))]\n",
        ],
        ["loop", "memory"],
    )
    # 2. a reference that prints a lot: ~2 MB of stdout over its inputs
    task(
        "Heavy/chatty_sum",
        "chatty_sum",
        'def chatty_sum(xs: list) -> int:\n    """Return the sum of xs."""\n',
        ["assert chatty_sum([1, 2, 3]) == 6", "assert chatty_sum([]) == 0"],
        "def chatty_sum(xs):\n    total = 0\n    for x in xs:\n        print('adding', x, 'to', total)\n        total += x\n    return total\n",
        [[[rng.randint(-1000, 1000) for _ in range(rng.randint(800, 1600))]] for _ in range(60)],
        [
            "def chatty_sum(xs):\n    return sum(xs)\n",
            "def chatty_sum(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t\n",
            "import functools, operator\ndef chatty_sum(xs):\n    return functools.reduce(operator.add, xs, 0)\n",
        ],
        [
            "def chatty_sum(xs):\n    return sum(xs[1:]) if len(xs) > 3 else sum(xs)\n",
            "def chatty_sum(xs):\n    return sum(abs(x) for x in xs)\n",
            "def chatty_sum(xs):\n    return max(xs, default=0) if len(xs) > 5 else sum(xs)\n",
        ],
        ["print", "fork"],
    )
    # 3. slow on some inputs: naive primality, ~0.7-1.7 s each on the six large ones
    small = [[rng.randint(0, 300)] for _ in range(40)]
    slow = [[n] for n in (18_000, 20_000, 22_000, 24_000, 26_000, 28_000)]
    task(
        "Heavy/count_primes",
        "count_primes",
        'def count_primes(n: int) -> int:\n    """How many primes are < n."""\n',
        ["assert count_primes(10) == 4", "assert count_primes(2) == 0"],
        "def count_primes(n):\n    count = 0\n    for k in range(2, n):\n        if all(k % d for d in range(2, k)):\n            count += 1\n    return count\n",
        small[:20] + slow + small[20:],
        [
            "def count_primes(n):\n    if n < 3:\n        return 0\n    sieve = bytearray([1]) * n\n    sieve[0] = sieve[1] = 0\n    for i in range(2, int(n ** 0.5) + 1):\n        if sieve[i]:\n            sieve[i * i::i] = bytearray(len(range(i * i, n, i)))\n    return sum(sieve)\n",
            "def count_primes(n):\n    primes = []\n    for k in range(2, n):\n        if all(k % p for p in primes if p * p <= k):\n            primes.append(k)\n    return len(primes)\n",
            "def count_primes(n):\n    return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k ** 0.5) + 1)))\n",
        ],
        [
            "def count_primes(n):\n    return sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, int(k ** 0.5) + 1)))\n",
            "def count_primes(n):\n    return sum(1 for k in range(1, n) if all(k % d for d in range(2, int(k ** 0.5) + 1)))\n",
            "def count_primes(n):\n    return n // 3\n",
        ],
        ["sleep", "exit"],
    )
    # 4. output order depends on the string hash seed
    cases: list[list[Any]] = [[[]], [["solo"]], [["same", "same", "same"]]]
    cases += [[_words(rng, rng.randint(4, 30))] for _ in range(37)]
    task(
        "Heavy/unique_words",
        "unique_words",
        'def unique_words(words: list) -> list:\n    """Return the distinct words of the list."""\n',
        ["assert sorted(unique_words(['a', 'b', 'a'])) == ['a', 'b']"],
        "def unique_words(words):\n    return list(set(words))\n",
        cases,
        [
            "def unique_words(words):\n    return list(set(words))\n",
            "def unique_words(words):\n    return sorted(set(words))\n",
            "def unique_words(words):\n    return list(dict.fromkeys(words))\n",
        ],
        [
            "def unique_words(words):\n    return words\n",
            "def unique_words(words):\n    return list(set(words))[:1]\n",
            "def unique_words(words):\n    return [w for w in set(words) if len(w) > 3]\n",
        ],
        ["fd3", "ctypes"],
    )
    # 5. the reference raises on some inputs
    task(
        "Heavy/checked_isqrt",
        "checked_isqrt",
        'def checked_isqrt(x: int) -> int:\n    """The integer square root of x; ValueError if x < 0."""\n',
        ["assert checked_isqrt(16) == 4", "assert checked_isqrt(17) == 4"],
        "import math\ndef checked_isqrt(x):\n    if x < 0:\n        raise ValueError('negative')\n    return math.isqrt(x)\n",
        [[rng.randint(-50, 10**6)] for _ in range(40)] + [[10**30 + 7], [-(10**12)]],
        [
            "import math\ndef checked_isqrt(x):\n    return math.isqrt(x)\n",
            "def checked_isqrt(x):\n    if x < 0:\n        raise ValueError(x)\n    lo, hi = 0, x + 1\n    while hi - lo > 1:\n        mid = (lo + hi) // 2\n        if mid * mid <= x:\n            lo = mid\n        else:\n            hi = mid\n    return lo\n",
            "import math\ndef checked_isqrt(x):\n    r = math.isqrt(max(x, 0))\n    return r\n",
        ],
        [
            "def checked_isqrt(x):\n    return int(max(x, 0) ** 0.5)\n",
            "def checked_isqrt(x):\n    return round(max(x, 0) ** 0.5)\n",
            "import math\ndef checked_isqrt(x):\n    return math.isqrt(x) + (x % 7 == 3)\n",
        ],
        ["loop", "print"],
    )
    # 6-12: ordinary HumanEval-like tasks
    task(
        "Heavy/53_add",
        "add",
        'def add(x: int, y: int) -> int:\n    """Add two numbers x and y."""\n',
        ["assert add(2, 3) == 5", "assert add(5, 7) == 12"],
        "def add(x, y):\n    return x + y\n",
        [[rng.randint(-1000, 1000), rng.randint(-1000, 1000)] for _ in range(50)],
        [
            "def add(x, y):\n    return x + y\n",
            "def add(x, y):\n    return y + x\n",
            "def add(x, y):\n    return sum((x, y))\n",
        ],
        [
            "def add(x, y):\n    return x + y if x > 0 else x - y\n",
            "def add(x, y):\n    return abs(x) + abs(y)\n",
            "def add(x, y):\n    return x + y + (x == y)\n",
        ],
        ["memory", "sleep"],
    )
    pal = [["".join(rng.choices("ab", k=rng.randint(0, 9)))] for _ in range(40)]
    pal += [["abcba"], ["xyzzyx"], ["aibohphobia"]]
    task(
        "Heavy/48_is_palindrome",
        "is_palindrome",
        'def is_palindrome(text: str) -> bool:\n    """Checks if given string is a palindrome."""\n',
        ["assert is_palindrome('aba') is True", "assert is_palindrome('zbcd') is False"],
        "def is_palindrome(text):\n    for i in range(len(text)):\n        if text[i] != text[len(text) - 1 - i]:\n            return False\n    return True\n",
        pal,
        [
            "def is_palindrome(text):\n    return text == text[::-1]\n",
            "def is_palindrome(text):\n    return all(text[i] == text[-1 - i] for i in range(len(text) // 2))\n",
            "def is_palindrome(text):\n    return list(text) == list(reversed(text))\n",
        ],
        [
            "def is_palindrome(text):\n    return text[:1] == text[-1:]\n",
            "def is_palindrome(text):\n    return text == text[::-1] and len(text) > 0\n",
            "def is_palindrome(text):\n    return 1 if text == text[::-1] else 0\n",
        ],
        ["fork", "exit"],
    )
    task(
        "Heavy/37_sort_even",
        "sort_even",
        'def sort_even(l: list) -> list:\n    """Sort the values at the even indices, keep the odd ones."""\n',
        [
            "assert sort_even([1, 2, 3]) == [1, 2, 3]",
            "assert sort_even([5, 6, 3, 4]) == [3, 6, 5, 4]",
        ],
        "def sort_even(l):\n    evens = sorted(l[::2])\n    odds = l[1::2]\n    ans = []\n    for e, o in zip(evens, odds):\n        ans.extend([e, o])\n    if len(evens) > len(odds):\n        ans.append(evens[-1])\n    return ans\n",
        [[[rng.randint(-50, 50) for _ in range(rng.randint(0, 15))]] for _ in range(50)],
        [
            "def sort_even(l):\n    out = list(l)\n    out[::2] = sorted(l[::2])\n    return out\n",
            "def sort_even(l):\n    ev = iter(sorted(l[::2]))\n    return [next(ev) if i % 2 == 0 else x for i, x in enumerate(l)]\n",
            "def sort_even(l):\n    res = l[:]\n    res[0::2] = sorted(res[0::2])\n    return res\n",
        ],
        [
            "def sort_even(l):\n    return sorted(l)\n",
            "def sort_even(l):\n    out = list(l)\n    out[1::2] = sorted(l[1::2])\n    return out\n",
            "def sort_even(l):\n    out = list(l)\n    out[::2] = sorted(l[::2], reverse=True)\n    return out\n",
        ],
        ["fd3", "memory"],
    )
    task(
        "Heavy/64_vowels_count",
        "vowels_count",
        'def vowels_count(s: str) -> int:\n    """Count a, e, i, o, u, and y only at the end."""\n',
        ["assert vowels_count('abcde') == 2", "assert vowels_count('ACEDY') == 3"],
        "def vowels_count(s):\n    n = sum(c in 'aeiouAEIOU' for c in s)\n    if s and s[-1] in 'yY':\n        n += 1\n    return n\n",
        [["".join(rng.choices("abcdeiouyAEY", k=rng.randint(0, 12)))] for _ in range(50)],
        [
            "def vowels_count(s):\n    n = sum(1 for c in s.lower() if c in 'aeiou')\n    return n + (s[-1:].lower() == 'y')\n",
            "def vowels_count(s):\n    n = len([c for c in s if c in 'aeiouAEIOU'])\n    if s.endswith(('y', 'Y')):\n        n += 1\n    return n\n",
            "def vowels_count(s):\n    count = 0\n    for c in s:\n        if c.lower() in 'aeiou':\n            count += 1\n    if s and s[-1].lower() == 'y':\n        count += 1\n    return count\n",
        ],
        [
            "def vowels_count(s):\n    return sum(c in 'aeiouy' for c in s.lower())\n",
            "def vowels_count(s):\n    return sum(c in 'aeiou' for c in s)\n",
            "def vowels_count(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        ],
        ["ctypes", "loop"],
    )
    task(
        "Heavy/52_below_threshold",
        "below_threshold",
        'def below_threshold(l: list, t: int) -> bool:\n    """True if all numbers in l are below t."""\n',
        [
            "assert below_threshold([1, 2, 4, 10], 100) is True",
            "assert below_threshold([1, 20, 4, 10], 5) is False",
        ],
        "def below_threshold(l, t):\n    for e in l:\n        if e >= t:\n            return False\n    return True\n",
        [
            [[rng.randint(0, 60) for _ in range(rng.randint(0, 8))], rng.randint(0, 60)]
            for _ in range(50)
        ],
        [
            "def below_threshold(l, t):\n    return all(x < t for x in l)\n",
            "def below_threshold(l, t):\n    return not any(x >= t for x in l)\n",
            "def below_threshold(l, t):\n    return max(l, default=t - 1) < t\n",
        ],
        [
            "def below_threshold(l, t):\n    return all(x <= t for x in l)\n",
            "def below_threshold(l, t):\n    return max(l) < t if l else False\n",
            "def below_threshold(l, t):\n    return sum(l) < t\n",
        ],
        ["sleep", "print"],
    )
    task(
        "Heavy/8_sum_product",
        "sum_product",
        'def sum_product(numbers: list) -> tuple:\n    """A tuple of the sum and the product of the numbers (0 and 1 when empty)."""\n',
        ["assert sum_product([]) == (0, 1)", "assert sum_product([1, 2, 3, 4]) == (10, 24)"],
        "def sum_product(numbers):\n    s, p = 0, 1\n    for n in numbers:\n        s += n\n        p *= n\n    return s, p\n",
        [[[rng.randint(-9, 9) for _ in range(rng.randint(0, 10))]] for _ in range(50)],
        [
            "import math\ndef sum_product(numbers):\n    return (sum(numbers), math.prod(numbers))\n",
            "def sum_product(numbers):\n    p = 1\n    for n in numbers:\n        p *= n\n    return sum(numbers), p\n",
            "from functools import reduce\ndef sum_product(numbers):\n    return sum(numbers), reduce(lambda a, b: a * b, numbers, 1)\n",
        ],
        [
            "import math\ndef sum_product(numbers):\n    return [sum(numbers), math.prod(numbers)]\n",
            "import math\ndef sum_product(numbers):\n    return (sum(numbers), math.prod(numbers) if numbers else 0)\n",
            "def sum_product(numbers):\n    return (sum(numbers), sum(numbers))\n",
        ],
        ["exit", "fork"],
    )
    task(
        "Heavy/4_mean_absolute_deviation",
        "mean_absolute_deviation",
        'def mean_absolute_deviation(numbers: list) -> float:\n    """Mean absolute deviation around the mean."""\n',
        ["assert abs(mean_absolute_deviation([1.0, 2.0, 3.0, 4.0]) - 1.0) < 1e-6"],
        "def mean_absolute_deviation(numbers):\n    mean = sum(numbers) / len(numbers)\n    return sum(abs(x - mean) for x in numbers) / len(numbers)\n",
        [
            [[round(rng.uniform(-100, 100), 3) for _ in range(rng.randint(1, 20))]]
            for _ in range(50)
        ],
        [
            "def mean_absolute_deviation(numbers):\n    m = sum(numbers) / len(numbers)\n    return sum(abs(x - m) for x in numbers) / len(numbers)\n",
            "import statistics\ndef mean_absolute_deviation(numbers):\n    m = statistics.fmean(numbers)\n    return statistics.fmean(abs(x - m) for x in numbers)\n",
            "def mean_absolute_deviation(numbers):\n    n = len(numbers)\n    m = sum(numbers) / n\n    return sum(map(lambda x: abs(x - m), numbers)) / n\n",
        ],
        [
            "import statistics\ndef mean_absolute_deviation(numbers):\n    return statistics.pstdev(numbers)\n",
            "def mean_absolute_deviation(numbers):\n    m = sum(numbers) / len(numbers)\n    return sum(abs(x - m) for x in numbers) / max(1, len(numbers) - 1)\n",
            "import statistics\ndef mean_absolute_deviation(numbers):\n    m = statistics.median(numbers)\n    return sum(abs(x - m) for x in numbers) / len(numbers)\n",
        ],
        ["loop", "ctypes"],
        atol=1e-6,
    )
    return out


def heavy_bytes(row: dict[str, Any]) -> int:
    """JSON bytes of all_prefixes' outputs on the task's inputs (computed from their lengths)."""
    total = 0
    for case in row["hidden_tests"]["cases"]:
        n = len(case["args"][0])
        total += n * (n + 1) // 2 + 3 * n + 1  # the characters, quotes and commas, brackets
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/heavy", help="output directory (default /tmp/heavy)")
    parser.add_argument(
        "--heavy-inputs",
        type=int,
        default=100,
        help="inputs of the 1-2 MB-per-output task (default 100)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pairs = tasks_and_samples(args.heavy_inputs, args.seed)
    out = Path(args.out)
    n = write_jsonl(out / "tasks.jsonl", [row for row, _ in pairs])
    m = write_jsonl(
        out / "samples.jsonl",
        [{"task_id": row["task_id"], "model": MODEL, "samples": s} for row, s in pairs],
    )
    print(f"{out / 'tasks.jsonl'}: {n} tasks; {out / 'samples.jsonl'}: {m} rows, model {MODEL}")
    for row, samples in pairs:
        extra = ""
        if row["entry_point"] == "all_prefixes":
            mb = heavy_bytes(row) / 1e6
            extra = f", reference outputs ~{mb:.0f} MB as JSON"
        print(
            f"  {row['task_id']}: {len(row['hidden_tests']['cases'])} hidden inputs, "
            f"{len(samples)} samples{extra}"
        )
    size = sum(len(json.dumps(row)) for row, _ in pairs) / 1e6
    print(f"  task file: {size:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
