"""A TCP relay in front of a test PostgreSQL, so a test can take the database away from a client
and give it back: ``cut()`` resets every connection and refuses new ones (the server gone),
clearing ``flowing`` holds the bytes (a server that hangs), ``start()`` listens again on the same
port. ``dsn`` is the test DSN rewritten to go through the relay."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from psycopg import conninfo

__all__ = ["PgRelay"]

_Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class PgRelay:
    """Relays 127.0.0.1:``port`` to the server ``dsn`` names (a Unix socket or TCP)."""

    def __init__(self, dsn: str) -> None:
        params = conninfo.conninfo_to_dict(dsn)
        host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
        self._target: Callable[[], Awaitable[_Streams]]
        if host.startswith("/"):
            self._target = lambda: asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            self._target = lambda: asyncio.open_connection(host, port)
        self._dsn = dsn
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.flowing = asyncio.Event()  # cleared: bytes are held, as by a hung server
        self.flowing.set()

    @property
    def dsn(self) -> str:
        return conninfo.make_conninfo(
            self._dsn, host="127.0.0.1", port=str(self.port), connect_timeout="2"
        )

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self._target()
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}
