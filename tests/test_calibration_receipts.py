"""Shadow receipts are verified before use, filtered to labelled ones, and the skips explained.

The receipts here are written by a small writer that follows the documented canonical form
(independently of ``firstpass.calibration.data``), so a mismatch in either side would show.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from firstpass.calibration import Settings, calibrate, read_receipts
from firstpass.calibration.cli import main
from firstpass.errors import CalibrationError

GENESIS = "sha256:" + "0" * 64


def write_chain(path: Path, records: list[dict[str, Any]]) -> Path:
    """Append records with prev_hash/hash over the canonical JSON, as firstpass.receipts does."""
    prev = GENESIS
    with path.open("w", encoding="utf-8") as fh:
        for record in records:
            body = {**record, "prev_hash": prev}
            canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            body["hash"] = prev = "sha256:" + hashlib.sha256(canon.encode("utf-8")).hexdigest()
            fh.write(json.dumps(body, ensure_ascii=False) + "\n")
    return path


def shadow(
    k: int, c: int, label: bool | None, *, route: str = "code", **extra: Any
) -> dict[str, Any]:
    """A shadow receipt with the documented keys (probe.k, probe.pass_count, gate_label)."""
    regime = "escalate" if c == 0 else ("serve" if c == k else "gate")
    return {
        "mode": "shadow",
        "route": route,
        "request_sha256": "sha256:" + "ab" * 32,
        "probe": {"k": k, "pass_count": c, "regime": regime, **extra},
        "decision": {"action": "serve", "counterfactual": regime, "gate_label": label},
    }


def _labelled_log(path: Path) -> Path:
    records = [shadow(5, 5, True, route="ünïcode")] * 80 + [shadow(5, 3, False)] * 10
    records += [shadow(5, 4, None)] * 3  # no label
    records += [{"mode": "cascade", "route": "code"}] * 4  # not shadow
    records += [
        {"mode": "shadow", "route": "code", "decision": {"gate_label": True}}
    ] * 2  # no probe
    return write_chain(path, records)


def test_labelled_shadow_receipts_are_used_and_the_rest_counted_by_reason(tmp_path: Path) -> None:
    """Only shadow receipts with a probe and a gate label are used; every skip has a reason."""
    data = read_receipts([_labelled_log(tmp_path / "r.jsonl")])
    assert data.n == 90 and int(data.failed.sum()) == 10
    assert data.source.skipped == {"no gate label": 3, "not shadow mode": 4, "no probe": 2}
    assert data.source.chain_heads[0] is not None
    assert data.source.verified and data.source.chain_heads[0].startswith("sha256:")
    assert set(data.route_names) == {"ünïcode", "code"}


def test_rows_the_sandbox_could_not_check_against_a_null_answer_are_counted_apart(
    tmp_path: Path,
) -> None:
    """A null stub that passed (the tests carry no signal) and a sandbox that could not tell
    ("unknown": no slot, a failed reference) both leave the row out, under separate reasons:
    a busy sandbox must not read as vacuous tests."""
    from firstpass.calibration._rows import NULL_UNKNOWN_SKIP, VACUOUS_SKIP

    records = [shadow(5, 5, True)] * 20
    records += [shadow(5, 5, True, vacuous_visible="returns_none")] * 2
    records += [shadow(5, 5, True, vacuous_visible="raises")]
    records += [shadow(5, 5, True, vacuous_visible="unknown")] * 4
    data = read_receipts([write_chain(tmp_path / "r.jsonl", records)])
    assert data.n == 20
    assert data.source.skipped == {VACUOUS_SKIP: 3, NULL_UNKNOWN_SKIP: 4}
    assert "null answer passes" not in NULL_UNKNOWN_SKIP


def test_the_chain_head_is_the_last_receipts_hash(tmp_path: Path) -> None:
    """The head recorded for the calibration JSON is the hash on the log's last line."""
    path = _labelled_log(tmp_path / "r.jsonl")
    last = json.loads(path.read_text(encoding="utf-8").splitlines()[-1])
    assert read_receipts([path]).source.chain_heads == (last["hash"],)


