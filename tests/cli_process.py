"""`firstpass serve` as a real process on a free port, for tests that run commands as printed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[str]
    output: str = ""  # stdout and stderr, once stopped


@contextmanager
def serving(command: str, cwd: Path, **env: str) -> Iterator[Server]:
    """Run a `firstpass serve` command line in bash on a free port (given as FIRSTPASS_PORT, so
    the command itself stays as printed) and wait until /readyz answers; on exit stop it as
    Ctrl-C would (SIGINT to its process group) and keep its output."""
    port = free_port()
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, **env, "FIRSTPASS_PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    server = Server(port=port, proc=proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{command!r} exited with {proc.returncode}:\n{proc.communicate()[0]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{command!r} was not ready within 60 s")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            server.output = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            server.output = proc.communicate()[0]
