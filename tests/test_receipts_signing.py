"""Signed checkpoints: a log signed by the writer verifies under its public key, and a log
rewritten without the private key does not; ``firstpass keygen`` makes that key safely."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from firstpass import cli
from firstpass.config import config_from_dict
from firstpass.errors import ConfigError, ReceiptError
from firstpass.receipts import (
    GENESIS_HASH,
    CheckpointSigner,
    KeyFiles,
    ReceiptWriter,
    iter_receipts,
    load_public_key,
    new_receipt_id,
    verify_chain,
    verify_checkpoints,
    write_key_files,
)
from firstpass.receipts._rotate import next_rotated_name

#: an interval no test waits out: the only checkpoints are the ones a test makes happen
NEVER_S = 3600.0


@pytest.fixture(autouse=True)
def only_these_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the CLI parser with just the commands under test."""
    monkeypatch.setattr(cli, "COMMANDS", ("receipts", "keygen"))


@pytest.fixture
def key(tmp_path: Path) -> KeyFiles:
    return write_key_files(tmp_path / "keys" / "signing.key")


@pytest.fixture
def other_key(tmp_path: Path) -> KeyFiles:
    return write_key_files(tmp_path / "other" / "signing.key")


def request(n: int) -> dict[str, Any]:
    return {
        "id": new_receipt_id(),
        "mode": "cascade",
        "decision": {"action": "served"},
        "cost": {"total_usd": 0.001 * n},
    }


def write_signed(path: Path, key: KeyFiles, batches: list[int]) -> None:
    """Write ``batches[i]`` requests then a checkpoint over the head, for each ``i``, with the
    real writer and signer (the periodic hook is tested on its own below)."""
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


def rewrite_from_genesis(
    path: Path, *, keep_checkpoints: bool, resign: KeyFiles | None = None
) -> None:
    """What someone with write access but without the key can do: change a request, drop or
    keep (or re-sign with their own key) the checkpoints, and recompute every hash from the
    genesis hash with the writer's own code, so the hash chain verifies again."""
    records = [
        {k: v for k, v in record.items() if k not in ("hash", "prev_hash")}
        for record in iter_receipts(path, include_special=True)
    ]
    for record in records:
        if "kind" not in record:
            record["cost"] = {"total_usd": 0.0}  # the edit the rewrite is for
    forger = CheckpointSigner.from_file(resign.private, interval_s=NEVER_S) if resign else None
    path.unlink()

    async def run() -> None:
        async with ReceiptWriter(path, fsync="never") as writer:
            for record in records:
                if record.get("kind") == "checkpoint":
                    if forger is not None:
                        await writer.flush()
                        head = (await asyncio.to_thread(verify_chain, path)).head
                        record = forger.checkpoint(head)
                    elif not keep_checkpoints:
                        continue
                await writer.write(record)

    asyncio.run(run())
    assert verify_chain(path).ok  # the chain alone cannot tell


def public(key: KeyFiles) -> Any:
    return load_public_key(key.public)


# -- what verifies -------------------------------------------------------------------------


def test_a_signed_log_verifies_with_its_public_key(tmp_path: Path, key: KeyFiles, capsys):
    """Every checkpoint verifies; the CLI prints the count and the key id and exits 0."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [3, 2])
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.n_checkpoints == 2 and report.problems == ()
    assert report.n_lines == 7 and report.unsigned_tail_lines == 0
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: 5 receipts, 2 checkpoint(s), head ")
    assert out[1].startswith(f"signatures ok: 2 checkpoint(s) verify with {key.key_id}")


def test_lines_after_the_last_checkpoint_are_reported_as_unsigned_not_as_a_failure(
    tmp_path: Path, key: KeyFiles, capsys
):
    """The live log's newest lines are not signed yet: counted, and the log still verifies."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2])
    asyncio.run(_append(log, [request(9), request(10)]))
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.unsigned_tail_lines == 2
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 0
    assert "2 line(s) after the last checkpoint are not signed yet" in capsys.readouterr().out


async def _append(path: Path, records: list[dict[str, Any]]) -> None:
    async with ReceiptWriter(path, fsync="never") as writer:
        for record in records:
            await writer.write(record)


