"""Signed calibration files, and calibration only from receipts a signed checkpoint vouches for.

A calibration file's id is a SHA-256 anyone can recompute: before signatures, an edited λ with
its id re-hashed, a fabricated file, a consistent forged rung-0 + rung-1 pair, and a file
calibrated from a receipt log forged and re-hashed after its last checkpoint were all enforced.
Each test below starts the real server (or runs the real ``firstpass calibrate``) on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
import structlog

from firstpass.cli import main as firstpass_main
from firstpass.config import Given, calibration_id, sign_calibration
from firstpass.errors import ConfigError
from firstpass.receipts import (
    GENESIS_HASH,
    KeyFiles,
    canonical_bytes,
    iter_receipts,
    load_signing_key,
    new_receipt_id,
    verify_chain,
    write_key_files,
)
from tests import server_harness
from tests.add_task import GOOD, TESTS, WRONG
from tests.certificates import certificate, write_calibration
from tests.server_harness import LiveStack
from tests.stub_upstream import Reply
from tests.test_certificate_e2e import TableSandbox, Traffic, _send

K = 5
N_SHADOW = 400
ALPHA, DELTA = "0.15", "0.1"


@pytest.fixture
def key(tmp_path: Path) -> KeyFiles:
    return write_key_files(tmp_path / "keys" / "trusted.key")


@pytest.fixture
def other(tmp_path: Path) -> KeyFiles:
    return write_key_files(tmp_path / "keys" / "other.key")


Hooks = dict[Path, list[Callable[[Path], object]]]


def _enforce(calibration: list[Path], **extra: Any) -> dict[str, Any]:
    return {
        "k": K,
        "escalate_at": 0,
        "mode": "enforce",
        "calibration": [str(p) for p in calibration],
        **extra,
    }


@pytest.fixture
def after_bind(monkeypatch: pytest.MonkeyPatch) -> Hooks:
    """Steps run on a cited test calibration file once the harness has bound it to the stub
    upstream's endpoint (which re-derives its id): sign it there, as calibrating against that
    upstream would have, then tamper with it."""
    hooks: Hooks = {}
    original = server_harness.bind_to_endpoint

    def bind(paths: Sequence[str | Path], endpoint: str) -> None:
        original(paths, endpoint)
        for path in map(Path, paths):
            for hook in hooks.get(path, ()):
                hook(path)

    monkeypatch.setattr(server_harness, "bind_to_endpoint", bind)
    return hooks


def _sign(path: Path, key: KeyFiles) -> Path:
    doc = json.loads(path.read_text("utf-8"))
    path.write_text(json.dumps(sign_calibration(doc, load_signing_key(key.private))), "utf-8")
    return path


def _start(
    tmp_path: Path, elastic: dict[str, Any], **kw: Any
) -> tuple[LiveStack, list[MutableMapping[str, Any]]]:
    """A live stack, and the log events of its start (the ready line among them)."""
    quiet = structlog.get_config()["wrapper_class"]  # tests log warnings only: let info in
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with structlog.testing.capture_logs() as events:
            stack = LiveStack(
                tmp_path / f"receipts-{new_receipt_id()}.jsonl", elastic=elastic, **kw
            )
    finally:
        structlog.configure(wrapper_class=quiet)
    return stack, events


@pytest.fixture
def stacks() -> Iterator[list[LiveStack]]:
    started: list[LiveStack] = []
    yield started
    for stack in started:
        stack.close()


# -- enforce takes only files a trusted key signed ------------------------------------------


def test_a_signed_calibration_starts_enforce_and_the_ready_line_names_its_signer(
    tmp_path: Path, key: KeyFiles, stacks: list[LiveStack], after_bind: Hooks
) -> None:
    """Signed by a key in ``trusted_keys``: enforce starts, the ready line says who signed."""
    cal = write_calibration(tmp_path / "cal.json")
    after_bind[cal] = [lambda p: _sign(p, key)]
    stack, events = _start(tmp_path, _enforce([cal], trusted_keys=[str(key.public)]))
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    (status,) = ready["certificate_signatures"].values()
    assert status == f"signed by trusted key {key.key_id}"
    assert "unsigned_certificates_in_force" not in ready


def test_the_receipts_signing_key_is_trusted_for_calibrations(
    tmp_path: Path, key: KeyFiles, stacks: list[LiveStack], after_bind: Hooks
) -> None:
    """``[receipts] signing_key`` alone makes its public half a trusted signer."""
    cal = write_calibration(tmp_path / "cal.json")
    after_bind[cal] = [lambda p: _sign(p, key)]
    stack, events = _start(
        tmp_path, _enforce([cal]), receipts_extra={"signing_key": str(key.private)}
    )
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    assert list(ready["certificate_signatures"].values()) == [f"signed by trusted key {key.key_id}"]


def _raise_lambda(path: Path) -> None:
    """λ lowered in a signed file and its id re-derived: what the id check alone lets through."""
    doc = json.loads(path.read_text("utf-8"))
    doc["certificates"][0]["lambda"] = 0.2
    doc["id"] = calibration_id(doc)
    path.write_text(json.dumps(doc), "utf-8")


def test_an_edited_lambda_with_its_id_rehashed_fails_the_start(
    tmp_path: Path, key: KeyFiles, after_bind: Hooks
) -> None:
    """λ edited in a signed file and the id recomputed (the id check alone passes it): the
    signature no longer verifies, and enforce refuses to start, naming the file."""
    cal = write_calibration(tmp_path / "cal.json", certificate(lam=0.9))
    after_bind[cal] = [lambda p: _sign(p, key), _raise_lambda]
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", elastic=_enforce([cal], trusted_keys=[str(key.public)]))
    assert err.value.key_path == "escalation.elastic.calibration"
    assert str(cal) in str(err.value) and "does not verify" in str(err.value)
    assert "--signing-key" in str(err.value)


@pytest.mark.parametrize("signed_by", [None, "other"])
def test_a_fabricated_file_with_a_valid_id_fails_the_start(
    tmp_path: Path,
    key: KeyFiles,
    other: KeyFiles,
    signed_by: str | None,
    after_bind: Hooks,
    stacks: list[LiveStack],
) -> None:
    """A whole file written by hand with a correct id, unsigned or signed by a key that is
    not trusted: refused, each with its own reason (without trusted keys it starts)."""
    control, cal = (write_calibration(tmp_path / n, certificate(lam=0.2)) for n in ("c", "f"))
    if signed_by is not None:
        after_bind[cal] = after_bind[control] = [lambda p: _sign(p, other)]
    stacks.append(LiveStack(tmp_path / "r2.jsonl", elastic=_enforce([control])))
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", elastic=_enforce([cal], trusted_keys=[str(key.public)]))
    assert str(cal) in str(err.value)
    why = "is not signed" if signed_by is None else f"by {other.key_id}, which is not a trusted"
    assert why in str(err.value)


def test_a_consistent_forged_rung_pair_signed_by_an_untrusted_key_fails_the_start(
    tmp_path: Path,
    key: KeyFiles,
    other: KeyFiles,
    after_bind: Hooks,
    stacks: list[LiveStack],
) -> None:
    """A rung-0 file and a rung-1 file that names it in ``given``, consistent with each other
    (enforce takes the pair without trusted keys) and signed by an attacker's own key: with a
    trusted key, the start fails naming the first file."""

    def pair(name: str) -> list[Path]:
        rung0 = write_calibration(tmp_path / f"{name}0.json", certificate(lam=0.2))
        r0_id = json.loads(rung0.read_text("utf-8"))["id"]
        given = Given(rung=0, certificate=r0_id, lambda_=0.2, escalate_at=0, max_gate_candidates=1)
        rung1 = write_calibration(
            tmp_path / f"{name}1.json",
            certificate(rung=1, lam=0.2, model="stub/strong-model", given=[given]),
        )
        after_bind[rung0] = after_bind[rung1] = [lambda p: _sign(p, other)]
        return [rung0, rung1]

    stack, events = _start(tmp_path, _enforce(pair("control")), strong_k=K)
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    assert "gates" not in ready["certificates"].values()  # both rungs licensed
    rung0, rung1 = pair("forged")
    with pytest.raises(ConfigError) as err:
        LiveStack(
            tmp_path / "r.jsonl",
            elastic=_enforce([rung0, rung1], trusted_keys=[str(key.public)]),
            strong_k=K,
        )
    assert str(rung0) in str(err.value) and "not a trusted key" in str(err.value)


def test_shadow_labels_an_unsigned_file_without_refusing(
    tmp_path: Path, key: KeyFiles, stacks: list[LiveStack]
) -> None:
    """Shadow with a trusted key starts on an unsigned file and says so on the ready line."""
    cal = write_calibration(tmp_path / "cal.json")
    block = {"k": K, "mode": "shadow", "calibration": str(cal), "trusted_keys": [str(key.public)]}
    stack, events = _start(tmp_path, block)
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    (status,) = ready["certificate_signatures"].values()
    assert status == "not signed by a trusted key: it is not signed"


def test_without_any_key_the_ready_line_says_the_certificates_in_force_are_unsigned(
    tmp_path: Path, stacks: list[LiveStack]
) -> None:
    """No trusted key configured: enforce runs as before, and the ready line lists the
    certificates in force as unsigned."""
    cal = write_calibration(tmp_path / "cal.json")
    stack, events = _start(tmp_path, _enforce([cal]))
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    assert ready["unsigned_certificates_in_force"] == [json.loads(cal.read_text())["id"]]


def test_a_missing_trusted_key_fails_the_start_naming_its_index(tmp_path: Path) -> None:
    """``trusted_keys`` entries are read at start; a bad one names its place."""
    cal = write_calibration(tmp_path / "cal.json")
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", elastic=_enforce([cal], trusted_keys=["nope.pub"]))
    assert err.value.key_path == "escalation.elastic.trusted_keys[0]"


def _plausible(body: dict[str, Any]) -> Reply:
    """The cheap model's k answers all pass the visible tests and fail the gate
    (``TableSandbox``): served without the gate, each is a failure."""
    if body.get("model") != server_harness.CHEAP:
        return Reply.ok(GOOD)
    n = int(body.get("n") or 1)
    return Reply.ok(*(WRONG.replace("a - b", f"a - b  #plausible {i}") for i in range(n)))


def _ask_enforce(stack: LiveStack) -> openai.APIStatusError | dict[str, Any]:
    """One request asking for ``mode = "enforce"``: the refusal, or the firstpass object."""
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    try:
        reply = client.chat.completions.create(
            model=server_harness.MODEL,
            messages=[{"role": "user", "content": "write add"}],
            extra_body={"firstpass": {**TESTS, "mode": "enforce"}},
        )
    except openai.APIStatusError as exc:
        return exc
    extra = reply.model_extra or {}
    fp: dict[str, Any] = extra["firstpass"]
    return fp


def _vouched_by(key: KeyFiles) -> dict[str, Any]:
    """A calibration file's ``source`` as ``calibrate --pubkey KEY`` records it."""
    return {"source": {"checkpoints": {"verified": True, "key_id": key.key_id}}}


