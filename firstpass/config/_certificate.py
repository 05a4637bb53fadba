"""Certificates: what a calibration licenses, for which context, and where it applies.

``firstpass calibrate --out FILE`` writes a calibration JSON whose ``certificates`` list holds one
entry per (route, rung) it certified a λ for. Each entry records everything its guarantee
depends on: the method and its risk levels, the probe score and the rule that picks the sample
the policy serves, k, ``escalate_at``, the route and rung, the rung's model and the endpoint
it was served from, the sampling and the output cap the proxy added to the probes' calls, the
visible checks' digest, what "failure" meant (``gate``: the gate checks' digest and whether the
gate included the requests' hidden tests), the lower rungs' policy while the data was
collected (``given``: who reaches a higher rung depends on it), and the receipts it was
computed from. A certificate licenses a skip only where the
running policy is that context: ``bind`` checks every probed (route, rung) against the
certificates the config cites and says, per rung, either which certificate is in force or why
none is. A rung without one gates.

Pure: reading the files is ``read_certificates``; everything else works on values.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeGuard, overload

from firstpass._json import JSON
from firstpass.config._signature import SIGNATURE_KEY, CalibrationSignature
from firstpass.errors import ConfigError

__all__ = [
    "CANDIDATE_RULES",
    "Certificate",
    "CertificateFile",
    "GateContext",
    "Given",
    "Licence",
    "calibration_id",
    "candidate_rule",
    "read_certificates",
]

#: how the sample elastic serves (or gates, or labels) is chosen, per probe score: with
#: ``pass_share`` samples agree when their extracted code is the same; with a behavioural score,
#: when their outputs on the probe inputs are. Labels taken under one rule say nothing about the
#: candidate of the other, so the rule is part of a certificate's context.
CANDIDATE_RULES: Mapping[str, str] = {
    "pass_share": "most_shared_code",
    "agreement": "largest_behaviour_cluster",
    "unanimous_agreement": "largest_behaviour_cluster",
}


def candidate_rule(score: str) -> str:
    """The candidate rule that goes with a probe score (``CANDIDATE_RULES``)."""
    return CANDIDATE_RULES.get(score, "most_shared_code")


@dataclass(frozen=True, kw_only=True)
class Given:
    """A lower probed rung as it ran while a higher rung's data was collected: which requests
    reach the higher rung depends on it, so its certificate (or its absence) and λ are part of
    the higher rung's context. ``lambda_`` None: that rung never skipped (it gated)."""

    rung: int
    certificate: str | None
    lambda_: float | None
    #: who goes up from that rung also depends on these
    escalate_at: int = 0
    max_gate_candidates: int = 1

    def to_dict(self) -> dict[str, JSON]:
        """As receipts and calibration files spell it."""
        return {
            "rung": self.rung,
            "certificate": self.certificate,
            "lambda": self.lambda_,
            "escalate_at": self.escalate_at,
            "max_gate_candidates": self.max_gate_candidates,
        }

    @classmethod
    def from_dict(cls, g: object) -> Given | None:
        """The entry as receipts and calibration files spell it; None when it is malformed."""
        if not isinstance(g, dict):
            return None
        entry: Mapping[str, object] = g
        rung = entry.get("rung")
        cert, lam = entry.get("certificate"), entry.get("lambda")
        esc, mgc = entry.get("escalate_at", 0), entry.get("max_gate_candidates", 1)
        if not (
            _int(rung, 0)
            and (cert is None or isinstance(cert, str))
            and (lam is None or _number(lam, 0.0, 1.0))
            and _int(esc, 0)
            and _int(mgc, 1)
        ):
            return None
        return cls(
            rung=int(rung),
            certificate=cert,
            lambda_=None if lam is None else float(lam),
            escalate_at=int(esc),
            max_gate_candidates=int(mgc),
        )


@dataclass(frozen=True, kw_only=True)
class GateContext:
    """What "failure" meant for a certificate's labels: the digest of the route's gate checks
    (None: it had none) and which ``gate_hidden_tests`` values its rows had (whether a
    request's gate included its own hidden tests). A request gated otherwise is judged by
    another standard than the certified rate's."""

    checks: str | None
    hidden_tests: tuple[bool, ...]

    def to_dict(self) -> dict[str, JSON]:
        """As calibration files spell it."""
        return {"checks": self.checks, "hidden_tests": list(self.hidden_tests)}


