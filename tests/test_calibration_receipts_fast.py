"""Reading a receipt log in one pass gives exactly what verifying it and parsing every line gives.

The one-pass read (``firstpass.calibration._scan``) hashes and links each line itself and decodes only the
values calibration needs (``fast_row``); whenever it answers, its answer must equal the full
parse's, on the lines the proxy writes it must answer (or it would be no faster), and whatever
breaks the chain must be reported as the sequential ``verify_chain`` reports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstpass.calibration import _onepass, _receipts, _scan, data
from firstpass.calibration._rows import receipt_values
from firstpass.calibration.data import PASS_SHARE, read_receipts
from firstpass.errors import CalibrationError
from firstpass.receipts import GENESIS_HASH
from firstpass.receipts._canonical import encode_record
from firstpass.receipts._chain import link

SCORES = (PASS_SHARE, "agreement")


def shadow_receipt(
    i: int, c: int, label: bool | None, *, score: str = PASS_SHARE, **over: Any
) -> dict[str, Any]:
    """A shadow receipt shaped like the pipeline's (checks, calls, probe with samples), recorded
    under ``score`` (its gate label is that score's candidate's)."""
    k = 5
    record: dict[str, Any] = {
        "id": f"rcpt_{i:026d}",
        "time": "2026-11-30T01:02:03.456Z",
        "mode": "shadow",
        "route": "code",
        "config_digest": "sha256:" + "c" * 64,
        "firstpass_version": "0.1.0",
        "request": {"model": "code", "n_messages": 2, "stream": False, "task_id": f"t/{i}"},
        "upstream_calls": [{"rung": 0, "purpose": "probe", "n": k, "cost_usd": 0.0005}],
        "checks": [
            {"rung": 0, "sample": s, "kind": "visible", "passed": s < c, "category": None}
            for s in range(k)
        ],
        "decision": {
            "action": "served",
            "steps": ["call:0", "visible:0:pass"],
            "counterfactual": "serve_after_gate",
            "gate_label": label,
            "label_sample": 0,
        },
        "probe": {
            "k": k,
            "pass_count": c,
            "regime": "gate",
            "clusters": [c],
            "samples": [{"n_passed": 1, "n_total": 1, "category": None}] * k,
            "score": {"name": score, "value": c / k},
            "scores": {"pass_share": c / k, "agreement": c / k},
        },
        "served": {"rung": 0, "model": "demo-cheap"},
        "cost": {"total_usd": 0.0005},
        "timings_ms": {"total": 1.0},
        "error": None,
    }
    record.update(over)
    return record


def line_of(record: dict[str, Any], prev: str = GENESIS_HASH) -> tuple[bytes, str]:
    """The line the proxy's writer would write for ``record`` (without its newline)."""
    raw, digest = link(encode_record(record), prev)
    return raw[:-1], digest


def full_parse(raw: bytes, score: str) -> Any:
    """The reference: ``json.loads`` and the row rules; an error is returned as ``"error"``."""
    try:
        return receipt_values(Path("r.jsonl"), 1, json.loads(raw), score)
    except CalibrationError:
        return "error"


def agrees(raw: bytes, score: str) -> bool:
    fast = _scan.fast_row(raw, score)
    return fast is None or fast == full_parse(raw, score)


def write_log(path: Path, records: list[dict[str, Any]]) -> Path:
    prev = GENESIS_HASH
    with path.open("wb") as fh:
        for record in records:
            raw, prev = link(encode_record(record), prev)
            fh.write(raw)
    return path


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize(("c", "label"), [(0, False), (3, True), (5, True), (2, None), (4, False)])
def test_the_proxys_shadow_lines_are_read_without_a_full_parse(
    score: str, c: int, label: bool | None
) -> None:
    """A pipeline-shaped shadow line, recorded under the score calibrated, takes the fast path
    and gives the full parse's row."""
    raw, _ = line_of(shadow_receipt(1, c, label, score=score))
    fast = _scan.fast_row(raw, score)
    assert fast is not None
    assert fast == full_parse(raw, score)


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"mode": "cascade"}, "not shadow mode"),
        ({"probe": None}, "no probe"),
        ({"decision": {"action": "served", "gate_label": None}}, "no gate label"),
        ({"decision": {"action": "served"}}, "no gate label"),
    ],
)
def test_skip_reasons_come_from_the_fast_path_too(over: dict[str, Any], reason: str) -> None:
    """Unlabelled, non-shadow and probe-less receipts are skipped for the same reason."""
    raw, _ = line_of(shadow_receipt(1, 3, True, **over))
    assert _scan.fast_row(raw, PASS_SHARE) == reason == full_parse(raw, PASS_SHARE)


