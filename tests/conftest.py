"""Shared test hygiene: a scrubbed environment and the live-server fixtures.

Every test starts without provider keys or Firstpass overrides in its environment, so nothing a
developer has exported can change a result or leak into a sandbox.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

pytest_plugins = ["tests.stub_upstream", "tests.pg_server", "tests.live_model"]

_SCRUB_PREFIXES = ("FIRSTPASS_", "OPENAI_", "ANTHROPIC_", "GROQ_", "TOGETHER_")


@pytest.fixture(autouse=True)
def _scrubbed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_SCRUB_PREFIXES) and name != "FIRSTPASS_DATA":
            monkeypatch.delenv(name, raising=False)


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (pytest swaps it per test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _quiet_structlog() -> None:
    """structlog for tests: warnings and errors only, to the stderr pytest captures. An
    in-process server logs each ``request`` event in a callback that may run after its test
    returned, outside any capture: at info level those lines landed in pytest's own output.
    Tests that read the log configure their own (``configure_logging(..., stream=...)``)."""
    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Every test starts and ends with the quiet test logging and no background log writer: a
    test that configured logging (an in-process ``firstpass`` command, a JSON log fixture) must
    not leave later tests' in-process servers writing to a stream of its choosing."""
    from firstpass.logs import close_logging

    close_logging()
    _quiet_structlog()
    yield
    close_logging()
    _quiet_structlog()


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


@pytest.fixture(autouse=True)
def _no_cpu_timer_left() -> Iterator[None]:
    """A test that runs the sandbox's child code in this process (the judge's link) may arm a
    CPU-time timer; one left armed would end the whole run with SIGPROF minutes later, far
    from its cause. Disarm it here and fail the test that left it."""
    yield
    left = signal.getitimer(signal.ITIMER_PROF)[0]
    if left:
        signal.setitimer(signal.ITIMER_PROF, 0)
        pytest.fail(f"the test left a CPU-time timer armed ({left:.3f} s): disarm it")
