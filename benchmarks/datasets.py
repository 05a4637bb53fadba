"""Readers for the third-party data in ``../shared/data`` (never copied into this repository).

The data directory is ``$FIRSTPASS_DATA`` if set, else ``<repo>/../shared/data``. Every reader
raises ``DataMissing`` with a message naming the path when the data is absent, so scripts and
tests can skip with that message.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DataMissing", "MbppPlusTask", "data_dir", "load_mbppplus"]

ROOT = Path(__file__).resolve().parent.parent


class DataMissing(FileNotFoundError):
    """The shared data set is not where we looked."""


def data_dir() -> Path:
    """Where the shared data lives: ``$FIRSTPASS_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("FIRSTPASS_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def _jsonl_gz(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        raise DataMissing(
            f"{path} not found: set FIRSTPASS_DATA to the shared data directory "
            "(it holds mbppplus/, mbpp/, specfix-llm-samples/)"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


@dataclass(frozen=True, kw_only=True)
class MbppPlusTask:
    """One MBPP+ task as stored (inputs are JSON-decoded: tuples arrive as lists)."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    asserts: tuple[str, ...]  # the original MBPP assert lines
    base_inputs: tuple[Any, ...]
    plus_inputs: tuple[Any, ...]
    atol: float

    @property
    def first_assert(self) -> str:
        return self.asserts[0]


def load_mbppplus(root: Path | None = None) -> list[MbppPlusTask]:
    """All MBPP+ tasks from ``mbppplus/MbppPlus.jsonl.gz`` (see its SOURCE.md and NOTES.md)."""
    path = (root or data_dir()) / "mbppplus" / "MbppPlus.jsonl.gz"
    tasks = []
    for row in _jsonl_gz(path):
        asserts = tuple(
            line.strip() for line in row["assertion"].splitlines() if line.strip().startswith("assert")
        )
        tasks.append(
            MbppPlusTask(
                task_id=row["task_id"],
                prompt=row["prompt"],
                entry_point=row["entry_point"],
                canonical_solution=row["canonical_solution"],
                asserts=asserts,
                base_inputs=tuple(json.loads(row["base_input"]) if isinstance(row["base_input"], str) else row["base_input"]),
                plus_inputs=tuple(json.loads(row["plus_input"]) if isinstance(row["plus_input"], str) else row["plus_input"]),
                atol=float(row.get("atol") or 0),
            )
        )
    return tasks