ADVERSARIAL: list[tuple[str, dict[str, Any]]] = [
    (
        "key names inside strings",
        {"request": {"task_id": '","route":"evil","k":9,"gate_label":false'}},
    ),
    ("brackets inside strings", {"request": {"task_id": "}]{[", "model": "{"}}),
    ("backslashes", {"served": {"model": 'a\\"b'}, "route": 'r"1'}),
    (
        "nested route and decision in checks",
        {"checks": [{"route": "x", "decision": {"gate_label": False}}]},
    ),
    ("nested gate_label before decision", {"cost": {"gate_label": False}}),
    (
        "nested k in probe samples",
        {"probe": {**shadow_receipt(0, 2, True)["probe"], "samples": [{"k": 1, "pass_count": 0}]}},
    ),
    (
        "a later probe inside the probe",
        {"probe": {**shadow_receipt(0, 2, True)["probe"], "later": {"k": 9, "pass_count": 9}}},
    ),
    ("route inside request", {"request": {"model": "m", "route": "inner"}}),
    ("route inside request after a bracket string", {"request": {"model": "}", "route": "in"}}),
    (
        "route inside a probe sample",
        {"probe": {**shadow_receipt(0, 2, True)["probe"], "samples": [{"n": 1, "route": "s"}]}},
    ),
    ("decision inside error", {"error": {"a": 1, "decision": {"gate_label": True}}}),
    (
        "gate label in a later decision object",
        {"error": {"b": [1], "decision": {"gate_label": None}}},
    ),
    ("route after the top-level one", {"served": {"route": "other"}}),
    ("error with a message", {"error": {"status": 502, "message": 'bad "thing" [x]'}}),
    ("decision holding an object", {"decision": {"gate_label": True, "why": {"a": 1}}}),
    ("route null", {"route": None}),
    ("route a number", {"route": 7}),
    ("unicode route", {"route": "ünïcode ✓"}),
    ("label a string", {"decision": {"gate_label": "yes"}}),
    ("k a float", {"probe": {"k": 5.0, "pass_count": 3}}),
    ("pass count above k", {"probe": {"k": 5, "pass_count": 7}}),
    ("probe a list", {"probe": [1, 2]}),
    ("decision null", {"decision": None}),
    ("no route", {"route": "drop"}),
    ("no route but one in request", {"route": "drop", "request": {"model": "}", "route": "in"}}),
]


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize(("name", "over"), ADVERSARIAL, ids=[n for n, _ in ADVERSARIAL])
def test_adversarial_lines_agree_with_the_full_parse(
    score: str, name: str, over: dict[str, Any]
) -> None:
    """Lookalike keys, nested namesakes, escapes and bad values never change the answer."""
    record = shadow_receipt(1, 3, False, score=score, **over)
    if over.get("route") == "drop":
        del record["route"]
    probe = record.get("probe")
    if isinstance(probe, dict) and "score" in probe:  # a replaced probe: recorded under `score`
        record["probe"] = {**probe, "score": {"name": score, "value": 0.4}}
    raw, _ = line_of(record)
    assert agrees(raw, score)