@dataclass(frozen=True, kw_only=True)
class Certificate:
    """One certified λ for one (route, rung), with the context its guarantee was computed for.

    ``route`` None: calibrated on the pooled traffic of ``routes`` (its guarantee is over that
    mix); ``delta`` None: conformal risk control, whose α bounds the joint rate P(skip and fail)
    in expectation rather than the rate among skips with confidence 1 − δ.
    """

    id: str
    path: Path
    route: str | None
    routes: tuple[str | None, ...]
    rung: int
    lambda_: float
    method: str
    alpha: float
    delta: float | None
    score: str
    k: int
    escalate_at: int
    candidate_rule: str
    #: the rung's ``provider/model`` and the sampling the probes were drawn with: the failure
    #: rate certified is that model's at that temperature (None: the data did not say)
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    given: tuple[Given, ...] = ()
    n: int = 0
    skipped: int = 0
    failures: int = 0
    #: the digest of the route's listed visible checks the probes were scored by (None: tests
    #: only); ``RouteConfig.visible_checks_digest``
    visible_checks: str | None = None
    #: the upstream the probes were drawn from (``ProviderConfig.endpoint``) and the gate that
    #: labelled them; None: not recorded (an older firstpass, or receipts from before them)
    endpoint: str | None = None
    gate: GateContext | None = None
    #: the output cap the probes' calls were sent with (``probe.output_cap``: the request's own
    #: max_tokens or max_completion_tokens, else a budget's ``default_max_tokens``): it changes
    #: which answers pass, so only a request drawn under the same cap is covered. None: none
    #: (also a file from before it was recorded)
    output_cap: int | None = None
    #: the ``time`` of the oldest and of the newest receipt row it was computed from (ISO 8601
    #: UTC; None: a study without times, or an older firstpass). A revocation after the oldest
    #: was decided on news some of its data did not hold, so it cannot lift that revocation
    #: (``firstpass.monitor``): rows after it do not outweigh the rows from before it
    data_since: str | None = None
    data_until: str | None = None

    def to_dict(self) -> dict[str, JSON]:
        """The entry of the calibration file's ``certificates`` list (``id`` and ``path`` are
        the file's own)."""
        return {
            "route": self.route,
            "routes": list(self.routes),
            "rung": self.rung,
            "lambda": self.lambda_,
            "method": self.method,
            "alpha": self.alpha,
            "delta": self.delta,
            "score": self.score,
            "candidate_rule": self.candidate_rule,
            "k": self.k,
            "escalate_at": self.escalate_at,
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "given": [g.to_dict() for g in self.given],
            **({"visible_checks": self.visible_checks} if self.visible_checks else {}),
            "endpoint": self.endpoint,
            "output_cap": self.output_cap,
            "gate": None if self.gate is None else self.gate.to_dict(),
            "data_since": self.data_since,
            "data_until": self.data_until,
            "n": self.n,
            "skipped": self.skipped,
            "failures": self.failures,
            # the realized rates on the calibration rows (not the guarantee: that is α)
            "realized": {
                "skip_share": self.skipped / self.n if self.n else None,
                "failure_rate_among_skips": self.failures / self.skipped if self.skipped else None,
            },
        }

    def samples_like(self, temperature: float | None, top_p: float | None) -> bool:
        """A request drawn at these settings is drawn the way the certificate's data was."""
        return self.temperature == temperature and self.top_p == top_p

    def covers(self, route: str) -> bool:
        """Made for this route, or pooled over traffic that included it."""
        return self.route == route if self.route is not None else route in self.routes

    def where(self) -> str:
        """For messages: which file, route and rung."""
        route = "pooled routes" if self.route is None else f"route {self.route!r}"
        return f"{self.path} ({route}, rung {self.rung})"


@dataclass(frozen=True, kw_only=True)
class CertificateFile:
    """A calibration file as the config uses it: its certificates and the (route, rung) slices
    it examined without certifying anything (for messages that say why a rung gates)."""

    path: Path
    id: str
    certificates: tuple[Certificate, ...]
    uncertified: tuple[tuple[str | None, int], ...] = ()
    #: why the file licenses nothing although it lists certificates (None: it may)
    void: str | None = None
    #: its ``signature`` member as read (None: unsigned); ``_signature.signature_problem``
    #: checks it against the trusted keys at start
    signature: CalibrationSignature | None = None
    #: the key id whose signature verified (set at start, when trusted keys are configured)
    signed_by: str | None = None
    #: why no trusted key vouches for it (set at start: unsigned, untrusted key, bad signature,
    #: evidence vouched for by an untrusted key)
    unsigned: str | None = None
    #: the key whose signed checkpoints vouched for the receipts it was calibrated on
    #: (``source.checkpoints.key_id``; None: not recorded, calibrated without a key)
    evidence_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class Licence:
    """What one (route, rung) runs under: a certificate, or the reason it has none (it gates)."""

    certificate: Certificate | None
    problem: str | None = None
    #: the config key a mismatch is about (``escalation.elastic.k``), for the start-up error
    key: str | None = None
    #: what to do about the mismatch
    advice: str | None = None


