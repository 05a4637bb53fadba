"""Receipts under attack: forged and edited logs, copied files, torn tails, crashes, keys, and
an answer as a client holds it. Each test is named after what a user would see."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass import cli
from firstpass.receipts import (
    GENESIS_HASH,
    CheckpointSigner,
    KeyFiles,
    LineTally,
    ReceiptWriter,
    canonical_bytes,
    discover_chains,
    iter_lines,
    iter_receipts,
    load_public_key,
    new_receipt_id,
    read_lines,
    summarize,
    verify_chain,
    verify_checkpoints,
    verify_files,
    write_key_files,
)
from firstpass.receipts._filestore import FileStore
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

NEVER_S = 3600.0


@pytest.fixture(autouse=True)
def only_these_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", ("receipts", "keygen"))


@pytest.fixture
def key(tmp_path: Path) -> KeyFiles:
    return write_key_files(tmp_path / "keys" / "signing.key")


def request(n: int) -> dict[str, Any]:
    return {"id": new_receipt_id(), "mode": "cascade", "cost": {"total_usd": 0.001 * n}}


def write_signed(path: Path, key: KeyFiles, batches: list[int]) -> None:
    """``batches[i]`` requests then a checkpoint over the head, for each ``i``."""
    signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)

    async def run() -> None:
        async with ReceiptWriter(path, fsync="never") as writer:
            n = 0
            for size in batches:
                for _ in range(size):
                    n += 1
                    await writer.write(request(n))
                await writer.flush()
                head = (await asyncio.to_thread(verify_chain, path)).head
                await writer.write(signer.checkpoint(head))

    asyncio.run(run())


def _hashed(inner: bytes) -> tuple[bytes, str]:
    """A line whose bytes hash as the writer's do: ``{"hash":"…",`` + ``inner`` (the rest,
    ending in ``}``), which need not be canonical JSON."""
    digest = "sha256:" + hashlib.sha256(b"{" + inner).hexdigest()
    return b'{"hash":"' + digest.encode() + b'",' + inner + b"\n", digest


def _members(record: dict[str, Any]) -> list[bytes]:
    return [json.dumps(k).encode() + b":" + canonical_bytes(record[k]) for k in sorted(record)]


def forge_keeping_checkpoints(log: Path, how: str) -> None:
    """Rewrite ``log`` from the genesis hash without the key (every request's cost zeroed),
    and keep each original checkpoint line so that it *parses* with its original
    ``prev_hash`` (the head it signed) while its bytes link it to the rewritten chain:
    ``duplicate`` writes ``prev_hash`` twice (the chain reads the first, JSON the last);
    ``nested`` puts the forged link in an object between ``hash`` and ``id``, ``after_id``
    in one between ``id`` and ``kind``."""
    records = [json.loads(line) for line in log.read_bytes().splitlines()]
    prev = GENESIS_HASH
    out = []
    for original in records:
        body = {k: v for k, v in original.items() if k not in ("hash", "prev_hash")}
        if original.get("kind") == "checkpoint":
            real = b'"prev_hash":' + json.dumps(original["prev_hash"]).encode()
            fake = b'"prev_hash":' + json.dumps(prev).encode()
            members = _members(body)
            if how == "duplicate":
                at = next(i for i, m in enumerate(members) if m > b'"prev_hash"')
                members[at:at] = [fake, real]
            else:  # "ia" sorts before "id", "idx" after it (then "kind" no longer follows "id")
                name = b'"ia"' if how == "nested" else b'"idx"'
                members.append(name + b':{"a":0,' + fake + b"}")
                members.append(real)
                members.sort()
            line, digest = _hashed(b",".join(members) + b"}")
        else:
            body["cost"] = {"total_usd": 0.0}
            body["prev_hash"] = prev
            digest = "sha256:" + hashlib.sha256(canonical_bytes(body)).hexdigest()
            line = canonical_bytes({**body, "hash": digest}) + b"\n"
        out.append(line)
        prev = digest
    log.write_bytes(b"".join(out))


# -- signed checkpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["duplicate", "nested", "after_id"])
def test_a_rewritten_log_fails_verify_pubkey_when_its_checkpoints_are_kept_with_two_links(
    tmp_path: Path, key: KeyFiles, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the key, every request edited and every hash recomputed: the original
    checkpoints, kept with a ``prev_hash`` the chain reads and another one JSON reads, must
    not vouch for the rewritten chain (they did: ``verify --pubkey`` said ok)."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [3, 2])
    forge_keeping_checkpoints(log, how)
    assert verify_chain(log).ok  # the hash chain alone cannot tell (default, byte-level check)
    report = verify_checkpoints([log], load_public_key(key.public))
    assert not report.ok
    assert [p.line for p in report.problems] == [4, 7]
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    out = capsys.readouterr().out
    assert "signatures FAIL" in out
    assert ("not the head this line follows" if how != "after_id" else "'kind' does not") in out


def test_verify_pubkey_standalone_checks_the_chain_under_the_checkpoints(
    tmp_path: Path, key: KeyFiles
) -> None:
    """``verify_checkpoints`` alone (the Python API) on a log edited under a checkpoint: the
    checkpoint's signature is intact, but it no longer follows the head it signed."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [3])
    lines = log.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b'"total_usd":0.001', b'"total_usd":0.000')
    log.write_bytes(b"".join(lines))
    report = verify_checkpoints([log], load_public_key(key.public))
    assert not report.ok
    assert "does not verify" in report.problems[0].reason