def test_duplicate_keys_are_left_to_the_full_parse() -> None:
    """A hand-made line repeating a key (JSON keeps the last) is never answered from the first."""
    raw, _ = line_of(shadow_receipt(1, 3, True))
    text = raw.decode()
    doubled = [
        text[:-1] + ',"mode":"cascade"}',
        text[:-1] + ',"route":"second"}',
        text[:-1] + ',"decision":{"gate_label":false}}',
        text.replace('"k":5,', '"k":5,"k":4,'),
        text.replace('"gate_label":true,', '"gate_label":true,"gate_label":false,'),
    ]
    for line in doubled:
        assert agrees(line.encode(), PASS_SHARE), line


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 9), st.floats(0, 1), st.text(max_size=12)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "k",
                    "pass_count",
                    "route",
                    "mode",
                    "probe",
                    "decision",
                    "gate_label",
                    "scores",
                    "agreement",
                    "x",
                    "hash",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["shadow", "cascade"]),
    route=st.one_of(st.none(), st.text(max_size=8), json_value),
    label=st.one_of(st.booleans(), st.none(), json_leaf),
    k=st.one_of(st.integers(-1, 7), json_leaf),
    c=st.one_of(st.integers(-1, 8), json_leaf),
    agreement=st.one_of(st.floats(0, 1), st.sampled_from([0.0, 0.2, 0.6, 1.0]), json_leaf),
    noise=st.dictionaries(
        st.sampled_from(["checks", "request", "served", "cost", "error", "zzz"]),
        json_value,
        max_size=3,
    ),
    probe_extra=st.dictionaries(
        st.sampled_from(
            [
                "samples",
                "later",
                "score",
                "clusters",
                "lambda",
                "a",
                "provider",
                "model",
                "temperature",
                "top_p",
                "logit_bias",
            ]
        ),
        st.one_of(json_value, st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
        max_size=4,
    ),
    recorded=st.sampled_from(SCORES),
    score=st.sampled_from(SCORES),
)
def test_any_receipt_the_writer_can_write_reads_the_same_either_way(
    mode: str,
    route: Any,
    label: Any,
    k: Any,
    c: Any,
    agreement: Any,
    noise: dict[str, Any],
    probe_extra: dict[str, Any],
    recorded: str,
    score: str,
) -> None:
    """Over generated receipts (nested namesakes, odd values, recorded under the score read or
    another), fast equals the full parse."""
    probe = {
        "k": k, "pass_count": c, "scores": {"agreement": agreement},
        "score": {"name": recorded, "value": 0.0}, **probe_extra,
    }  # fmt: skip
    record = shadow_receipt(
        1,
        0,
        None,
        mode=mode,
        route=route,
        probe=probe,
        **noise,
        decision={"steps": ["a"], "gate_label": label},
    )
    raw, _ = line_of(record)
    assert agrees(raw, score)


def _reference(path: Path, score: str, monkeypatch: pytest.MonkeyPatch) -> data.Labelled:
    """The log read the sequential way: ``verify_chain``, then ``json.loads`` for every line
    (the one-pass read is made to give up, as it does on a line it cannot vouch for)."""
    with monkeypatch.context() as patch:
        patch.setattr(_onepass, "PARALLEL_BYTES", 1 << 62)
        patch.setattr(_onepass, "scan_span", lambda *a, **k: _scan.Span(lines=0, chain_ok=False))
        return read_receipts([path], score=score)


def _record_pools(patch: pytest.MonkeyPatch) -> list[Any]:
    """Every pool ``read_receipts`` asks for (None where it could not start one)."""
    got: list[Any] = []
    real = _onepass.Pool.get

    def get(self: Any) -> Any:
        pool = real(self)
        got.append(pool)
        return pool

    patch.setattr(_onepass.Pool, "get", get)
    return got


def _same(a: data.Labelled, b: data.Labelled) -> None:
    for name in ("score", "failed", "k", "pass_count", "route", "level_set"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.route_names == b.route_names and a.level_sets == b.level_sets
    assert a.source == b.source and a.digest() == b.digest()


@pytest.mark.parametrize("score", SCORES)
def test_a_log_read_in_parallel_spans_equals_the_full_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, score: str
) -> None:
    """Read in small spans by a process pool, a mixed log gives the same data as parsing every
    line: same rows, routes and level sets in order, skips, heads and digest."""
    rng = np.random.default_rng(3)
    records = []
    for i in range(600):
        c = int(rng.integers(0, 6))
        over: dict[str, Any] = {"route": ["code", "sql", None][i % 3]}
        if i % 7 == 0:
            over["mode"] = "cascade"
        if i % 11 == 0:
            over["error"] = {"message": 'odd "quote" [x]'}
        if i % 13 == 0:
            over["decision"] = ["not", "an", "object"]  # msgspec refuses: full parse for this one
        records.append(shadow_receipt(i, c, bool(rng.random() < 0.8), score=score, **over))
    path = write_log(tmp_path / "r.jsonl", records)
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 50_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0)
    with monkeypatch.context() as patch:
        patch.setattr(_receipts, "_read_parsed", lambda *a, **k: pytest.fail("sequential path"))
        pools = _record_pools(patch)
        fast = read_receipts([path], score=score)
    assert pools and pools[0] is not None  # the spans were read by worker processes
    _same(fast, _reference(path, score, monkeypatch))
    assert fast.source.skipped == {"not shadow mode": 86, "no gate label": 40}
    assert fast.source.verified and fast.source.file_sha256 == (None,)