def test_a_checkpoint_is_a_special_line_that_names_its_key_and_signs_its_prev_hash(
    tmp_path: Path, key: KeyFiles
):
    """The record shape readers rely on: ``kind``/``mode`` = checkpoint, ``signed.head`` = its
    own ``prev_hash``, the key id and a base64 signature; no request content."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [1])
    lines: list[dict[str, Any]] = list(iter_receipts(log, include_special=True))
    request_line, checkpoint = lines
    assert checkpoint["kind"] == checkpoint["mode"] == "checkpoint"
    assert checkpoint["signed"]["head"] == checkpoint["prev_hash"] == request_line["hash"]
    assert checkpoint["signed"]["key_id"] == key.key_id
    assert checkpoint["id"].startswith("rcpt_") and checkpoint["time"].endswith("Z")
    assert len(checkpoint["signature"]) == 88  # 64 bytes, base64


# -- what does not -------------------------------------------------------------------------


def test_a_signed_log_fails_with_another_public_key(
    tmp_path: Path, key: KeyFiles, other_key: KeyFiles, capsys
):
    """Checked against the wrong key, every checkpoint fails and the CLI exits 1 naming it."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2, 1])
    report = verify_checkpoints([log], public(other_key))
    assert not report.ok and [p.line for p in report.problems] == [3, 5]
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(other_key.public)]) == 1
    out = capsys.readouterr().out
    assert f"{log}:3: signed by another key ({key.key_id}" in out
    assert "signatures FAIL" in out


def test_a_log_rewritten_from_genesis_keeping_its_checkpoints_fails(
    tmp_path: Path, key: KeyFiles, capsys
):
    """Copied into the rewritten chain, each checkpoint signs a head that is no longer there."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2, 2])
    rewrite_from_genesis(log, keep_checkpoints=True)
    report = verify_checkpoints([log], public(key))
    assert not report.ok and len(report.problems) == 2
    assert all("is not this line's prev_hash" in p.reason for p in report.problems)
    assert cli.main(["receipts", "verify", str(log)]) == 0  # the chain alone: fine
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    assert "a checkpoint copied from another chain" in capsys.readouterr().out


def test_a_log_rewritten_from_genesis_without_its_checkpoints_fails(
    tmp_path: Path, key: KeyFiles, capsys
):
    """No checkpoint left: the log cannot be tied to the key, which is a failure."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [3])
    rewrite_from_genesis(log, keep_checkpoints=False)
    report = verify_checkpoints([log], public(key))
    assert not report.ok and report.n_checkpoints == 0
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    assert "no signed checkpoint: this log cannot be tied to the key" in capsys.readouterr().out


def test_a_log_rewritten_and_re_signed_with_another_key_fails(
    tmp_path: Path, key: KeyFiles, other_key: KeyFiles
):
    """Fresh checkpoints over the new heads, signed by a key that is not the configured one."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2])
    rewrite_from_genesis(log, keep_checkpoints=True, resign=other_key)
    assert verify_checkpoints([log], public(other_key)).ok  # the forger's own key: fine
    report = verify_checkpoints([log], public(key))
    assert not report.ok and "signed by another key" in report.problems[0].reason


def test_an_edited_checkpoint_fails_even_with_its_hashes_recomputed(
    tmp_path: Path, key: KeyFiles, capsys
):
    """Moving a checkpoint's signed time (and fixing every hash after it) breaks its signature;
    claiming the right key id does not help."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2])
    records: list[dict[str, Any]] = [
        {k: v for k, v in record.items() if k not in ("hash", "prev_hash")}
        for record in iter_receipts(log, include_special=True)
    ]
    records[-1]["signed"]["time"] = "2020-01-01T00:00:00.000Z"
    log.unlink()

    async def relink() -> None:
        async with ReceiptWriter(log, fsync="never") as writer:
            for record in records[:-1]:
                await writer.write(record)
            await writer.flush()
            head = (await asyncio.to_thread(verify_chain, log)).head
            await writer.write({**records[-1], "signed": {**records[-1]["signed"], "head": head}})

    asyncio.run(relink())
    assert verify_chain(log).ok
    report = verify_checkpoints([log], public(key))
    assert [(p.line, p.reason) for p in report.problems] == [
        (3, "signature does not verify: the checkpoint was edited or forged")
    ]
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    assert f"{log}:3: signature does not verify" in capsys.readouterr().out


