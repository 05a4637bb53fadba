"""Rotation: the active log keeps its name, full files become numbered siblings, the chain runs
on across files, and ``verify``/readers take a rotated log or a whole directory."""

from __future__ import annotations

import asyncio
import itertools
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx

from firstpass import cli
from firstpass.receipts import (
    GENESIS_HASH,
    ReceiptWriter,
    discover_chains,
    find_receipt,
    iter_receipts,
    new_receipt_id,
    verify_files,
)
from tests.receipt_fixtures import complete
from tests.test_receipts_durable import HmacCheckpointer


def receipt(i: int) -> dict[str, Any]:
    return {"id": new_receipt_id(), "mode": "cascade", "pad": "x" * 200, "seq": i}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def write_n(
    path: Path, start: int, n: int, *, whole: bool = False, **kwargs: Any
) -> ReceiptWriter:
    """``n`` receipts, one batch each (``whole``: receipts with every field, as the summary
    reads them; else just enough for the chain)."""
    async with ReceiptWriter(path, **kwargs) as writer:
        for i in range(start, start + n):
            await writer.write(complete(receipt(i)) if whole else receipt(i))
            await writer.flush()  # one batch each, so rotation can fall between any two
    return writer


async def test_rotation_by_size_continues_the_chain_across_numbered_files(tmp_path: Path):
    log = tmp_path / "receipts.jsonl"
    writer = await write_n(log, 0, 20, rotate_bytes=1500)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[-1] == "receipts.jsonl"
    rotated = [tmp_path / name for name in files[:-1]]
    assert [p.name for p in rotated] == [
        f"receipts.{n:06d}.jsonl" for n in range(1, len(rotated) + 1)
    ]
    assert len(rotated) >= 3 and writer.stats.rotations == len(rotated)
    chain = [*rotated, log]
    assert lines(chain[0])[0]["prev_hash"] == GENESIS_HASH
    for before, after in itertools.pairwise(chain):
        assert lines(after)[0]["prev_hash"] == lines(before)[-1]["hash"]
        assert before.stat().st_size <= 1500
        assert stat.S_IMODE(after.stat().st_mode) == 0o600
    assert [r["seq"] for r in iter_receipts(log)] == list(range(20))
    assert [r["seq"] for r in iter_receipts(tmp_path)] == list(range(20))
    last = lines(rotated[0])[-1]
    assert find_receipt(log, last["id"]) == last
    (found,) = discover_chains(tmp_path)
    assert found.files == tuple(chain)
    assert verify_files(found).ok


async def test_rotation_by_time(tmp_path: Path):
    log = tmp_path / "receipts.jsonl"
    async with ReceiptWriter(log, rotate_s=0.05) as writer:
        for i in range(3):
            await writer.write(receipt(i))
            await writer.flush()
            await asyncio.sleep(0.1)
    assert writer.stats.rotations == 2
    assert [r["seq"] for r in iter_receipts(log)] == [0, 1, 2]
    assert (tmp_path / "receipts.000002.jsonl").exists()


async def test_a_checkpoint_closes_each_rotated_file(tmp_path: Path):
    log = tmp_path / "receipts.jsonl"
    signer = HmacCheckpointer(interval_s=3600)
    await write_n(log, 0, 10, rotate_bytes=1000, checkpointer=signer)
    chain = discover_chains(log)[0].files
    assert len(chain) >= 3
    for path in chain:
        last = lines(path)[-1]
        assert last["kind"] == "checkpoint" and last["signed"]["head"] == last["prev_hash"]
    assert verify_files(discover_chains(log)[0]).ok


async def test_restart_after_rotation_continues_from_the_newest_file(tmp_path: Path):
    """An empty (or missing) active file with rotated siblings: the chain continues from the
    newest sibling's last line."""
    log = tmp_path / "receipts.jsonl"
    await write_n(log, 0, 6, rotate_bytes=800)
    # a rotation cut short by a crash: renamed, no new active file yet
    newest = tmp_path / f"receipts.{len(list(tmp_path.glob('receipts.0*.jsonl'))) + 1:06d}.jsonl"
    log.rename(newest)
    await write_n(log, 6, 2)
    assert lines(log)[0]["prev_hash"] == lines(newest)[-1]["hash"]
    assert [r["seq"] for r in iter_receipts(log)] == list(range(8))
    assert verify_files(discover_chains(log)[0]).ok