@pytest.mark.parametrize("parallel", [True, False], ids=["pool", "in-process"])
@pytest.mark.parametrize("score", SCORES)
def test_a_log_mixing_scores_is_refused_the_same_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, score: str, parallel: bool
) -> None:
    """Receipts recorded under another score, deep in a later span: the one-pass read refuses
    the log with the full parse's message, naming both scores and how many receipts."""
    other = "agreement" if score == PASS_SHARE else PASS_SHARE
    records = [
        shadow_receipt(i, i % 6, True, score=other if i in (250, 251, 377) else score)
        for i in range(400)
    ]
    path = write_log(tmp_path / "r.jsonl", records)
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 40_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0 if parallel else 1 << 62)
    with monkeypatch.context() as patch:
        patch.setattr(_receipts, "_read_parsed", lambda *a, **k: pytest.fail("sequential path"))
        pools = _record_pools(patch)
        with pytest.raises(CalibrationError) as fast:
            read_receipts([path], score=score)
    assert bool(pools and pools[0] is not None) == parallel
    with pytest.raises(CalibrationError) as full:
        _reference(path, score, monkeypatch)
    assert str(fast.value) == str(full.value)
    assert f"3 recorded under score {other!r}" in str(fast.value)
    assert f"calibrating score {score!r}" in str(fast.value)


@pytest.mark.parametrize("parallel", [True, False], ids=["pool", "in-process"])
def test_a_log_of_labelled_rows_only_read_by_column_equals_the_full_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """Spans holding only labelled pass-share rows (what a shadow deployment writes) are decoded
    in one call and checked by column; that shortcut must give the full parse's rows too."""
    rng = np.random.default_rng(5)
    records = [
        shadow_receipt(
            i, int(rng.integers(0, 6)), bool(rng.random() < 0.7), route=["a", "b", None][i % 3]
        )
        for i in range(400)
    ]
    path = write_log(tmp_path / "r.jsonl", records)
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 40_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0 if parallel else 1 << 62)
    calls: list[int] = []
    real = _scan._columns

    def counted(rows):
        calls.append(len(rows))
        return real(rows)

    monkeypatch.setattr(_scan, "_columns", counted)
    with monkeypatch.context() as patch:
        patch.setattr(_receipts, "_read_parsed", lambda *a, **k: pytest.fail("sequential path"))
        pools = _record_pools(patch)
        fast = read_receipts([path], score=PASS_SHARE)
    if parallel:
        assert pools and pools[0] is not None  # the spans were read by worker processes
    else:  # the patch reaches only this process
        assert calls and sum(calls) == 400 and not pools
    _same(fast, _reference(path, PASS_SHARE, monkeypatch))


def _cut(path: Path, drop: int) -> Path:
    """The log with its line ``drop`` (0-based) removed: every line still hashes to itself."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:drop] + lines[drop + 1 :]))
    return path


@pytest.mark.parametrize("parallel", [True, False], ids=["pool", "in-process"])
def test_a_line_deleted_at_a_span_boundary_breaks_the_chain_at_that_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """Spans are checked on their own; the join between them is checked too, and the error
    names the line exactly as the sequential verification does."""
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 20_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0 if parallel else 1 << 62)
    path = write_log(tmp_path / "r.jsonl", [shadow_receipt(i, 3, True) for i in range(120)])
    starts = [a for a, _ in _onepass._spans(path)]
    offsets = [0]
    for line in path.read_bytes().splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    first_of_second_span = offsets.index(starts[1])
    _cut(path, first_of_second_span)
    with pytest.raises(
        CalibrationError, match=rf"at line {first_of_second_span + 1} \(broken link"
    ):
        read_receipts([path])
    unverified = read_receipts([path], allow_unverified=True)
    assert unverified.n == 119 and not unverified.source.verified
    assert unverified.source.file_sha256[0] is not None
    assert unverified.source.file_sha256[0].startswith("sha256:")


def test_an_edited_line_in_a_later_span_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line edited after it was written no longer hashes to itself: found in its span."""
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 20_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0)
    path = write_log(tmp_path / "r.jsonl", [shadow_receipt(i, 3, True) for i in range(120)])
    lines = path.read_bytes().splitlines(keepends=True)
    lines[100] = lines[100].replace(b'"gate_label":true', b'"gate_label":false')
    path.write_bytes(b"".join(lines))
    with pytest.raises(CalibrationError, match=r"at line 101 \(hash mismatch"):
        read_receipts([path])


