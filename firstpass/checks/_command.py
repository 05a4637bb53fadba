"""``command``: an executable the operator configured decides (never one a request names).

The command reads ``{"answer": ..., "request": {"prompt", "messages", "context"}}`` as JSON on
stdin and prints ``{"verdict": "pass" | "fail" | "abstain", "score"?: 0..1, "reason"?: "..."}``
on stdout. A non-zero exit, a timeout, too much output or anything but that JSON is an
``abstain`` (the check's ``on_abstain`` decides what that means).

When it abstains (a crash, a timeout, no verdict), the reason ends with the tail of what it
wrote to stderr (bounded: ``STDERR_TAIL``), so an operator sees why; the command's environment is
empty, so that tail holds no secret of the proxy's.

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
#: of stderr, only this many final bytes are kept (the rest is read and dropped), and of those
#: the last ``STDERR_LINES`` lines, at most ``STDERR_CHARS`` characters, go into an abstain's
#: reason: why a grader crashed is in the end of its traceback
STDERR_TAIL = 4096
STDERR_LINES = 5
STDERR_CHARS = 600


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

    def _abstain(
        self, reason: str, category: str = "check_error", stderr: _Tail | None = None
    ) -> CheckResult:
        said = stderr.text() if stderr is not None else ""
        if said:
            reason += f"; stderr: {said}"
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
                stderr=asyncio.subprocess.PIPE,
                env={},
                cwd=workdir,
                start_new_session=True,
            )
        except OSError as exc:
            return self._abstain(f"could not start {self.argv[0]}: {exc.strerror}")
        stderr = _Tail()
        try:
            out = await asyncio.wait_for(self._talk(proc, payload, stderr), self.timeout_s)
        except TimeoutError:
            return self._abstain(f"no verdict within {self.timeout_s:g} s", "timeout", stderr)
        finally:
            _kill_group(proc.pid)
            await proc.wait()
        if len(out) > OUTPUT_MAX:
            return self._abstain(f"printed more than {OUTPUT_MAX} bytes", stderr=stderr)
        if proc.returncode != 0:
            name = os.path.basename(self.argv[0])
            return self._abstain(f"{name} exited with {proc.returncode}", stderr=stderr)
        return self._parse(out, stderr)

    @classmethod
    async def _talk(cls, proc: asyncio.subprocess.Process, payload: bytes, stderr: _Tail) -> bytes:
        """Write the payload, read stdout (bounded) and stderr (its tail, into ``stderr``) at
        once, so that a command filling one pipe never blocks on it."""
        assert proc.stderr is not None
        errors = asyncio.ensure_future(stderr.drain(proc.stderr))
        try:
            out = await cls._stdout(proc, payload)
            if len(out) <= OUTPUT_MAX:
                await errors  # the command has exited: stderr ends with it
            return out
        finally:
            errors.cancel()

    @staticmethod
    async def _stdout(proc: asyncio.subprocess.Process, payload: bytes) -> bytes:
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

    def _parse(self, out: bytes, stderr: _Tail) -> CheckResult:
        try:
            doc = json.loads(out)
        except (ValueError, RecursionError):
            return self._abstain(
                'did not print a JSON object like {"verdict": "pass"}', stderr=stderr
            )
        if not isinstance(doc, dict) or doc.get("verdict") not in ("pass", "fail", "abstain"):
            return self._abstain(
                'printed no "verdict" of "pass", "fail" or "abstain"', stderr=stderr
            )
        verdict = doc["verdict"]
        score = doc.get("score", 1.0 if verdict == "pass" else 0.0)
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
            or not 0 <= score <= 1
        ):
            return self._abstain(
                f"printed a score that is not a number in [0, 1]: {score!r}", stderr=stderr
            )
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


class _Tail:
    """The last ``STDERR_TAIL`` bytes a command wrote to stderr; kept as they arrive, so a
    command killed at its timeout still shows what it had said."""

    def __init__(self) -> None:
        self.data = bytearray()

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65_536):
            self.data += chunk
            del self.data[:-STDERR_TAIL]

    def text(self) -> str:
        """The last lines, joined with " | ", control characters escaped (one line, bounded)."""
        decoded = self.data.decode("utf-8", errors="replace")
        lines = [line.strip() for line in decoded.splitlines() if line.strip()]
        said = " | ".join(lines[-STDERR_LINES:])
        said = "".join(c if c.isprintable() else repr(c)[1:-1] for c in said)
        return said if len(said) <= STDERR_CHARS else "…" + said[-(STDERR_CHARS - 1) :]


def _kill_group(pid: int) -> None:
    """Kill the command and everything it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
