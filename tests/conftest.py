"""Shared test hygiene: a scrubbed environment and the live-server fixtures.

Every test starts without provider keys or Firstpass overrides in its environment, so nothing a
developer has exported can change a result or leak into a sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

pytest_plugins = ["tests.stub_upstream"]

_SCRUB_PREFIXES = ("FIRSTPASS_", "OPENAI_", "ANTHROPIC_", "GROQ_", "TOGETHER_")


@pytest.fixture(autouse=True)
def _scrubbed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_SCRUB_PREFIXES) and name != "FIRSTPASS_DATA":
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def live_stack(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: ``live_stack(**config)`` starts a stub upstream + Firstpass; closed at teardown."""
    from tests.server_harness import LiveStack

    stacks: list[LiveStack] = []

    def start(**kwargs: Any) -> LiveStack:
        stack = LiveStack(tmp_path / f"receipts-{len(stacks)}.jsonl", **kwargs)
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.close()


@pytest.fixture
def blockbuster() -> Iterator[BlockBuster]:
    """Fail the test if anything blocks the event loop."""
    with blockbuster_ctx() as bb:
        yield bb