def test_a_bad_line_deep_in_a_verified_log_is_named_by_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed probe in a later span is reported with its line number in the file."""
    records = [shadow_receipt(i, 3, True) for i in range(300)]
    records[256] = shadow_receipt(256, 3, True, probe={"k": 5, "pass_count": 9})
    path = write_log(tmp_path / "r.jsonl", records)
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 20_000)
    with pytest.raises(CalibrationError, match=r"line 257: \"probe.pass_count\""):
        read_receipts([path])


def test_workers_are_forked_only_while_this_process_has_one_thread() -> None:
    """Forking a process with other threads can copy a held lock into the child: then spawn."""
    import threading

    stop = threading.Event()
    if threading.active_count() == 1:
        assert _onepass._start_method() == "fork"
    else:  # a thread of the test runner's: the fork half is checked in a fresh interpreter
        import subprocess
        import sys

        code = "from firstpass.calibration import _onepass; print(_onepass._start_method())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "fork", out.stderr
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert _onepass._start_method() == "spawn"
    finally:
        stop.set()
        worker.join()


def test_a_broken_chain_is_reported_before_a_bad_row_in_an_earlier_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are gathered while later spans are still being checked; a bad row found on the way
    must not hide that the log itself does not verify."""
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 20_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 0)
    records = [shadow_receipt(i, 3, True) for i in range(120)]
    records[3] = shadow_receipt(3, 3, True, probe={"k": 5, "pass_count": 9})
    path = write_log(tmp_path / "r.jsonl", records)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[100] = lines[100].replace(b'"gate_label":true', b'"gate_label":false')
    path.write_bytes(b"".join(lines))
    with pytest.raises(CalibrationError, match=r"hash chain does not verify at line 101"):
        read_receipts([path])


# --- hand-forged logs: lines whose hashes are right but whose bytes are odd ------------------

_H = '"hash":"sha256:' + "0" * 64 + '",'


def _forge(path: Path, templates: list[str | bytes], newline: bytes = b"\n") -> Path:
    """A chain from line templates holding the member ``_H`` and ``"prev_hash":"@P"``: each
    line's hash is computed the way the writer's is (over the line without its hash member)."""
    import hashlib

    prev, out = GENESIS_HASH, []
    for t in templates:
        raw = t.encode("utf-8", "surrogatepass") if isinstance(t, str) else t
        raw = raw.replace(b"@P", prev.encode())
        at = raw.index(_H.encode())
        digest = "sha256:" + hashlib.sha256(raw[:at] + raw[at + len(_H) :]).hexdigest()
        out.append(raw[:at] + b'"hash":"' + digest.encode() + b'",' + raw[at + len(_H) :] + newline)
        prev = digest
    path.write_bytes(b"".join(out))
    return path


def _rec(k: Any = 5, c: Any = 3, *, post: str = "", route: str = "code") -> str:
    return (
        '{"decision":{"gate_label":true},' + _H + '"id":"x","mode":"shadow","prev_hash":"@P",'
        f'"probe":{{"k":{k},"pass_count":{c}}},"route":{json.dumps(route)}{post}}}'
    )