@pytest.mark.parametrize("flaw", ["unsigned", "untrusted signer", "untrusted evidence"])
def test_a_client_asking_for_enforce_is_refused_on_a_file_no_trusted_key_vouches_for(
    tmp_path: Path,
    key: KeyFiles,
    other: KeyFiles,
    flaw: str,
    after_bind: Hooks,
    stacks: list[LiveStack],
) -> None:
    """Shadow block, enforce in client_modes, a trusted key, and a cited file it does not
    vouch for (unsigned; signed by another key; signed, over receipts another key's
    checkpoints vouched for): the file licenses nothing, so a request asking for enforce gets
    403 enforce_not_certified naming why, and the ready line shows the rung gating. The same
    file fully vouched for serves that request without the gate (the control)."""

    def start(name: str, signer: KeyFiles | None, evidence: KeyFiles) -> tuple[LiveStack, Any]:
        cal = write_calibration(
            tmp_path / f"{name}.json", certificate(lam=0.2), **_vouched_by(evidence)
        )
        if signer is not None:
            after_bind[cal] = [lambda p: _sign(p, signer)]
        block = {"k": K, "escalate_at": 0, "mode": "shadow", "calibration": str(cal)}
        stack, events = _start(
            tmp_path,
            {**block, "trusted_keys": [str(key.public)]},
            client_modes=["cascade", "shadow", "enforce"],
            sandbox_factory=lambda _c: TableSandbox(),
        )
        stacks.append(stack)
        stack.stub.responder = _plausible
        (ready,) = [e for e in events if e["event"] == "ready"]
        return stack, ready

    control, ready = start("control", key, key)
    assert ready["certificates"]["code/0"] != "gates"
    served = _ask_enforce(control)
    assert isinstance(served, dict) and served["verification"] == "gate_skipped"

    signer = {"unsigned": None, "untrusted signer": other, "untrusted evidence": key}[flaw]
    evidence = other if flaw == "untrusted evidence" else key
    stack, ready = start("flawed", signer, evidence)
    assert ready["certificates"]["code/0"] == "gates"
    refused = _ask_enforce(stack)
    assert isinstance(refused, openai.APIStatusError), refused
    assert refused.status_code == 403 and refused.code == "enforce_not_certified"
    why = {
        "unsigned": "is not signed",
        "untrusted signer": f"signed by {other.key_id}, which is not a trusted key",
        "untrusted evidence": f"checkpoints signed by {other.key_id}",
    }[flaw]
    assert why in refused.message
    assert stack.stub.completions == []  # refused at the door: nothing went upstream