def test_verify_names_the_line_that_hashes_but_is_not_json_instead_of_crashing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line forged to pass the byte-level check that is not JSON (or nests too deeply to
    parse) and looks like a gap marker: ``verify`` raised a JSONDecodeError/RecursionError
    traceback, and the writer would not start with anything but that traceback."""
    link = b'"prev_hash":"' + GENESIS_HASH.encode() + b'"'
    for name, tail in (
        ("nonjson", b',"z":}'),
        ("deep", b',"z":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ):
        log = tmp_path / f"{name}.jsonl"
        line, _ = _hashed(b'"id":"x","kind":"gap","mode":"gap",' + link + tail)
        log.write_bytes(line)
        report = verify_chain(log)
        assert not report.ok and report.first_bad_line == 1
        assert report.reason is not None and report.reason.startswith("not ")
        assert cli.main(["receipts", "verify", str(log)]) == 1
        assert "line 1: not " in capsys.readouterr().out

        async def start(path: Path = log) -> None:
            async with ReceiptWriter(path):
                pass

        with pytest.raises(Exception, match="does not verify") as info:
            asyncio.run(start())
        assert type(info.value).__name__ == "ReceiptError"


# -- directories -----------------------------------------------------------------------------


def test_a_copy_of_a_log_beside_it_fails_directory_verify_instead_of_doubling_every_count(
    tmp_path: Path, key: KeyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cp receipts.jsonl receipts.bak.jsonl``: the directory held two chains that each
    verified (signatures too), and summary/iter counted every receipt twice."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_signed(logs / "receipts.jsonl", key, [3, 2])
    shutil.copy(logs / "receipts.jsonl", logs / "receipts.bak.jsonl")
    reports = [verify_files(chain) for chain in discover_chains(logs)]
    assert [r.ok for r in reports] == [True, False]
    assert "same line as" in (reports[1].files[0].problem or "")
    assert cli.main(["receipts", "verify", str(logs), "--pubkey", str(key.public)]) == 1
    assert "one of them is a copy" in capsys.readouterr().out


def test_two_worker_logs_in_one_directory_still_verify(tmp_path: Path, key: KeyFiles) -> None:
    """Distinct chains from the genesis hash (worker 0 and worker 1) are not copies."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_signed(logs / "receipts.jsonl", key, [2])
    write_signed(logs / "receipts.w1.jsonl", key, [3])
    assert cli.main(["receipts", "verify", str(logs), "--pubkey", str(key.public)]) == 0


# -- torn tails ------------------------------------------------------------------------------


def test_a_last_line_missing_only_its_newline_is_kept_not_moved_aside(tmp_path: Path) -> None:
    """A whole receipt whose write stopped one byte short (its newline): start-up repair moved
    the complete, valid receipt out of the chain into a ``.torn`` file as if it were lost."""
    log = tmp_path / "receipts.jsonl"
    ids: list[str] = []

    async def write(n: int) -> None:
        async with ReceiptWriter(log, fsync="always") as writer:
            for i in range(n):
                record = request(i)
                ids.append(record["id"])
                await writer.write(record)

    asyncio.run(write(3))
    log.write_bytes(log.read_bytes()[:-1])  # the last newline never made it
    assert verify_chain(log).torn
    asyncio.run(write(1))
    report = verify_chain(log)
    assert report.ok and report.gaps == () and report.n_receipts == 4
    assert [r["id"] for r in iter_receipts(log)] == ids
    assert not list(tmp_path.glob("*.torn-*"))


def test_a_truly_torn_last_line_is_still_moved_aside_behind_a_gap_marker(tmp_path: Path) -> None:
    log = tmp_path / "receipts.jsonl"

    async def write(n: int) -> None:
        async with ReceiptWriter(log, fsync="always") as writer:
            for i in range(n):
                await writer.write(request(i))

    asyncio.run(write(2))
    log.write_bytes(log.read_bytes()[:-20])
    asyncio.run(write(1))
    report = verify_chain(log)
    assert report.ok and len(report.gaps) == 1 and report.n_receipts == 2
    assert len(list(tmp_path.glob("receipts.jsonl.torn-*"))) == 1


