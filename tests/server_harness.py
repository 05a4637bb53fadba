"""A live Firstpass server and a stub upstream, both real HTTP on loopback, for SDK-level tests.

Both run on one event loop in a background thread, so the test thread is free to use the
*synchronous* openai client (which would otherwise block the loop the server runs on) as well as
the async one on the test's own loop. The stub is scripted from the test thread before each call.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from firstpass.config import Config, ProviderConfig, config_from_dict
from firstpass.server import create_app, serve_forever
from firstpass.server._keys import RECEIPT_WRITER
from tests.certificates import bind_to_endpoint as bind_to_endpoint
from tests.stub_upstream import StubUpstream

T = TypeVar("T")

CHEAP = "cheap-model"
STRONG = "strong-model"
MODEL = "firstpass-code"


def stack_config(
    upstream_url: str,
    receipts: Path,
    *,
    honours_n: bool = True,
    retries: int = 2,
    timeout_s: float = 5.0,
    on_exhausted: str = "unverified",
    without_checks: str = "passthrough",
    max_concurrency: int = 64,
    max_body_bytes: int = 1_048_576,
    client_keys_env: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    elastic: dict[str, Any] | None = None,
    store_content: bool = False,
    keepalive_s: float = 5.0,
    debug: bool = False,
    strong_k: int | None = None,
    client_modes: list[str] | None = None,
    request_timeout_s: float = 120.0,
    route_extra: dict[str, Any] | None = None,
    prices_extra: list[dict[str, Any]] | None = None,
    receipts_extra: dict[str, Any] | None = None,
    observability: dict[str, Any] | None = None,
    tables: dict[str, Any] | None = None,
) -> Config:
    """A two-rung ladder (cheap → strong) on one stub upstream, with test-sized timeouts;
    ``route_extra`` adds keys to the route (its checks, a revision loop), ``prices_extra``
    prices (a judge's), ``receipts_extra`` keys of ``[receipts]`` (a signing key),
    ``observability`` the ``[observability]`` table; ``tables`` adds top-level tables
    (``budgets``) or keys to one (``{"sandbox": {"concurrency": 1}}`` merges into it)."""
    data: dict[str, Any] = {
        "server": {
            "host": "127.0.0.1",
            "port": 0,
            "max_concurrency": max_concurrency,
            "max_body_bytes": max_body_bytes,
            "client_keys_env": list(client_keys_env),
            "keepalive_s": keepalive_s,
            "debug": debug,
            "request_timeout_s": request_timeout_s,
        },
        "sandbox": {"wall_s": 5.0, "cpu_s": 5.0},
        "receipts": {
            "path": str(receipts),
            "fsync": "never",
            "store_content": store_content,
            **(receipts_extra or {}),
        },
        "provider": [
            {
                "id": "stub",
                "kind": "openai",
                "base_url": upstream_url,
                "timeout_s": timeout_s,
                "connect_timeout_s": 1.0,
                "retries": retries,
                "backoff_base_s": 0.01,
                "backoff_max_s": 0.05,
                "honours_n": honours_n,
            }
        ],
        "route": [
            {
                "name": "code",
                "models": [MODEL],
                "ladder": [
                    f"stub/{CHEAP}",
                    {"rung": f"stub/{STRONG}", "k": strong_k} if strong_k else f"stub/{STRONG}",
                ],
                "temperature": 0.7,
                "on_exhausted": on_exhausted,
                "without_checks": without_checks,
                **({"client_modes": client_modes} if client_modes is not None else {}),
                **(route_extra or {}),
            }
        ],
        "price": _prices(prices_extra or []),
    }
    if elastic is not None:
        # no random audits unless a test asks for them (audit_rate): a would-be skip drawn at
        # the default 5% would be gated, and tests of what enforce serves must not be dice
        data["escalation"] = {"elastic": {"audit_rate": 0.0, **elastic}}
        cited = elastic.get("calibration")
        if cited is not None:  # test certificates are made for this stub upstream
            stub = ProviderConfig(id="stub", kind="openai", base_url=upstream_url)
            listed = [cited] if isinstance(cited, str) else cited
            bind_to_endpoint([receipts.parent / p for p in listed], stub.endpoint)
    if observability is not None:
        data["observability"] = observability
    for name, table in (tables or {}).items():
        data[name] = {**data.get(name, {}), **table}
    return config_from_dict(data, base_dir=receipts.parent, env=env or {})


def _prices(extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ladder's prices, then ``extra``: an entry for a rung already priced adds its keys
    to that rung's (a cache price), any other is a price of its own (a judge's)."""
    prices: dict[str, dict[str, Any]] = {
        f"stub/{CHEAP}": {
            "model": f"stub/{CHEAP}",
            "input_per_mtok": 0.10,
            "output_per_mtok": 0.40,
        },
        f"stub/{STRONG}": {
            "model": f"stub/{STRONG}",
            "input_per_mtok": 3.00,
            "output_per_mtok": 15.00,
        },
    }
    for entry in extra:
        prices[entry["model"]] = {**prices.get(entry["model"], {}), **entry}
    return list(prices.values())


class LiveStack:
    """Stub upstream + Firstpass server on a private loop thread; ``close()`` drains receipts."""

    def __init__(
        self,
        receipts: Path,
        *,
        sandbox_factory: Any = None,
        upstream: str | None = None,
        **config_kwargs: Any,
    ) -> None:
        self.receipts = receipts
        self._sandbox_factory = sandbox_factory
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.stub: StubUpstream = self.run(self._start_stub())
        # ``upstream``: another stack's stub URL (the upstream a certificate was calibrated on)
        self.config = stack_config(upstream or self.stub.url, receipts, **config_kwargs)
        self._stop: asyncio.Event | None = None
        self._server: asyncio.Future[None] | None = None
        self.base_url = self.run(self._start_server())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the stack's loop and wait for it from the calling thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start_stub(self) -> StubUpstream:
        stub = StubUpstream()
        await stub.start()
        return stub

    async def _start_server(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        ready = asyncio.Event()
        self._stop = asyncio.Event()
        self.app = create_app(self.config, sandbox_factory=self._sandbox_factory)
        self._server = asyncio.ensure_future(
            serve_forever(
                self.config,
                sock=sock,
                started=lambda _u: ready.set(),
                stop=self._stop,
                app=self.app,
            )
        )
        waiter = asyncio.ensure_future(ready.wait())
        done, _ = await asyncio.wait({self._server, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if self._server in done:
            waiter.cancel()
            self._server.result()
        return f"http://127.0.0.1:{port}/v1"

    def flush(self) -> None:
        """Wait until every receipt written so far is on disk."""
        self.run(self.app[RECEIPT_WRITER].flush())

    def receipts_list(self) -> list[dict[str, Any]]:
        """Every receipt on disk so far, in order."""
        from firstpass.receipts import iter_receipts

        self.flush()
        return list(iter_receipts(self.receipts))

    async def _stop_server(self) -> None:
        if self._stop is not None and self._server is not None:
            self._stop.set()
            await self._server
            self._stop = self._server = None

    def restart(self, **config_kwargs: Any) -> None:
        """Stop the Firstpass server and start a new one on the same receipts and stub upstream
        (a process restart); ``config_kwargs``: the new server's config, else the same one."""
        self.run(self._stop_server())
        if config_kwargs:
            self.config = stack_config(self.stub.url, self.receipts, **config_kwargs)
        self.base_url = self.run(self._start_server())

    async def _shutdown(self) -> None:
        await self._stop_server()
        await self.stub.close()

    def close(self) -> None:
        try:
            self.run(self._shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()
