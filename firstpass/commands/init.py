"""``firstpass init``: write a starter ``firstpass.toml`` that serves offline as written.

The starter serves the bundled demo data set through the ``replay`` provider, so ``firstpass
serve`` answers at once, with no network and no keys, wherever Firstpass is installed. The demo
samples ship as package data; relative paths in a config resolve against the config's directory,
so the starter names the installed sample file by its absolute path, resolved here. Commented
blocks show OpenAI, Anthropic, vLLM, Ollama and Groq upstreams, each valid once uncommented.

The file is written atomically (a temporary file in the same directory, then a rename) and never
over an existing file unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import tempfile
from pathlib import Path

from firstpass._console import invoked_as
from firstpass.commands import Subparsers
from firstpass.errors import ConfigError

__all__ = ["demo_samples_path", "register", "starter_config"]

#: where ``serve`` looks when given no --config and no FIRSTPASS_CONFIG
DEFAULT_PATH = Path("firstpass.toml")


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "init",
        help="write a starter firstpass.toml (offline demo route + commented provider examples)",
        description="Write a starter config that `firstpass serve` runs as is: a replay route on "
        "the bundled demo set (offline, no keys) and commented OpenAI, Anthropic, vLLM, Ollama "
        "and Groq blocks to switch to. Refuses to overwrite an existing file without --force.",
    )
    p.add_argument(
        "--path",
        default=str(DEFAULT_PATH),
        metavar="FILE",
        help="where to write it (default: ./firstpass.toml, where `firstpass serve` looks); a "
        "directory, or a path ending in /, gets FILE/firstpass.toml; missing directories are "
        "created",
    )
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.set_defaults(func=_run)


def demo_samples_path() -> Path:
    """The installed demo sample set (package data), as an absolute path."""
    from firstpass.demo import SAMPLES_PATH

    path = SAMPLES_PATH.resolve()
    if not path.is_file():  # a broken install: say so rather than write a config that fails
        raise ConfigError(
            "firstpass init",
            f"the bundled demo samples are missing ({path}); reinstall firstpass-verify",
        )
    return path


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are TOML's, except DEL must be escaped)."""
    import json

    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def starter_config(samples: Path) -> str:
    """The starter file's text, with the replay provider reading ``samples``."""
    return _STARTER.replace("@SAMPLES@", _toml_string(str(samples)))


