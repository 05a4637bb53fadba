"""Hostile samples: each is contained, categorized, and leaves the host healthy."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from firstpass.sandbox import Limits, Sandbox, parse_spec
from tests.sandbox_helpers import leftover_files, processes_of

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the hostile suite needs root (uid isolation)"),
    pytest.mark.slow,  # hostile samples run to their real limits (~17 s together)
]

SPEC = parse_spec(["assert f(1) == 2", "assert f(2) == 3"])
GOOD = "def f(x):\n    return x + 1\n"
#: CPU time is what bounds a spinning sample (load does not change it); the wall limit is far
#: above it so that on a loaded machine a memory or output bomb still meets its own limit
#: first, not the wall clock (at load 30 a 3 s wall limit ended memory_bomb_list as a timeout)
FAST = Limits(cpu_s=2.0, wall_s=30.0, memory_mb=256, nproc=16, output_bytes=100_000)
#: how long cleanup may take after an answer: it runs at once, but a loaded machine is slow
CLEANUP_S = 30.0


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    async with Sandbox(concurrency=2, limits=FAST) as sandbox:
        assert sandbox.isolation == "netns+uid"
        yield sandbox


async def assert_healthy(sb: Sandbox) -> None:
    """The next normal sample passes, no sandbox-uid process is alive, no file is left."""
    result = await sb.run(GOOD, SPEC)
    assert result.passed, result
    deadline = time.monotonic() + CLEANUP_S  # cleanup runs right after the answer is sent
    while (processes_of(sb.worker_uids) or leftover_files(sb)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert processes_of(sb.worker_uids) == []
    assert leftover_files(sb) == []


HOSTILE = [
    ("infinite_loop", "def f(x):\n    while True:\n        pass\n", "timeout"),
    ("infinite_loop_at_load", "while True:\n    pass\n", "timeout"),
    (
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "timeout",
    ),
    ("memory_bomb", "def f(x):\n    return len(bytearray(10**10))\n", "memory_limit"),
    (
        "memory_bomb_list",
        "def f(x):\n    a = []\n    while True:\n        a.append(bytearray(10**8))\n",
        "memory_limit",
    ),
    ("deep_recursion", "def f(x):\n    return f(x) + 1\n", "runtime_error"),
    ("segfault", "import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n", "runtime_error"),
    ("huge_output", "def f(x):\n    while True:\n        print('x' * 10000)\n", "output_limit"),
    (
        "huge_output_at_load",
        "import sys\nsys.stdout.write('y' * 10**7)\nsys.stdout.flush()\n",
        "output_limit",
    ),
    (
        "sys_exit_before_tests",
        "import sys\ndef f(x):\n    return 0\nsys.exit(0)\n",
        "runtime_error",
    ),
    ("os_exit_before_tests", "import os\ndef f(x):\n    return 0\nos._exit(0)\n", "runtime_error"),
    ("os_exit_inside_test", "import os\ndef f(x):\n    os._exit(0)\n", "runtime_error"),
    (
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(x):\n    return 0\n",
        "assertion_failed",  # pid 1 of its own namespace: no parent in sight, so it lives on
    ),
    (
        "kill_everything",
        "import os, signal\ndef f(x):\n    os.kill(-1, signal.SIGKILL)\n",
        "runtime_error",  # alone in its PID namespace: there is nobody to kill (ESRCH)
    ),
    (
        "eq_always_true",
        "class A:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
        "def f(x):\n    return A()\n",
        "unsupported",
    ),
    (
        "int_subclass_eq",
        "class I(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return I(0)\n",
        "assertion_failed",
    ),
    (
        "patch_builtins_and_assertionerror",
        "import builtins\nbuiltins.AssertionError = type('AE', (Exception,), {})\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.bool = lambda *a: True\n"
        "def f(x):\n    return -1\n",
        "runtime_error",
    ),
    (
        "forged_stdout",
        'import sys\nprint(\'{"t":"test","i":0,"values":[{"v":2}]}\')\n'
        "print('PASSED 2/2', file=sys.stderr)\ndef f(x):\n    return -1\n",
        "assertion_failed",
    ),
    (
        "garbage_on_result_fd",
        "import os\nos.write(3, b'\\x00\\x00\\x00\\x05hello')\ndef f(x):\n    return 0\n",
        "sandbox_violation",
    ),
    (
        "forged_record_then_harness",
        "import os, json\ndata = json.dumps({'t': 'load'}).encode()\n"
        "os.write(3, len(data).to_bytes(4, 'big') + data)\ndef f(x):\n    return x + 1\n",
        "sandbox_violation",
    ),
    (
        "forged_records_then_exit",
        "import os, json\n"
        "for rec in ({'t': 'load'}, {'t': 'test', 'i': 0, 'values': [{'v': 999}]},\n"
        "            {'t': 'test', 'i': 1, 'values': [{'v': 999}]}, {'t': 'done'}):\n"
        "    data = json.dumps(rec).encode()\n"
        "    os.write(3, len(data).to_bytes(4, 'big') + data)\n"
        "os._exit(0)\n",
        "sandbox_violation",
    ),
    ("close_result_fd", "import os\nos.close(3)\ndef f(x):\n    return x + 1\n", "runtime_error"),
    (
        "close_all_fds",
        "import os\nos.closerange(0, 1000)\ndef f(x):\n    return x + 1\n",
        "runtime_error",
    ),
    ("close_fd_then_hang", "import os\nos.close(3)\nwhile True:\n    pass\n", "runtime_error"),
    (
        "escaped_grandchild",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
        "def f(x):\n    return -1\n",
        "assertion_failed",
    ),
]


@pytest.mark.parametrize(("name", "code", "category"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_sample_is_contained_and_categorized(
    sb: Sandbox, name: str, code: str, category: str
) -> None:
    """Each hostile sample fails with its category and the host stays healthy."""
    result = await sb.run(code, SPEC)
    assert not result.passed
    assert result.category == category, result.tests
    assert result.isolation == "netns+uid"
    await assert_healthy(sb)


async def test_failing_test_does_not_hide_the_others(sb: Sandbox) -> None:
    """A test that hangs times out on its own; the tests after it still report."""
    spec = parse_spec(["assert f(1) == 2", "assert f(0) == 1", "assert f(3) == 4"])
    code = "def f(x):\n    while x == 1:\n        pass\n    return x + 1\n"
    result = await sb.run(code, spec, limits=Limits(cpu_s=2, wall_s=30))
    assert [t.passed for t in result.tests] == [False, True, True]
    assert result.tests[0].error_type == "timeout"


async def test_network_is_unreachable(sb: Sandbox) -> None:
    """A sample cannot connect to a listener on the host's 127.0.0.1."""
    connections = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = (
        "import socket\n"
        "def f(x):\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
        "    return x + 1\n"
    )
    async with server:
        result = await sb.run(code, SPEC)
        await asyncio.sleep(0.05)
    assert not result.passed
    assert result.category == "runtime_error"
    assert connections == []
    await assert_healthy(sb)