def _bad(where: str, path: Path, message: str) -> ConfigError:
    return ConfigError(where, f"{path}: {message}")


def _number(value: object, lo: float, hi: float) -> TypeGuard[int | float]:
    """A JSON number in [lo, hi] (compared exactly: a huge integer is simply out of range)."""
    if type(value) is float:
        return math.isfinite(value) and lo <= value <= hi
    return type(value) is int and lo <= value <= hi


def _int(value: object, lo: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


@overload
def _optional(
    c: Mapping[str, object], key: str, where: str, path: Path, at: str, kind: type[str]
) -> str | None: ...
@overload
def _optional(
    c: Mapping[str, object],
    key: str,
    where: str,
    path: Path,
    at: str,
    kind: type[float],
    hi: float = 2.0,
) -> float | None: ...
def _optional(
    c: Mapping[str, object],
    key: str,
    where: str,
    path: Path,
    at: str,
    kind: type[str] | type[float],
    hi: float = 2.0,
) -> str | float | None:
    value = c.get(key)
    if value is None:
        return None
    if kind is str and isinstance(value, str):
        return value
    if kind is float and _number(value, 0.0, hi):
        return float(value)
    what = "a string" if kind is str else f"a number in [0, {hi:g}]"
    raise _bad(where, path, f"{at}.{key} must be {what} or null, got {value!r}")


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


#: the calibration file's own keys that its id does not cover (the id itself, when, and the
#: signature: a signed and an unsigned file of the same content share their id)
_UNHASHED = ("id", "created_at", SIGNATURE_KEY)


def calibration_id(doc: Mapping[str, object]) -> str:
    """``cal_`` + 16 hex of SHA-256 over the canonical JSON of the file's content (all but
    ``id`` and ``created_at``): same data and settings, same id, and an edited file no longer
    matches its own id."""
    body = {k: v for k, v in doc.items() if k not in _UNHASHED}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "cal_" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def read_certificates(path: Path, where: str) -> CertificateFile | None:
    """The certificates in a calibration JSON; None when the file does not exist (yet: shadow
    mode may cite the file it will be calibrated into). Malformed files are ConfigErrors naming
    ``where`` (the config key) and the file."""
    if not path.exists():
        return None
    try:
        data: JSON = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(where, f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _bad(where, path, "expected a JSON object (a calibration file)")
    file_id = data.get("id")
    if not isinstance(file_id, str) or not file_id:
        raise _bad(where, path, '"id" must be a non-empty string')
    raw = data.get("certificates")
    if raw is None:
        raise _bad(
            where,
            path,
            'no "certificates" list: it was written by an older firstpass and does not record '
            "the route, rung and context its λ holds for. Run `firstpass calibrate` again on "
            "the shadow receipts",
        )
    if not isinstance(raw, list):
        raise _bad(where, path, '"certificates" must be a list')
    certs = tuple(_certificate(where, path, file_id, i, c) for i, c in enumerate(raw))
    if file_id != calibration_id(data):
        raise _bad(
            where,
            path,
            f"its id {file_id} does not match its content ({calibration_id(data)}): the file was "
            "edited after `firstpass calibrate` wrote it, so it certifies nothing. Calibrate "
            "again rather than editing a certificate",
        )
    signature = CalibrationSignature.read(data)
    uncertified: list[tuple[str | None, int]] = []
    listed = data.get("uncertified") or []
    for entry in listed if isinstance(listed, list) else ():
        if isinstance(entry, dict) and _int(rung := entry.get("rung"), 0):
            route = entry.get("route")
            uncertified.append((route if isinstance(route, str) else None, rung))
    source = data.get("source")
    checkpoints = source.get("checkpoints") if isinstance(source, dict) else None
    found = checkpoints.get("key_id") if isinstance(checkpoints, dict) else None
    evidence_key = found if isinstance(found, str) else None
    if isinstance(source, dict) and source.get("verified") is False:
        # --allow-unverified: the receipts may have been altered, so nothing here is evidence
        return CertificateFile(
            path=path,
            id=file_id,
            certificates=(),
            uncertified=tuple((c.route, c.rung) for c in certs) + tuple(uncertified),
            void="it was computed from receipt logs whose hash chain does not verify "
            "(--allow-unverified)",
            signature=signature,
            evidence_key=evidence_key,
        )
    return CertificateFile(
        path=path,
        id=file_id,
        certificates=certs,
        uncertified=tuple(uncertified),
        signature=signature,
        evidence_key=evidence_key,
    )


def _route_names(value: object) -> TypeGuard[list[str | None]]:
    return isinstance(value, list) and all(r is None or isinstance(r, str) for r in value)


def _certificate(where: str, path: Path, file_id: str, i: int, c: JSON) -> Certificate:
    at = f"certificates[{i}]"
    if not isinstance(c, dict):
        raise _bad(where, path, f"{at} must be an object")

    def wrong(key: str, what: str) -> ConfigError:
        return _bad(where, path, f"{at}.{key} must be {what}, got {c.get(key)!r}")

    def need_int(key: str, lo: int, what: str) -> int:
        value = c.get(key)
        if not _int(value, lo):
            raise wrong(key, what)
        return value

    def need_share(key: str) -> float:
        value = c.get(key)
        if not _number(value, 0.0, 1.0):
            raise wrong(key, "a number in [0, 1]")
        return float(value)

    def need_str(key: str, what: str) -> str:
        value = c.get(key)
        if not isinstance(value, str):
            raise wrong(key, what)
        return value

    method = c.get("method")
    if not (isinstance(method, str) and method in ("ltt", "crc")):
        raise wrong("method", '"ltt" or "crc"')
    delta = c.get("delta")
    if method == "ltt":
        if not (_number(delta, 0.0, 1.0) and delta not in (0, 1)):
            raise wrong("delta", "a number in (0, 1)")
    elif delta is not None:
        raise _bad(where, path, f"{at}.delta must be null under conformal risk control")
    route = c.get("route")
    if route is not None and not isinstance(route, str):
        raise _bad(where, path, f"{at}.route must be a string or null, got {route!r}")
    routes = c.get("routes", [])
    if not _route_names(routes):
        raise _bad(where, path, f"{at}.routes must be a list of route names")
    raw_given = c.get("given") or []
    if not isinstance(raw_given, list):
        raise _bad(where, path, f"{at}.given must be a list")
    given = []
    for j, g in enumerate(raw_given):
        entry = Given.from_dict(g)
        if entry is None:
            raise _bad(
                where,
                path,
                f"{at}.given[{j}] must be {{rung, certificate, lambda, escalate_at, "
                "max_gate_candidates}",
            )
        given.append(entry)
    return Certificate(
        id=file_id,
        path=path,
        route=route,
        routes=tuple(routes),
        rung=need_int("rung", 0, "an integer ≥ 0"),
        lambda_=need_share("lambda"),
        method=method,
        alpha=need_share("alpha"),
        delta=None if delta is None else float(delta),
        score=need_str("score", "a score name"),
        k=need_int("k", 1, "an integer ≥ 1"),
        escalate_at=need_int("escalate_at", -1, "an integer ≥ -1"),
        candidate_rule=need_str("candidate_rule", "a rule name"),
        model=_optional(c, "model", where, path, at, str),
        temperature=_optional(c, "temperature", where, path, at, float),
        top_p=_optional(c, "top_p", where, path, at, float, hi=1.0),
        given=tuple(given),
        n=_count(c.get("n")),
        skipped=_count(c.get("skipped")),
        failures=_count(c.get("failures")),
        visible_checks=_optional(c, "visible_checks", where, path, at, str),
        endpoint=_optional(c, "endpoint", where, path, at, str),
        output_cap=_output_cap(c.get("output_cap"), where, path, at),
        gate=_gate(c.get("gate"), where, path, at),
        data_since=_time(c.get("data_since"), where, path, f"{at}.data_since"),
        data_until=_time(c.get("data_until"), where, path, f"{at}.data_until"),
    )


def _output_cap(raw: object, where: str, path: Path, at: str) -> int | None:
    """``output_cap``: a positive integer, or absent/null (no cap)."""
    if raw is None:
        return None
    if not _int(raw, 1):
        raise _bad(where, path, f"{at}.output_cap must be an integer ≥ 1 or null, got {raw!r}")
    return raw


def _time(raw: JSON | None, where: str, path: Path, at: str) -> str | None:
    """An ISO 8601 time as ``2026-01-31T12:00:00.123Z`` (UTC; a time without a zone is UTC),
    or None."""
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00")) if isinstance(raw, str) else None
    except ValueError:
        when = None
    if when is None:
        raise _bad(where, path, f"{at} must be an ISO 8601 time or null, got {raw!r}")
    return _utc_text(when)


def _utc_text(when: datetime) -> str:
    """``when`` in the format of a receipt's ``time`` (a naive time is taken as UTC)."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _gate(raw: JSON | None, where: str, path: Path, at: str) -> GateContext | None:
    """``gate``: ``{"checks": digest | null, "hidden_tests": [bool, ...]}``, or absent/null."""
    if raw is None:
        return None
    checks = raw.get("checks") if isinstance(raw, dict) else None
    hidden = raw.get("hidden_tests") if isinstance(raw, dict) else None
    if (
        not isinstance(raw, dict)
        or not (checks is None or isinstance(checks, str))
        or not isinstance(hidden, list)
        or not all(type(v) is bool for v in hidden)
    ):
        raise _bad(
            where,
            path,
            f'{at}.gate must be {{"checks": digest or null, "hidden_tests": [true/false...]}}, '
            f"got {raw!r}",
        )
    return GateContext(checks=checks, hidden_tests=tuple(sorted({bool(v) for v in hidden})))


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The running elastic policy at one (route, rung), as a certificate must match it."""

    route: str
    rung: int
    model: str
    method: str
    k: int
    score: str
    escalate_at: int
    alpha: float | None  # the operator's required α (None: whatever the certificate says)
    delta: float | None
    temperature: float | None  # the route's: what its probes are drawn at
    given: tuple[Given, ...]
    visible_checks: str | None = None  # the route's listed visible checks' digest
    #: the rung's provider endpoint (``ProviderConfig.endpoint``) and the route's gate checks'
    #: digest (``RouteConfig.gate_checks_digest``)
    endpoint: str | None = None
    gate_checks: str | None = None
    #: the ``max_tokens`` the proxy adds to a probe's call that sets none: ``[budgets]
    #: default_max_tokens`` when any budget is configured (None: none). Only a certificate
    #: computed uncapped is refused against it (no request here is drawn uncapped); one
    #: computed with a cap covers the requests drawn with that cap (``applicable``)
    output_cap: int | None = None


def licence_for(policy: Policy, files: Sequence[CertificateFile]) -> Licence:
    """The certificate in force at ``policy``'s (route, rung), or why there is none.

    A certificate made for this very route wins over one pooled over several routes; among
    equals, the first file cited wins. Every context key is compared; the first that differs is
    the problem, naming the key and both values.
    """
    found = [
        c for f in files for c in f.certificates if c.rung == policy.rung and c.covers(policy.route)
    ]
    found.sort(key=lambda c: c.route is None)  # stable: exact route first, file order kept
    if not found:
        examined = any(
            (r == policy.route or r is None) and rung == policy.rung
            for f in files
            for r, rung in f.uncertified
        )
        cited = ", ".join(str(f.path) for f in files) or "no calibration file"
        void = [f"{f.path}: {f.void}" for f in files if f.void]
        if void:
            why = "nothing cited licenses it; " + "; ".join(void)
        elif examined:
            why = f"the calibration ({cited}) certified no λ for it"
        else:
            why = f"no certificate for it in {cited}"
        where = f"route {policy.route!r} rung {policy.rung}"
        return Licence(certificate=None, problem=f"{where}: {why}")
    cert = found[0]
    mismatch = _mismatch(cert, policy)
    if mismatch is None:
        return Licence(certificate=cert)
    key, what, advice = mismatch
    return Licence(
        certificate=None,
        key=key,
        problem=(
            f"route {policy.route!r} rung {policy.rung}: {what} (certificate {cert.id}, "
            f"{cert.path})"
        ),
        advice=advice,
    )


_RECALIBRATE = (
    "Its guarantee holds for that setup only: set it back, or collect shadow receipts under "
    'this block (mode = "shadow") and calibrate again'
)


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]" if value else "[] (no lower rung)"
    if isinstance(value, Given):
        cert = value.certificate or "no certificate"
        lam = "gates" if value.lambda_ is None else f"λ = {value.lambda_:g}"
        return (
            f"rung {value.rung}: {cert}, {lam}, escalate_at {value.escalate_at}, "
            f"max_gate_candidates {value.max_gate_candidates}"
        )
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _uncapped(added: object) -> str:
    """Why a certificate computed uncapped covers nothing where the budgets add ``added``."""
    return (
        f"the probes are sent with max_tokens = {_show(added)} here (the budgets' "
        "default_max_tokens, added when a request sets none; else the request's own cap), but "
        "the certificate was computed on samples sent with none: no request here is drawn as "
        "its rows were (a cap changes which answers pass)"
    )


def _mismatch(cert: Certificate, p: Policy) -> tuple[str, str, str] | None:
    """The first way the running policy differs from the certificate's context: the key, what
    differs (both values), and what to do."""
    for key, recorded in (("endpoint", cert.endpoint), ("gate", cert.gate)):
        if recorded is None:
            what = (
                f"the certificate does not record its {key} (written by an older firstpass, "
                "or from receipts that predate it), so it cannot be bound to this setup"
            )
            advice = (
                "Calibrate again with this version: collect shadow receipts under it "
                '(mode = "shadow") and run `firstpass calibrate` on them'
            )
            return "calibration", what, advice
    rule = candidate_rule(p.score)
    pairs: list[tuple[str, object, object]] = [
        ("model", p.model, cert.model),
        ("endpoint", p.endpoint, cert.endpoint),
        ("output_cap", p.output_cap, cert.output_cap),
        ("temperature", p.temperature, cert.temperature),
        ("method", p.method, cert.method),
        ("score", p.score, cert.score),
        ("candidate_rule", rule, cert.candidate_rule),
        ("k", p.k, cert.k),
        ("escalate_at", p.escalate_at, cert.escalate_at),
        ("visible_checks", p.visible_checks, cert.visible_checks),
        ("gate_checks", p.gate_checks, None if cert.gate is None else cert.gate.checks),
    ]
    for key, mine, theirs in pairs:
        if key == "output_cap":
            if theirs is None and mine is not None:
                return key, _uncapped(mine), _RECALIBRATE
            # computed with a cap C, it stays in force whatever the budgets add: a request
            # that sends C itself is drawn as its rows were, the rest gate (``applicable``)
            continue
        if mine != theirs:
            what = f"{key} = {_show(mine)} here, but it was computed for {key} = {_show(theirs)}"
            advice = _RECALIBRATE
            if key == "visible_checks":
                what = (
                    "the route's visible checks (its [[route.visible_checks]] and the visible "
                    "tests [route.checks] lends) are not the ones its probes were scored by "
                    f"(digest {_show(mine)} here, {_show(theirs)} in the certificate)"
                )
            if key == "gate_checks":
                what = (
                    "the route's gate checks (its [[route.gate_checks]] and the hidden tests "
                    "[route.checks] lends) are not the ones its calibration labels were "
                    f"judged by (digest {_show(mine)} here, {_show(theirs)} in the certificate)"
                )
            if key == "endpoint":
                what = (
                    f"the rung's provider serves from {_show(mine)} here, but the certificate "
                    f"was computed on samples from {_show(theirs)}"
                )
            if key == "model" and theirs is None:
                advice = (
                    "The calibration names no model (a study without --model): calibrate it "
                    "again with --model PROVIDER/MODEL --temperature T"
                )
            return key, what, advice
    if p.given != cert.given:
        what = (
            f"the lower rungs run as {_show(p.given)} here, but it was computed while they ran "
            f"as {_show(cert.given)}: other requests reach this rung now"
        )
        running = {g.certificate for g in p.given}
        named = {g.certificate for g in cert.given if g.certificate} - {None, *running}
        advice = (
            f"Cite the lower rungs' calibration files too ({', '.join(sorted(named))}), e.g. "
            'calibration = ["rung0.json", "rung1.json"]'
            if named
            else _RECALIBRATE
        )
        return "given", what, advice
    if p.alpha is not None and cert.alpha > p.alpha:
        what = f"the block requires alpha ≤ {p.alpha:g}, the certificate promises {cert.alpha:g}"
        return "alpha", what, f"Calibrate again with --alpha {p.alpha:g}, or relax alpha"
    if p.delta is not None and (cert.delta is None or cert.delta > p.delta):
        theirs = "no δ (conformal risk control)" if cert.delta is None else f"{cert.delta:g}"
        what = f"the block requires delta ≤ {p.delta:g}, the certificate promises {theirs}"
        return "delta", what, f"Calibrate again with --delta {p.delta:g}, or relax delta"
    return None
