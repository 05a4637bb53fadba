"""What ``firstpass calibrate`` certifies is exactly what the config can enforce: per route, per
rung, in the context it was computed for, and nothing else."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from firstpass.calibration.cli import main as calibrate_main
from firstpass.config import calibration_id, config_from_dict
from firstpass.errors import ConfigError
from tests.certificates import certificate, file_id, write_calibration
from tests.test_calibration_receipts import shadow as _shadow
from tests.test_calibration_receipts import write_chain

#: what the proxy records of how rung 0's probes were drawn (the config below: p/cheap at 0.8)
#: the endpoint of provider "p" in the configs below
P_URL = "http://127.0.0.1:9/v1"
DRAWN = {
    "provider": "p",
    "model": "cheap",
    "temperature": 0.8,
    "endpoint": P_URL,
    "gate_hidden_tests": True,
}


def shadow(k: int, c: int, label: bool | None, **extra: Any) -> dict[str, Any]:
    """A shadow receipt whose probe says which model drew it, at which temperature."""
    return _shadow(k, c, label, **{**DRAWN, **extra})


def _config(tmp_path: Path, block: dict[str, Any], routes: tuple[str, ...] = ("a", "b")) -> Any:
    data = {
        "provider": [{"id": "p", "kind": "openai", "base_url": "http://127.0.0.1:9/v1"}],
        "route": [
            {"name": r, "models": [r], "ladder": ["p/cheap", {"rung": "p/strong", "k": 3}]}
            for r in routes
        ],
        "price": [
            {"model": "p/cheap", "input_per_mtok": 1, "output_per_mtok": 1},
            {"model": "p/strong", "input_per_mtok": 9, "output_per_mtok": 9},
        ],
        "escalation": {"elastic": block},
    }
    return config_from_dict(data, base_dir=tmp_path, env={})


def _toml_block(stdout: str) -> dict[str, Any]:
    start = stdout.index("[escalation.elastic]")
    return tomllib.loads(stdout[start:])["escalation"]["elastic"]  # type: ignore[no-any-return]


def test_by_route_writes_one_certificate_per_route_that_the_printed_block_enforces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--by-route: route a is certified, route b (failing often) is not; the printed block,
    pasted as printed, enforces a's λ and leaves b gating."""
    records = [shadow(5, 5, True, route="a")] * 200
    records += [shadow(5, 5, i % 3 != 0, route="b") for i in range(200)]
    log = write_chain(tmp_path / "r.jsonl", records)
    out = tmp_path / "cal.json"
    assert calibrate_main(["--receipts", str(log), "--by-route", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (cert,) = doc["certificates"]
    assert (cert["route"], cert["rung"], cert["lambda"], cert["k"]) == ("a", 0, 1.0, 5)
    assert cert["candidate_rule"] == "most_shared_code" and cert["given"] == []
    assert {"route": "b", "rung": 0, "reason": "no λ certified"} in doc["uncertified"]
    block = _toml_block(capsys.readouterr().out)
    assert "lambda" not in block and block["mode"] == "enforce"
    elastic = _config(tmp_path, block).elastic
    assert elastic.lambda_for("a", 0, "enforce") == 1.0
    assert elastic.lambda_for("b", 0, "enforce") is None
    assert "certified no λ" in (elastic.licence("b", 0).problem or "")


def test_a_pooled_certificate_covers_only_the_routes_it_was_computed_on(tmp_path: Path) -> None:
    """Without --by-route the certificate holds for the pooled traffic of a and b, not for c."""
    records = [shadow(5, 5, True, route=r) for r in ("a", "b") for _ in range(100)]
    log = write_chain(tmp_path / "r.jsonl", records)
    out = tmp_path / "cal.json"
    assert calibrate_main(["--receipts", str(log), "--out", str(out), "--json"]) == 0
    (cert,) = json.loads(out.read_text())["certificates"]
    assert cert["route"] is None and sorted(cert["routes"]) == ["a", "b"]
    block = {"k": 5, "mode": "enforce", "calibration": str(out)}
    elastic = _config(tmp_path, block, routes=("a", "b", "c")).elastic
    assert [elastic.lambda_for(r, 0, "enforce") for r in "abc"] == [1.0, 1.0, None]


def _two_rung_receipt(c0: int, label0: bool, c1: int, label1: bool, given: list[Any]) -> Any:
    later = {
        "rung": 1, "k": 3, "pass_count": c1, "gate_label": label1,
        "score": {"name": "pass_share", "value": c1 / 3}, "given": given,
        "provider": "p", "model": "strong", "temperature": 0.8, "endpoint": P_URL,
        "gate_hidden_tests": True,
    }  # fmt: skip
    return shadow(5, c0, label0, route="a", later=[later])


def test_a_higher_rung_is_calibrated_on_the_requests_elastic_sent_there(tmp_path: Path) -> None:
    """calibrate --rung 1 reads probe.later, records the lower rung's policy as `given` and the
    rung's own model, and the config enforces that certificate only while rung 0 runs under
    that very policy."""
    r0 = write_calibration(
        tmp_path / "r0.json",
        certificate(route="a", lam=1.0, model="p/cheap", temperature=0.8, endpoint=P_URL),
    )
    given = [
        {"rung": 0, "certificate": file_id(r0), "lambda": 1.0, "escalate_at": 0,
         "max_gate_candidates": 1}
    ]  # fmt: skip
    records = [_two_rung_receipt(0, False, 3, True, given)] * 150
    records += [shadow(5, 5, True, route="a")] * 50  # elastic stayed at rung 0: no rung-1 row
    log = write_chain(tmp_path / "r.jsonl", records)
    r1 = tmp_path / "r1.json"
    assert calibrate_main(["--receipts", str(log), "--rung", "1", "--out", str(r1)]) == 0
    doc = json.loads(r1.read_text())
    (cert,) = doc["certificates"]
    assert (cert["rung"], cert["k"], cert["lambda"], cert["n"]) == (1, 3, 1.0, 150)
    assert (cert["model"], cert["temperature"]) == ("p/strong", 0.8)
    assert cert["given"] == given and doc["rung"] == 1
    assert "no probe of rung 1" in " ".join(doc["source"]["skipped"])
    block = {"k": 5, "mode": "enforce", "calibration": [str(r0), str(r1)]}
    elastic = _config(tmp_path, block, routes=("a",)).elastic
    assert elastic.lambda_for("a", 1, "enforce") == 1.0
    # without rung 0's certificate, rung 0 gates: other requests reach rung 1, so it is refused
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, {**block, "calibration": [str(r1)]}, routes=("a",))
    assert info.value.key_path == "escalation.elastic.given"
    # another max_gate_candidates at rung 0 sends other requests up too
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, {**block, "max_gate_candidates": 2}, routes=("a",))
    assert info.value.key_path == "escalation.elastic.given"


