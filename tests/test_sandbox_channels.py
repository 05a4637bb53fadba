"""No channel between two samples: abstract unix names, file-event watches, the host's ptys."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from firstpass.sandbox import Limits, Sandbox, parse_spec

#: slow: samples that wait for each other through every channel they might share (~4 s together)
pytestmark = pytest.mark.slow


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    async with Sandbox(concurrency=2, limits=Limits(cpu_s=5, wall_s=10)) as sandbox:
        if sandbox.isolation != "netns+uid":
            pytest.skip(f"needs isolation netns+uid (have {sandbox.isolation})")
        yield sandbox


def _returns(body: str) -> str:
    return "def f():\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())


AUTOBIND = _returns(
    """
import socket
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
except PermissionError:
    return 'refused'
a.connect(('',)) if False else None
return 'allowed'
"""
)


async def test_a_sample_cannot_ask_for_credentials_and_so_autobind_a_unix_name(
    sb: Sandbox,
) -> None:
    """SO_PASSCRED (which autobinds a socket to an abstract name) is refused."""
    result = await sb.run(AUTOBIND, parse_spec(["assert f() == 'refused'"]))
    assert result.passed, result


RECEIVER = _returns(
    """
import ctypes, socket, struct, time
libc = ctypes.CDLL(None, use_errno=True)
s, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
for opt in (16, 76):  # SO_PASSCRED, SO_PASSPIDFD: the kernel autobinds on the next send
    try:
        s.setsockopt(socket.SOL_SOCKET, opt, 1)
    except OSError:
        pass
try:
    s.send(b'autobind')
except OSError:
    pass
unspec = ctypes.create_string_buffer(struct.pack('H', 0), 16)
libc.connect(s.fileno(), unspec, 16)  # AF_UNSPEC: unpair, keep the name
s.settimeout(0.2)
end = time.monotonic() + 3
while time.monotonic() < end:
    try:
        if s.recv(100) == b'hello':
            return 'received'
    except OSError:
        pass
return 'nothing'
"""
)
SENDER = _returns(
    """
import socket, time
sent = 0
end = time.monotonic() + 3
while time.monotonic() < end:
    try:
        names = [l.split()[-1] for l in open('/proc/net/unix').read().splitlines()[1:]
                 if l.split()[-1].startswith('@')]
    except OSError:
        names = []
    for name in names:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError:
            s, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.sendto(b'hello', b'\\0' + name[1:].encode())
            sent += 1
        except OSError:
            pass
    time.sleep(0.05)
return sent
"""
)


async def test_two_samples_find_no_abstract_unix_name_to_talk_through(sb: Sandbox) -> None:
    """A sample that tries every route to a name, and one that sends to any name it can see in
    /proc/net/unix, run side by side: nothing arrives."""
    receiver = asyncio.ensure_future(sb.run(RECEIVER, parse_spec(["assert f() == 'nothing'"])))
    sender = asyncio.ensure_future(sb.run(SENDER, parse_spec(["assert f() == 0"])))
    got, sent = await asyncio.gather(receiver, sender)
    assert got.passed, got
    assert sent.passed, sent


INOTIFY = _returns(
    """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
return 'refused' if fd < 0 and ctypes.get_errno() == 1 else 'allowed'
"""
)


async def test_a_sample_cannot_watch_file_events(sb: Sandbox) -> None:
    """inotify (which shows what host files others open) is refused."""
    result = await sb.run(INOTIFY, parse_spec(["assert f() == 'refused'"]))
    assert result.passed, result


PTY = _returns(
    """
import os
try:
    fd = os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY)
except OSError:
    return 'no pty'
os.close(fd)
return 'pty'
"""
)


async def test_a_sample_cannot_take_ptys_from_the_hosts_pool(sb: Sandbox) -> None:
    """/dev/ptmx is covered: no pty of the host's limited pool can be held by a sample."""
    result = await sb.run(PTY, parse_spec(["assert f() == 'no pty'"]))
    assert result.passed, result


async def test_asyncio_still_runs_in_a_sample(sb: Sandbox) -> None:
    """socketpair stays allowed: asyncio's loop (its self-pipe is a socketpair) works."""
    code = "import asyncio\nasync def g():\n    return 3\ndef f():\n    return asyncio.run(g())\n"
    result = await sb.run(code, parse_spec(["assert f() == 3"]))
    assert result.passed, result


NET_VIEW = _returns(
    """
import os, socket
held = []
for _ in range(20):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b'x', ('10.255.255.1', 9))  # autobinds a port, even with no route
    except OSError:
        pass
    held.append(s)
udp = len(open('/proc/net/udp').read().splitlines()) - 1
cgroups = os.listdir('/sys/fs/cgroup') if os.path.isdir('/sys/fs/cgroup') else []
return [udp, cgroups]
"""
)


async def test_a_sample_sees_no_other_samples_sockets_or_cgroup_usage(sb: Sandbox) -> None:
    """Two samples each holding 20 autobound UDP sockets see only their own in /proc/net, and
    no slot's memory or CPU usage under /sys/fs/cgroup (both were channels)."""
    spec = parse_spec(["assert f() == [20, []]"])
    results = await asyncio.gather(*(sb.run(NET_VIEW, spec) for _ in range(4)))
    assert all(r.passed for r in results), [r.tests[0].message for r in results]