async def test_parent_environment_secret_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret in the parent's environment is in neither the sample's environ nor /proc."""
    monkeypatch.setenv("FIRSTPASS_TEST_SECRET", "s3cret-value")
    code = (
        "import os\n"
        "def found():\n"
        "    if any('s3cret' in v for v in os.environ.values()):\n"
        "        return True\n"
        "    for pid in os.listdir('/proc'):\n"
        "        try:\n"
        "            if b's3cret' in open(f'/proc/{pid}/environ', 'rb').read():\n"
        "                return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
        "def f(x):\n"
        "    return 'leaked' if found() else x + 1\n"
    )
    async with Sandbox(concurrency=1, limits=FAST) as sandbox:
        result = await sandbox.run(code, SPEC)
    assert result.passed, result.tests


async def test_writes_outside_the_work_dir_do_not_reach_the_host(
    sb: Sandbox, tmp_path: Path
) -> None:
    """Writing to /tmp, the repo or a host directory leaves no file on the host."""
    target = tmp_path / "planted"
    repo_file = Path(__file__).resolve().parent / "sandbox-escape.txt"
    host_tmp = Path("/tmp") / f"firstpass-escape-{os.getpid()}"
    code = (
        "def f(x):\n"
        "    wrote = 0\n"
        f"    for path in {[str(target), str(repo_file), str(host_tmp)]!r}:\n"
        "        try:\n"
        "            open(path, 'w').write('x')\n"
        "            wrote += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    return x + 1\n"
    )
    result = await sb.run(code, SPEC)
    assert result.passed
    assert not target.exists() and not repo_file.exists() and not host_tmp.exists()
    await assert_healthy(sb)


async def test_deleting_host_files_fails(sb: Sandbox, tmp_path: Path) -> None:
    """A sample cannot delete the package's own files or a file the host owns."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    harness = (
        Path(__file__).resolve().parent.parent / "firstpass" / "sandbox" / "_child" / "worker.py"
    )
    code = (
        "import os, shutil\n"
        f"for p in [{str(victim)!r}, {str(harness)!r}]:\n"
        "    try:\n"
        "        os.remove(p)\n"
        "    except OSError:\n"
        "        pass\n"
        f"shutil.rmtree({str(harness.parent)!r}, ignore_errors=True)\n"
        "def f(x):\n"
        "    return x + 1\n"
    )
    result = await sb.run(code, SPEC)
    assert result.passed
    assert victim.read_text() == "keep me"
    assert harness.exists()
    await assert_healthy(sb)