def test_rung_receipts_collected_under_different_lower_policies_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows that reached rung 1 under two rung-0 policies have no one population: refused."""
    a = [{"rung": 0, "certificate": None, "lambda": 1.0}]
    b = [{"rung": 0, "certificate": "cal_x", "lambda": 0.8}]
    records = [_two_rung_receipt(0, False, 3, True, a)] * 5
    records += [_two_rung_receipt(0, False, 3, True, b)] * 5
    log = write_chain(tmp_path / "r.jsonl", records)
    assert calibrate_main(["--receipts", str(log), "--rung", "1"]) == 2
    err = capsys.readouterr().err
    assert "2 different lower-rung policies" in err and "cal_x" in err


def test_receipts_recorded_under_another_score_are_refused(tmp_path: Path) -> None:
    """Labels taken on the agreement candidate do not calibrate pass_share (another sample)."""
    records = [shadow(5, 5, True, score={"name": "agreement", "value": 1.0})] * 100
    log = write_chain(tmp_path / "r.jsonl", records)
    from firstpass.calibration import read_receipts
    from firstpass.errors import CalibrationError

    with pytest.raises(CalibrationError, match="recorded under score 'agreement'"):
        read_receipts([log])


def test_a_certificate_is_bound_to_the_model_it_was_measured_on(tmp_path: Path) -> None:
    """Swap rung 0's model (or its temperature) and its certificate no longer applies: enforce
    fails at start naming the ladder entry, shadow records the rung as uncertified."""
    cal = write_calibration(
        tmp_path / "cal.json",
        certificate(route="a", lam=1.0, model="p/cheap", temperature=0.8, endpoint=P_URL),
    )
    block = {"k": 5, "mode": "enforce", "calibration": str(cal)}
    assert _config(tmp_path, block, routes=("a",)).elastic.lambda_for("a", 0, "enforce") == 1.0
    with pytest.raises(ConfigError) as info:
        _config_with(tmp_path, block, ladder=["p/other", "p/strong"])
    assert info.value.key_path == "route[0].ladder[0]"
    assert '"p/other" here' in str(info.value) and '"p/cheap"' in str(info.value)


def test_an_edited_certificate_certifies_nothing(tmp_path: Path) -> None:
    """Raising λ by hand in the file breaks its content id: refused at start."""
    cal = write_calibration(
        tmp_path / "cal.json",
        certificate(route="a", lam=1.0, model="p/cheap", temperature=0.8, endpoint=P_URL),
    )
    doc = json.loads(cal.read_text())
    doc["certificates"][0]["lambda"] = 0.2
    cal.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, {"k": 5, "mode": "shadow", "calibration": str(cal)}, routes=("a",))
    assert "edited after" in str(info.value)


def _config_with(tmp_path: Path, block: dict[str, Any], *, ladder: list[str]) -> Any:
    data = {
        "provider": [{"id": "p", "kind": "openai", "base_url": "http://127.0.0.1:9/v1"}],
        "route": [{"name": "a", "models": ["a"], "ladder": ladder}],
        "price": [
            {"model": m, "input_per_mtok": 1, "output_per_mtok": 1}
            for m in ("p/cheap", "p/strong", "p/other")
        ],
        "escalation": {"elastic": block},
    }
    return config_from_dict(data, base_dir=tmp_path, env={})


def test_receipts_mixing_models_on_a_route_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows drawn from two models on one route certify neither: exit 2, naming both."""
    records = [shadow(5, 5, True, route="a")] * 50
    records += [shadow(5, 5, True, route="a", model="other")] * 50
    log = write_chain(tmp_path / "r.jsonl", records)
    assert calibrate_main(["--receipts", str(log)]) == 2
    err = capsys.readouterr().err
    assert "p/cheap" in err and "p/other" in err and "mix 2 models" in err


