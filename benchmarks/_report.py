"""What every benchmark report shares: the provenance header, cluster-bootstrap intervals and
rate tables, the output flags and I/O.

Intervals are percentile bootstraps that resample *tasks* (with all their draws or requests), not
rows: draws of one task are correlated, and treating them as independent would make the
intervals too narrow.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "RESULTS",
    "add_output_flags",
    "bootstrap_ci",
    "command_line",
    "dump_json",
    "header",
    "load_inputs",
    "machine",
    "pct",
    "pct_ci",
    "percentile",
    "publish",
    "rate_table",
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


def _git(*args: str) -> str:
    """One read-only git command in the repository; its output, stripped (blocking)."""
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        ["git", *args], cwd=root, text=True, capture_output=True, timeout=10, check=True
    )
    return run.stdout.strip()


def revision() -> str:
    """The git commit the code ran at, ``+ uncommitted changes`` when the tree is dirty (blocking)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain")
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


def rate_table(
    masks: dict[str, npt.NDArray[np.bool_]],
    ok: npt.NDArray[np.bool_],
    *,
    rate: str,
    seed: int = 0,
    reps: int = 1000,
) -> dict[str, dict[str, Any]]:
    """Per mask over (tasks, draws) arrays: its share of draws and the rate of ``ok`` within it.

    Each row has ``n``, ``share``, ``share_ci``, ``<rate>`` and ``<rate>_ci``; the intervals
    resample tasks (:func:`bootstrap_ci`), with ``seed`` for the shares and ``seed + 1`` for the
    rates. A rate is NaN where its mask holds no draw.
    """
    tasks, draws = ok.shape
    out: dict[str, dict[str, Any]] = {}
    for name, m in masks.items():
        n, good = m.sum(axis=1), (m & ok).sum(axis=1)  # per task

        def share(idx: npt.NDArray[np.int64], n: Any = n) -> float:
            return float(n[idx].sum() / (idx.size * draws))

        def within(idx: npt.NDArray[np.int64], n: Any = n, good: Any = good) -> float:
            tot = n[idx].sum()
            return float(good[idx].sum() / tot) if tot else float("nan")

        total = int(n.sum())
        out[name] = {
            "n": total,
            "share": total / (tasks * draws) if tasks else float("nan"),
            "share_ci": list(bootstrap_ci(tasks, share, reps=reps, seed=seed)),
            rate: float(good.sum() / total) if total else float("nan"),
            f"{rate}_ci": list(bootstrap_ci(tasks, within, reps=reps, seed=seed + 1)),
        }
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); NaN for no data."""
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


def pct(x: float | None, digits: int = 1) -> str:
    """A share as a percentage, ``-`` when unknown."""
    if x is None or x != x:
        return "-"
    return f"{100 * x:.{digits}f}%"


def pct_ci(interval: Sequence[float | None]) -> str:
    """An interval of shares as ``lo – hi`` percentages."""
    return f"{pct(interval[0])} – {pct(interval[1])}"


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command a results file names: ``python -m <module>`` and its arguments."""
    return f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)


def add_output_flags(parser: argparse.ArgumentParser, *, md_default: str) -> None:
    """The ``--json``, ``--md`` and ``--no-md`` flags that :func:`publish` reads."""
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--md", help=f"write the markdown report here (default {md_default})")
    parser.add_argument("--no-md", action="store_true", help="do not write the markdown report")


def publish(
    args: argparse.Namespace, md: str, default_md: Path, doc: dict[str, Any] | None = None
) -> None:
    """Print the report, and write it and the JSON as the ``--md``, ``--no-md``, ``--json``
    flags say (blocking: scripts call it after their event loop ends)."""
    print(md)
    if doc is not None and args.json:
        dump_json(Path(args.json), doc)
    if not args.no_md:
        write_text(Path(args.md) if args.md else default_md, md)


def write_text(path: Path, text: str) -> None:
    """Write a results file (blocking: scripts call it after their event loop ends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def load_inputs(
    tasks_path: Path, samples_paths: Sequence[Path]
) -> tuple[list[Any], list[dict[str, Any]]]:
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
