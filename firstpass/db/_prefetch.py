"""Reading ahead: the next chunks of a chain are fetched in a thread while the caller verifies
or writes the current one (libpq waits and SHA-256 over a line both release the GIL, so the
two overlap). Closing stops the thread and waits for it: the connection is the caller's again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator

__all__ = ["Prefetch"]

_END = object()
_POLL_S = 0.05


class Prefetch(Iterator[bytes]):
    """Iterate ``chunks`` (a generator, run and closed in its own thread) ``depth`` ahead."""

    def __init__(self, chunks: Generator[bytes, None, None], depth: int = 2) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=self._run, args=(chunks,), name="firstpass-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, chunks: Generator[bytes, None, None]) -> None:
        end: object = _END
        try:
            for chunk in chunks:
                if not self._put(chunk):
                    break
        except BaseException as exc:  # handed to the reader, raised there
            end = exc
        finally:
            try:
                chunks.close()  # in this thread: the generator's cleanup uses the connection
            except BaseException as exc:
                end = exc if end is _END else end
        self._put(end)

    def __next__(self) -> bytes:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            self._thread.join()
            raise item
        assert isinstance(item, bytes)
        return item

    def close(self) -> None:
        """Stop reading ahead and wait for the thread (idempotent)."""
        self._done = True
        self._stop.set()
        self._thread.join()
