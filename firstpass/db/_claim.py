"""Who holds a replica id: one row per id in ``firstpass_replicas``, refreshed while its holder
is connected.

A session advisory lock alone cannot say it: PostgreSQL drops the lock with the connection, so
after the database restarts, a second process started with the same id would get it while the
first still runs, and the two would then write one chain (a fork) or release each other's budget
holds (an overspend). The row outlives connections. A process takes an id another process
holds only once that holder is gone: on the same host, once its pid is gone (a replica
restarted after ``kill -9`` gets its id back at once; one merely cut off from the database
keeps it); on another host, once it has been silent for ``LEASE_S``. A holder that finds its id
taken when it reconnects (a holder on another host, cut off past the lease) stops writing under
it.

The receipt writer refreshes the row (``HEARTBEAT_S``); the shared budget ledger of the same
process claims the id with the same process token, so the two never contend.
"""

from __future__ import annotations

import os
import socket
import uuid

import psycopg
from psycopg.rows import TupleRow

from firstpass.errors import ReceiptError

__all__ = [
    "HEARTBEAT_S",
    "LEASE_S",
    "ReplicaInUse",
    "ReplicaTakenOver",
    "claim",
    "heartbeat",
    "holder",
    "process_token",
]

#: how long a holder may be silent before another process may take its id
LEASE_S = 30.0
#: how often a connected holder says it is alive
HEARTBEAT_S = 10.0

_TOKENS: dict[int, str] = {}


class ReplicaInUse(ReceiptError):
    """Another live process holds this replica id."""


class ReplicaTakenOver(ReceiptError):
    """While this process was away, another took its replica id: it must stop writing."""


def process_token() -> str:
    """This process's token (a forked worker gets its own, not its parent's)."""
    pid = os.getpid()
    token = _TOKENS.get(pid)
    if token is None:
        token = _TOKENS[pid] = f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:12]}"
    return token


async def claim(
    conn: psycopg.AsyncConnection[TupleRow],
    replica: str,
    *,
    first: bool,
    lease_s: float = LEASE_S,
) -> None:
    """Hold ``replica`` for this process, or raise. ``first``: at start (an id left by a dead or
    long-silent process is taken over); else a reconnect, where finding another holder means
    this process lost the id (``ReplicaTakenOver``)."""
    me = process_token()
    host, pid = socket.gethostname(), os.getpid()
    async with conn.transaction():
        row = await (
            await conn.execute(
                "SELECT owner, host, pid, extract(epoch FROM now() - seen)::float8"
                " FROM firstpass_replicas WHERE replica = %s FOR UPDATE",
                (replica,),
            )
        ).fetchone()
        if row is not None and row[0] != me:
            owner_host, owner_pid, silent_s = str(row[1]), int(row[2]), float(row[3])
            if not first:
                raise ReplicaTakenOver(
                    f"replica id {replica!r} was taken by pid {owner_pid} on {owner_host} while "
                    "this process could not reach the database; it stops writing under it. "
                    "Keep its spill file: the receipts it holds are not in the table; its "
                    "first line links to this replica's chain as it was before the takeover"
                )
            if _holds(owner_host, owner_pid, silent_s, lease_s):
                raise ReplicaInUse(
                    f"replica id {replica!r} is held by pid {owner_pid} on {owner_host}, last "
                    f"seen {silent_s:.0f} s ago: give each replica its own id ([receipts] "
                    f"replica or FIRSTPASS_REPLICA). If that process is gone, its id is free "
                    f"at once on that host, elsewhere {lease_s:.0f} s after it was last seen"
                )
        await conn.execute(
            "INSERT INTO firstpass_replicas (replica, owner, host, pid, seen)"
            " VALUES (%s, %s, %s, %s, now()) ON CONFLICT (replica) DO UPDATE"
            " SET owner = excluded.owner, host = excluded.host, pid = excluded.pid,"
            " seen = excluded.seen",
            (replica, me, host, pid),
        )


async def heartbeat(conn: psycopg.AsyncConnection[TupleRow], replica: str) -> None:
    """Say this process still holds ``replica``; ``ReplicaTakenOver`` if it no longer does."""
    cursor = await conn.execute(
        "UPDATE firstpass_replicas SET seen = now() WHERE replica = %s AND owner = %s",
        (replica, process_token()),
    )
    if cursor.rowcount != 1:
        raise ReplicaTakenOver(
            f"replica id {replica!r} is no longer held by this process; it stops writing"
        )


def holder(
    conn: psycopg.Connection[TupleRow], replica: str, *, lease_s: float = LEASE_S
) -> str | None:
    """Who holds ``replica`` by ``claim``'s own rule (seen less than ``lease_s`` ago by a
    process that may be alive), as ``pid P on HOST, last seen N s ago``; ``None`` when the id
    is free (no row, or a holder that is gone or long silent). Reads only: claims nothing."""
    row = conn.execute(
        "SELECT owner, host, pid, extract(epoch FROM now() - seen)::float8"
        " FROM firstpass_replicas WHERE replica = %s",
        (replica,),
    ).fetchone()
    if row is None or row[0] == process_token():
        return None
    owner_host, owner_pid, silent_s = str(row[1]), int(row[2]), float(row[3])
    if _holds(owner_host, owner_pid, silent_s, lease_s):
        return f"pid {owner_pid} on {owner_host}, last seen {max(silent_s, 0.0):.0f} s ago"
    return None


def _holds(host: str, pid: int, silent_s: float, lease_s: float) -> bool:
    """Whether a recorded holder may still hold its id: on this host, as long as its pid runs
    (however long it was silent: a process cut off from the database still answers requests
    and spills their receipts); on another host, for ``lease_s`` after it was last seen."""
    if host == socket.gethostname():
        return _alive(host, pid)
    return silent_s < lease_s


def _alive(host: str, pid: int) -> bool:
    """Whether the holder may still run: on another host, assume so; on this one, its pid
    exists and is not this process (a container restarted with the same pid is a new life)."""
    if host != socket.gethostname():
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