def test_an_edited_checkpoint_line_fails_the_chain_check_first(
    tmp_path: Path, key: KeyFiles, capsys
):
    """Edited in place without recomputing the hash: the chain check names the line."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2])
    log.write_bytes(log.read_bytes().replace(b'"mode":"checkpoint"', b'"mode":"checkpoinT"'))
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    assert capsys.readouterr().out.startswith("line 3: hash mismatch")


def test_verify_refuses_a_private_key_as_pubkey(tmp_path: Path, key: KeyFiles, capsys):
    """Handing the private key to an auditor is the mistake; the message says which file."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [1])
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.private)]) == 2
    assert f"{key.private} is a private key" in capsys.readouterr().err


def test_an_empty_log_has_nothing_to_tie_and_passes(tmp_path: Path, key: KeyFiles):
    log = tmp_path / "receipts.jsonl"
    log.write_bytes(b"")
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.n_checkpoints == 0 and report.n_lines == 0


# -- keygen --------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_can_read_and_a_public_key(
    tmp_path: Path, capsys
):
    """``keygen --out F``: F is mode 0600 PKCS8 Ed25519, F.pub a public key; the output gives
    the key id and the config line to paste."""
    out = tmp_path / "k" / "signing.key"
    out.parent.mkdir()
    assert cli.main(["keygen", "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    pub = out.with_name("signing.key.pub")
    printed = capsys.readouterr().out
    assert "key id: ed25519:" in printed
    assert f"signing_key = {json.dumps(str(out.resolve()))}" in printed
    assert f"--pubkey {pub}" in printed
    signer = CheckpointSigner.from_file(out, interval_s=NEVER_S)
    assert f"key id: {signer.key_id}" in printed
    private = serialization.load_pem_private_key(out.read_bytes(), None)
    assert isinstance(private, Ed25519PrivateKey)
    assert load_public_key(pub).public_bytes_raw() == private.public_key().public_bytes_raw()


def test_keygen_refuses_to_overwrite_a_key_without_force(tmp_path: Path, capsys):
    out = tmp_path / "signing.key"
    assert cli.main(["keygen", "--out", str(out)]) == 0
    before = out.read_bytes(), out.with_name("signing.key.pub").read_bytes()
    capsys.readouterr()
    assert cli.main(["keygen", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (out.read_bytes(), out.with_name("signing.key.pub").read_bytes()) == before
    assert cli.main(["keygen", "--out", str(out), "--force"]) == 0
    assert out.read_bytes() != before[0] and stat.S_IMODE(out.stat().st_mode) == 0o600


def test_keygen_refuses_when_only_the_public_half_exists(tmp_path: Path):
    out = tmp_path / "signing.key"
    out.with_name("signing.key.pub").write_text("mine")
    with pytest.raises(ReceiptError, match=r"signing\.key\.pub already exists"):
        write_key_files(out)
    assert not out.exists()


# -- the key in the config -----------------------------------------------------------------


def config_with(tmp_path: Path, **receipts: Any) -> Any:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"task_id": "t", "model": "m", "samples": ["x"]}\n', encoding="utf-8")
    data = {
        "receipts": receipts,
        "provider": [{"id": "replay", "kind": "replay", "samples": samples.name}],
        "route": [{"name": "code", "models": ["code"], "ladder": ["replay/m"]}],
        "price": [{"model": "replay/m", "input_per_mtok": 0.1, "output_per_mtok": 0.4}],
    }
    return config_from_dict(data, base_dir=tmp_path, env={})


def test_config_takes_the_key_path_and_the_interval(tmp_path: Path, key: KeyFiles):
    config = config_with(tmp_path, signing_key="keys/signing.key", checkpoint_interval_s=5)
    assert config.receipts.signing_key == key.private
    assert config.receipts.checkpoint_interval_s == 5.0
    assert config_with(tmp_path).receipts.signing_key is None


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "does not exist; create it with `firstpass keygen"),
        ("group_readable", "is readable by group or others (mode 0640)"),
        ("not_ed25519", "is not an Ed25519 key"),
        ("not_a_key", "is not a PEM private key"),
    ],
)
def test_config_refuses_a_signing_key_it_cannot_use(
    tmp_path: Path, key: KeyFiles, setup: str, message: str
):
    """Each error names ``receipts.signing_key`` and says what to do."""
    path = tmp_path / "bad.key"
    if setup == "group_readable":
        path = key.private
        path.chmod(0o640)
    elif setup == "not_ed25519":
        pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.write_bytes(pem)
        path.chmod(0o600)
    elif setup == "not_a_key":
        path.write_text("hello")
        path.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        config_with(tmp_path, signing_key=str(path))
    assert info.value.key_path == "receipts.signing_key"
    assert message in str(info.value)


