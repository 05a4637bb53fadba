"""``command``: an executable the operator configured decides (never one a request names).

The command reads ``{"answer": ..., "request": {"prompt", "messages", "context"}}`` as JSON on
stdin and prints ``{"verdict": "pass" | "fail" | "abstain", "score"?: 0..1, "reason"?: "..."}``
on stdout. A non-zero exit, a timeout, too much output or anything but that JSON is an
``abstain`` (the check's ``on_abstain`` decides what that means).

It runs with the sandbox's process hygiene, because what it reads is untrusted model output:
an empty environment (no API keys), its own session and process group (killed whole at the
timeout), rlimits on CPU time, address space, file size, open files and processes, a fresh
empty working directory, and bounded output. It is started and awaited by asyncio, so the event
loop never waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._result import CheckResult
from firstpass.errors import CheckSpecError

__all__ = ["CommandCheck"]

#: set the limits, then become the command (runs in a fresh ``python -I -S``, so nothing of the
#: proxy's environment or site-packages is in it)
_LAUNCHER = """
import json, os, resource, sys
lim = json.loads(sys.argv[1])
for name, value in lim.items():
    resource.setrlimit(getattr(resource, name), (value, value))
os.execve(sys.argv[2], sys.argv[2:], {})  # not os.environ: Python may have set LC_CTYPE
"""

#: stdout beyond this is not a verdict
OUTPUT_MAX = 65_536


def _resolve(argv: object) -> tuple[str, ...]:
    if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
        raise CheckSpecError(
            "argv", 'expected a non-empty list of strings, e.g. ["/usr/local/bin/grade", "--x"]'
        )
    if not all(isinstance(a, str) for a in argv):
        raise CheckSpecError("argv", "every element must be a string")
    program = str(argv[0])
    found = program if os.path.isabs(program) else shutil.which(program)
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise CheckSpecError("argv[0]", f"{program!r} is not an executable file")
    return (os.path.abspath(found), *(str(a) for a in argv[1:]))


@dataclass(frozen=True, kw_only=True)
class CommandCheck:
    """Runs ``argv`` (``argv[0]`` resolved to an absolute path when the check is built, since
    the command gets no ``PATH``) on every answer."""

    options: Options
    argv: Sequence[str]
    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    kind: str = "command"

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", _resolve(self.argv))
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 3600:
            raise CheckSpecError("timeout_s", f"expected a number in (0, 3600], got {t!r}")
        for key, least in (("cpu_s", 1), ("memory_mb", 64)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise CheckSpecError(key, f"expected an integer >= {least}, got {v!r}")

    @property
    def name(self) -> str:
        return self.options.name

    def _limits(self) -> dict[str, int]:
        return {
            "RLIMIT_CPU": self.cpu_s,
            "RLIMIT_AS": self.memory_mb * 1024 * 1024,
            "RLIMIT_FSIZE": 16 * 1024 * 1024,
            "RLIMIT_NOFILE": 64,
            "RLIMIT_CORE": 0,
        }

    def _abstain(self, reason: str, category: str = "check_error") -> CheckResult:
        return self.options.result(
            self.kind, verdict="abstain", score=0.0, reasons=(reason,), category=category
        )

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        payload = json.dumps({"answer": answer, "request": request.to_json()}).encode()
        # a fresh empty working directory, made and removed off the event loop
        workdir = await asyncio.to_thread(tempfile.mkdtemp, prefix="firstpass-command-")
        try:
            return await self._run_in(workdir, payload)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _run_in(self, workdir: str, payload: bytes) -> CheckResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                "-c",
                _LAUNCHER,
                json.dumps(self._limits()),
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env={},
                cwd=workdir,
                start_new_session=True,
            )
        except OSError as exc:
            return self._abstain(f"could not start {self.argv[0]}: {exc.strerror}")
        try:
            out = await asyncio.wait_for(self._talk(proc, payload), self.timeout_s)
        except TimeoutError:
            return self._abstain(f"no verdict within {self.timeout_s:g} s", "timeout")
        finally:
            _kill_group(proc.pid)
            await proc.wait()
        if len(out) > OUTPUT_MAX:
            return self._abstain(f"printed more than {OUTPUT_MAX} bytes")
        if proc.returncode != 0:
            return self._abstain(f"{os.path.basename(self.argv[0])} exited with {proc.returncode}")
        return self._parse(out)

    @staticmethod
    async def _talk(proc: asyncio.subprocess.Process, payload: bytes) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(payload)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the command need not read everything; its exit status and output decide
        finally:
            proc.stdin.close()
        chunks: list[bytes] = []
        size = 0
        while size <= OUTPUT_MAX:
            chunk = await proc.stdout.read(65_536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        else:
            return b"".join(chunks)  # too much: the caller abstains, the group is killed
        await proc.wait()
        return b"".join(chunks)

    def _parse(self, out: bytes) -> CheckResult:
        try:
            doc = json.loads(out)
        except (ValueError, RecursionError):
            return self._abstain('did not print a JSON object like {"verdict": "pass"}')
        if not isinstance(doc, dict) or doc.get("verdict") not in ("pass", "fail", "abstain"):
            return self._abstain('printed no "verdict" of "pass", "fail" or "abstain"')
        verdict = doc["verdict"]
        score = doc.get("score", 1.0 if verdict == "pass" else 0.0)
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
            or not 0 <= score <= 1
        ):
            return self._abstain(f"printed a score that is not a number in [0, 1]: {score!r}")
        reason = doc.get("reason")
        reasons = (reason,) if isinstance(reason, str) and reason else ()
        if verdict == "abstain":
            return self.options.result(
                self.kind,
                verdict="abstain",
                score=float(score),
                reasons=reasons,
                category="check_error",
            )
        return self.options.result(
            self.kind,
            verdict=verdict,
            score=float(score),
            reasons=reasons,
            category=None if verdict == "pass" else "command_rejected",
            needs_revision=verdict == "fail" and bool(reasons),
        )


def _kill_group(pid: int) -> None:
    """Kill the command and everything it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
