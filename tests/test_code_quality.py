"""The package passes its linters as part of the test run, so CI enforces them: ruff over the
package, the calibration, the tests and the benchmarks, and mypy strict over the package and the
calibration (pyproject.toml holds both tools' settings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.timeout(300)
def test_ruff_finds_nothing() -> None:
    """`ruff check` is clean on every Python file of the project."""
    result = _run("ruff", "check", "firstpass", "calibration", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_mypy_strict_finds_nothing_in_the_package() -> None:
    """`mypy` (strict, from pyproject.toml) is clean on the package and the calibration."""
    result = _run("mypy", "firstpass", "calibration")
    assert result.returncode == 0, result.stdout + result.stderr