# -- keygen ----------------------------------------------------------------------------------


def test_keygen_force_that_cannot_write_the_public_key_keeps_the_old_private_key(
    tmp_path: Path,
) -> None:
    """``firstpass keygen --force`` when ``KEY.pub`` cannot be written (here a directory):
    the existing private key was replaced, then deleted: no key at all, the server's
    ``signing_key`` gone."""
    old = write_key_files(tmp_path / "signing.key")
    before = old.private.read_bytes()
    old.public.unlink()
    old.public.mkdir()
    assert cli.main(["keygen", "--out", str(old.private), "--force"]) == 2
    assert old.private.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_keygen_replaces_a_symlink_at_the_target_not_the_file_it_points_to(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "signing.key"
    link.symlink_to(victim)
    assert cli.main(["keygen", "--out", str(link)]) == 2  # refused without --force
    assert cli.main(["keygen", "--out", str(link), "--force"]) == 0
    assert victim.read_text() == "keep me"
    assert not link.is_symlink() and (link.stat().st_mode & 0o777) == 0o600


# -- find --answer with what the openai SDK hands a client ---------------------------------

TRICKY = "def add(a, b):\n    return a + b  \r\n\n# naïve ✓ \u2028 end  "
VISIBLE = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verified", [True, False], ids=["verified", "passthrough"])
@pytest.mark.e2e
def test_find_answer_matches_the_content_the_openai_sdk_returns(
    live_stack: Any, tmp_path: Path, stream: bool, verified: bool
) -> None:
    """The documented rule (the content exactly as served, as UTF-8) holds for what a client
    really gets: ``choices[0].message.content``, or the concatenated stream deltas."""
    stack = live_stack()
    stack.stub.script(Reply.ok(f"```python\n{TRICKY}\n```" if verified else TRICKY), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=20)
    extra = {"firstpass": VISIBLE} if verified else {}
    messages: Any = [{"role": "user", "content": "write add(a, b)"}]
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, extra_body=extra
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra)
        text = reply.choices[0].message.content or ""
    stack.flush()
    answer = tmp_path / "answer.txt"
    answer.write_bytes(text.encode("utf-8"))
    assert (
        cli.main(["receipts", "find", "--answer", str(answer), "--path", str(stack.receipts)]) == 0
    )


# -- crash consistency -----------------------------------------------------------------------

