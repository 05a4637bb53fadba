"""The bundled demo: a small data set written by Firstpass itself, and the offline demo runner.

The data set (``tasks.jsonl``, ``samples.jsonl``) is DEMO DATA, not a benchmark: a dozen small
Python tasks and hand-written answers from two made-up models, arranged so that one offline run
shows every decision the proxy can make. The package carries only the two files; their source,
which writes and documents them, is ``tests/demo_dataset.py`` in the repository
(``python -m tests.demo_dataset --write``), and tests/test_demo_dataset.py checks both.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SAMPLES_PATH", "TASKS_PATH"]

#: the demo tasks: prompt, visible assert, hidden cases (package data)
TASKS_PATH = Path(__file__).with_name("tasks.jsonl")
#: the recorded answers of ``demo-cheap`` and ``demo-strong``, for the replay provider
SAMPLES_PATH = Path(__file__).with_name("samples.jsonl")