def test_a_trusted_signature_over_evidence_an_untrusted_key_vouched_for_fails_the_start(
    tmp_path: Path, key: KeyFiles, other: KeyFiles, after_bind: Hooks
) -> None:
    """Signed by a trusted key, but calibrated on receipts whose checkpoints another key
    signed (``calibrate --signing-key TRUSTED --pubkey OTHER``): enforce refuses to start,
    naming the file and the evidence key."""
    cal = write_calibration(tmp_path / "cal.json", **_vouched_by(other))
    after_bind[cal] = [lambda p: _sign(p, key)]
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", elastic=_enforce([cal], trusted_keys=[str(key.public)]))
    assert err.value.key_path == "escalation.elastic.calibration"
    assert str(cal) in str(err.value) and other.key_id in str(err.value)
    assert "not a trusted key" in str(err.value)


def test_the_ready_line_names_the_key_that_vouched_for_the_evidence(
    tmp_path: Path, key: KeyFiles, other: KeyFiles, after_bind: Hooks, stacks: list[LiveStack]
) -> None:
    """Evidence vouched for by a trusted key (here another trusted one): enforce starts, and
    the ready line says which key's checkpoints vouched for the receipts; a file with no
    recorded checkpoints says so."""
    cal = write_calibration(tmp_path / "cal.json", **_vouched_by(other))
    bare = write_calibration(tmp_path / "bare.json", certificate(route=None, routes=["code"]))
    after_bind[cal] = after_bind[bare] = [lambda p: _sign(p, key)]
    trusted = [str(key.public), str(other.public)]
    stack, events = _start(tmp_path, _enforce([cal, bare], trusted_keys=trusted))
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    evidence = {name.split(" ")[1]: v for name, v in ready["certificate_evidence"].items()}
    assert evidence[f"({cal})"] == f"receipts vouched for by checkpoints signed by {other.key_id}"
    assert "no signed checkpoint" in evidence[f"({bare})"]