def test_config_refuses_a_non_positive_interval(tmp_path: Path):
    with pytest.raises(
        ConfigError, match=r"receipts.checkpoint_interval_s: must be greater than 0"
    ):
        config_with(tmp_path, checkpoint_interval_s=0)


# -- the writer and the server sign on their own ----------------------------------------------


def test_the_writer_signs_at_its_interval_and_at_close(tmp_path: Path, key: KeyFiles):
    """With a checkpointer the writer adds checkpoints itself: a batch written once the
    interval has passed ends with one, and the log ends signed; it verifies with the public
    key."""
    log = tmp_path / "receipts.jsonl"
    signer = CheckpointSigner.from_file(key.private, interval_s=0.05)

    async def run() -> None:
        async with ReceiptWriter(log, fsync="never", checkpointer=signer) as writer:
            for n in range(3):
                await writer.write(request(n))
                await writer.flush()
                await asyncio.sleep(0.1)  # past the interval: the next batch ends signed
            await writer.write(request(3))

    asyncio.run(run())
    records = list(iter_receipts(log, include_special=True))
    kinds = [record.get("kind") for record in records]
    assert kinds[-1] == "checkpoint"  # close signed the final head
    assert kinds.count("checkpoint") >= 2  # and the interval at least once before
    assert all(kind in (None, "checkpoint") for kind in kinds)
    assert verify_chain(log).ok
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.unsigned_tail_lines == 0
    assert report.last_head == records[-1]["prev_hash"]


def test_close_signs_the_final_head(tmp_path: Path, key: KeyFiles):
    """Long before the interval is up, closing the writer signs what it wrote."""
    log = tmp_path / "receipts.jsonl"
    signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)
    asyncio.run(_append_with(log, [request(1), request(2)], signer))
    records: list[dict[str, Any]] = list(iter_receipts(log, include_special=True))
    assert [record.get("kind") for record in records] == [None, None, "checkpoint"]
    assert records[2]["signed"]["head"] == records[1]["hash"]
    assert verify_checkpoints([log], public(key)).ok


async def _append_with(path: Path, records: list[dict[str, Any]], signer: Any) -> None:
    async with ReceiptWriter(path, fsync="never", checkpointer=signer) as writer:
        for record in records:
            await writer.write(record)


