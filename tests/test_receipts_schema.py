"""The typed receipt against logs written before it existed (schema version 1).

``tests/data/receipts_v1/`` holds receipt logs written by the code before the receipt became
``msgspec`` Structs (firstpass-verify 0.1.0): request receipts of every shape the test suite
made (cascade, pass-through, shadow with later rungs, enforce with certificates, revisions,
budgets, refusals, stored content, listed checks with details and parts, dropped cases), gap
markers and signed checkpoints, plus a 600-request shadow log with the summary and the
certificate the 0.1.0 code computed from it (README.md there says how they were made).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from firstpass.cli import main as cli_main
from firstpass.config import calibration_id, load_config
from firstpass.pipeline import Trace
from firstpass.receipts import (
    SCHEMA_VERSION,
    Decision,
    ProbeRecord,
    Receipt,
    RequestInfo,
    ScoreRecord,
    canonical_bytes,
    receipt_from_builtins,
    verify_chain,
)
from firstpass.receipts._schemadoc import BEGIN, END, render

V1 = Path(__file__).parent / "data" / "receipts_v1"
LOGS = sorted(V1.glob("*.jsonl"))
ROOT = Path(__file__).resolve().parents[1]


def _request_lines(path: Path) -> list[bytes]:
    """The lines the 0.1.0 pipeline wrote (every one has a ``config_digest``); the writer
    tests' hand-made lines and the gap markers and checkpoints are not request receipts."""
    lines = [raw.rstrip(b"\n") for raw in path.read_bytes().splitlines()]
    return [raw for raw in lines if "config_digest" in json.loads(raw)]


def _shadow_log(tmp_path: Path) -> Path:
    path = tmp_path / "shadow-600.jsonl"
    with gzip.open(V1 / "shadow-600.jsonl.gz", "rb") as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def test_the_version_1_sample_logs_are_there() -> None:
    """The golden logs exist and hold request receipts, gap markers and checkpoints."""
    assert len(LOGS) >= 10
    kinds = {json.loads(raw).get("kind") for log in LOGS for raw in log.read_bytes().splitlines()}
    assert {None, "gap", "checkpoint"} <= kinds


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_every_version_1_line_reads_into_the_types_and_encodes_to_the_same_bytes(log: Path) -> None:
    """Decoded into ``Receipt`` and encoded again, each line is byte for byte what the 0.1.0
    code wrote: the types hold every field of every shape, and nothing is added."""
    lines = _request_lines(log)
    if not lines:
        pytest.skip(f"{log.name} holds the writer tests' lines and markers only")
    for raw in lines:
        receipt = receipt_from_builtins(json.loads(raw))
        assert receipt.version == 1
        assert canonical_bytes(msgspec.to_builtins(receipt)) == raw


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_version_1_logs_still_verify(log: Path) -> None:
    """The hash chains written by the 0.1.0 code verify with this code, strictly too."""
    assert verify_chain(log).ok
    assert verify_chain(log, strict=True).ok


def test_a_version_1_log_summarises_as_the_version_1_code_summarised_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``receipts summary --json`` on a 0.1.0 shadow log prints what 0.1.0 printed (plus
    ``cost.saved_share``, added in 0.3.0: the saving from unrounded sums)."""
    for name, path in (
        ("shadow-600", _shadow_log(tmp_path)),
        ("demo-shadow", V1 / "demo-shadow.jsonl"),
    ):
        assert cli_main(["receipts", "summary", str(path), "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        expected = json.loads((V1 / f"{name}.summary.json").read_text())
        assert "saved_share" in printed["cost"], name
        del printed["cost"]["saved_share"]
        assert printed == expected, name


def test_a_version_1_shadow_log_calibrates_to_the_same_certificate(tmp_path: Path) -> None:
    """``calibrate`` on a 0.1.0 shadow log certifies what 0.1.0 certified from it: the same
    λ per (route, rung), the same levels and bounds, the same data digest and id."""
    out = tmp_path / "cert.json"
    log = _shadow_log(tmp_path)
    args = ["calibrate", "--receipts", str(log), "--alpha", "0.2", "--delta", "0.1"]
    assert cli_main([*args, "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    expected = json.loads((V1 / "shadow-600.calibration.json").read_text())
    # the file names the log it read: 0.1.0 read it at another path, so that path (and the
    # id, which covers it) are the only differences; with this path, 0.1.0's id is ours
    assert expected["source"]["paths"] != got["source"]["paths"]
    expected["source"]["paths"] = got["source"]["paths"]
    # 0.3.0 adds to each certificate what it rests on beyond 0.1.0's keys: the endpoint the
    # probes came from and the gate that labelled them. A 0.1.0 log records neither, so both
    # are null (enforce refuses such a certificate at start: calibrate again with this
    # version); every other key is exactly 0.1.0's, and with these two added, so is the id
    for cert, old in zip(got["certificates"], expected["certificates"], strict=True):
        assert (cert["endpoint"], cert["gate"]) == (None, None)
        old["endpoint"], old["gate"] = None, None
        # 0.3.0: the output cap a budget added to the probes (none in a 0.1.0 log: null)
        assert cert["output_cap"] is None
        old["output_cap"] = None
        # 0.3.0 tests each slice as a look of its looks ledger (docs/calibration.md,
        # "Calibrating again"): the certificate records it, and look 1's bounds are at
        # 1 − δ_1 (δ_1 = δ·6/π²); the p-values, what is certified and λ are 0.1.0's
        old["looks"] = cert["looks"]
        # 0.3.0: the times of the oldest and newest rows used (a revocation is compared with
        # the oldest)
        assert cert["data_since"] is not None and cert["data_until"] is not None
        old["data_since"], old["data_until"] = cert["data_since"], cert["data_until"]
    for level, old_level in zip(got["levels"], expected["levels"], strict=True):
        assert level["p_value"] == old_level["p_value"]
        old_level["risk_bound"] = level["risk_bound"]
    expected["looks"], expected["delta_tested"] = got["looks"], got["delta_tested"]
    expected["ledger"] = got["ledger"]  # 0.3.0: the ledger's head as this run left it
    assert calibration_id(expected) == got["id"]
    for doc in (got, expected):
        doc.pop("created_at")
        doc.pop("id")
    assert got == expected


def test_new_receipts_carry_the_schema_version() -> None:
    """A receipt this code writes says which schema it is in."""
    config = load_config(ROOT / "firstpass.toml")
    trace = Trace(
        receipt_id="rcpt_x", config=config, route=None, mode="rejected", request=RequestInfo()
    )
    receipt = trace.record(action="rejected", served=None)
    line = canonical_bytes(msgspec.to_builtins(receipt))
    assert b'"schema_version":2' in line and receipt.version == SCHEMA_VERSION == 2
    assert receipt_from_builtins(json.loads(line)) == receipt


def test_a_line_that_does_not_fit_the_schema_is_named_with_its_field() -> None:
    """A reader told a line is not a receipt hears which field, by path."""
    line = json.loads(_request_lines(V1 / "demo-shadow.jsonl")[0])
    line["cost"]["total_usd"] = "x"
    with pytest.raises(msgspec.ValidationError, match=r"\$\.cost\.total_usd"):
        receipt_from_builtins(line)


def test_the_documented_schema_is_the_one_in_the_types() -> None:
    """docs/receipts.md's schema tables are generated from the types and up to date."""
    page = (ROOT / "docs" / "receipts.md").read_text()
    start, end = page.index(BEGIN), page.index(END) + len(END)
    assert page[start:end] == render(), "regenerate: python -m firstpass.receipts._schemadoc"


