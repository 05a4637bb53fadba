"""The app's typed state: every ``web.AppKey`` the server's modules share, in one place.

Kept apart from the handlers and the wiring so that each imports the keys, not the other
(the error middleware reads the config; the wiring fills every key; the handlers read them).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
from aiohttp import web

from firstpass.admission import SpecParser
from firstpass.config import Config
from firstpass.pipeline import Checks, Pipeline, SandboxService
from firstpass.providers import Provider
from firstpass.receipts import ReceiptLog
from firstpass.server._auth import KeyRing

__all__ = [
    "CLIENT_KEYS",
    "CONFIG",
    "ENDPOINTS",
    "PARSE_SPEC",
    "PIPELINE",
    "PROVIDERS",
    "RECEIPT_WRITER",
    "ROUTE_CHECKS",
    "SANDBOX",
    "SESSION",
    "STATE",
    "Endpoint",
    "Handler",
    "ServerState",
    "SpecParser",
]


@dataclass
class ServerState:
    """Mutable per-app counters: requests in flight, bodies being read (and the bytes they
    hold), and whether start-up finished."""

    in_flight: int = 0
    #: receipted requests whose body is being read (they hold no concurrency slot yet)
    reading: int = 0
    #: bytes those bodies hold so far
    body_bytes: int = 0
    ready: bool = False
    started_at: float = field(default_factory=time.time)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: how the API's middlewares (``_door``) treat an endpoint: ``keyed`` takes a client key;
#: ``receipted`` also gives every request its one receipt, a refused one included (a request
#: the pipeline would have run)
Endpoint = Literal["keyed", "receipted"]

CONFIG = web.AppKey("config", Config)
#: the accepted client keys (``firstpass.server._auth.KeyRing``), built once at start
CLIENT_KEYS = web.AppKey("client_keys", KeyRing)
STATE = web.AppKey("state", ServerState)
PIPELINE = web.AppKey("pipeline", Pipeline)
RECEIPT_WRITER = web.AppKey("receipt_writer", ReceiptLog)
SESSION = web.AppKey("session", aiohttp.ClientSession)
PROVIDERS: web.AppKey[dict[str, Provider]] = web.AppKey("providers", dict)
SANDBOX = web.AppKey("sandbox", SandboxService)
#: route name -> the checks of its [route.checks], parsed at start
ROUTE_CHECKS: web.AppKey[dict[str, Checks]] = web.AppKey("route_checks", dict)
#: the API's endpoints, by handler; any other (health, metrics, an unknown path) is open
ENDPOINTS: web.AppKey[dict[Handler, Endpoint]] = web.AppKey("endpoints", dict)
#: the sandbox's spec parser (``firstpass.sandbox.parse_spec``), as admission takes it
PARSE_SPEC: web.AppKey[SpecParser] = web.AppKey("parse_spec", object)  # type: ignore[arg-type]