async def test_verify_a_directory_reports_each_workers_chain(tmp_path: Path, capsys: Any):
    await write_n(tmp_path / "receipts.jsonl", 0, 8, rotate_bytes=1000)
    await write_n(tmp_path / "receipts.w1.jsonl", 0, 8, rotate_bytes=1000)
    chains = discover_chains(tmp_path)
    assert [c.files[-1].name for c in chains] == ["receipts.jsonl", "receipts.w1.jsonl"]
    assert chains[1].files[0].name == "receipts.w1.000001.jsonl"
    capsys.readouterr()
    assert cli.main(["receipts", "verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok: 8 receipts") == 2
    assert "receipts.w1.000001.jsonl: ok:" in out


async def test_verify_a_directory_with_a_missing_middle_file_fails_naming_it(
    tmp_path: Path, capsys: Any
):
    await write_n(tmp_path / "receipts.jsonl", 0, 12, rotate_bytes=1000)
    (tmp_path / "receipts.000002.jsonl").unlink()
    capsys.readouterr()
    assert cli.main(["receipts", "verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "continues a chain whose previous file is missing" in out
    assert "BROKEN" in out


async def test_verify_a_rotated_log_by_its_active_file(tmp_path: Path, capsys: Any):
    log = tmp_path / "receipts.jsonl"
    await write_n(log, 0, 10, rotate_bytes=1000)
    capsys.readouterr()
    assert cli.main(["receipts", "verify", str(log)]) == 0
    out = capsys.readouterr().out
    assert "chain 1" in out and ": ok: 10 receipts" in out
    middle = tmp_path / "receipts.000002.jsonl"
    middle.write_bytes(middle.read_bytes().replace(b'"seq":', b'"seq":1', 1))
    assert cli.main(["receipts", "verify", str(log)]) == 1
    out = capsys.readouterr().out
    assert "receipts.000002.jsonl: line 1: hash mismatch" in out
    assert "not checked" in out


async def test_rotating_writer_never_blocks_the_loop(tmp_path: Path):
    """Rotating (rename, open, fsync the directory) happens in the writer's thread: blockbuster
    fails the test if any of it runs on the loop, and the files show it did rotate."""
    with blockbuster_ctx():
        await write_n(tmp_path / "receipts.jsonl", 0, 10, rotate_bytes=1000, fsync="durable")
    assert len(list(tmp_path.glob("receipts.0*.jsonl"))) >= 2


@pytest.mark.parametrize("kwargs", [{"rotate_bytes": 0}, {"rotate_s": 0}])
def test_invalid_rotation_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any]):
    from firstpass.errors import ReceiptError

    with pytest.raises(ReceiptError, match="must be positive"):
        ReceiptWriter(tmp_path / "r.jsonl", **kwargs)


async def test_summary_and_show_read_a_rotated_log_whole(tmp_path: Path, capsys: Any):
    log = tmp_path / "receipts.jsonl"
    await write_n(log, 0, 10, whole=True, rotate_bytes=2000)
    first = lines(tmp_path / "receipts.000001.jsonl")[0]
    capsys.readouterr()
    assert cli.main(["receipts", "summary", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n"] == 10 and data["chain"]["verified"] is True
    assert cli.main(["receipts", "show", first["id"], "--path", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == first["id"]


def _shadow(c: int, label: bool) -> dict[str, Any]:
    return {
        "id": new_receipt_id(),
        "mode": "shadow",
        "route": "code",
        "probe": {"k": 5, "pass_count": c, "regime": "serve" if c == 5 else "gate"},
        "decision": {"action": "served", "gate_label": label},
    }


async def test_calibration_reads_a_rotated_log_in_chain_order_and_skips_writer_lines(
    tmp_path: Path,
):
    """A shadow log that rotated, with a gap marker and checkpoints in it, calibrates when its
    files are given in chain order (``receipts*.jsonl`` sorts so); out of order it is refused."""
    from firstpass.calibration import read_receipts
    from firstpass.errors import CalibrationError

    log = tmp_path / "receipts.jsonl"
    log.write_bytes(b'{"id":"rcpt_torn')  # a crash left a torn line: a gap marker replaces it
    signer = HmacCheckpointer(interval_s=3600)
    async with ReceiptWriter(log, rotate_bytes=3000, checkpointer=signer) as writer:  # type: ignore[arg-type]  # on purpose: no begin()
        for record in [_shadow(5, True)] * 30 + [_shadow(2, False)] * 5:
            await writer.write({**record, "id": new_receipt_id()})
            await writer.flush()
    files = sorted(tmp_path.glob("receipts*.jsonl"))
    assert len(files) >= 3
    data = await asyncio.to_thread(read_receipts, files)
    assert data.n == 35 and data.source.verified
    assert set(data.source.skipped) == {"not a request (a gap marker or a checkpoint)"}
    with pytest.raises(CalibrationError, match="genesis"):
        await asyncio.to_thread(read_receipts, files[::-1])


@pytest.mark.e2e
def test_the_server_rotates_its_log_by_the_config(live_stack: Any):
    """``[receipts] rotate_bytes`` reaches the server's writer: its receipts span files, one
    chain, and every request has its receipt."""
    import openai

    stack = live_stack(receipts_extra={"rotate_bytes": 4096})
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    for i in range(8):
        client.chat.completions.create(
            model="firstpass-code", messages=[{"role": "user", "content": f"hi {i}"}]
        )
        stack.flush()
    log = stack.receipts
    (chain,) = discover_chains(log)
    assert len(chain.files) >= 2
    assert verify_files(chain).ok
    assert len(list(iter_receipts(log))) == 8
