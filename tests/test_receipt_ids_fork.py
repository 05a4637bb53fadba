"""Receipt ids stay unique across a fork (the server's workers are forked processes)."""

from __future__ import annotations

import os
import time

from firstpass.receipts import new_receipt_id


def _ids_in_child(count: int) -> list[str]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write its ids and leave without running the parent's cleanup
        os.close(read)
        os.write(write, "\n".join(new_receipt_id() for _ in range(count)).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode().split("\n")


def test_a_forked_child_draws_its_own_random_bits():
    """After a fork, parent and child never hand out the same random part, let alone the same id."""
    new_receipt_id()  # the parent has drawn random bytes before forking
    time.sleep(0.002)  # so the next id in each process starts a new millisecond with a fresh draw
    child = _ids_in_child(50)
    parent = [new_receipt_id() for _ in range(50)]
    assert len(set(child)) == 50 and not set(parent) & set(child)
    assert not {i[-16:] for i in parent} & {i[-16:] for i in child}