def test_calibrations_fast_decoder_reads_only_fields_the_schema_has() -> None:
    """Calibration decodes a projection of the receipt (the few fields it needs, the rest
    skipped in C); each field of the projection is a field of the schema, so the two cannot
    drift apart."""
    from firstpass.calibration import _scan

    pairs: list[tuple[type[msgspec.Struct], type[msgspec.Struct]]] = [
        (_scan._Receipt, Receipt),
        (_scan._Probe, ProbeRecord),
        (_scan._Decision, Decision),
        (_scan._Score, ScoreRecord),
    ]
    for projection, full in pairs:
        names = {f.encode_name for f in msgspec.structs.fields(projection)}
        assert names <= {f.encode_name for f in msgspec.structs.fields(full)}, projection


def test_every_line_of_a_version_1_shadow_log_encodes_to_the_same_bytes(tmp_path: Path) -> None:
    """600 shadow receipts (probes, labels, counterfactual costs) round-trip exactly."""
    lines = _request_lines(_shadow_log(tmp_path))
    assert len(lines) == 600
    for raw in lines:
        assert canonical_bytes(msgspec.to_builtins(receipt_from_builtins(json.loads(raw)))) == raw


async def test_a_receipt_holding_text_that_is_not_unicode_is_written_repaired(
    tmp_path: Path,
) -> None:
    """A lone surrogate (from an upstream's text, a check's reason) cannot be canonical JSON:
    the writer refuses it at ``write()`` (``ReceiptValueError``), and the pipeline writes the
    receipt again with that text as U+FFFD instead of losing it."""
    import asyncio
    from types import SimpleNamespace

    from firstpass.errors import ReceiptValueError
    from firstpass.observe import ObservedSink, RequestMetrics
    from firstpass.pipeline._run import Pipeline
    from firstpass.receipts import ReceiptWriter

    line = json.loads(_request_lines(V1 / "demo-shadow.jsonl")[0])
    for key in ("hash", "prev_hash"):
        line.pop(key)
    line["upstream_calls"][0]["error"] = "bad \ud800 text"
    receipt = receipt_from_builtins(line)
    log = tmp_path / "r.jsonl"
    metrics = RequestMetrics()
    async with ReceiptWriter(log) as writer:
        with pytest.raises(ReceiptValueError):
            await writer.write(receipt)
        sink = ObservedSink(writer, metrics=metrics, request_log=False)
        await Pipeline._write(SimpleNamespace(writer=sink), receipt)  # type: ignore[arg-type]  # only its writer is used
        await asyncio.sleep(0)  # the sink counts in a call_soon callback
    written = json.loads(log.read_bytes())
    assert written["upstream_calls"][0]["error"] == "bad \ufffd text"
    assert verify_chain(log).ok
    counted = [
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "firstpass_requests_total"
    ]
    assert counted == [1.0]  # the refused attempt and its repaired write: one request


def test_a_shadow_log_with_request_added_checks_calibrates_without_them(tmp_path: Path) -> None:
    """A probe the request added visible checks to is never calibrated on: calibrate leaves
    its row out (once it crashed: the fast reader put the list of names in a set)."""
    import asyncio

    from firstpass.receipts import ReceiptWriter

    lines = [json.loads(raw) for raw in _request_lines(_shadow_log(tmp_path))]
    for line in lines:
        line.pop("hash")
        line.pop("prev_hash")
    lines[0]["probe"]["request_checks"] = ["request:mine"]
    log = tmp_path / "mixed.jsonl"

    async def write() -> None:
        async with ReceiptWriter(log) as writer:
            for line in lines:
                await writer.write(line)

    asyncio.run(write())
    out = tmp_path / "cert.json"
    args = ["calibrate", "--receipts", str(log), "--alpha", "0.2", "--delta", "0.1"]
    assert cli_main([*args, "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["n"] == 599 and got["source"]["used"] == 599
