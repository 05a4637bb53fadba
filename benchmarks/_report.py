"""What every benchmark report shares: the provenance header, cluster-bootstrap intervals, I/O.

Intervals are percentile bootstraps that resample *tasks* (with all their draws or requests), not
rows: draws of one task are correlated, and treating them as independent would make the
intervals too narrow.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "RESULTS",
    "bootstrap_ci",
    "header",
    "load_inputs",
    "machine",
    "pct",
    "percentile",
    "revision",
    "write_text",
]

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    """One line naming the hardware and software the numbers come from."""
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def revision() -> str:
    """The git commit the code ran at, ``+ uncommitted changes`` when the tree is dirty (blocking)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, text=True,
                               capture_output=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if dirty else "")


def header(title: str, command: str, extra: Sequence[str] = ()) -> list[str]:
    """The markdown head of a results file: the command, the date, the code and the machine."""
    return [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- code: {revision()}",
        f"- machine: {machine()}",
        *[f"- {line}" for line in extra],
        "",
    ]


def bootstrap_ci(
    groups: int,
    statistic: Callable[[npt.NDArray[np.int64]], float],
    *,
    reps: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of ``statistic(indices)`` over ``reps`` resamples of ``groups`` groups.

    ``statistic`` receives an index array (with repeats) of the groups in one resample; NaN
    values (an empty regime in that resample) are left out.
    """
    if groups == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, groups, groups)) for _ in range(reps)])
    values = values[~np.isnan(values)]
    if values.size == 0:
        return (float("nan"), float("nan"))
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return (float(lo), float(hi))


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); NaN for no data."""
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


def pct(x: float | None, digits: int = 1) -> str:
    """A share as a percentage, ``-`` when unknown."""
    if x is None or x != x:
        return "-"
    return f"{100 * x:.{digits}f}%"


def write_text(path: Path, text: str) -> None:
    """Write a results file (blocking: scripts call it after their event loop ends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def load_inputs(tasks_path: Path, samples_paths: Sequence[Path]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Tasks and one ``task_id -> row`` mapping per sample file (blocking)."""
    from benchmarks.datasets import load_sample_rows, load_tasks

    return load_tasks(tasks_path), [load_sample_rows(p) for p in samples_paths]


def dump_json(path: Path, obj: Any) -> None:
    """Write JSON with NaN spelled as null."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and x != x:
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(obj), indent=2) + "\n", encoding="utf-8")