def test_a_writer_with_nothing_new_to_sign_adds_no_checkpoint_at_close(
    tmp_path: Path, key: KeyFiles
):
    """Reopening a signed log and closing it without writing leaves it as it was."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2])
    before = log.read_bytes()
    signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)

    asyncio.run(_append_with(log, [], signer))
    assert log.read_bytes() == before


@pytest.mark.e2e
def test_the_server_signs_its_receipts_at_shutdown(
    tmp_path: Path, key: KeyFiles, capsys, blockbuster
):
    """``[receipts] signing_key``: start, one request, stop; the log ends with a checkpoint
    over the request's receipt and ``verify --pubkey`` passes. The key is read and the
    checkpoint signed off the event loop (``blockbuster``)."""
    import openai

    from tests.server_harness import CHEAP, MODEL, LiveStack
    from tests.stub_upstream import Reply

    log = tmp_path / "receipts.jsonl"
    stack = LiveStack(log, receipts_extra={"signing_key": str(key.private)})
    try:
        stack.stub.script(Reply.ok("hello"), model=CHEAP)
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "hello"
    finally:
        stack.close()
    lines: list[dict[str, Any]] = list(iter_receipts(log, include_special=True))
    request_receipt, checkpoint = lines
    assert "kind" not in request_receipt and checkpoint["kind"] == "checkpoint"
    assert checkpoint["signed"]["head"] == request_receipt["hash"]
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 0
    assert "signatures ok: 1 checkpoint(s)" in capsys.readouterr().out


def test_a_rotated_signed_log_verifies_across_its_files(tmp_path: Path, key: KeyFiles, capsys):
    """Rotation signs the head before each new file; ``verify DIR --pubkey`` checks the chain
    over all its files, and a checkpoint copied between files would not fit."""
    log = tmp_path / "logs" / "receipts.jsonl"
    signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)

    async def run() -> None:
        async with ReceiptWriter(
            log, fsync="never", checkpointer=signer, rotate_bytes=400
        ) as writer:
            for n in range(6):
                await writer.write(request(n))
                await writer.flush()

    asyncio.run(run())
    files = sorted(log.parent.iterdir())
    assert len(files) > 1
    assert cli.main(["receipts", "verify", str(log.parent), "--pubkey", str(key.public)]) == 0
    out = capsys.readouterr().out
    assert "signatures ok:" in out and "not signed yet" not in out


# -- what a checkpoint vouches for: only the lines its own writer wrote -----------------------


def signed_writer(log: Path, key: KeyFiles, **options: Any) -> ReceiptWriter:
    signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)
    return ReceiptWriter(log, fsync="never", checkpointer=signer, **options)


async def _restart_and_write(log: Path, key: KeyFiles, n: int, **options: Any) -> None:
    async with signed_writer(log, key, **options) as writer:
        for i in range(n):
            await writer.write(request(100 + i))
            await writer.flush()  # one batch each: rotation happens between batches


def kinds(log: Path) -> list[object]:
    return [record.get("kind") for record in iter_receipts(log, include_special=True)]


def test_a_log_forged_while_the_server_was_stopped_is_not_signed_by_the_next_start(
    tmp_path: Path, key: KeyFiles, capsys
):
    """The laundering reproduction: a signed log rewritten from genesis without its
    checkpoints fails ``verify --pubkey``; a writer restarted on it with the key and one more
    request must not make it pass (its checkpoint signed the forged head): its checkpoint
    vouches only from where it started, and the forged lines 1-5 are named."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [3, 2])
    rewrite_from_genesis(log, keep_checkpoints=False)
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    asyncio.run(_restart_and_write(log, key, 1))
    assert kinds(log) == [None] * 6 + ["checkpoint"]
    assert verify_chain(log).ok
    report = verify_checkpoints([log], public(key))
    assert not report.ok and report.n_checkpoints == 1
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [
        (7, "lines 1-5 are not vouched for")
    ]
    capsys.readouterr()
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 1
    out = capsys.readouterr().out
    assert (
        f"{log}:7: lines 1-5 are not vouched for: they were never signed by this key, written"
        " before a crash that came before a checkpoint, or rewritten while the server was"
        " stopped"
    ) in out
    assert "signatures FAIL" in out


def test_requests_appended_while_the_server_was_stopped_are_named_after_a_signed_restart(
    tmp_path: Path, key: KeyFiles
):
    """A clean shutdown signed lines 1-2; someone appends two requests (hashes and all) while
    the server is stopped; the restarted writer's checkpoint does not cover them."""
    log = tmp_path / "receipts.jsonl"
    asyncio.run(_restart_and_write(log, key, 2))
    asyncio.run(_append(log, [request(8), request(9)]))  # no key: the attacker's writer
    asyncio.run(_restart_and_write(log, key, 1))
    assert kinds(log) == [None, None, "checkpoint", None, None, None, "checkpoint"]
    report = verify_checkpoints([log], public(key))
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [
        (7, "lines 4-5 are not vouched for")
    ]


