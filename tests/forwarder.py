"""A loopback TCP forwarder for tests: a TLS terminator in front of the dev server, or a
cable to pull out from under PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading

from worker.stack import free_port


class Forwarder:
    """A loopback TCP forwarder to ``upstream`` on its own thread and event loop.

    With ``tls`` it terminates TLS first (the test's stand-in for a TLS cluster or
    Temporal Cloud's front door). :meth:`stop` closes the listener and every open
    connection, so clients see the far side go away.
    """

    def __init__(self, upstream: str, tls: ssl.SSLContext | None = None) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.tls = tls
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def start(self) -> Forwarder:
        self._thread.start()

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self.tls)

        self._server = asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
