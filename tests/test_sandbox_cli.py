"""The ``firstpass check`` command: per-test output, JSON shape, exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: e2e: every test runs `firstpass check` as its own process
pytestmark = pytest.mark.e2e

GOOD = "Here is my answer:\n```python\ndef f(x):\n    return x + 1\n```\n"
BAD = "def f(x):\n    return x\n"


def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "firstpass", "check", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def tests_file(tmp_path: Path) -> Path:
    path = tmp_path / "tests.json"
    path.write_text(json.dumps(["assert f(1) == 2", "assert f(2) == 3"]))
    return path


def test_passing_code_prints_results_and_exits_zero(tmp_path: Path, tests_file: Path) -> None:
    """A passing answer prints each test, the isolation level, and exits 0."""
    code = tmp_path / "answer.md"
    code.write_text(GOOD)
    proc = check("--code", str(code), "--tests", str(tests_file))
    assert proc.returncode == 0, proc.stderr
    assert "test 0: PASS" in proc.stdout and "test 1: PASS" in proc.stdout
    assert "2/2 passed" in proc.stdout and "isolation" in proc.stdout


def test_failing_code_from_stdin_prints_json_and_exits_one(tests_file: Path) -> None:
    """--code - reads stdin; --json prints one object with the documented keys; failure exits 1."""
    proc = check("--code", "-", "--tests", str(tests_file), "--json", stdin=BAD)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert {"passed", "n_passed", "n_total", "category", "isolation", "tests"} <= set(data)
    assert (data["passed"], data["n_passed"], data["n_total"], data["category"]) == (
        False,
        0,
        2,
        "assertion_failed",
    )
    assert data["tests"][0]["message"] == "assertion failed: f(1) -> 1"


def test_cases_spec_with_entry_point_flag(tmp_path: Path) -> None:
    """A cases spec runs against the entry point named on the command line."""
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps({"cases": [{"args": [1], "expected": 2}]}))
    proc = check("--code", "-", "--tests", str(spec), "--entry-point", "f", "--json", stdin=GOOD)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["category"] is None


def test_malformed_spec_is_a_one_line_error_naming_the_field(tmp_path: Path) -> None:
    """A bad spec exits 2 with a one-line message that names the field."""
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"asserts": ["assert f(1) == 2", 7]}))
    proc = check("--code", "-", "--tests", str(spec), stdin=GOOD)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "firstpass check: asserts[1]: must be a string, not int"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "flag", "message"),
    [
        (b"\xff\xfe not text", "--code", "firstpass check: --code: {path} is not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "--tests", "nested too deeply to be a test spec"),
    ],
    ids=["binary code file", "deeply nested tests"],
)
def test_unreadable_inputs_are_one_line_errors(
    tmp_path: Path, tests_file: Path, content: bytes, flag: str, message: str
) -> None:
    """A code file that is not UTF-8, or a tests file nested past the parser's limit, exits 2
    with a one-line message instead of a traceback."""
    bad = tmp_path / "bad"
    bad.write_bytes(content)
    code = str(bad) if flag == "--code" else str(tmp_path / "code.py")
    (tmp_path / "code.py").write_text(GOOD)
    tests = str(bad) if flag == "--tests" else str(tests_file)
    proc = check("--code", code, "--tests", tests)
    assert proc.returncode == 2
    assert message.format(path=bad) in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["inf", "-1", "0"])
def test_a_timeout_outside_a_day_is_refused_naming_the_flag(
    tmp_path: Path, tests_file: Path, value: str
) -> None:
    """--timeout inf, -1 or 0 exits 2 naming --timeout (what the user typed), no traceback."""
    proc = check("--code", "-", "--tests", str(tests_file), "--timeout", value, stdin=GOOD)
    assert proc.returncode == 2
    assert "--timeout: must be a number of seconds in (0, 86400]" in proc.stderr
    assert "Traceback" not in proc.stderr and "limits." not in proc.stderr


def test_a_sample_cannot_forge_pass_lines_with_terminal_escapes(tmp_path: Path) -> None:
    """A message quoting the sample's exception text is printed with its control characters
    escaped: no carriage return, cursor move or newline of the sample's reaches the terminal."""
    forged = "\r\x1b[2K\x1b[1Atest 0: PASS\ntest 1: PASS\n2/2 passed"
    code = tmp_path / "answer.py"
    code.write_text(f"def f(x):\n    raise ValueError({forged!r})\n")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps(["assert f(1) == 2"]))
    proc = check("--code", str(code), "--tests", str(tests))
    assert proc.returncode == 1
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("test 0: FAIL runtime_error - ValueError: \\r\\x1b[2K")
    assert not any(line.startswith("test 1") for line in lines), lines