_CHILD = r"""
import asyncio, random, sys
from firstpass.receipts import CheckpointSigner, ReceiptWriter, new_receipt_id

async def main():
    signer = CheckpointSigner.from_file(sys.argv[2], interval_s=0.01)
    writer = ReceiptWriter(sys.argv[1], fsync="durable", rotate_bytes=200_000, checkpointer=signer)
    await writer.start()

    async def one():
        rid = new_receipt_id()
        pad = "x" * random.choice([10, 3000, 70000])
        await writer.write({"id": rid, "mode": "cascade", "pad": pad})
        sys.stdout.write("ACK " + rid + "\n")
        sys.stdout.flush()

    while True:
        await asyncio.gather(*(one() for _ in range(random.randint(1, 30))))

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # 8 interpreter starts: seconds alone, minutes on a loaded machine
def test_kill_9_at_random_points_never_loses_an_acknowledged_durable_receipt(
    tmp_path: Path, key: KeyFiles
) -> None:
    """A real writer process killed with SIGKILL at random points (mid-batch, mid-rotation),
    restarted each time: the directory always verifies as one chain, every checkpoint's
    signature holds (the only signature failures are the lines of a crash window, which no
    checkpoint signed), and every record whose durable ``write()`` returned is in it.

    Each kill comes after a random number of acknowledged writes, not after a random time: on
    a loaded machine a time could pass before the child had even imported anything."""
    logs = tmp_path / "logs"
    log = logs / "receipts.jsonl"
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    acked: set[str] = set()
    rng = random.Random(15)
    for _ in range(int(os.environ.get("FIRSTPASS_CRASH_ROUNDS", "8"))):
        target = rng.randint(5, 60)  # a rotation is every ~9 records: most rounds cross one
        proc = subprocess.Popen(
            [sys.executable, str(child), str(log), str(key.private)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        seen: list[str] = []
        while len(seen) < target and (line := proc.stdout.readline()):
            if line.startswith(b"ACK "):
                seen.append(line[4:].decode().strip())
        if not acked:  # the first round: a checkpoint is signed before the first kill
            deadline = time.monotonic() + 120
            while not any(b'"kind":"checkpoint"' in f.read_bytes() for f in logs.iterdir()):
                assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
                time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # the child goes on writing until the signal lands
        out, err = proc.communicate(timeout=60)
        assert len(seen) == target, err.decode()[-2000:]  # it died before `target` acks
        acked.update(seen)
        acked.update(line[4:] for line in out.decode().split("\n")[:-1] if line.startswith("ACK "))

        async def restart() -> None:
            signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)
            async with ReceiptWriter(log, fsync="durable", checkpointer=signer):
                pass

        asyncio.run(restart())
        chains = discover_chains(logs)
        assert len(chains) == 1
        report = verify_files(chains[0])
        assert report.ok, [(f.path.name, f.report, f.problem) for f in report.files]
        signatures = verify_checkpoints(chains[0].files, load_public_key(key.public))
        # a kill between two checkpoints leaves the lines after the last one signed by no one:
        # the only failure allowed is naming them (tests/test_receipts_signing.py: "crash")
        assert signatures.n_checkpoints, signatures
        assert all(" not vouched for: " in p.reason for p in signatures.problems), signatures
        have = {r["id"] for r in iter_receipts(logs)}
        assert acked <= have
    assert len(acked) > 100  # 161 acknowledged before the kills alone (seed 15, 8 rounds)


# -- durable: nothing of an answer before its fsync ------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_with_durable_receipts_no_byte_of_the_answer_leaves_before_its_fsync(
    live_stack: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The receipt's fsync is held back: the client sees no answer (a stream: keep-alive
    comments only, no ``data:`` event) until it is released, then gets it."""
    import http.client
    import threading
    import urllib.parse

    held = threading.Event()
    release = threading.Event()
    original = FileStore._write_batch

    def slow_batch(self: FileStore, records: Any, sync: bool) -> int:
        if records and sync and any(b'"mode":"cascade"' in r.data for r in records):
            held.set()
            release.wait(20)
        return original(self, records, sync)

    monkeypatch.setattr(FileStore, "_write_batch", slow_batch)
    stack = live_stack(receipts_extra={"fsync": "durable"}, keepalive_s=0.2)
    stack.stub.script(Reply.ok("```python\ndef add(a, b):\n    return a + b\n```"), model=CHEAP)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "write add(a, b)"}],
        "stream": stream,
        "firstpass": VISIBLE,
    }
    received: list[bytes] = []
    done = threading.Event()

    def call() -> None:
        url = urllib.parse.urlsplit(stack.base_url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request(
            "POST",
            url.path + "/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        received.append(f"{response.status}".encode())
        while piece := response.read1(65536):
            received.append(piece)
        conn.close()
        done.set()

    thread = threading.Thread(target=call)
    thread.start()
    assert held.wait(20)
    if stream:  # keep-alives go on while the fsync is held: wait for two of them
        deadline = time.monotonic() + 30
        while b"".join(received).count(b"firstpass: verifying") < 2:
            assert time.monotonic() < deadline and not done.is_set(), b"".join(received)
            time.sleep(0.01)
    else:  # nothing at all may go out: a window of several keep-alive intervals
        time.sleep(0.8)  # (load can only lengthen it, never fail it)
    before = b"".join(received)
    assert not done.is_set()
    assert b"data:" not in before and b"add" not in before
    if stream:  # the 200 and keep-alive comments went out: the answer still waited
        assert b"firstpass: verifying" in before
    release.set()
    thread.join(20)
    after = b"".join(received)
    assert b"add" in after
    assert any(r["decision"]["action"] == "served" for r in stack.receipts_list())


# -- client text that looks like a writer line -----------------------------------------------

SPOOF = '","kind":"checkpoint","mode":"gap"} {"kind":"gap"'


@pytest.mark.e2e
def test_client_text_shaped_like_a_checkpoint_or_gap_is_counted_as_the_request_it_is(
    live_stack: Any,
) -> None:
    """``task_id``, a request check's name and its pattern carry ``"kind":"checkpoint"`` and
    ``"kind":"gap"``: every reader still counts one request, and no marker."""
    stack = live_stack()
    stack.stub.script(Reply.ok("```python\ndef add(a, b):\n    return a + b\n```"), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=20)
    checks = {"visible": [{"kind": "regex", "name": SPOOF, "must_match": '"kind":"gap"|def'}]}
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": SPOOF}],
        extra_body={"firstpass": {**VISIBLE, "task_id": SPOOF, "checks": checks}},
    )
    receipts = stack.receipts_list()
    assert len(receipts) == 1 and receipts[0]["request"]["task_id"] == SPOOF
    report = verify_chain(stack.receipts)
    assert report.ok and report.n_receipts == 1 and report.n_special == 0
    assert len(list(iter_receipts(stack.receipts, include_special=True))) == 1
    tally = LineTally()
    summary = summarize(read_lines(iter_lines(stack.receipts), tally), markers=tally.markers)
    assert summary.n == 1 and not summary.markers and tally.unreadable == 0
