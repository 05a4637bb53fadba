"""The OpenAI-compatible HTTP endpoint (aiohttp): routes, errors, streaming, wiring.

What a request may do and as what is ``firstpass.admission``'s; this package is its HTTP side.
"""

from firstpass.server._app import create_app, run_server, serve_forever

__all__ = ["create_app", "run_server", "serve_forever"]