def _tamper(path: Path, line: int) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[line - 1])
    record["decision"]["gate_label"] = not record["decision"]["gate_label"]
    lines[line - 1] = json.dumps(record, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_broken_chain_is_refused_naming_the_line(tmp_path: Path) -> None:
    """A receipt edited after the fact breaks the chain; calibration refuses and names the line."""
    path = _labelled_log(tmp_path / "r.jsonl")
    _tamper(path, 7)
    with pytest.raises(
        CalibrationError,
        match=r"r\.jsonl: hash chain does not verify at line 7.*--allow-unverified",
    ):
        read_receipts([path])


def test_allow_unverified_uses_the_lines_and_says_so(tmp_path: Path) -> None:
    """With allow_unverified a broken log is read, and the source records the problem."""
    path = _labelled_log(tmp_path / "r.jsonl")
    _tamper(path, 7)
    data = read_receipts([path], allow_unverified=True)
    assert data.n == 90 and not data.source.verified
    assert "line 7" in data.source.chain_problems[0]


def test_a_truncated_last_line_is_skipped_only_when_unverified(tmp_path: Path) -> None:
    """A crash mid-write leaves half a line: refused by default, skipped and counted otherwise."""
    path = _labelled_log(tmp_path / "r.jsonl")
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"mode": "shadow", "pro')
    with pytest.raises(CalibrationError, match="line 100"):
        read_receipts([path])
    data = read_receipts([path], allow_unverified=True)
    assert data.source.skipped["unparseable line (unverified log)"] == 1


def test_several_logs_are_verified_each_and_combined(tmp_path: Path) -> None:
    """Two logs: both chains checked, both heads kept, rows combined."""
    a = write_chain(tmp_path / "a.jsonl", [shadow(5, 5, True)] * 30)
    b = write_chain(tmp_path / "b.jsonl", [shadow(5, 5, True)] * 40)
    data = read_receipts([a, b])
    assert data.n == 70 and len(data.source.chain_heads) == 2


def test_receipts_without_any_label_are_an_error_that_says_how_to_get_labels(
    tmp_path: Path,
) -> None:
    """No labelled receipt at all: the error counts the skips and points at shadow mode."""
    path = write_chain(tmp_path / "r.jsonl", [{"mode": "cascade"}] * 3)
    with pytest.raises(CalibrationError, match=r"3 not shadow mode.*mode = \"shadow\""):
        read_receipts([path])


def test_a_malformed_probe_is_named_by_line(tmp_path: Path) -> None:
    """A receipt whose probe has a pass count above k is refused with its line number."""
    path = write_chain(tmp_path / "r.jsonl", [shadow(5, 5, True), shadow(5, 7, True)])
    with pytest.raises(CalibrationError, match=r"line 2: \"probe.pass_count\""):
        read_receipts([path])


def agreement(value: float | None, label: bool | None = True) -> dict[str, Any]:
    """A shadow receipt recorded under the agreement score (its label is that candidate's)."""
    scores: dict[str, Any] = {} if value is None else {"scores": {"agreement": value}}
    return shadow(5, 5, label, score={"name": "agreement", "value": value}, **scores)


def test_another_probe_score_can_be_calibrated(tmp_path: Path) -> None:
    """--score NAME reads probe.scores[NAME] (a share with levels i/k) of receipts recorded
    under NAME, and skips those without it."""
    records = [agreement(1.0)] * 60 + [agreement(0.8)] * 40 + [agreement(0.4, False)] * 20
    records += [agreement(None)] * 5
    data = read_receipts([write_chain(tmp_path / "r.jsonl", records)], score="agreement")
    assert data.n == 120 and data.source.skipped == {"no probe.scores.agreement": 5}
    fit = calibrate(data, Settings()).overall
    assert fit.lam == 0.8
    assert data.score_name == "agreement"


@pytest.mark.parametrize("score", ["agreement", "pass_share"])
def test_a_log_mixing_scores_is_refused_naming_both_and_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], score: str
) -> None:
    """A gate label belongs to the candidate of the score its receipt was recorded under (another
    sample under another score): a log holding receipts of another score than the one being
    calibrated is refused, whichever score is asked for, never silently filtered."""
    records = [agreement(1.0)] * 60 + [shadow(5, 5, True)] * 50  # no score named: pass_share
    records += [shadow(5, 4, True, score={"name": "pass_share", "value": 0.8})] * 10
    path = write_chain(tmp_path / "r.jsonl", records)
    with pytest.raises(CalibrationError) as info:
        read_receipts([path], score=score)
    message = str(info.value)
    other = "pass_share" if score == "agreement" else "agreement"
    assert f"60 recorded under score {other!r} in {path}" in message
    assert f"calibrating score {score!r}" in message
    assert "belongs to the candidate of the score it was recorded under" in message
    assert "Calibrate with --score set to the score the shadow run used" in message
    assert "one score per log" in message
    assert main(["--receipts", str(path), "--score", score]) == 2
    err = capsys.readouterr().err
    assert f"recorded under score {other!r}" in err and "Traceback" not in err


