"""Every code block in README.md runs as printed, or the README says why it is not run.

Each fenced block in README.md is preceded by a marker comment:

    <!-- snippet: NAME -->                      run by a test below
    <!-- snippet: NAME; not run: REASON -->     not run; the reason is listed as a skip

The snippets run in a throwaway "clone" directory holding what a clone of the repository gives
them (``firstpass.toml`` and the ``firstpass`` package with its demo data), with ``.venv`` pointing at the environment running
these tests, so ``.venv/bin/firstpass`` and ``.venv/bin/python`` are the commands the README
prints after its own install command. Commands are run by ``bash`` exactly as printed, with these
substitutions, each asserted to apply exactly once:

- the servers (``firstpass serve``) listen on a free port given through ``FIRSTPASS_PORT`` (the
  command itself is unchanged), and the Quickstart's Python snippet gets that port in place of
  ``127.0.0.1:8787``;
- ``rcpt_01J...`` in ``receipts show`` becomes the receipt id the Quickstart printed;
- the demo command's install steps (``python3 -m venv .venv && .venv/bin/pip install .``) need
  PyPI, so only the command they lead to (``.venv/bin/firstpass demo``) runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_process import serving

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_MARKER = re.compile(r"^<!-- snippet: ([a-z0-9-]+)(?:; not run: (.+?))? -->$")
_FENCE = re.compile(r"^```(\w*)\s*$")

#: the snippets the tests below run; every other block must say why it is not run
RUN = {
    "demo",
    "quickstart-serve",
    "quickstart-python",
    "quickstart-apis",
    "receipts",
    "init",
    "check",
    "test-spec-shapes",
    "config-errors",
    "calibration",
    "checks-python",
}

PORT_IN_README = "127.0.0.1:8787"
RECEIPT_PLACEHOLDER = "rcpt_01J..."
INSTALL_STEPS = "python3 -m venv .venv && .venv/bin/pip install . && "


@dataclass(frozen=True)
class Snippet:
    name: str | None  # None: a block without a marker
    lang: str
    text: str
    line: int  # of the opening fence, 1-based
    not_run: str | None  # the README's reason, for blocks it marks as not run


def readme_snippets() -> list[Snippet]:
    """Every fenced block of README.md with the marker before it (blank lines and other
    HTML comments may stand between the marker and the fence)."""
    lines = README.read_text(encoding="utf-8").split("\n")
    found: list[Snippet] = []
    marker: re.Match[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            found.append(
                Snippet(
                    name=marker.group(1) if marker else None,
                    lang=fence.group(1),
                    text="\n".join(body) + "\n",
                    line=start + 1,
                    not_run=marker.group(2) if marker else None,
                )
            )
            marker = None
        elif m := _MARKER.match(line.strip()):
            marker = m
        elif line.strip() and not line.strip().startswith("<!--"):
            marker = None  # a marker applies only to the block right after it
        i += 1
    return found


def snippet(name: str) -> Snippet:
    matches = [s for s in readme_snippets() if s.name == name]
    assert len(matches) == 1, f"README.md has {len(matches)} snippets named {name!r}"
    assert matches[0].not_run is None, f"README.md marks {name!r} as not run"
    return matches[0]


def commands(block: Snippet) -> list[str]:
    """The block's command lines (each runs in its own shell, as typed at a prompt)."""
    return [line for line in block.text.splitlines() if line.strip()]


def _not_run() -> list[Snippet]:
    return [s for s in readme_snippets() if s.not_run is not None]