# -- key files -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_a_trusted_key_others_can_write_fails_the_start(
    tmp_path: Path, key: KeyFiles, mode: int
) -> None:
    """A trusted ``.pub`` writable by group or others: anyone there could swap in their own
    key, so the start fails naming ``trusted_keys[0]`` and the chmod that fixes it."""
    cal = write_calibration(tmp_path / "cal.json")
    key.public.chmod(mode)
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", elastic=_enforce([cal], trusted_keys=[str(key.public)]))
    assert err.value.key_path == "escalation.elastic.trusted_keys[0]"
    assert f"chmod go-w {key.public}" in str(err.value)


def test_a_trusted_key_file_with_two_keys_fails_the_start(
    tmp_path: Path, key: KeyFiles, other: KeyFiles
) -> None:
    """Two PEM blocks in one ``.pub``: which one is trusted would be a guess (the first was
    taken silently); the start fails saying one key per file."""
    cal = write_calibration(tmp_path / "cal.json")
    both = tmp_path / "both.pub"
    both.write_bytes(other.public.read_bytes() + key.public.read_bytes())
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", elastic=_enforce([cal], trusted_keys=[str(both)]))
    assert err.value.key_path == "escalation.elastic.trusted_keys[0]"
    assert "2 PEM blocks" in str(err.value) and "one key per file" in str(err.value)


def test_a_receipts_signing_key_that_is_a_public_key_says_so(tmp_path: Path, key: KeyFiles) -> None:
    """``[receipts] signing_key`` naming the ``.pub`` half: the error says it is the public
    key and names the private one beside it (not a permissions complaint)."""
    with pytest.raises(ConfigError) as err:
        LiveStack(tmp_path / "r.jsonl", receipts_extra={"signing_key": str(key.public)})
    assert err.value.key_path == "receipts.signing_key"
    assert "is a public key" in str(err.value) and str(key.private) in str(err.value)
    assert "readable by group or others" not in str(err.value)


