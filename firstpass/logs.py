"""Logging set-up for the CLI: structlog to stderr, so stdout stays for results.

``FIRSTPASS_LOG_LEVEL`` (debug, info, warning, error; default info) and ``FIRSTPASS_LOG_FORMAT``
(``console`` or ``json``; production runs ``json``: one object a line, see docs/operations.md).
Log events carry hashes and ids, never prompt or answer text. Records of the standard
``logging`` module (aiohttp, asyncio) are routed through the same renderer and writer.

The server logs through a background writer (``configure_logging(background=True)``): a log
call renders its line (CPU, microseconds) and hands it to one thread that writes it. A stderr
write can block (a slow terminal, a full pipe to a log shipper), and the server logs one event
per request from its event loop, which must never wait on that. Rendering stays with the caller:
on the thread, a batch of renders holds the GIL while the loop waits for it.
``close_logging()`` writes what is buffered.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TextIO

import structlog

__all__ = [
    "BackgroundLog",
    "close_logging",
    "configure_logging",
    "flush_logging",
    "write_event",
]


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (tests and tools swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

#: structlog's JSON or console renderer: an event dict to its line (without the newline)
Renderer = structlog.typing.Processor


class BackgroundLog:
    """Rendered log lines, written to ``stream`` by one daemon thread, a batch at a time.

    ``put`` never blocks: it appends to a buffer (a stalled stream holds lines in memory rather
    than stalling requests). The thread wakes once for the first line of a batch and then
    lingers ``LINGER_S`` before writing, so a busy server hands lines over a few times a second,
    not once per request: measured, a wake-up per event (a GIL hand-over each time) cost the
    pass-through path about 0.2 ms at p50. ``flush`` waits until everything put before it is
    written, without the linger.
    """

    #: how long the writer waits after the first line of a batch for more
    LINGER_S = 0.05

    def __init__(self, stream: TextIO | _Stderr) -> None:
        self._stream = stream
        self._cond = threading.Condition(threading.Lock())
        self._buffer: list[str | threading.Event | None] = []
        self._urgent = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="firstpass-log", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        with self._cond:
            self._buffer.append(line)
            if len(self._buffer) == 1:
                self._cond.notify()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until every line put so far is written."""
        if self._closed:
            return
        done = threading.Event()
        self._mark(done)
        done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is buffered and stop the thread (idempotent)."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._mark(None)
        self._thread.join(timeout)

    def _mark(self, marker: threading.Event | None) -> None:
        with self._cond:
            self._buffer.append(marker)
            self._urgent = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._buffer:
                    self._cond.wait()
                if not self._urgent:
                    self._cond.wait(self.LINGER_S)  # more lines join this batch meanwhile
                batch, self._buffer, self._urgent = self._buffer, [], False
            lines = [item for item in batch if isinstance(item, str)]
            if lines:
                try:
                    self._stream.write("".join(lines))
                    self._stream.flush()
                except (OSError, ValueError):  # a closed or broken stream: drop, keep serving
                    pass
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                return


class _QueueLogger:
    """The structlog logger of the background mode: every level method hands the rendered line
    to the writer thread."""

    def __init__(self, sink: BackgroundLog) -> None:
        self._sink = sink

    def _put(self, line: str) -> None:
        self._sink.put(line + "\n")

    msg = debug = info = warning = warn = error = critical = exception = fatal = _put


_background: BackgroundLog | None = None
#: with the background JSON writer: the lowest level written (``write_event``'s fast path)
_json_level: int | None = None