def test_model_and_temperature_pick_the_rows_of_one_setting(tmp_path: Path) -> None:
    """A route with a few requests at their own temperature: --temperature keeps the rows drawn
    at the route's, counts the rest as skipped, and the certificate records that setting."""
    records = [shadow(5, 5, True, route="a")] * 200
    records += [shadow(5, 5, False, route="a", temperature=1.5)] * 30
    log = write_chain(tmp_path / "r.jsonl", records)
    out = tmp_path / "cal.json"
    argv = ["--receipts", str(log), "--out", str(out), "--json"]
    assert calibrate_main([*argv, "--model", "p/cheap", "--temperature", "0.8"]) == 0
    doc = json.loads(out.read_text())
    (cert,) = doc["certificates"]
    assert (cert["model"], cert["temperature"], cert["n"]) == ("p/cheap", 0.8, 200)
    assert sum(n for why, n in doc["source"]["skipped"].items() if "temperature" in why) == 30


def test_a_huge_integer_is_a_one_line_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2**1024 has no float: in a receipt it is a named bad line (exit 2), in a certificate a
    ConfigError naming the field."""
    log = write_chain(tmp_path / "r.jsonl", [shadow(5, 5, True, route="a", temperature=2**1024)])
    assert calibrate_main(["--receipts", str(log)]) == 2
    assert "line 1" in capsys.readouterr().err
    cal = tmp_path / "cal.json"
    doc = json.loads(write_calibration(cal, certificate(route="a", model="p/cheap")).read_text())
    doc["certificates"][0]["temperature"] = 2**1024
    del doc["id"]
    cal.write_text(json.dumps({"id": calibration_id(doc), **doc}))
    with pytest.raises(ConfigError, match=r"certificates\[0\]\.temperature"):
        _config(tmp_path, {"k": 5, "calibration": str(cal)}, routes=("a",))


def test_rows_drawn_with_logit_bias_are_left_out_of_calibration(tmp_path: Path) -> None:
    """Receipts whose probe was drawn under a client's logit_bias are counted, not used."""
    records = [shadow(5, 5, True, route="a")] * 20 + [shadow(5, 5, False, logit_bias=True)] * 5
    log = write_chain(tmp_path / "r.jsonl", records)
    from firstpass.calibration import read_receipts

    data = read_receipts([log])
    assert data.n == 20 and data.source.skipped == {
        "drawn with logit_bias (no certificate covers it)": 5
    }


def test_a_calibration_from_unverified_receipts_licenses_nothing(
    tmp_path: Path,
) -> None:
    """--allow-unverified reads an altered log; what it certifies is no evidence: enforce is
    refused at start, saying so."""
    records = [shadow(5, 5, True, route="a")] * 200
    log = write_chain(tmp_path / "r.jsonl", records)
    lines = log.read_text().splitlines()
    lines[5] = lines[5].replace('"gate_label": true', '"gate_label": false')
    assert '"gate_label": false' in lines[5]
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "cal.json"
    argv = ["--receipts", str(log), "--allow-unverified", "--out", str(out), "--json"]
    assert calibrate_main(argv) == 0
    assert json.loads(out.read_text())["certificates"]  # the report still shows its result
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, {"k": 5, "mode": "enforce", "calibration": str(out)}, routes=("a",))
    assert "hash chain does not verify" in str(info.value)


