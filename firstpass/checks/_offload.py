"""Where checks do CPU work: a small thread pool of their own, off the event loop.

Patterns and schemas may come from a client. Each search is time-limited, but a hostile
definition can still keep a thread busy for a while; on a pool of their own such checks can
only queue behind each other, never take the threads the rest of the proxy uses
(``asyncio.to_thread``'s default pool: receipts, probe inputs).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["off_loop"]

T = TypeVar("T")

#: threads for check work: enough for the CPU, few enough that a flood only queues
_POOL = ThreadPoolExecutor(
    max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="firstpass-checks"
)


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the checks' pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args))
