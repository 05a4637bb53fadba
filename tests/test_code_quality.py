"""The package passes its linters as part of the test run, so CI enforces them: ruff (lint and
format) over the package (the calibration included), the tests and the benchmarks, and mypy over the package
(strict) and the tests (strict about what a test does, not about annotating its fixtures).
pyproject.toml holds both tools' settings."""

from __future__ import annotations

import subprocess
import sys
import tomllib
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
    result = _run("ruff", "check", "firstpass", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_every_file_is_formatted_as_ruff_format_writes_it() -> None:
    """`ruff format --check` is clean: one layout, so a diff shows only what changed."""
    result = _run("ruff", "format", "--check", "firstpass", "tests", "benchmarks")
    assert result.returncode == 0, (
        "run `ruff format firstpass tests benchmarks`:\n" + result.stdout + result.stderr
    )


@pytest.mark.timeout(300)
def test_mypy_finds_nothing_in_the_package_or_the_tests() -> None:
    """`mypy firstpass tests` is clean: the package strict (the calibration included), the
    tests under pyproject.toml's override for ``tests.*`` (bodies checked in full, test and
    fixture signatures need no annotations). One run, so both see the same package types."""
    result = _run("mypy", "firstpass", "tests")
    assert result.returncode == 0, "mypy firstpass tests:\n" + result.stdout + result.stderr


def test_mypy_overrides_leave_the_package_strict() -> None:
    """pyproject.toml's mypy overrides relax only the tests' signatures (and silence the
    benchmark scripts the tests import); none of them reaches the package."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["mypy"]
    assert config["strict"] is True
    overridden = {m for o in config.get("overrides", []) for m in o["module"]}
    assert not {m for m in overridden if m.split(".")[0] == "firstpass"}, overridden