# -- calibrating from checkpoint-signed receipts ---------------------------------------------


@pytest.fixture(scope="module")
def shadow_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A shadow run's receipts, written with a signing key (checkpoint at close): the log,
    the private key and the public key."""
    tmp = tmp_path_factory.mktemp("shadow")
    keys = write_key_files(tmp / "keys" / "signing.key")
    stack = LiveStack(
        tmp / "receipts.jsonl",
        elastic={"k": K, "escalate_at": 0, "mode": "shadow"},
        sandbox_factory=lambda _c: TableSandbox(),
        receipts_extra={"signing_key": str(keys.private), "checkpoint_interval_s": 3600},
    )
    try:
        stack.stub.responder = Traffic(seed=1).responder
        _send(stack, N_SHADOW)
        stack.flush()
    finally:
        stack.close()
    return stack.receipts, keys.private, keys.public


def _copy(shadow_log: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    log = tmp_path / "receipts.jsonl"
    shutil.copy(shadow_log[0], log)
    return log


def _calibrate(log: Path, out: Path, *flags: str) -> int:
    argv = ["calibrate", "--receipts", str(log), "--alpha", ALPHA, "--delta", DELTA]
    return firstpass_main([*argv, "--out", str(out), *flags])


def _rehash_from(records: list[dict[str, Any]], prev: str) -> bytes:
    """Lines that link as the writer's do, from ``prev`` on: a forger without the key."""
    out = []
    for record in records:
        body = {k: v for k, v in record.items() if k not in ("hash", "prev_hash")}
        body["prev_hash"] = prev
        prev = "sha256:" + hashlib.sha256(canonical_bytes(body)).hexdigest()
        out.append(canonical_bytes({**body, "hash": prev}) + b"\n")
    return b"".join(out)


def _passing(log: Path) -> list[dict[str, Any]]:
    """Labelled shadow receipts whose probe would skip and whose label says it passed."""
    receipts: list[dict[str, Any]] = list(iter_receipts(log))
    return [
        r
        for r in receipts
        if r.get("probe") and r["probe"].get("pass_count") == K and r.get("mode") == "shadow"
    ]


@pytest.mark.e2e
def test_calibrate_signs_the_file_and_the_server_trusting_the_key_verifies_it(
    shadow_log: tuple[Path, Path, Path], tmp_path: Path, stacks: list[LiveStack]
) -> None:
    """``calibrate --signing-key`` on checkpoint-signed receipts writes a signed file that
    records its checkpoint key; a server trusting the key finds it signed."""
    _, private, public = shadow_log
    out = tmp_path / "cal.json"
    assert _calibrate(_copy(shadow_log, tmp_path), out, "--signing-key", str(private)) == 0
    doc = json.loads(out.read_text("utf-8"))
    kid = doc["signature"]["key_id"]
    assert doc["signature"]["alg"] == "ed25519"
    assert doc["source"]["checkpoints"] == {"verified": True, "key_id": kid}
    assert doc["id"] == calibration_id(doc)
    assert doc["certificates"], "the shadow traffic certifies a λ"
    # shadow: the recorded endpoint is the shadow run's stub, another port than a new stack's
    block = {"k": K, "mode": "shadow", "calibration": str(out), "trusted_keys": [str(public)]}
    stack, events = _start(tmp_path, block, sandbox_factory=lambda _c: TableSandbox())
    stacks.append(stack)
    (ready,) = [e for e in events if e["event"] == "ready"]
    assert list(ready["certificate_signatures"].values()) == [f"signed by trusted key {kid}"]


