"""A certificate records the times of the oldest and the newest receipt rows it was calibrated on
(``data_since``, ``data_until``); the licence monitor compares the oldest with revocations: the
same times whichever way the log is read, only rows the calibration used counting, and the
config reading them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from firstpass.calibration import _onepass, _receipts, _scan
from firstpass.calibration._until import period
from firstpass.calibration._window import RowWindow, parse_time
from firstpass.calibration.cli import main
from firstpass.calibration.data import read_receipts
from firstpass.config import read_certificates
from firstpass.errors import ConfigError
from firstpass.monitor import LicenceKey, predating, read_recorded
from firstpass.receipts._special import revocation_record
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


def _period_by_route(records: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for r in records:
        if r["mode"] == "shadow" and r["decision"]["gate_label"] is not None:
            low, top = out.get(r["route"], (r["time"], r["time"]))
            out[r["route"]] = (min(low, r["time"]), max(top, r["time"]))
    return out


@pytest.mark.parametrize("way", ["columns", "spans", "rows", "sequential"])
def test_each_routes_oldest_and_newest_row_times_are_the_same_whichever_way_the_log_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """The one-pass read by column, in parallel spans, row by row (an odd line among them), and
    the sequential parse give each route the oldest and newest ``time`` of the rows it kept,
    never that of a receipt that was no row."""
    records = _records()
    # receipts that are no rows, before every row: not the oldest
    records.insert(0, shadow_receipt(900, 5, None, route="code", time=_at(1)))
    records.insert(1, shadow_receipt(901, 5, True, route="sql", time=_at(2), mode="cascade"))
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
    expected = _period_by_route(records)
    periods = zip(got.data_since, got.data_until, strict=True)
    assert dict(zip(got.route_names, periods, strict=True)) == expected
    assert expected == {"code": (_at(10), _at(40)), "sql": (_at(20), _at(50))}


def test_a_time_window_ends_the_data_where_it_ends(tmp_path: Path) -> None:
    """``--until`` leaves the later rows out, and their times with them."""
    path = write_log(tmp_path / "r.jsonl", _records())
    window = RowWindow(until=parse_time("2026-03-01T12:30:00Z", "--until"))
    got = read_receipts([path], window=window)
    assert max(t for t in got.data_until if t is not None) < "2026-03-01T12:30:00.000Z"


def test_a_time_window_starts_the_data_where_it_starts(tmp_path: Path) -> None:
    """``--since`` leaves the earlier rows out, and their times with them: the oldest row is
    the first one at or after it."""
    path = write_log(tmp_path / "r.jsonl", _records())
    window = RowWindow(since=parse_time("2026-03-01T12:30:00Z", "--since"))
    got = read_receipts([path], window=window)
    assert dict(zip(got.route_names, got.data_since, strict=True)) == {
        "code": _at(30),
        "sql": _at(30),
    }


def test_a_row_without_a_readable_time_leaves_its_routes_data_time_unknown(
    tmp_path: Path,
) -> None:
    """One row whose time does not read: the route's oldest and newest are not known (None),
    so its certificate lifts no revocation, rather than one that may be too early."""
    records = _records()
    odd = next(r for r in records if r["route"] == "code")
    odd["time"] = "yesterday"
    got = read_receipts([write_log(tmp_path / "r.jsonl", records)])
    assert dict(zip(got.route_names, got.data_until, strict=True)) == {"code": None, "sql": _at(50)}
    assert dict(zip(got.route_names, got.data_since, strict=True)) == {"code": None, "sql": _at(20)}


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([_at(2), _at(3), _at(1)], (_at(1), _at(3))),
        (["2026-03-01T13:30:00+01:00", _at(20)], (_at(20), _at(30))),  # parsed: another zone
        (["2026-03-01T12:05:00", _at(1)], (_at(1), _at(5))),  # no zone: UTC
        ([_at(1), None], None),
        ([_at(1), "2026-03-01T12:99:00.000Z"], None),  # receipt-shaped, but not a time
        ([], None),
    ],
)
def test_the_oldest_and_newest_of_receipt_times(
    times: list[object], expected: tuple[str, str] | None
) -> None:
    assert period(times) == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], {None: (_at(10), _at(50))}),
        (["--by-route"], {"code": (_at(10), _at(40)), "sql": (_at(20), _at(50))}),
    ],
    ids=["pooled", "by-route"],
)
def test_calibrate_records_each_certificates_data_since_and_until_and_the_config_reads_them(
    tmp_path: Path, flags: list[str], expected: dict[str | None, tuple[str, str]]
) -> None:
    """A pooled certificate's data starts at its oldest route's row and ends at its newest
    route's; ``--by-route`` gives each route its own; ``read_certificates`` reads them back."""
    log = write_log(tmp_path / "r.jsonl", _records())
    out = tmp_path / "cal.json"
    assert main(["--receipts", str(log), "--alpha", "0.2", "--out", str(out), *flags]) == 0
    doc = json.loads(out.read_text())
    assert {c["route"]: (c["data_since"], c["data_until"]) for c in doc["certificates"]} == expected
    read = read_certificates(out, "calibration")
    assert read is not None
    assert {c.route: (c.data_since, c.data_until) for c in read.certificates} == expected