def _capped_config(tmp_path: Path, block: dict[str, Any], **tables: Any) -> Any:
    """``_config`` for route "a" with extra top-level tables (``budgets``, ``server``)."""
    data: dict[str, Any] = {
        "provider": [{"id": "p", "kind": "openai", "base_url": P_URL}],
        "route": [{"name": "a", "models": ["a"], "ladder": ["p/cheap", "p/strong"]}],
        "price": [
            {"model": "p/cheap", "input_per_mtok": 1, "output_per_mtok": 1},
            {"model": "p/strong", "input_per_mtok": 9, "output_per_mtok": 9},
        ],
        "escalation": {"elastic": block},
        **tables,
    }
    return config_from_dict(data, base_dir=tmp_path, env={"TEAM_A_KEY": "sk-a"})


#: a key's own daily cap opens a ledger without any [budgets] table
KEY_CAP = {"client_key": [{"name": "team-a", "key_env": "TEAM_A_KEY", "daily_usd": 5.0}]}


@pytest.mark.parametrize(
    ("tables", "cap"),
    [({}, None), ({"budgets": {}}, 4096), ({"budgets": {"default_max_tokens": 16}}, 16),
     ({"server": KEY_CAP}, 4096)],
    ids=["none", "budgets-default", "budgets-16", "key-cap-only"],
)  # fmt: skip
def test_the_bound_output_cap_is_the_one_the_budgets_add(
    tmp_path: Path, tables: dict[str, Any], cap: int | None
) -> None:
    """The cap a certificate must match is what the proxy adds to a probe that sets no
    max_tokens: default_max_tokens exactly when a ledger counts spend (``ledger_for``)."""
    from firstpass.budgets import ledger_for
    from firstpass.config._elastic import probe_output_cap

    config = _capped_config(tmp_path, {"k": 5, "mode": "shadow"}, **tables)
    assert probe_output_cap(config.budgets, config.server.client_key) == cap
    assert (ledger_for(config) is None) == (cap is None)
    cal = write_calibration(
        tmp_path / "cal.json",
        certificate(route="a", lam=1.0, model="p/cheap", temperature=0.8, endpoint=P_URL),
    )
    block = {"k": 5, "mode": "enforce", "calibration": str(cal)}
    if cap is None:
        assert _capped_config(tmp_path, block, **tables).elastic.lambda_for("a", 0, "enforce")
        return
    with pytest.raises(ConfigError) as info:
        _capped_config(tmp_path, block, **tables)
    assert info.value.key_path == "budgets.default_max_tokens"
    assert f"max_tokens = {cap} here" in str(info.value) and "sent with none" in str(info.value)


def test_a_certificate_written_before_output_caps_were_recorded_reads_as_uncapped(
    tmp_path: Path,
) -> None:
    """A file without the key (written earlier) binds where no budget caps the probes, and is
    refused, naming the key, where one does."""
    cert = certificate(route="a", lam=1.0, model="p/cheap", temperature=0.8, endpoint=P_URL)
    entry = cert.to_dict()
    del entry["output_cap"]
    cal = tmp_path / "cal.json"
    doc: dict[str, Any] = {"certificates": [entry], "uncertified": []}
    cal.write_text(json.dumps({"id": calibration_id(doc), **doc}), "utf-8")
    block = {"k": 5, "mode": "enforce", "calibration": str(cal)}
    assert _capped_config(tmp_path, block).elastic.lambda_for("a", 0, "enforce") == 1.0
    with pytest.raises(ConfigError) as info:
        _capped_config(tmp_path, block, budgets={"daily_usd": 10.0})
    assert info.value.key_path == "budgets.default_max_tokens"


@pytest.mark.parametrize("value", [0, "16", True, 2.5])
def test_a_malformed_output_cap_in_a_calibration_file_is_refused(
    tmp_path: Path, value: object
) -> None:
    entry: dict[str, Any] = {**certificate(route="a", lam=1.0, endpoint=P_URL).to_dict()}
    entry["output_cap"] = value
    doc: dict[str, Any] = {"certificates": [entry], "uncertified": []}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"id": calibration_id(doc), **doc}), "utf-8")
    with pytest.raises(ConfigError, match=r"output_cap must be an integer ≥ 1 or null"):
        _capped_config(tmp_path, {"k": 5, "mode": "shadow", "calibration": str(cal)})