def test_cli_refuses_a_broken_chain_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI prints one line naming the bad line and exits 2, with no traceback."""
    path = _labelled_log(tmp_path / "r.jsonl")
    _tamper(path, 3)
    assert main(["--receipts", str(path)]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "--allow-unverified" in err and "Traceback" not in err


def test_cli_with_allow_unverified_reports_how_many_lines_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--allow-unverified calibrates anyway and says how many receipts from how many lines."""
    path = _labelled_log(tmp_path / "r.jsonl")
    _tamper(path, 3)
    assert main(["--receipts", str(path), "--allow-unverified"]) == 0
    captured = capsys.readouterr()
    assert "used 90 labelled receipts from 99 lines" in captured.err
    assert "UNVERIFIED" in captured.out


def test_cli_puts_the_chain_head_in_the_calibration_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calibration JSON's source names the receipt files and their verified chain heads."""
    path = _labelled_log(tmp_path / "r.jsonl")
    out = tmp_path / "cal.json"
    assert main(["--receipts", str(path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["source"]["chain_heads"] == list(read_receipts([path]).source.chain_heads)
    assert doc["source"]["skipped"] == {"no gate label": 3, "no probe": 2, "not shadow mode": 4}
    assert doc["lambda"] == 1.0 and doc["n"] == 90


def test_the_proxys_chain_report_is_what_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head recorded is the one firstpass.receipts.verify_chain computes (here for lines
    re-serialised with spaces, which only a parse can vouch for); and where the one-pass read
    gives up, verify_chain's failure (line, reason) is what is reported."""
    from firstpass import receipts
    from firstpass.calibration import _onepass, _scan

    good = write_chain(tmp_path / "good.jsonl", [shadow(5, 5, True)] * 60)
    assert read_receipts([good]).source.chain_heads == (receipts.verify_chain(good).head,)
    verdicts = {
        "bad.jsonl": receipts.VerifyReport(
            ok=False,
            n_lines=11,
            head="sha256:" + "d" * 64,
            first_bad_line=12,
            reason="hash mismatch",
        ),
    }
    monkeypatch.setattr(receipts, "verify_chain", lambda path: verdicts[Path(path).name])
    monkeypatch.setattr(_onepass, "scan_span", lambda *a, **k: _scan.Span(lines=0, chain_ok=False))
    bad = write_chain(tmp_path / "bad.jsonl", [shadow(5, 5, True)] * 60)
    with pytest.raises(
        CalibrationError,
        match=r"bad\.jsonl: hash chain does not verify at line 12 \(hash mismatch\)",
    ):
        read_receipts([bad])
    problems = read_receipts([bad], allow_unverified=True).source.chain_problems
    assert problems == (
        f"{bad}: hash chain does not verify at line 12 (hash mismatch); "
        "11 lines verified before it",
    )


def test_an_unreadable_log_is_a_calibration_error(tmp_path: Path) -> None:
    """A receipt path that cannot be read is reported as such, not as a traceback."""
    with pytest.raises(CalibrationError, match="cannot read"):
        read_receipts([tmp_path / "missing.jsonl"])


async def test_receipts_written_by_the_proxys_writer_calibrate(tmp_path: Path) -> None:
    """A log written by firstpass.receipts.ReceiptWriter verifies and calibrates, and editing
    one of its lines afterwards is caught."""
    from firstpass.receipts import ReceiptWriter, new_receipt_id

    path = tmp_path / "proxy.jsonl"
    async with ReceiptWriter(path, fsync="never") as writer:
        for record in [shadow(5, 5, True)] * 70 + [shadow(5, 2, False)] * 5:
            await writer.write({"id": new_receipt_id(), **record})
    # reading is blocking file work: off the event loop, as the CLI does it (no loop at all)
    data = await asyncio.to_thread(read_receipts, [path])
    assert data.n == 75 and data.source.verified
    assert calibrate(data, Settings()).overall.lam == 1.0
    await asyncio.to_thread(_tamper, path, 40)
    with pytest.raises(CalibrationError, match="line 40"):
        await asyncio.to_thread(read_receipts, [path])


def test_a_compressed_or_piped_log_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """The chain covers the bytes the proxy wrote and the log is read twice: a .gz log or a
    pipe gets a one-line error naming the fix, not a misleading chain or empty-log error."""
    import gzip
    import os

    log = write_chain(tmp_path / "r.jsonl", [shadow(5, 3, True)] * 3)
    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    with pytest.raises(CalibrationError, match="decompress it first"):
        read_receipts([packed])
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(CalibrationError, match="not a regular file"):
        read_receipts([fifo])
    with pytest.raises(CalibrationError, match="not a regular file"):
        read_receipts([tmp_path])


def test_a_negative_seed_is_refused_before_any_data_is_read() -> None:
    """--seed must be a non-negative integer (numpy's generator would raise later)."""
    with pytest.raises(CalibrationError, match="--seed must be an integer >= 0"):
        Settings(seed=-1)


def test_a_certificate_records_the_visible_checks_its_probes_were_scored_by(
    tmp_path: Path,
) -> None:
    """Receipts of a route with listed visible checks carry their digest; so does the
    certificate, and the proxy refuses it for a route whose visible checks changed."""
    digest = "sha256:" + "cd" * 32
    extra: dict[str, Any] = {"provider": "stub", "model": "cheap", "temperature": 0.7}
    records = [shadow(5, 5, True, visible_checks_digest=digest, **extra)] * 400
    records += [shadow(5, 2, False, visible_checks_digest=digest, **extra)] * 50
    path = write_chain(tmp_path / "r.jsonl", records)
    out = tmp_path / "cal.json"
    assert main(["--receipts", str(path), "--out", str(out), "--alpha", "0.1"]) == 0
    (cert,) = json.loads(out.read_text(encoding="utf-8"))["certificates"]
    assert cert["visible_checks"] == digest


def test_receipts_scored_by_two_sets_of_visible_checks_are_refused(tmp_path: Path) -> None:
    records = [shadow(5, 5, True, visible_checks_digest="sha256:" + "a" * 64)] * 50
    records += [shadow(5, 5, True, visible_checks_digest="sha256:" + "b" * 64)] * 50
    path = write_chain(tmp_path / "r.jsonl", records)
    with pytest.raises(CalibrationError, match="2 different sets of visible checks"):
        calibrate(read_receipts([path]), Settings(alpha=0.1, delta=0.05))


def test_probes_scored_with_a_requests_own_checks_are_left_out(tmp_path: Path) -> None:
    """A client could add checks that every sample passes and so push λ down for everyone."""
    records = [shadow(5, 5, True)] * 300 + [
        shadow(5, 5, False, request_checks=["request:basic"])
    ] * 50
    path = write_chain(tmp_path / "r.jsonl", records)
    data = read_receipts([path])
    assert data.n == 300
    assert data.source.skipped == {
        "scored with the request's own checks (no certificate covers it)": 50
    }


def test_a_certificate_records_the_output_cap_its_probes_were_sent_with(tmp_path: Path) -> None:
    """A budget's default_max_tokens capped the probes (``probe.output_cap``): the certificate
    records it, and one calibrated on uncapped probes records null."""
    extra: dict[str, Any] = {"provider": "stub", "model": "cheap", "temperature": 0.7}
    for cap in (16, None):
        capped: dict[str, Any] = {} if cap is None else {"output_cap": cap}
        records = [shadow(5, 5, True, **capped, **extra)] * 400
        records += [shadow(5, 2, False, **capped, **extra)] * 50
        path = write_chain(tmp_path / f"r{cap}.jsonl", records)
        out = tmp_path / f"cal{cap}.json"
        assert main(["--receipts", str(path), "--out", str(out), "--alpha", "0.1"]) == 0
        (cert,) = json.loads(out.read_text(encoding="utf-8"))["certificates"]
        assert cert["output_cap"] == cap


def test_receipts_drawn_under_two_output_caps_are_refused(tmp_path: Path) -> None:
    """Budgets added (or default_max_tokens changed) while the receipts were collected: no one
    failure rate holds for both, so the route is refused naming both caps and --output-cap."""
    records = [shadow(5, 5, True)] * 50 + [shadow(5, 5, True, output_cap=16)] * 50
    path = write_chain(tmp_path / "r.jsonl", records)
    with pytest.raises(CalibrationError, match=r"2 output caps \(16, none: .*--output-cap 16"):
        calibrate(read_receipts([path]), Settings(alpha=0.1, delta=0.05))


@pytest.mark.parametrize("cap", [0, "16", True, 1.5])
def test_a_malformed_output_cap_is_named_by_line(tmp_path: Path, cap: object) -> None:
    records = [shadow(5, 5, True, output_cap=16)] * 3 + [shadow(5, 5, True, output_cap=cap)]
    path = write_chain(tmp_path / "r.jsonl", records)
    with pytest.raises(CalibrationError, match=r"line 4: .*\"probe.output_cap\" a positive"):
        read_receipts([path])
