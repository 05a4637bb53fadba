"""`firstpass init` writes a starter config that serves offline; `serve` without one says what to do."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from firstpass.config import load_config
from firstpass.demo import SAMPLES_PATH
from tests.cli_process import serving

#: e2e: every test runs `firstpass init` or `firstpass serve` as its own process
pytestmark = pytest.mark.e2e

FIRSTPASS = f"{shlex.quote(sys.executable)} -m firstpass"
FAKE_KEYS = {
    "OPENAI_API_KEY": "sk-test",
    "GROQ_API_KEY": "gsk-test",
    "ANTHROPIC_API_KEY": "sk-ant-test",
}

_EXAMPLE = re.compile(r"^# ---- example: (.*?) -+\n(.*?)^# ---- end -+$", re.M | re.S)


def examples(text: str) -> dict[str, str]:
    """The example blocks of a config file: name -> body."""
    return {m[1]: m[2] for m in _EXAMPLE.finditer(text)}


def firstpass(args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m firstpass ARGS` in ``cwd``, as a user's shell would run it."""
    return subprocess.run(
        ["bash", "-c", f"{FIRSTPASS} {args}"],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def next_command(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("next: ")]
    return line.removeprefix("next: ")


def ask_demo(port: int) -> openai.types.chat.ChatCompletion:
    """One Quickstart-style request: demo task 1 with a visible test and a hidden gate."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model="firstpass-demo",
        messages=[{"role": "user", "content": "Write is_palindrome(s)"}],
        extra_body={
            "firstpass": {
                "task_id": "demo/1",
                "entry_point": "is_palindrome",
                "tests": {
                    "visible": ["assert is_palindrome('aba')"],
                    "hidden": {"cases": [{"args": ["ab"], "expected": False}]},
                },
            }
        },
    )


def uncommented(text: str, names: list[str]) -> str:
    """The file with these example blocks uncommented (one leading "#" off each line)."""
    blocks = examples(text)
    for name in names:
        body = "\n".join(
            line[1:] if line.startswith("#") else line for line in blocks[name].split("\n")
        )
        text += "\n" + body
    return text


def test_init_writes_a_starter_whose_printed_next_command_serves_a_verified_answer(
    tmp_path: Path,
) -> None:
    """In an empty directory: init writes ./firstpass.toml, the config loader accepts it, and the
    `serve` command it prints answers a request offline from the installed demo samples."""
    result = firstpass("init", tmp_path)

    assert result.returncode == 0, result.stderr
    written = tmp_path / "firstpass.toml"
    assert f"wrote {written}" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["firstpass.toml"]  # no temp file left
    config = load_config(written, env={})
    (route,) = config.routes
    assert {"firstpass-demo", "demo"} <= set(route.models)
    assert config.provider("replay").samples == SAMPLES_PATH.resolve()
    command = next_command(result.stdout)
    assert command == f"{FIRSTPASS} serve"  # ./firstpass.toml is where serve looks

    with serving(command, tmp_path) as server:
        completion = ask_demo(server.port)
    fp = completion.model_extra["firstpass"]  # type: ignore[index]
    assert (fp["action"], fp["served_model"], fp["gate"]) == (
        "served",
        "replay/demo-cheap",
        "passed",
    )
    assert "def is_palindrome" in (completion.choices[0].message.content or "")
    assert server.proc.returncode == 0 and "Traceback" not in server.output
    assert (tmp_path / "receipts.jsonl").read_text().count("\n") == 1


def test_init_with_a_path_elsewhere_prints_a_serve_command_naming_it(tmp_path: Path) -> None:
    """`--path conf/fp.toml`: the printed command names the file, and it serves from another
    working directory (the samples path does not depend on where serve runs)."""
    (tmp_path / "conf").mkdir()
    result = firstpass("init --path conf/fp.toml", tmp_path)

    assert result.returncode == 0, result.stderr
    command = next_command(result.stdout)
    assert command == f"{FIRSTPASS} serve --config conf/fp.toml"
    with serving(command, tmp_path) as server:
        assert ask_demo(server.port).model_extra["firstpass"]["action"] == "served"  # type: ignore[index]
    assert (tmp_path / "conf" / "receipts.jsonl").is_file()  # beside the config, as documented


def test_init_refuses_to_overwrite_an_existing_file_unless_forced(tmp_path: Path) -> None:
    """An existing config is left byte for byte (exit 2, one line); --force replaces it."""
    target = tmp_path / "firstpass.toml"
    target.write_text("# mine\n")

    refused = firstpass("init", tmp_path)

    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "firstpass init: firstpass.toml: already exists; pass --force to overwrite it, "
        "or --path FILE for another"
    ]
    assert target.read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["firstpass.toml"]

    forced = firstpass("init --force", tmp_path)

    assert forced.returncode == 0, forced.stderr
    assert load_config(target, env={}).routes[0].name == "demo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["firstpass.toml"]


@pytest.mark.parametrize(
    ("path", "written"),
    [
        ("x/y/", "x/y/firstpass.toml"),
        ("x/y/starter.toml", "x/y/starter.toml"),
        ("x/y", "x/y"),
    ],
    ids=["directory", "file", "no-slash-is-a-file"],
)
def test_init_creates_missing_directories_as_keygen_does(
    tmp_path: Path, path: str, written: str
) -> None:
    """`init --path x/y/` failed on the missing directory (`keygen --out` creates it): now the
    directories are made, a trailing slash names a directory (firstpass.toml goes in it), and
    the printed next command serves that file."""
    result = firstpass(f"init --path {path}", tmp_path)

    assert result.returncode == 0, result.stderr
    assert (tmp_path / written).is_file()
    assert next_command(result.stdout).endswith(f"serve --config {written}")
    assert load_config(tmp_path / written, env={}).routes[0].name == "demo"


@pytest.mark.parametrize("name", ["OpenAI", "Anthropic", "vLLM", "Ollama", "Groq"])
def test_each_provider_example_in_the_starter_is_valid_once_uncommented(
    tmp_path: Path, name: str
) -> None:
    """Every commented provider block of the starter loads once uncommented (keys faked)."""
    assert firstpass("init", tmp_path).returncode == 0
    text = (tmp_path / "firstpass.toml").read_text()
    (full,) = [n for n in examples(text) if name in n]
    (tmp_path / "firstpass.toml").write_text(uncommented(text, [full]))

    config = load_config(tmp_path / "firstpass.toml", env=FAKE_KEYS)

    assert len(config.routes) == 2


def test_the_starter_examples_load_together_and_say_which_model_a_client_sends(
    tmp_path: Path,
) -> None:
    """All provider examples at once; the vLLM and Ollama routes answer the model names their
    comments say a client sends (the route name, or the upstream's own model name)."""
    assert firstpass("init", tmp_path).returncode == 0
    text = (tmp_path / "firstpass.toml").read_text()
    names = [m.group(1) for m in _EXAMPLE.finditer(text)]
    assert len(names) == 5
    (tmp_path / "firstpass.toml").write_text(uncommented(text, names))

    config = load_config(tmp_path / "firstpass.toml", env=FAKE_KEYS)

    vllm = config.route_for("local-code")
    assert vllm is not None and config.route_for("Qwen/Qwen2.5-Coder-7B-Instruct") == vllm
    ollama = config.route_for("ollama-code")
    assert ollama is not None and config.route_for("qwen2.5-coder:7b") == ollama
    assert 'The `model` a client sends to Firstpass: "local-code"' in text
    assert 'The `model` a client sends to Firstpass: "ollama-code"' in text


def test_the_starter_vllm_and_ollama_examples_are_the_repository_ones(tmp_path: Path) -> None:
    """The starter and the repository's firstpass.toml show the same vLLM and Ollama blocks."""
    assert firstpass("init", tmp_path).returncode == 0
    starter = examples((tmp_path / "firstpass.toml").read_text())
    shipped_text = (Path(__file__).resolve().parents[1] / "firstpass.toml").read_text()
    shipped = examples(shipped_text)
    for name in ("vLLM", "Ollama"):
        (key,) = [k for k in starter if name in k]
        assert starter[key] == shipped[key]
        assert "# models = [" in starter[key]


def test_serve_with_no_config_anywhere_says_to_run_init(tmp_path: Path) -> None:
    """No --config, no FIRSTPASS_CONFIG, no ./firstpass.toml: one line saying what to do, exit 2."""
    result = firstpass("serve", tmp_path)

    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("firstpass serve: no config:")
    assert "run `firstpass init`" in line and "or pass --config PATH" in line


def test_serve_with_a_missing_config_file_names_it_and_how_to_create_it(tmp_path: Path) -> None:
    """--config or FIRSTPASS_CONFIG naming no file: one line naming the file and `init --path`."""
    missing = tmp_path / "nope.toml"
    for result in (
        firstpass("serve --config nope.toml", tmp_path),
        firstpass("serve", tmp_path, FIRSTPASS_CONFIG=str(missing)),
    ):
        assert result.returncode == 2
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"firstpass serve: {missing}: config file not found")
        assert f"firstpass init --path {missing}" in line


def test_init_on_a_path_it_cannot_use_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file name too long for the filesystem, or a file used as a directory: one line, exit 2."""
    from firstpass.cli import main

    (tmp_path / "file").write_text("x")
    for path in (tmp_path / ("a" * 300 + ".toml"), tmp_path / "file" / "x.toml"):
        assert main(["init", "--path", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert "is not a directory" in err