def test_a_study_file_records_no_data_until(tmp_path: Path) -> None:
    study = tmp_path / "s.jsonl"
    rows = [{"k": 5, "pass_count": 5, "label": i % 100 != 0} for i in range(500)]
    study.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cal.json"
    assert main(["--study", str(study), "--out", str(out)]) == 0
    (cert,) = json.loads(out.read_text())["certificates"]
    assert cert["data_since"] is None and cert["data_until"] is None


@pytest.mark.parametrize("field", ["data_since", "data_until"])
def test_a_data_time_that_is_not_a_time_fails_the_start_naming_it(
    tmp_path: Path, field: str
) -> None:
    """An edited time is refused by its key path (an edited file fails its id check too, but
    the field's own check names what is wrong)."""
    from tests.certificates import certificate, write_calibration

    doc = certificate().to_dict()
    doc[field] = "last week"
    path = tmp_path / "cal.json"
    write_calibration(path, certificate())
    raw = json.loads(path.read_text())
    raw["certificates"] = [doc]
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=rf"certificates\[0\]\.{field} must be an ISO 8601"):
        read_certificates(path, "escalation.elastic.calibration")


def _revocation_line(at: str) -> dict[str, Any]:
    """The line a replica appends when the monitor revokes ``cal_revoked`` at code/0."""
    return revocation_record(
        {
            "licence": f"code/0/{REVOKED}",
            "route": "code",
            "rung": 0,
            "certificate": REVOKED,
            "alpha": 0.1,
            "level": 0.05,
            "audited": 40,
            "failures": 12,
            "log_wealth": 4.0,
            "bound": 0.15,
            "time": at,
            "replica": "a",
        }
    )


REVOKED = "cal_0123456789abcdef"


def test_a_whole_log_with_a_row_after_a_revocation_gives_a_certificate_that_stays_revoked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hole: the rows from before a revocation at 12:45, the revocation line, one row
    after it. Calibrated whole, the certificate's newest row is after the revocation but its
    oldest is before: the monitor keeps its licence revoked, and ``calibrate`` says it will.
    Calibrated ``--since`` the revocation, the data starts after it and lifts it."""
    records = [r for r in _records() if r["route"] == "code"]
    records.append(_revocation_line(_at(45)))
    records.append(shadow_receipt(700, 5, True, route="code", time=_at(50)))
    log = write_log(tmp_path / "r.jsonl", records)
    out = tmp_path / "cal.json"
    assert main(["--receipts", str(log), "--alpha", "0.2", "--out", str(out)]) == 0
    assert "will not lift the revocation" in capsys.readouterr().err
    read = read_certificates(out, "calibration")
    assert read is not None
    (cert,) = read.certificates
    assert (cert.data_since, cert.data_until) == (_at(10), _at(50))
    (rev,) = read_recorded([log]).revocations
    key = LicenceKey(route="code", rung=0, certificate=cert.id)
    why = predating(key, cert.data_since, [rev])
    assert why is not None and why.revocation.key.certificate == REVOKED
    assert f"its oldest row is from {_at(10)}" in why.evidence()

    later = [{**r, "id": r["id"] + "b", "time": _at(50)} for r in records if "kind" not in r]
    log = write_log(tmp_path / "more.jsonl", [*records, *later])
    out = tmp_path / "after.json"
    since = ["--since", "2026-03-01T12:45:00Z", "--looks", str(tmp_path / "new.looks.jsonl")]
    assert main(["--receipts", str(log), "--alpha", "0.2", "--out", str(out), *since]) == 0
    assert "will not lift" not in capsys.readouterr().err
    read = read_certificates(out, "calibration")
    assert read is not None
    (cert,) = read.certificates
    assert cert.data_since == _at(50)
    key = LicenceKey(route="code", rung=0, certificate=cert.id)
    assert predating(key, cert.data_since, [rev]) is None
