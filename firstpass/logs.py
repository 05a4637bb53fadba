"""Logging set-up for the CLI: structlog to stderr, so stdout stays for results.

``FIRSTPASS_LOG_LEVEL`` (debug, info, warning, error; default info) and ``FIRSTPASS_LOG_FORMAT``
(``console`` or ``json``). Log events carry hashes and ids, never prompt or answer text.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging"]


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (tests and tools swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def configure_logging(env: dict[str, str] | None = None) -> None:
    env = dict(os.environ) if env is None else env
    level = _LEVELS.get(env.get("FIRSTPASS_LOG_LEVEL", "info").lower(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if env.get("FIRSTPASS_LOG_FORMAT", "console").lower() == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