def test_a_clean_stop_and_restart_with_more_records_verifies(tmp_path: Path, key: KeyFiles, capsys):
    """Stop (the last checkpoint signs the head), start again, write, stop, and once more
    with nothing written: between one writer's last checkpoint and the next writer's first
    line there is only that checkpoint, which vouches for itself."""
    log = tmp_path / "receipts.jsonl"
    asyncio.run(_restart_and_write(log, key, 3))
    asyncio.run(_restart_and_write(log, key, 2))
    asyncio.run(_restart_and_write(log, key, 0))
    asyncio.run(_restart_and_write(log, key, 1))
    records: list[dict[str, Any]] = list(iter_receipts(log, include_special=True))
    assert kinds(log) == [None] * 3 + ["checkpoint"] + [None] * 2 + [
        "checkpoint",
        None,
        "checkpoint",
    ]
    # each writer's checkpoint vouches from the head it inherited: the previous one's line
    assert records[3]["signed"]["since"] == GENESIS_HASH
    assert records[6]["signed"]["since"] == records[3]["hash"]
    assert records[8]["signed"]["since"] == records[6]["hash"]
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.n_checkpoints == 3 and report.problems == ()
    assert cli.main(["receipts", "verify", str(log), "--pubkey", str(key.public)]) == 0
    assert "signatures ok: 3 checkpoint(s)" in capsys.readouterr().out


def test_a_torn_line_after_a_clean_stop_is_repaired_and_still_verifies(
    tmp_path: Path, key: KeyFiles
):
    """A start-up gap marker right after a checkpoint (the torn bytes of a line no receipt was
    acknowledged for) is a line the writer adds itself: nothing unvouched."""
    log = tmp_path / "receipts.jsonl"
    asyncio.run(_restart_and_write(log, key, 2))
    with log.open("ab") as fh:
        fh.write(b'{"hash":"sha256:0123')
    asyncio.run(_restart_and_write(log, key, 1))
    assert kinds(log) == [None, None, "checkpoint", "gap", None, "checkpoint"]
    assert verify_checkpoints([log], public(key)).ok


def test_a_checkpoint_follows_the_restarts_head_even_after_older_checkpoints_without_since(
    tmp_path: Path, key: KeyFiles
):
    """Logs signed before ``since`` existed: their checkpoints vouch from the previous one's
    head (they still verify), and a writer restarted on such a log signs on from its end."""
    log = tmp_path / "receipts.jsonl"
    write_signed(log, key, [2, 1])  # checkpoints made by hand: no begin, no since
    assert all(
        isinstance(r["signed"], dict) and "since" not in r["signed"]
        for r in iter_receipts(log, include_special=True)
        if r.get("kind")
    )
    assert verify_checkpoints([log], public(key)).ok
    asyncio.run(_restart_and_write(log, key, 2))
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.n_checkpoints == 3


