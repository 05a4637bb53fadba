"""The front's end of one zygote process: start it, frame requests to it, match its answers.

Apart from :class:`~._runner.Sandbox`, which decides what to run where: this is the one pipe
to one process, on the event loop (reads and writes, never a blocking call).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import TYPE_CHECKING, cast

from firstpass.errors import SandboxError

from ._child.frames import FRAME, MAX_FRAME, encode_frame

if TYPE_CHECKING:
    from ._child.codec import Wire
    from ._child.frames import Hello, Response, RunRequest

__all__ = ["ZygoteDied", "ZygoteProcess"]


class ZygoteDied(Exception):
    """The zygote ended; ``started`` says whether it had begun running the request."""

    def __init__(self, started: bool = False) -> None:
        self.started = started
        super().__init__("the sandbox process died")


class ZygoteProcess:
    """One zygote process and the requests in flight on it."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: asyncio.subprocess.Process | None = None
        #: by the request id Z's answers name (None: an answer naming none matches nothing)
        self.pending: dict[int | None, asyncio.Future[Response]] = {}
        self.acked: set[int | None] = set()
        self.reader: asyncio.Task[None] | None = None
        self.errlog: asyncio.Task[None] | None = None
        self.pid = 0
        self.root = ""
        self.memory_bound = "per-process"
        self.alive = False
        self.stderr_tail = b""

    async def start(self) -> None:
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={},
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox interpreter: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.errlog = asyncio.create_task(self._drain_stderr(self.proc.stderr))
        try:
            hello = cast("Hello", await asyncio.wait_for(self._read_frame(), 20))  # Z's first
        except (TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await self.kill()
            tail = self.stderr_tail.decode(errors="replace").strip()[-500:]
            raise SandboxError(f"the sandbox did not start: {tail or exc!r}") from exc
        if not hello.get("ready"):
            await self.kill()
            raise SandboxError(f"the sandbox refused to start: {hello.get('error')}")
        self.pid, self.root, self.alive = int(hello["pid"]), str(hello["root"]), True
        self.memory_bound = str(hello.get("memory_bound") or "per-process")
        self.reader = asyncio.create_task(self._read_loop())

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.stderr_tail = (self.stderr_tail + chunk)[-4096:]

    async def _read_raw(self) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        head = await self.proc.stdout.readexactly(FRAME.size)
        (size,) = FRAME.unpack(head)
        if size > MAX_FRAME:
            raise ValueError("oversized frame from the zygote")
        return await self.proc.stdout.readexactly(size)

    async def _read_frame(self) -> Wire:  # JSON gives nothing else: the casts say so
        raw = await self._read_raw()
        if len(raw) > 1 << 20:  # a large answer is decoded off the event loop
            return cast("Wire", await asyncio.to_thread(json.loads, raw))
        return cast("Wire", json.loads(raw))

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = cast("Response", await self._read_frame())  # Z's answers have this shape
                if msg.get("has_outputs"):  # reference outputs follow in their own frame
                    msg["outputs"] = await self._read_frame()
                if msg.get("ack"):
                    self.acked.add(msg.get("id"))
                    continue
                self.acked.discard(msg.get("id"))
                fut = self.pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (asyncio.IncompleteReadError, ValueError, ConnectionError):
            pass
        finally:
            self.alive = False
            for key, fut in self.pending.items():
                if not fut.done():
                    fut.set_exception(ZygoteDied(started=key in self.acked))
            self.pending.clear()

    async def request(self, req: RunRequest) -> Response:
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise ZygoteDied()
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.pending[req["id"]] = fut
        try:
            self.proc.stdin.write(encode_frame(req))
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            self.pending.pop(req["id"], None)
            raise ZygoteDied() from exc
        return await fut

    async def close(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()
        await self._finish_tasks()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            await self.proc.wait()
        self.alive = False
        await self._finish_tasks()

    async def _finish_tasks(self) -> None:
        for task in (self.reader, self.errlog):
            if task is not None and not task.done():
                try:
                    await asyncio.wait_for(task, 5)
                except TimeoutError:
                    task.cancel()
