"""Calibration files for tests that need a certificate in force.

The file format is the package's own (``Certificate.to_dict``), so a test certificate is exactly
what ``firstpass calibrate`` writes for the same context; calibration itself is tested on its
own (tests/test_calibration_*.py, tests/test_certificate_e2e.py).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from firstpass.config import Certificate, GateContext, Given, calibration_id, candidate_rule

#: the endpoint a test certificate is made for until ``bind_to_endpoint`` writes the stub
#: upstream's (its port is known only once it runs); ``stack_config`` does that
STUB_ENDPOINT = "stub:endpoint"
#: the gate a test certificate's labels were judged by: no route gate checks, requests both
#: with and without hidden tests
ANY_GATE = GateContext(checks=None, hidden_tests=(False, True))


def certificate(
    *,
    route: str | None = "code",
    routes: Sequence[str | None] | None = None,
    rung: int = 0,
    lam: float = 0.9,
    k: int = 5,
    score: str = "pass_share",
    escalate_at: int = 0,
    method: str = "ltt",
    alpha: float = 0.1,
    delta: float | None = 0.05,
    given: Sequence[Given] = (),
    rule: str | None = None,
    model: str | None = "stub/cheap-model",
    temperature: float | None = 0.7,
    top_p: float | None = None,
    visible_checks: str | None = None,
    endpoint: str | None = STUB_ENDPOINT,
    gate: GateContext | None = ANY_GATE,
) -> Certificate:
    """One certificate entry for (route, rung) in the given context."""
    return Certificate(
        id="",
        path=Path(),
        route=route,
        routes=tuple(routes) if routes is not None else (route,),
        rung=rung,
        lambda_=lam,
        method=method,
        alpha=alpha,
        delta=delta if method == "ltt" else None,
        score=score,
        k=k,
        escalate_at=escalate_at,
        candidate_rule=rule or candidate_rule(score),
        model=model,
        temperature=temperature,
        top_p=top_p,
        given=tuple(given),
        n=500,
        skipped=400,
        failures=3,
        visible_checks=visible_checks,
        endpoint=endpoint,
        gate=gate,
    )


def write_calibration(path: Path, *certs: Certificate, **extra: Any) -> Path:
    """A calibration JSON holding ``certs`` (one default certificate when none are given), with
    the content-derived id ``firstpass calibrate`` gives it (``file_id`` reads it back)."""
    entries = (
        [c.to_dict() for c in certs]
        if certs or "uncertified" in extra
        else [certificate().to_dict()]
    )
    doc: dict[str, Any] = {"certificates": entries, "uncertified": [], **extra}
    doc = {"id": calibration_id(doc), **doc}
    path.write_text(json.dumps(doc), "utf-8")
    return path


def bind_to_endpoint(paths: Sequence[str | Path], endpoint: str) -> None:
    """Write ``endpoint`` into the certificates of these calibration files that were made for
    ``STUB_ENDPOINT``, in order, re-deriving each file's id and the ``given`` entries of later
    files that named an earlier one (as calibrating against that upstream would have)."""
    renamed: dict[str, str] = {}
    for path in map(Path, paths):
        if not path.is_file():
            continue
        doc = json.loads(path.read_text("utf-8"))
        entries = doc.get("certificates") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            continue
        intact = doc.get("id") == calibration_id(doc)  # an edited file stays as edited
        changed = False
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            if entry.get("endpoint") == STUB_ENDPOINT:
                entry["endpoint"], changed = endpoint, True
            for g in entry.get("given") or []:
                if isinstance(g, dict) and g.get("certificate") in renamed:
                    g["certificate"], changed = renamed[g["certificate"]], True
        if changed and intact:
            old = doc["id"]
            doc["id"] = calibration_id(doc)
            renamed[old] = doc["id"]
            path.write_text(json.dumps(doc), "utf-8")


def file_id(path: Path) -> str:
    """The id of a calibration file (what receipts and ``given`` name)."""
    return str(json.loads(path.read_text("utf-8"))["id"])


#: the block's hand-set λ as keyword arguments of ``elastic_block`` (its key is a Python
#: keyword): ``elastic_block(mode, **Lambda({"lambda": 0.5}))``
Lambda = TypedDict("Lambda", {"lambda": float})


def elastic_block(
    mode: str, *, checks: str | None = None, gate_checks: str | None = None, **kw: Any
) -> dict[str, Any]:
    """An ``[escalation.elastic]`` block for the test harness's route "code"; under enforce
    (unless a calibration is cited) λ comes from a certificate for rung 0 computed in this very
    context (score, k, escalate_at, ``checks``: the route's visible checks' digest,
    ``gate_checks``: its gate checks' digest), written to a fresh calibration file."""
    block = {"k": 5, "lambda": 0.9, "escalate_at": 0, "mode": mode, **kw}
    if mode == "enforce" and "calibration" not in block:
        lam = block.pop("lambda")
        path = Path(tempfile.mkdtemp()) / "calibration.json"
        cert = certificate(
            lam=lam, k=block["k"], escalate_at=block["escalate_at"],
            score=block.get("score", "pass_share"), visible_checks=checks,
            gate=GateContext(checks=gate_checks, hidden_tests=ANY_GATE.hidden_tests),
        )  # fmt: skip
        block["calibration"] = str(write_calibration(path, cert))
    return block