_CRASHING_CHILD = r"""
import asyncio, sys, time
from firstpass.receipts import CheckpointSigner, ReceiptWriter, new_receipt_id

async def main():
    signer = CheckpointSigner.from_file(sys.argv[2], interval_s=3600)
    writer = ReceiptWriter(sys.argv[1], fsync="always", checkpointer=signer)
    await writer.start()
    def request():
        return {"id": new_receipt_id(), "mode": "cascade"}
    for _ in range(4):
        await writer.write(request())
        await writer.flush()
    signer.interval_s = 1e-9  # the writer reads it for each batch: this one ends signed
    await writer.write(request())
    await writer.flush()
    signer.interval_s = 3600
    for _ in range(2):  # the crash window: written, never signed
        await writer.write(request())
        await writer.flush()
    print("READY", flush=True)
    time.sleep(60)

asyncio.run(main())
"""


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_lines_written_between_the_last_checkpoint_and_a_kill_are_named_after_the_restart(
    tmp_path: Path, key: KeyFiles, torn: bool
):
    """A signed writer (a real process) writes lines 1-5 (the 6th a checkpoint), lines 7-8,
    and is killed with SIGKILL before its next checkpoint (``torn``: in the middle of a 9th
    line). Until a writer starts again the unsigned lines are only the tail; once a new writer
    writes and closes, ``verify --pubkey`` fails naming exactly lines 7-8: no checkpoint can
    ever sign them (the new writer did not write them, the dead one cannot any more)."""
    log = tmp_path / "receipts.jsonl"
    child = tmp_path / "child.py"
    child.write_text(_CRASHING_CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, str(child), str(log), str(key.private)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"READY\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert kinds(log) == [None] * 5 + ["checkpoint", None, None]
    report = verify_checkpoints([log], public(key))
    assert report.ok and report.unsigned_tail_lines == 2  # the tail of a log nobody restarted
    if torn:
        with log.open("ab") as fh:
            fh.write(b'{"hash":"sha256:4567')
    asyncio.run(_restart_and_write(log, key, 1))
    assert kinds(log) == [None] * 5 + ["checkpoint", None, None] + (["gap"] if torn else []) + [
        None,
        "checkpoint",
    ]
    report = verify_checkpoints([log], public(key))
    assert not report.ok
    last = 11 if torn else 10
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [
        (last, "lines 7-8 are not vouched for")
    ]


def test_a_checkpoint_lost_with_a_failed_write_leaves_no_lines_unvouched(
    tmp_path: Path, key: KeyFiles, monkeypatch: pytest.MonkeyPatch
):
    """The disk fails the batch that carries a checkpoint (the signer already made it); the
    batch is cut back and written again with a new one, which must vouch from where the
    lost one did, not from the head the lost one signed."""
    log = tmp_path / "receipts.jsonl"
    real_write = os.write
    failed: list[bytes] = []

    def write(fd: int, data: Any) -> int:
        if (
            threading.current_thread().name.startswith("firstpass-receipts")
            and b'"kind":"checkpoint"' in bytes(data)
            and not failed
        ):
            failed.append(bytes(data))
            raise OSError(28, os.strerror(28))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    signer = CheckpointSigner.from_file(key.private, interval_s=NEVER_S)

    async def run() -> None:
        async with ReceiptWriter(log, fsync="never", checkpointer=signer) as writer:
            await writer.write(request(1))
            await writer.flush()
            signer.interval_s = 1e-9  # the next batch ends with a checkpoint
            await writer.enqueue(request(2))
            with pytest.raises(ReceiptError):  # ReceiptUnavailable: the disk failed
                await writer.flush()
            await writer.flush()  # the disk is back: the batch lands, signed anew
            signer.interval_s = NEVER_S
            await writer.write(request(3))

    asyncio.run(run())
    assert failed
    assert kinds(log) == [None, None, "checkpoint", None, "checkpoint"]
    report = verify_checkpoints([log], public(key))
    assert report.ok, report.problems


def test_a_restart_after_a_rotation_vouches_across_files(tmp_path: Path, key: KeyFiles, capsys):
    """Rotated files, a restart whose inherited head is the last line of a rotated file (the
    active file was moved aside, as a crash mid-rotation leaves it), more rotations: the chain
    of files verifies under the key, each writer's first checkpoint found in another file."""
    log = tmp_path / "logs" / "receipts.jsonl"
    asyncio.run(_restart_and_write(log, key, 6, rotate_bytes=400))
    log.rename(next_rotated_name(log))
    asyncio.run(_restart_and_write(log, key, 6, rotate_bytes=400))
    asyncio.run(_restart_and_write(log, key, 2, rotate_bytes=400))
    assert len(list(log.parent.iterdir())) > 4
    assert cli.main(["receipts", "verify", str(log.parent), "--pubkey", str(key.public)]) == 0
    out = capsys.readouterr().out
    assert "signatures ok:" in out and "not signed yet" not in out


def test_a_crash_window_across_a_rotation_is_named_in_both_files(tmp_path: Path, key: KeyFiles):
    """Lines written after the last checkpoint, a rotation without a checkpoint (a writer
    without a key rotated the log), and a signed restart: the span is named by file and line."""
    log = tmp_path / "logs" / "receipts.jsonl"
    asyncio.run(_restart_and_write(log, key, 1))

    async def unsigned() -> None:
        async with ReceiptWriter(log, fsync="never", rotate_bytes=300) as writer:
            for n in range(3):
                await writer.write(request(n))
                await writer.flush()

    asyncio.run(unsigned())
    asyncio.run(_restart_and_write(log, key, 1))
    files = sorted(log.parent.iterdir())  # chain order: receipts.000001.jsonl ... receipts.jsonl
    assert [len(f.read_bytes().splitlines()) for f in files] == [2, 1, 1, 3]
    report = verify_checkpoints(files, public(key))
    assert not report.ok
    # the signed writer's request and checkpoint, then one unsigned request in each file
    assert [str(p) for p in report.problems] == [
        f"{log}:3: lines {files[1]}:1 to {log}:1 are not vouched for: they were never signed by"
        " this key, written before a crash that came before a checkpoint, or rewritten while"
        " the server was stopped (this checkpoint's writer started after them)"
    ]
