"""A ``command`` check that abstains shows the tail of its stderr: why the grader failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: e2e: `firstpass check` runs as its own process, as a user debugging a grader runs it
pytestmark = pytest.mark.e2e

#: the most of stderr a reason carries, as docs/checks.md states it
STDERR_CHARS = 600


def check(tmp_path: Path, grader: str, *extra: str) -> dict[str, Any]:
    """`firstpass check --kind command --json` on a grader script; its one result."""
    script = tmp_path / "grade.py"
    script.write_text(grader, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "firstpass", "check", "--kind", "command", "--json",
         "--command", sys.executable, "--command", str(script), *extra, "--answer", "-"],
        input="an answer",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


CRASH = """\
import json, sys
doc = json.load(sys.stdin)
print("loading rubric", file=sys.stderr)
doc["expected_field"]
"""


def test_a_crashing_grader_shows_the_end_of_its_traceback(tmp_path: Path) -> None:
    """It said only "python exited with 1"; now the reason ends with the traceback's last
    lines, the exception itself last."""
    result = check(tmp_path, CRASH)
    assert result["verdict"] == "abstain" and result["category"] == "check_error"
    (reason,) = result["reasons"]
    assert " exited with 1; stderr: Traceback (most recent call last): | " in reason
    assert reason.endswith("KeyError: 'expected_field'"), reason
    assert "\n" not in reason


@pytest.mark.parametrize(
    ("grader", "starts"),
    [
        ('import sys\nsys.stderr.write("no rubric file\\n")\nprint("not json")\n',
         'did not print a JSON object like {"verdict": "pass"}; stderr: no rubric file'),
        ('import sys, time\nsys.stderr.write("waiting for the rubric\\n")\nsys.stderr.flush()\n'
         "time.sleep(600)\n",
         "no verdict within 2 s; stderr: waiting for the rubric"),
    ],
    ids=["no-verdict", "timeout"],
)  # fmt: skip
def test_every_abstain_shows_stderr_even_at_the_timeout(
    tmp_path: Path, grader: str, starts: str
) -> None:
    """What a grader said before printing no verdict, or before it was killed at its timeout."""
    extra = ("--timeout", "2") if "sleep" in grader else ()
    (reason,) = check(tmp_path, grader, *extra)["reasons"]
    assert reason == starts


def test_stderr_in_a_reason_is_bounded_and_on_one_line(tmp_path: Path) -> None:
    """Megabytes of stderr, control characters included: the reason keeps a short tail."""
    grader = (
        "import sys\n"
        "for i in range(200_000):\n"
        "    sys.stderr.write(f'noise {i} \\x1b[31m\\n')\n"
        "sys.stderr.write('the last word\\n')\n"
        "raise SystemExit(4)\n"
    )
    (reason,) = check(tmp_path, grader)["reasons"]
    said = reason.split("; stderr: ", 1)[1]
    assert len(said) <= STDERR_CHARS and said.endswith("the last word")
    assert "\x1b" not in reason and "\n" not in reason


def test_a_fail_verdict_gives_the_graders_own_reason_only(tmp_path: Path) -> None:
    """A verdict's reason may go back to the model as revision feedback: stderr stays out."""
    grader = (
        "import json, sys\n"
        "sys.stderr.write('debug: expected 42\\n')\n"
        "print(json.dumps({'verdict': 'fail', 'reason': 'wrong total'}))\n"
    )
    result = check(tmp_path, grader)
    assert result["verdict"] == "fail" and result["reasons"] == ["wrong total"]