def _write_atomically(target: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``target`` via a temporary file and a rename; no clobber unless forced.
    Missing directories on the way are created (as ``keygen --out`` creates them)."""
    directory = target.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where a directory must be
        raise ConfigError(str(target), f"directory {directory} is not a directory") from None
    except OSError as exc:
        raise ConfigError(
            str(target), f"cannot create directory {directory}: {exc.strerror or exc}"
        ) from exc
    if target.exists() and not force:
        raise ConfigError(
            str(target), "already exists; pass --force to overwrite it, or --path FILE for another"
        )
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ConfigError(str(target), f"cannot write: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        if force:
            os.replace(tmp, target)
        else:
            try:  # link() fails if the target appeared meanwhile: never clobber without --force
                os.link(tmp, target)
            except FileExistsError:
                raise ConfigError(
                    str(target), "already exists; pass --force to overwrite it"
                ) from None
            except OSError:  # a filesystem without hard links: the exists() check above stands
                os.replace(tmp, target)
    except OSError as exc:
        raise ConfigError(str(target), f"cannot write: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _run(args: argparse.Namespace) -> int:
    from firstpass.config import ENV_CONFIG

    raw: str = args.path
    target = Path(raw).expanduser()
    try:
        if target.is_dir() or raw.endswith(("/", os.sep)):  # a directory, existing or to be
            target = target / DEFAULT_PATH.name
    except OSError as exc:  # a name too long for the filesystem, say
        raise ConfigError(str(target), f"cannot use this path: {exc.strerror or exc}") from exc
    text = starter_config(demo_samples_path())
    try:
        _write_atomically(target, text, force=args.force)
    except OSError as exc:  # probing the path itself failed (a name too long, say)
        raise ConfigError(str(target), f"cannot write: {exc.strerror or exc}") from exc
    shown = target.absolute()
    serve = f"{invoked_as()} serve"
    if shown != DEFAULT_PATH.absolute() or os.environ.get(ENV_CONFIG, "").strip():
        serve += f" --config {shlex.quote(str(target))}"
    print(f"wrote {shown}: a replay route on the bundled demo set (offline, no keys) and")
    print("commented OpenAI, Anthropic, vLLM, Ollama and Groq blocks; edit it to point at your")
    print("models.")
    print(f"next: {serve}")
    print('then send model "firstpass-demo" to http://127.0.0.1:8787/v1 (README: Quickstart);')
    print("the Anthropic SDK takes the root, http://127.0.0.1:8787 (POST /v1/messages)")
    return 0


# The starter. "@SAMPLES@" is replaced with the installed demo sample file. Its example blocks
# follow the repository's firstpass.toml, and tests/test_cli_init.py loads each one uncommented.
_STARTER = """\
# firstpass.toml: a starter config written by `firstpass init`.
#
# As written, it serves the bundled DEMO data set offline with no API keys: the `replay`
# provider answers from recorded samples that ship with Firstpass (demo data, not a benchmark).
# Run `firstpass serve` here (or `firstpass serve --config THIS_FILE`), point the openai SDK at
# http://127.0.0.1:8787/v1 with model "firstpass-demo", and name a demo task in the request:
# extra_body={"firstpass": {"task_id": "demo/1", "tests": {...}}} (demo/1 .. demo/12).
#
# Every key, its type, default and meaning: docs/config.md in the repository. Relative paths
# are resolved against the directory of this file. Environment overrides: FIRSTPASS_CONFIG
# (which file), FIRSTPASS_HOST, FIRSTPASS_PORT, FIRSTPASS_RECEIPTS, FIRSTPASS_ELASTIC_MODE.
#
# The commented "example" blocks at the end show real upstreams. To use one, remove one "#"
# from each line between its "---- example" and "---- end" lines (lines with "##" stay comments).

[server]
host = "127.0.0.1"
port = 8787
max_body_bytes = 1048576        # 413 above this
max_concurrency = 256           # requests in flight; 429 above this
# client_keys_env = ["FIRSTPASS_CLIENT_KEY"]   # when set, clients must send one as their API key

[sandbox]
concurrency = 0                 # samples checked at once; 0 = one per CPU core

[receipts]
path = "receipts.jsonl"         # append-only, hash-chained; `firstpass receipts verify` checks it
store_content = false           # false: receipts hold hashes of prompts and answers, not the text

[[provider]]
id = "replay"
kind = "replay"
## the demo samples installed with Firstpass (an absolute path, resolved by `firstpass init`;
## if Firstpass is reinstalled elsewhere, run `firstpass init --force` again)
samples = @SAMPLES@
seed = 0

[[route]]
name = "demo"
models = ["firstpass-demo", "demo"]        # the `model` values a client sends for this route
ladder = ["replay/demo-cheap", "replay/demo-strong"]   # cheapest first
temperature = 0.8
on_exhausted = "unverified"     # top rung failed too: serve the best attempt marked unverified
without_checks = "passthrough"  # a request with no tests goes to the first rung, unchecked

# Made-up prices for the made-up demo models (USD per million tokens), so receipts show costs.
[[price]]
model = "replay/demo-cheap"
input_per_mtok = 0.15
output_per_mtok = 0.60

[[price]]
model = "replay/demo-strong"
input_per_mtok = 2.50
output_per_mtok = 10.00

# ---- example: OpenAI (needs OPENAI_API_KEY) -------------------------------------------------
## Prices as published by OpenAI at the time of writing; check their pricing page.
## A client sends model "code" (or "gpt-4o"); Firstpass tries gpt-4o-mini, then gpt-4o.
# [[provider]]
# id = "openai"
# kind = "openai"
# base_url = "https://api.openai.com/v1"
# api_key_env = "OPENAI_API_KEY"
# timeout_s = 60.0
# retries = 2
#
# [[route]]
# name = "code"
# models = ["code", "gpt-4o"]
# ladder = ["openai/gpt-4o-mini", "openai/gpt-4o"]
#
# [[price]]
# model = "openai/gpt-4o-mini"
# input_per_mtok = 0.15
# output_per_mtok = 0.60
#
# [[price]]
# model = "openai/gpt-4o"
# input_per_mtok = 2.50
# output_per_mtok = 10.00
# ---- end ----------------------------------------------------------------------------------

# ---- example: Anthropic (needs ANTHROPIC_API_KEY) -------------------------------------------
## Claude through the Messages API; prices (and prompt-cache prices) as published by Anthropic
## at the time of writing. A client sends model "claude-code" through any of the three APIs:
## POST /v1/chat/completions, /v1/responses or /v1/messages (docs/api-messages.md).
# [[provider]]
# id = "claude"
# kind = "anthropic"
# api_key_env = "ANTHROPIC_API_KEY"
#
# [[route]]
# name = "claude-code"
# ladder = ["claude/claude-haiku-4-5", "claude/claude-sonnet-4-5"]
#
# [[price]]
# model = "claude/claude-haiku-4-5"
# input_per_mtok = 1.00
# output_per_mtok = 5.00
# cache_read_per_mtok = 0.10
# cache_write_per_mtok = 1.25
#
# [[price]]
# model = "claude/claude-sonnet-4-5"
# input_per_mtok = 3.00
# output_per_mtok = 15.00
# cache_read_per_mtok = 0.30
# cache_write_per_mtok = 3.75
# ---- end ----------------------------------------------------------------------------------

# ---- example: a local vLLM server (`vllm serve Qwen/Qwen2.5-Coder-7B-Instruct`) ------------
## A rung splits at the FIRST "/": provider "vllm", model "Qwen/Qwen2.5-Coder-7B-Instruct".
# [[provider]]
# id = "vllm"
# kind = "openai"
# base_url = "http://127.0.0.1:8000/v1"
# timeout_s = 120.0
#
# [[route]]
# name = "local-code"
## The `model` a client sends to Firstpass: "local-code", or the name it already sent to vLLM.
# models = ["local-code", "Qwen/Qwen2.5-Coder-7B-Instruct"]
# ladder = ["vllm/Qwen/Qwen2.5-Coder-7B-Instruct"]
# temperature = 0.8
#
# [[price]]
# model = "vllm/Qwen/Qwen2.5-Coder-7B-Instruct"
# input_per_mtok = 0.0            ## self-hosted: put your own cost per million tokens here
# output_per_mtok = 0.0
# ---- end ----------------------------------------------------------------------------------

# ---- example: Ollama (`ollama pull qwen2.5-coder:7b`) --------------------------------------
## Ollama's OpenAI endpoint returns one choice whatever `n` is, so Firstpass makes k calls.
# [[provider]]
# id = "ollama"
# kind = "openai"
# base_url = "http://127.0.0.1:11434/v1"
# honours_n = false
# max_concurrency = 4
# timeout_s = 120.0
#
# [[route]]
# name = "ollama-code"
## The `model` a client sends to Firstpass: "ollama-code", or the name it already sent to Ollama.
# models = ["ollama-code", "qwen2.5-coder:7b"]
# ladder = ["ollama/qwen2.5-coder:7b"]
#
# [[price]]
# model = "ollama/qwen2.5-coder:7b"
# input_per_mtok = 0.0
# output_per_mtok = 0.0
# ---- end ----------------------------------------------------------------------------------

# ---- example: Groq (needs GROQ_API_KEY) -----------------------------------------------------
## Groq accepts only n = 1; prices as published by Groq at the time of writing.
## A client sends model "groq-code" (the route's name, as no `models` line is given).
# [[provider]]
# id = "groq"
# kind = "openai"
# base_url = "https://api.groq.com/openai/v1"
# api_key_env = "GROQ_API_KEY"
# honours_n = false
#
# [[route]]
# name = "groq-code"
# ladder = ["groq/llama-3.1-8b-instant", "groq/llama-3.3-70b-versatile"]
# on_exhausted = "error"
#
# [[price]]
# model = "groq/llama-3.1-8b-instant"
# input_per_mtok = 0.05
# output_per_mtok = 0.08
#
# [[price]]
# model = "groq/llama-3.3-70b-versatile"
# input_per_mtok = 0.59
# output_per_mtok = 0.79
# ---- end ----------------------------------------------------------------------------------

# More: the elastic policy ([escalation.elastic]), a route's own checks ([route.checks]), the
# sandbox limits ([sandbox]) and every other key are in docs/config.md of the repository.
"""