@pytest.mark.e2e
def test_rows_forged_after_the_last_checkpoint_are_not_evidence(
    shadow_log: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Passing rows appended after the last signed checkpoint and re-hashed (the chain
    verifies): without a key they count as evidence; with the key they are left out, and
    the report says how many and why."""
    log = _copy(shadow_log, tmp_path)
    head = verify_chain(log).head
    forged = [{**r, "id": new_receipt_id()} for r in _passing(log)[:50]] * 4
    forged = [{**r, "id": new_receipt_id()} for r in forged]
    with open(log, "ab") as fh:
        fh.write(_rehash_from(forged, head))
    assert verify_chain(log).ok
    plain, signed = tmp_path / "plain.json", tmp_path / "signed.json"
    assert _calibrate(log, plain) == 0
    assert _calibrate(log, signed, "--signing-key", str(shadow_log[1])) == 0
    used_plain = json.loads(plain.read_text())["source"]["used"]
    source = json.loads(signed.read_text())["source"]
    assert used_plain == source["used"] + len(forged)
    (reason,) = [r for r in source["skipped"] if "after the last signed checkpoint" in r]
    assert source["skipped"][reason] == len(forged)
    assert f"{len(forged):,} lines after the last signed checkpoint" in capsys.readouterr().err


@pytest.mark.e2e
def test_rows_forged_before_the_last_checkpoint_fail_the_calibration(
    shadow_log: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Labels flipped to passed in the signed part and the chain re-hashed from genesis: the
    chain verifies, the checkpoint no longer signs its head, and calibrate refuses."""
    log = _copy(shadow_log, tmp_path)
    records = [json.loads(line) for line in log.read_bytes().splitlines()]
    for record in records:
        if record.get("mode") == "shadow" and isinstance(record.get("probe"), dict):
            record["probe"]["pass_count"] = K
    log.write_bytes(_rehash_from(records, GENESIS_HASH))
    assert verify_chain(log).ok
    out = tmp_path / "cal.json"
    assert _calibrate(log, out, "--signing-key", str(shadow_log[1])) == 2
    assert "signed checkpoints do not hold up" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.e2e
def test_a_log_without_checkpoints_is_not_evidence(
    shadow_log: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log re-hashed without its checkpoint lines: nothing in it is evidence."""
    log = _copy(shadow_log, tmp_path)
    records = [json.loads(line) for line in log.read_bytes().splitlines()]
    log.write_bytes(
        _rehash_from([r for r in records if r.get("kind") != "checkpoint"], GENESIS_HASH)
    )
    assert _calibrate(log, tmp_path / "cal.json", "--signing-key", str(shadow_log[1])) == 2
    err = capsys.readouterr().err
    assert "a log with no signed checkpoint" in err
    # the way out is a proxy that signs checkpoints, not shadow mode (it already ran shadow)
    assert "[receipts] signing_key" in err and 'mode = "shadow"' not in err


@pytest.mark.e2e
def test_checkpoints_signed_by_another_key_fail_the_calibration(
    shadow_log: tuple[Path, Path, Path],
    tmp_path: Path,
    other: KeyFiles,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--pubkey`` of a key that did not write the log: the checkpoint is signed by another
    key, and calibrate refuses, saying so."""
    log = _copy(shadow_log, tmp_path)
    argv = ("--signing-key", str(shadow_log[1]), "--pubkey", str(other.public))
    assert _calibrate(log, tmp_path / "cal.json", *argv) == 2
    assert "signed by another key" in capsys.readouterr().err


@pytest.mark.e2e
def test_calibrate_warns_when_the_checkpoints_are_by_another_key_than_the_signature(
    shadow_log: tuple[Path, Path, Path],
    tmp_path: Path,
    other: KeyFiles,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--signing-key OTHER --pubkey WRITER``: the file is signed by one key over evidence
    another vouched for; calibrate says so on stderr, naming both (a server must trust both)."""
    log = _copy(shadow_log, tmp_path)
    out = tmp_path / "cal.json"
    argv = ("--signing-key", str(other.private), "--pubkey", str(shadow_log[2]))
    assert _calibrate(log, out, *argv) == 0
    writer = json.loads(out.read_text("utf-8"))["source"]["checkpoints"]["key_id"]
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert other.key_id in warning and writer in warning and "trusted_keys" in warning
    assert _calibrate(log, tmp_path / "same.json", "--signing-key", str(shadow_log[1])) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.e2e
def test_calibrate_with_a_signing_key_prints_a_block_that_trusts_it(
    shadow_log: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed ``[escalation.elastic]`` block lists the signing key's ``.pub`` in
    ``trusted_keys`` (pasted as is, enforce checks the signature); unsigned, it has none."""
    log = _copy(shadow_log, tmp_path)
    assert _calibrate(log, tmp_path / "cal.json", "--signing-key", str(shadow_log[1])) == 0
    block = capsys.readouterr().out.split("[escalation.elastic]")[1]
    public = json.dumps(str(shadow_log[2].absolute()))
    assert f"trusted_keys = [{public}]" in block.splitlines()
    assert _calibrate(log, tmp_path / "plain.json") == 0
    assert "trusted_keys" not in capsys.readouterr().out
