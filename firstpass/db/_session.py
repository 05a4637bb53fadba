"""One owner per connection: its statements run one at a time, each as a task of its own, and
the connection is closed only once no statement runs on it.

Why: closing a psycopg connection frees libpq's connection (``PQfinish``) and its socket, while
a statement still waiting for its result keeps libpq's raw pointer and watches the socket's
descriptor number, registering it with the loop again every 0.1 s. Once that number is reused
(the next socket opened: a reconnect's, most likely) and turns readable (the server resumed),
the statement calls libpq on the freed connection: a replica died with SIGSEGV when a frozen
PostgreSQL resumed (issue 26). Cancelling the statement instead makes psycopg send the server
a cancel request and wait for it, which on a hung server takes as long as the hang (``query
cancellation failed``).

So a statement given up on (past ``timeout_s``) keeps running, and its connection is *retired*:
a background task waits ``grace_s`` for the statement to return by itself (a server that
resumes), then aborts it by shutting the socket down (libpq sees the connection cut, in the
statement's own task: nothing is freed under it), waits until the statement has returned, and
only then closes the connection. A timed-out connect is left to finish, and the connection it
makes, if any, is closed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import TupleRow

__all__ = ["Conn", "Session", "abandon_connect", "cut"]

Conn = psycopg.AsyncConnection[TupleRow]
_T = TypeVar("_T")


class Session:
    """``conn`` and the one statement running on it (``run``); ``retire`` closes it safely."""

    def __init__(self, conn: Conn, *, timeout_s: float) -> None:
        self.conn = conn
        self._timeout_s = timeout_s
        # the statement now or last running: a future is invariant in its result, and the
        # statements return values of several types (read only through ``run``)
        self._step: asyncio.Future[Any] | None = None
        self._retired: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        """A statement is running on the connection (one given up on, or a caller's)."""
        return self._step is not None and not self._step.done()

    async def run(self, work: Callable[[Conn], Awaitable[_T]]) -> _T:
        """``work(conn)``'s result, or ``TimeoutError`` once it took ``timeout_s``: the
        statement then runs on, and the session must be retired (it runs nothing else). A
        caller cancelled meanwhile leaves the statement running the same way."""
        if self._retired is not None or self.busy:
            raise psycopg.InterfaceError("the connection is busy or retired: not reused")
        task: asyncio.Future[_T] = asyncio.ensure_future(work(self.conn))
        self._step = task
        done, _ = await asyncio.wait({task}, timeout=self._timeout_s)
        if task not in done:
            raise TimeoutError(f"PostgreSQL did not answer within {self._timeout_s:g} s")
        return task.result()

    def cut(self) -> None:
        """Abort the running statement, if any, now (it fails at its next wake-up); the
        connection stays open until closed."""
        if self.busy:
            cut(self.conn)

    def retire(self, grace_s: float) -> asyncio.Task[None]:
        """Close the connection in the background once no statement runs on it: a running
        one gets ``grace_s`` to return by itself, then is aborted. The same task each call."""
        if self._retired is None:
            self._retired = asyncio.ensure_future(self._close_when_idle(grace_s))
        return self._retired

    async def _close_when_idle(self, grace_s: float) -> None:
        step = self._step
        if step is not None and not step.done():
            await asyncio.wait({step}, timeout=grace_s)
            self.cut()
            # no timeout: closing before the statement has returned is the bug this prevents;
            # once cut, libpq fails it at its next wake-up
            await asyncio.wait({step})
        if step is not None and not step.cancelled():
            step.exception()  # retrieved: a statement given up on may fail late
        with contextlib.suppress(Exception):  # a connection already cut or broken
            await self.conn.close()


def cut(conn: Conn) -> None:
    """Shut the connection's socket down (both ways) without closing it: libpq owns the file
    descriptor and finds the connection cut at its next read or write."""
    try:
        copy = os.dup(conn.pgconn.socket)  # closing the copy leaves libpq's descriptor open
    except (OSError, psycopg.Error):
        return  # already gone: the statement fails or has failed by itself
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return
    with sock, contextlib.suppress(OSError):  # closes the copy only
        sock.shutdown(socket.SHUT_RDWR)  # OSError: not connected any more


def abandon_connect(task: asyncio.Future[Conn]) -> asyncio.Task[None]:
    """A connect given up on: let it finish, and close the connection it makes, if any (once
    the connect has returned, nothing else runs on it)."""

    async def close_when_made() -> None:
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            return
        with contextlib.suppress(Exception):
            await task.result().close()

    return asyncio.ensure_future(close_when_made())
