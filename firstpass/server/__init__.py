"""The OpenAI-compatible HTTP endpoint (aiohttp): routes, errors, streaming, wiring."""

from firstpass.server._app import create_app, run_server, serve_forever
from firstpass.server._handlers import resolve_mode
from firstpass.server._request import MODES, ChatRequest, parse_chat_body

__all__ = [
    "MODES",
    "ChatRequest",
    "create_app",
    "parse_chat_body",
    "resolve_mode",
    "run_server",
    "serve_forever",
]