class _StdlibHandler(logging.Handler):
    """Records of the standard ``logging`` module (aiohttp's "Error handling request" with its
    traceback, asyncio's, the sandbox's) as structlog events: rendered like every other event
    (under ``json`` one object a line, the traceback in ``exception``) and written by the same
    writer, instead of Python's last-resort handler printing plain lines to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if _malformed_http(record):
                return
            try:
                message = record.getMessage()
            except Exception:  # bad %-args: the template, not a lost record
                message = str(record.msg)
            level = max((n for n in _LEVEL_NUMBERS if n <= record.levelno), default=logging.DEBUG)
            fields: dict[str, object] = {"logger": record.name}
            if record.exc_info and record.exc_info[0] is not None:
                fields["exc_info"] = record.exc_info
            structlog.get_logger(record.name).log(level, message, **fields)
        except Exception:
            self.handleError(record)


def _malformed_http(record: logging.LogRecord) -> bool:
    """aiohttp's "Error handling request" for HTTP it could not parse, logged as one
    ``malformed_http_request`` event (info: the client's mistake, not ours) without the parser's
    message, which quotes the offending bytes: a bad ``Authorization`` line would put the
    client's key in the log. ``True`` when ``record`` was that and is handled."""
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None or not record.name.startswith("aiohttp."):
        return False
    from aiohttp.http_exceptions import HttpProcessingError

    if not isinstance(exc, HttpProcessingError):
        return False
    remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
    structlog.get_logger(record.name).info(
        "malformed_http_request",
        logger=record.name,
        remote=str(remote) if remote is not None else None,
        status=exc.code,
        error=type(exc).__name__,
    )
    return True


#: the levels structlog's filtering loggers name (a custom stdlib level logs as the one below it)
_LEVEL_NUMBERS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_stdlib_handler: _StdlibHandler | None = None
#: the root logger's level before ``_route_stdlib`` set it
_root_level = logging.WARNING


def _route_stdlib(level: int) -> None:
    """Send the root logger's records (every library's) through structlog, from ``level`` but
    never below warning: what Python's last-resort handler showed, now rendered like the rest
    (a library's info lines, such as an HTTP client's one per request, stay off)."""
    global _stdlib_handler, _root_level
    _unroute_stdlib()
    _stdlib_handler = _StdlibHandler()
    _root_level = logging.root.level
    logging.root.addHandler(_stdlib_handler)
    logging.root.setLevel(max(level, logging.WARNING))


def _unroute_stdlib() -> None:
    """Undo ``_route_stdlib``: the handler removed, the root level as it was."""
    global _stdlib_handler
    if _stdlib_handler is not None:
        logging.root.removeHandler(_stdlib_handler)
        logging.root.setLevel(_root_level)
        _stdlib_handler = None


def write_event(
    event: str, fields: Mapping[str, object], *, level: str = "info", timestamp: str | None = None
) -> bool:
    """Write one JSON event straight to the background writer; ``False`` when that path is not
    configured (no background writer, or the console format) and the caller should log through
    structlog instead. The line has the keys structlog's would, ``timestamp`` the given one
    (ISO 8601 UTC) or now.

    Why: the per-request event through structlog's processor chain cost about twice the CPU of
    this (measured), on every request the server answers. ``fields`` must be JSON data.
    """
    sink, threshold = _background, _json_level
    if sink is None or threshold is None:
        return False
    if _LEVELS.get(level, logging.INFO) < threshold:
        return True  # filtered out, as structlog would
    stamp = timestamp or datetime.now(UTC).isoformat().replace("+00:00", "Z")
    line = json.dumps({**fields, "event": event, "level": level, "timestamp": stamp}, default=str)
    sink.put(line + "\n")
    return True


def configure_logging(
    env: dict[str, str] | None = None,
    *,
    background: bool = False,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog from ``env`` (default ``os.environ``).

    ``background``: write on a thread of its own (the server); ``stream``: write there instead
    of ``sys.stderr``.
    """
    global _background, _json_level
    env = dict(os.environ) if env is None else env
    level = _LEVELS.get(env.get("FIRSTPASS_LOG_LEVEL", "info").lower(), logging.INFO)
    as_json = env.get("FIRSTPASS_LOG_FORMAT", "console").lower() == "json"
    renderer: Renderer = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    out: TextIO | _Stderr = stream if stream is not None else _Stderr()
    close_logging()
    common: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if background:
        _background = BackgroundLog(out)
        _json_level = level if as_json else None
        sink = _background
        structlog.configure(
            processors=[*common, renderer],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=lambda *_args: _QueueLogger(sink),
            cache_logger_on_first_use=False,
        )
        _route_stdlib(level)
        return
    structlog.configure(
        processors=[*common, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    _route_stdlib(level)


def flush_logging(timeout: float = 5.0) -> None:
    """Wait until the background writer (if any) has written every event logged so far."""
    if _background is not None:
        _background.flush(timeout)


def close_logging() -> None:
    """Write what the background writer holds and stop it (no-op without one)."""
    global _background, _json_level
    _json_level = None
    _unroute_stdlib()
    if _background is not None:
        background, _background = _background, None
        background.close()


atexit.register(close_logging)