# ---- the clone: what the snippets see after the README's install command ---------------------


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """What the snippets see in a clone (firstpass.toml and the package with its demo data),
    with ``.venv`` → the environment running this test."""
    root = tmp_path / "clone"
    root.mkdir()
    shutil.copy(ROOT / "firstpass.toml", root / "firstpass.toml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "firstpass", root / "firstpass", ignore=ignore)
    prefix = Path(sys.prefix)
    if sys.prefix != sys.base_prefix and (prefix / "bin" / "firstpass").exists():
        (root / ".venv").symlink_to(prefix, target_is_directory=True)
    else:  # not in a venv with the console script: stand-ins that run this interpreter
        bin_dir = root / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        for name, argv in (("firstpass", "-m firstpass"), ("python", "")):
            script = bin_dir / name
            script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {argv} "$@"\n')
            script.chmod(0o755)
    return root


def run(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """One command line, in bash, as a user would type it."""
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_quickstart_python(clone: Path, port: int) -> subprocess.CompletedProcess[str]:
    """Save the Quickstart's Python snippet as quickstart.py (port substituted) and run it with
    `.venv/bin/python quickstart.py`, as the README says."""
    code = snippet("quickstart-python").text
    assert code.count(PORT_IN_README) == 1, "the Quickstart names its port once"
    (clone / "quickstart.py").write_text(code.replace(PORT_IN_README, f"127.0.0.1:{port}"))
    return run(".venv/bin/python quickstart.py", clone)


def assert_quickstart_served(result: subprocess.CompletedProcess[str]) -> str:
    """The Quickstart printed a verified answer from the cheap rung; returns its receipt id."""
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "def is_palindrome" in out, out
    for shown in ("'action': 'served'", "'served_model': 'replay/demo-cheap'", "'gate': 'passed'"):
        assert shown in out, out
    last = out.strip().splitlines()[-1]
    match = re.fullmatch(r"served (rcpt_\w+)", last)
    assert match, out
    return match.group(1)


# ---- the tests ---------------------------------------------------------------------------------


def test_every_readme_code_block_is_run_here_or_says_why_not() -> None:
    """Each block has a marker; names are unique; the run ones are exactly those tested here."""
    blocks = readme_snippets()
    unmarked = [f"README.md line {s.line}" for s in blocks if s.name is None]
    assert not unmarked, f"code blocks without a <!-- snippet: ... --> marker: {unmarked}"
    names = [s.name for s in blocks]
    assert len(names) == len(set(names)), f"snippet names repeat: {names}"
    run_here = {s.name for s in blocks if s.not_run is None}
    assert run_here == RUN, (
        f"README snippets without a test: {run_here - RUN}; tests without a snippet: "
        f"{RUN - run_here}"
    )


@pytest.mark.parametrize("name", [s.name for s in _not_run()])
def test_readme_snippets_not_run_here(name: str) -> None:
    """Lists (as skips) the README blocks that are not run offline, with the README's reason."""
    (block,) = [s for s in _not_run() if s.name == name]
    pytest.skip(f"README snippet {name!r} (line {block.line}) not run: {block.not_run}")


@pytest.mark.e2e
def test_demo_command_runs_after_its_install_steps(clone: Path) -> None:
    """`.venv/bin/firstpass demo` (the demo command after its install steps) shows a verified
    chain of 12 receipts."""
    (command,) = commands(snippet("demo"))
    assert command.startswith(INSTALL_STEPS), command
    result = run(command.removeprefix(INSTALL_STEPS), clone)
    assert result.returncode == 0, result.stderr
    assert "receipt chain: ok, 12 receipts" in result.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_quickstart_serves_a_verified_answer_and_its_receipt_checks_out(clone: Path) -> None:
    """Serve as printed, run the Python snippet with the real openai SDK, stop with Ctrl-C; then
    the receipts commands verify, summarise and show the Quickstart's receipt."""
    (serve,) = commands(snippet("quickstart-serve"))
    with serving(serve, clone) as server:
        receipt_id = assert_quickstart_served(run_quickstart_python(clone, server.port))
    assert server.proc.returncode == 0, server.output
    assert "Traceback" not in server.output

    verify, summary, show = commands(snippet("receipts"))
    assert show.count(RECEIPT_PLACEHOLDER) == 1
    show = show.replace(RECEIPT_PLACEHOLDER, receipt_id)

    verified = run(verify, clone)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("ok: 1 receipts"), verified.stdout
    summarised = run(summary, clone)
    assert summarised.returncode == 0, summarised.stderr
    assert "actions: served 1" in summarised.stdout, summarised.stdout
    shown = run(show, clone)
    assert shown.returncode == 0, shown.stderr
    receipt = json.loads(shown.stdout)
    assert receipt["id"] == receipt_id
    assert receipt["decision"]["action"] == "served"


def test_the_quickstart_task_is_served_alike_through_responses_and_messages(clone: Path) -> None:
    """The README's Responses and Messages snippet, run as printed against the Quickstart's
    server with the real openai and anthropic SDKs, prints the verdict the chat request gets,
    and the receipts record each API."""
    (serve,) = commands(snippet("quickstart-serve"))
    code = snippet("quickstart-apis").text
    assert code.count(PORT_IN_README) == 2, "each client names the port"
    with serving(serve, clone) as server:
        script = code.replace(PORT_IN_README, f"127.0.0.1:{server.port}")
        (clone / "quickstart_apis.py").write_text(script)
        result = run(".venv/bin/python quickstart_apis.py", clone)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["responses served verified", "messages served verified"]
    receipts = [json.loads(line) for line in (clone / "receipts.jsonl").read_text().splitlines()]
    dialects = [r["request"]["dialect"] for r in receipts if "request" in r]
    assert dialects == ["responses", "messages"]


@pytest.mark.e2e
@pytest.mark.slow
def test_init_writes_a_starter_that_serves_the_quickstart(clone: Path) -> None:
    """`firstpass init --path starter.toml` writes a config the Quickstart works against, and
    refuses to overwrite it a second time."""
    init, serve = commands(snippet("init"))
    written = run(init, clone)
    assert written.returncode == 0, written.stderr
    assert "next: .venv/bin/firstpass serve --config starter.toml" in written.stdout
    assert (clone / "starter.toml").is_file()
    with serving(serve, clone) as server:
        assert_quickstart_served(run_quickstart_python(clone, server.port))
    assert server.proc.returncode == 0, server.output

    again = run(init, clone)
    assert again.returncode == 2
    assert "already exists; pass --force" in again.stderr, again.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_check_snippet_passes_its_own_sample(clone: Path) -> None:
    """The `firstpass check` snippet writes an answer and a spec and reports them passing."""
    for command in commands(snippet("check")):
        result = run(command, clone)
        assert result.returncode == 0, f"{command}\n{result.stdout}{result.stderr}"
    assert "1/1 passed" in result.stdout, result.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_every_test_spec_shape_in_the_readme_is_accepted_by_firstpass_check(clone: Path) -> None:
    """Each JSON shape shown (minus its `//` comment) passes `firstpass check` on a correct add."""
    shapes = [line.split("//")[0].strip() for line in commands(snippet("test-spec-shapes"))]
    assert len(shapes) >= 4
    (clone / "answer.md").write_text("def add(a, b):\n    return a + b\n")
    for shape in shapes:
        (clone / "tests.json").write_text(shape)
        result = run(".venv/bin/firstpass check --code answer.md --tests tests.json --json", clone)
        assert result.returncode == 0, f"{shape}\n{result.stdout}{result.stderr}"
        assert json.loads(result.stdout)["passed"] is True


_EXAMPLE = re.compile(r"^# ---- example: (.*?) -+\n(.*?)^# ---- end -+$", re.M | re.S)


def _with_openai_example(text: str) -> str:
    """The shipped config with its OpenAI example uncommented (one leading "#" removed)."""
    blocks = {m.group(1): m.group(2) for m in _EXAMPLE.finditer(text)}
    (name,) = [n for n in blocks if n.startswith("OpenAI")]
    lines = blocks[name].splitlines()
    return text + "\n" + "\n".join(line[1:] if line.startswith("#") else line for line in lines)


@pytest.mark.e2e
@pytest.mark.slow
def test_config_error_examples_are_what_serve_prints(clone: Path) -> None:
    """Each error line shown is exactly what `firstpass serve` prints (exit 2) for that mistake
    in the shipped config."""
    shipped = (clone / "firstpass.toml").read_text()
    with_openai = _with_openai_example(shipped)
    demo_ladder = '\nladder = ["replay/demo-cheap", "replay/demo-strong"]'  # route[0]'s
    assert shipped.count("\nport = 8787") == 1 and shipped.count(demo_ladder) == 1
    mistakes = {  # README line -> (the config with that mistake, extra environment)
        'route[0].ladder[1]: unknown provider "opnai" (known: replay, openai)': (
            with_openai.replace(demo_ladder, demo_ladder.replace("replay/demo-strong", "opnai/x")),
            {"OPENAI_API_KEY": "sk-test"},
        ),
        'server.prot: unknown key (did you mean "port"?)': (
            shipped.replace("\nport = 8787", "\nprot = 8787"),
            {},
        ),
        "provider[1].api_key_env: environment variable OPENAI_API_KEY is not set": (
            with_openai,
            {},
        ),
    }
    shown = commands(snippet("config-errors"))
    assert set(shown) == set(mistakes), "README's config errors changed: update this test"
    for line, (text, env) in mistakes.items():
        (clone / "bad.toml").write_text(text)
        result = run(".venv/bin/firstpass serve --config bad.toml", clone, **env)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip() == f"firstpass serve: {line}", result.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_calibration_snippet_labels_the_demo_and_reports_what_it_certifies(clone: Path) -> None:
    """Shadow receipts from the demo, then `firstpass calibrate` on them: it verifies the chain,
    writes a calibration file and, on a dozen requests, says that nothing is certified."""
    results = [run(command, clone) for command in commands(snippet("calibration"))]
    for command, result in zip(commands(snippet("calibration")), results, strict=True):
        assert result.returncode == 0, f"{command}\n{result.stdout}{result.stderr}"
    report = results[-1].stdout
    assert "hash chain verified" in report and "none certified" in report, report
    doc = json.loads((clone / "calibration.json").read_text())
    assert doc["certificates"] == [] and doc["uncertified"], doc


@pytest.mark.e2e
def test_checks_python_snippet_prints_what_its_comment_says(clone: Path) -> None:
    """The library example runs as printed and prints the line its last comment shows."""
    block = snippet("checks-python")
    expected = block.text.strip().splitlines()[-1].removeprefix("# ")
    done = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-c", block.text],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_the_init_snippet_says_to_stop_the_quickstart_server_first() -> None:
    """The starter listens on 8787, the port the Quickstart's server still holds: the text
    before the `init` snippet says to stop that server first (it did not, and the second server
    failed to bind)."""
    text = README.read_text(encoding="utf-8")
    before = text[: text.index("<!-- snippet: init -->")]
    paragraph = before.rstrip().rsplit("\n\n", 1)[-1]
    assert "stop\nthe Quickstart's server first" in paragraph or (
        "stop the Quickstart's server first" in " ".join(paragraph.split())
    ), paragraph
    assert "8787" in paragraph


DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_each_page_says_near_its_top_that_bare_commands_assume_the_venv(page: Path) -> None:
    """The README and each docs page write `firstpass ...`/`python ...` bare; each says, before
    its first section, that those assume the project's venv is active and how to do without."""
    top = page.read_text(encoding="utf-8").split("\n## ", 1)[0]
    said = " ".join(top.replace("\n> ", "\n").split())  # a block quote's lines joined
    assert "assume the project's virtualenv is active" in said, page
    assert "source .venv/bin/activate" in said and ".venv/bin/firstpass" in said, page
