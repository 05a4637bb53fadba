"""A certificate records the time of the newest receipt row it was calibrated on (``data_until``),
which the licence monitor compares with revocations: the same time whichever way the log is read,
only rows the calibration used counting, and the config reading it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from firstpass.calibration import _onepass, _receipts, _scan
from firstpass.calibration._until import newest
from firstpass.calibration._window import RowWindow, parse_time
from firstpass.calibration.cli import main
from firstpass.calibration.data import read_receipts
from firstpass.config import read_certificates
from firstpass.errors import ConfigError
from tests.test_calibration_receipts_fast import shadow_receipt, write_log


def _at(minute: int) -> str:
    return f"2026-03-01T12:{minute:02d}:00.000Z"


def _records() -> list[dict[str, Any]]:
    """300 labelled rows of "code" (newest at 12:40) and of "sql" (12:50), then later receipts
    that are no rows: a cascade one, an unlabelled one, a revocation-like line."""
    records = []
    for i in range(600):
        route, minute = ("code", 10 + i * 30 // 600) if i % 2 else ("sql", 20 + i * 30 // 600)
        c, label = (5, i % 100 != 0) if i % 3 else (4, i % 50 != 0)
        records.append(shadow_receipt(i, c, label, route=route, time=_at(minute)))
    records[-2]["time"] = _at(40) if records[-2]["route"] == "code" else _at(50)
    records[-1]["time"] = _at(50) if records[-1]["route"] == "sql" else _at(40)
    records.append(shadow_receipt(600, 5, True, route="code", time=_at(59), mode="cascade"))
    records.append(shadow_receipt(601, 5, None, route="code", time=_at(58)))
    return records


def _newest_by_route(records: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in records:
        if r["mode"] == "shadow" and r["decision"]["gate_label"] is not None:
            out[r["route"]] = max(out.get(r["route"], ""), r["time"])
    return out


@pytest.mark.parametrize("way", ["columns", "spans", "rows", "sequential"])
def test_each_routes_newest_row_time_is_the_same_whichever_way_the_log_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """The one-pass read by column, in parallel spans, row by row (an odd line among them), and
    the sequential parse give each route the newest ``time`` of the rows it kept, never that of
    a receipt that was no row."""
    records = _records()
    if way == "rows":
        records[7]["decision"] = ["not", "an", "object"]  # one line only the full parse reads
        records[9]["mode"] = "enforce"
    path = write_log(tmp_path / "r.jsonl", records)
    if way == "spans":
        monkeypatch.setattr(_onepass, "_SPAN_BYTES", 50_000)
        monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0)
    if way == "sequential":
        monkeypatch.setattr(
            _onepass, "scan_span", lambda *a, **k: _scan.Span(lines=0, chain_ok=False)
        )
    else:
        monkeypatch.setattr(_receipts, "_read_parsed", lambda *a, **k: pytest.fail("sequential"))
    if way == "rows":
        records = [r for i, r in enumerate(records) if i not in (7, 9)]
    got = read_receipts([path])
    expected = _newest_by_route(records)
    assert dict(zip(got.route_names, got.data_until, strict=True)) == expected
    assert expected == {"code": _at(40), "sql": _at(50)}


def test_a_time_window_ends_the_data_where_it_ends(tmp_path: Path) -> None:
    """``--until`` leaves the later rows out, and their times with them."""
    path = write_log(tmp_path / "r.jsonl", _records())
    window = RowWindow(until=parse_time("2026-03-01T12:30:00Z", "--until"))
    got = read_receipts([path], window=window)
    assert max(t for t in got.data_until if t is not None) < "2026-03-01T12:30:00.000Z"


def test_a_row_without_a_readable_time_leaves_its_routes_data_time_unknown(
    tmp_path: Path,
) -> None:
    """One row whose time does not read: the route's newest is not known (None), so its
    certificate lifts no revocation, rather than one that may be too early."""
    records = _records()
    odd = next(r for r in records if r["route"] == "code")
    odd["time"] = "yesterday"
    got = read_receipts([write_log(tmp_path / "r.jsonl", records)])
    assert dict(zip(got.route_names, got.data_until, strict=True)) == {"code": None, "sql": _at(50)}


@pytest.mark.parametrize(
    ("times", "top"),
    [
        ([_at(1), _at(3), _at(2)], _at(3)),
        (["2026-03-01T13:30:00+01:00", _at(20)], _at(30)),  # parsed: another zone
        (["2026-03-01T12:05:00", _at(1)], _at(5)),  # no zone: UTC
        ([_at(1), None], None),
        ([], None),
    ],
)
def test_the_newest_of_receipt_times(times: list[object], top: str | None) -> None:
    assert newest(times) == top


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([], {None: _at(50)}), (["--by-route"], {"code": _at(40), "sql": _at(50)})],
    ids=["pooled", "by-route"],
)
def test_calibrate_records_each_certificates_data_until_and_the_config_reads_it(
    tmp_path: Path, flags: list[str], expected: dict[str | None, str]
) -> None:
    """A pooled certificate's data ends at its newest route's row; ``--by-route`` gives each
    route its own; ``read_certificates`` reads the time back."""
    log = write_log(tmp_path / "r.jsonl", _records())
    out = tmp_path / "cal.json"
    assert main(["--receipts", str(log), "--alpha", "0.2", "--out", str(out), *flags]) == 0
    doc = json.loads(out.read_text())
    assert {c["route"]: c["data_until"] for c in doc["certificates"]} == expected
    read = read_certificates(out, "calibration")
    assert read is not None
    assert {c.route: c.data_until for c in read.certificates} == expected


def test_a_study_file_records_no_data_until(tmp_path: Path) -> None:
    study = tmp_path / "s.jsonl"
    rows = [{"k": 5, "pass_count": 5, "label": i % 100 != 0} for i in range(500)]
    study.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cal.json"
    assert main(["--study", str(study), "--out", str(out)]) == 0
    (cert,) = json.loads(out.read_text())["certificates"]
    assert cert["data_until"] is None


def test_a_data_until_that_is_not_a_time_fails_the_start_naming_it(tmp_path: Path) -> None:
    """An edited time is refused by its key path (an edited file fails its id check too, but
    the field's own check names what is wrong)."""
    from tests.certificates import certificate, write_calibration

    doc = certificate().to_dict()
    doc["data_until"] = "last week"
    path = tmp_path / "cal.json"
    write_calibration(path, certificate())
    raw = json.loads(path.read_text())
    raw["certificates"] = [doc]
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"certificates\[0\]\.data_until must be an ISO 8601"):
        read_certificates(path, "escalation.elastic.calibration")