def _outcome(path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    try:
        if monkeypatch is None:
            got = read_receipts([path])
        else:
            got = _reference(path, PASS_SHARE, monkeypatch)
    except CalibrationError as exc:
        return "error: " + str(exc)
    return (got.score.tolist(), got.failed.tolist(), got.route_names, got.source)


FORGED: list[tuple[str, list[str | bytes]]] = [
    (
        "two values on one line, one value over two lines",
        [
            _rec() + ' {"mode":"shadow","probe":{"k":5,"pass_count":1},"route":"evil"}',
            _rec(post=',"a":[{"x":1'),
            ',{"y":2,' + _H + '"prev_hash":"@P","z":1}]}',
        ],
    ),
    ("two values on a line that starts and ends with braces", [_rec() + ' {"x":1}', _rec()]),
    ("invalid UTF-8 in a field calibration skips", [_rec().encode()[:-1] + b',"zz":"\xff"}']),
    ("UTF-8-encoded surrogate in a skipped field", [_rec(post=',"zz":"\ud800"'), _rec()]),
    ("a byte order mark before a line", ["\ufeff" + _rec(), _rec()]),
    ("a rule broken on line 1, bad JSON on line 2", [_rec(k=0), _rec(post=',"z":01')]),
    ("nesting deeper than the parser's limit", [_rec(post=',"zz":' + "[" * 3000 + "]" * 3000)]),
    ("a k beyond int64", [_rec(k=2**63, c=1), _rec()]),
    ("a NaN in a skipped field", [_rec(post=',"zz":NaN'), _rec()]),
]


@pytest.mark.parametrize(("name", "templates"), FORGED, ids=[n for n, _ in FORGED])
def test_forged_lines_read_as_the_sequential_reader_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, templates: list[str | bytes]
) -> None:
    """Lines whose hashes check out but whose bytes are odd (found by review): the one-pass
    read gives the rows, or the error, that verify_chain + json give."""
    path = _forge(tmp_path / "forged.jsonl", templates)
    assert _outcome(path) == _outcome(path, monkeypatch)


def test_a_log_with_crlf_lines_is_still_read_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines only a parse can vouch for (CRLF endings here) are checked the way verify_chain
    checks them, inside the span, instead of sending the whole log to the sequential reader
    (which holds the whole file in memory)."""
    path = _forge(tmp_path / "crlf.jsonl", [_rec(c=c) for c in range(6)], newline=b"\r\n")
    monkeypatch.setattr(_receipts, "_read_parsed", lambda *a, **k: pytest.fail("sequential path"))
    got = read_receipts([path])
    assert got.pass_count.tolist() == list(range(6)) and got.source.verified


@pytest.mark.parametrize("cap", [16, None, 0, -3, "16", True, 2.0, [16]])
def test_a_probes_output_cap_reads_the_same_either_way(cap: object) -> None:
    """``probe.output_cap`` is part of the slice key: a valid cap takes the fast path with the
    full parse's key, a malformed one is left to the full parse (which names it)."""
    record = shadow_receipt(1, 5, True)
    record["probe"]["output_cap"] = cap
    raw, _ = line_of(record)
    assert agrees(raw, PASS_SHARE)
    if cap in (16, None) and type(cap) is not bool:
        fast = _scan.fast_row(raw, PASS_SHARE)
        assert fast is not None and not isinstance(fast, str) and fast[4][7] == cap
    else:
        assert full_parse(raw, PASS_SHARE) == "error"


def test_capped_rows_read_by_column_equal_the_full_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows a budget capped (``probe.output_cap`` on each) keep the column shortcut, with the
    full parse's rows, keys and digest."""
    records = []
    for i in range(300):
        record = shadow_receipt(i, i % 6, i % 4 != 0, route=["a", "b"][i % 2])
        record["probe"].update(provider="stub", model="cheap", output_cap=16)
        records.append(record)
    path = write_log(tmp_path / "r.jsonl", records)
    monkeypatch.setattr(_onepass, "_SPAN_BYTES", 40_000)
    monkeypatch.setattr(_onepass, "PARALLEL_BYTES", 1 << 62)
    keyed: list[int] = []
    real = _scan._keys

    def counted(rows: Any, probes: Any) -> Any:
        keys = real(rows, probes)
        keyed.extend(1 for key in keys if key is not None and key[7] == 16)
        return keys

    monkeypatch.setattr(_scan, "_keys", counted)
    with monkeypatch.context() as patch:
        patch.setattr(_receipts, "_read_parsed", lambda *a, **k: pytest.fail("sequential path"))
        fast = read_receipts([path], score=PASS_SHARE)
    assert sum(keyed) == 300
    assert {c.output_cap for c in fast.contexts} == {16}
    _same(fast, _reference(path, PASS_SHARE, monkeypatch))