async def test_files_written_in_the_work_dir_are_removed(sb: Sandbox) -> None:
    """Files a sample writes in its work dir and private /tmp are gone after the run."""
    code = (
        "import os\n"
        "open('here.txt', 'w').write('x')\n"
        "os.makedirs('deep/er', exist_ok=True)\n"
        "open('/tmp/stray.txt', 'w').write('x')\n"
        "os.chmod('deep', 0)\n"
        "def f(x):\n"
        "    return x + 1\n"
    )
    result = await sb.run(code, SPEC)
    assert result.passed
    await assert_healthy(sb)


async def test_concurrent_hostile_and_good_samples_do_not_interfere(sb: Sandbox) -> None:
    """A fork bomb running next to good samples does not change their verdicts."""
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    results = await sb.run_many([bomb, GOOD, GOOD, "def f(x):\n    return 0\n"], SPEC)
    assert [r.passed for r in results] == [False, True, True, False]
    assert results[0].category == "timeout"
    await assert_healthy(sb)


async def test_home_directories_are_hidden(sb: Sandbox) -> None:
    """Nothing in the host's /root or /home is visible, except the interpreter the sandbox runs."""
    visible = {
        p: sorted(os.listdir(p)) for p in ("/root", "/home") if os.path.isdir(p) and os.listdir(p)
    }
    code = (
        "import os\n"
        "def f(x):\n"
        f"    for d, names in {visible!r}.items():\n"
        "        seen = os.listdir(d) if os.path.isdir(d) else []\n"
        "        if any(n in seen and n != '.pyenv' for n in names):\n"
        "            return 'visible'\n"
        "    return x + 1\n"
    )
    result = await sb.run(code, SPEC)
    assert result.passed, result.tests


async def test_lingering_grandchild_neither_delays_nor_outlives_the_run(sb: Sandbox) -> None:
    """A forked child that keeps the result channel open is killed once the worker is done:
    the run ends well before the wall limit it would otherwise wait for (30 s), a bound load
    cannot reach (waiting for the child would take at least that long, load or not)."""
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(600)\n"
        "    os._exit(0)\n"
        "def f(x):\n"
        "    return x + 1\n"
    )
    t0 = time.monotonic()
    result = await sb.run(code, SPEC)
    assert result.passed, result.tests
    assert time.monotonic() - t0 < FAST.wall_s / 2
    await assert_healthy(sb)


#: a sample that searches its own process memory for "FPMARK-" followed by 16 hex digits
MEMORY_SCAN = """
import ctypes, re
def f(x):
    pattern = re.compile(rb"FPMARK-([0-9a-f]{16})")
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        if "r" not in fields[1] or (len(fields) > 5 and fields[5] not in ("[heap]", "[stack]")):
            continue  # anonymous memory holds every Python object; files could SIGBUS
        start, end = (int(p, 16) for p in fields[0].split("-"))
        found = pattern.search(ctypes.string_at(start, end - start))
        if found:
            return "FPMARK-" + found.group(1).decode()
    return "not found"
"""


async def test_expected_values_and_other_samples_never_enter_the_worker(sb: Sandbox) -> None:
    """Neither a case's expected value, an assert's, nor an earlier sample's code is in the
    memory of the process that runs the sample."""
    mark = "FPMARK-" + os.urandom(8).hex()
    other = "FPMARK-" + os.urandom(8).hex()
    cases = parse_spec({"entry_point": "f", "cases": [{"args": [1], "expected": mark}]})
    asserts = parse_spec([f"assert f(1) == {mark!r}"])
    await sb.run(f"def f(x):\n    return {other!r}\n", asserts)  # another sample's code
    for spec in (cases, asserts):
        result = await sb.run(MEMORY_SCAN, spec)
        assert not result.passed, "the sample found the expected value in its memory"
        assert result.tests[0].message in (  # the scan ran to the end and found nothing
            f"expected {mark!r}, got 'not found'",
            "assertion failed: f(1) -> 'not found'",
        )
    # control: the scan does find what the worker is sent on purpose (the arguments)
    sent = "FPMARK-" + os.urandom(8).hex()
    control = parse_spec({"entry_point": "f", "cases": [{"args": [sent], "expected": sent}]})
    assert (await sb.run(MEMORY_SCAN, control)).passed
