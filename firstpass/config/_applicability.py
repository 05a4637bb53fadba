"""Does the certificate in force at a (route, rung) apply to *this* request?

A certificate bounds the failure rate of samples drawn the way its calibration data was drawn,
checked by the checks it was computed under, and judged by the gate it was labelled with. A
request can change any of them: a body field that changes how the k samples are drawn
(``top_k``, ``seed``, ``response_format``...), another temperature or top_p, its own visible
checks, visible tests a null answer passes, or a gate the calibration never saw (its hidden
tests, or none). Then no certificate covers it, and λ falls back to what an uncertified rung
runs at (enforce: None, so it gates; shadow: the block's hand-set λ, labelled uncertified).
Pure: table-tested in tests/test_applicability.py and tests/test_binding_applicable.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from firstpass.config._certificate import Certificate, Licence

__all__ = [
    "NULL_UNKNOWN",
    "SKIP_SAFE_FIELDS",
    "Applied",
    "RequestDraw",
    "applicable",
    "unbound_fields",
]

#: ``probe.vacuous_visible`` when the sandbox could not tell whether a null stub passes the
#: visible tests (``firstpass.sandbox.NullVerdict``'s "unknown"): not a stub that passed
NULL_UNKNOWN = "unknown"

#: The request body fields that leave the probe's k draws as the certificate's data drew them.
#: A skip is licensed only when every field the request sends upstream is listed here:
#: default-deny, so a field nobody thought of (a vendor's ``top_k``, ``min_p``, a
#: ``response_format``, ``seed``, penalties, ``stop``, ``tools``...) gates instead of being
#: trusted. Why each is safe:
#:
#: - ``messages``, ``model``, ``n``, ``stream``, ``stream_options``, ``firstpass``: Firstpass's
#:   own (the prompt is the traffic the certificate is over; ``model`` and ``n`` are replaced by
#:   the rung's and k; streaming and the extension object never reach the draw);
#: - ``user``, ``metadata``, ``store``, ``service_tier``, ``safety_identifier``,
#:   ``prompt_cache_key``: bookkeeping of the upstream's, not read by the sampler;
#: - ``logprobs``, ``top_logprobs``: report the draw, do not change it;
#: - ``temperature``, ``top_p``: bound by the certificate itself (``Certificate.samples_like``).
#:
#: ``max_tokens`` and ``max_completion_tokens`` are not listed, yet they are bound: a cap cuts
#: long answers, which then fail the visible tests and stop skipping, while short wrong answers
#: still skip, so the failure rate among the skips that remain rises (a cap changes which
#: requests skip, not only how many). A probe records the one cap its call was sent with
#: (``probe.output_cap``: the request's own, else the one the budgets add), a certificate the
#: cap its rows were drawn under, and ``applicable`` lets only a draw under that same cap skip
#: (``RequestDraw.output_cap``), as it does for temperature. So ``unbound_fields`` leaves them
#: out when they set one cap (``RequestDraw.cap_of``); a body whose two fields set different
#: caps (or a value that is not an integer ≥ 1) keeps them unbound: which one an upstream
#: honours is its own choice.
SKIP_SAFE_FIELDS: frozenset[str] = frozenset(
    {
        "messages", "model", "n", "stream", "stream_options", "firstpass",
        "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
        "logprobs", "top_logprobs",
        "temperature", "top_p",
    }
)  # fmt: skip


#: the body fields that cap how many tokens a draw may produce
CAP_FIELDS: tuple[str, ...] = ("max_tokens", "max_completion_tokens")


def _own_cap(body: Mapping[str, object]) -> int | None:
    """The one output cap ``body`` sets itself; None when it sets none, two that differ, or
    one that is not an integer ≥ 1 (``null`` is no cap: the proxy treats it as unset)."""
    caps: set[int] = set()
    for name in CAP_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None
        caps.add(value)
    return caps.pop() if len(caps) == 1 else None


def unbound_fields(sent: Mapping[str, object]) -> tuple[str, ...]:
    """The fields of a body sent upstream that no certificate binds (sorted, for the receipt).

    The cap fields are bound when they set one cap (the probe records it, certificates bind
    it) or none at all (every one absent or null).
    """
    capped = any(sent.get(name) is not None for name in CAP_FIELDS)
    bound = SKIP_SAFE_FIELDS | (
        frozenset(CAP_FIELDS) if not capped or _own_cap(sent) is not None else frozenset()
    )
    return tuple(sorted({name for name in sent if name not in bound}))


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestDraw:
    """How a request has its samples drawn, checked and gated, as far as a certificate cares."""

    temperature: float | None
    top_p: float | None
    #: the output cap the probe's call was sent with (``probe.output_cap``: the request's own,
    #: else the one the budgets add; None: none). Always compared: a cap changes which answers
    #: pass
    output_cap: int | None = None
    #: fields the request sends upstream that are not in ``SKIP_SAFE_FIELDS`` (``unbound_fields``)
    unbound: tuple[str, ...] = ()
    #: names of the visible checks the request added itself
    request_checks: tuple[str, ...] = ()
    #: the route has operator gate checks but lists no visible checks of its own: only the
    #: request's tests would license the skip, and those are the client's to choose
    unlicensed_visible: bool = False
    #: the route's gate is the requests' hidden tests (it has no gate checks) and this request
    #: brings no visible tests: its pass share is the route's listed checks alone, not the
    #: tests-and-checks score calibration requests were probed with (certificates do not yet
    #: record whether their rows had visible tests, so such a request never skips)
    no_visible_tests: bool = False
    #: how the visible tests also passed a null stub of the entry point ("returns_none",
    #: "raises"), or ``NULL_UNKNOWN`` when the sandbox could not tell; None: they did not, or
    #: were not tried
    vacuous_visible: str | None = None
    #: whether this request's gate includes its own hidden tests (None: not known, not compared)
    gate_hidden_tests: bool | None = None

    @staticmethod
    def cap_of(body: Mapping[str, object]) -> int | None:
        """The one output cap ``body`` sets itself (``max_tokens``, ``max_completion_tokens``);
        None when it sets none, or not one value (then ``unbound_fields`` names the fields)."""
        return _own_cap(body)


@dataclass(frozen=True, kw_only=True, slots=True)
class Applied:
    """λ for this request, the certificate it comes from, and why there is none."""

    lam: float | None
    certificate: Certificate | None
    problem: str | None


def sampling_text(temperature: float | None, top_p: float | None) -> str:
    """A draw's settings as the refusal names them."""
    shown = "the provider's default" if temperature is None else f"{temperature:g}"
    return f"temperature {shown}" + ("" if top_p is None else f", top_p {top_p:g}")


def _cap_text(cap: int | None) -> str:
    return "none (no max_tokens)" if cap is None else f"max_tokens {cap}"


def _hidden_text(value: bool) -> str:
    return "with the request's hidden tests" if value else "without hidden tests"


def _void(cert: Certificate, draw: RequestDraw) -> str | None:
    """The first reason the certificate does not cover this draw (None: it does)."""
    if draw.request_checks:
        # the request's own visible checks change what a passing sample means
        return (
            "this request adds visible checks ("
            + ", ".join(draw.request_checks)
            + "), which no certificate is computed under"
        )
    if draw.unbound:
        # such a field can make the k draws one (top_k = 1, seed) or change what is drawn
        return (
            "this request sends " + ", ".join(draw.unbound) + " upstream, which no certificate "
            "binds (only the fields in firstpass.config.SKIP_SAFE_FIELDS may skip the gate)"
        )
    if draw.unlicensed_visible:
        return (
            "the route has gate checks but no visible checks of its own: a skip would rest on "
            "the request's own tests only, which license nothing there"
        )
    if draw.no_visible_tests:
        return (
            "this request brings no visible tests: its pass share is the route's listed checks "
            "alone, which is not what a skip rests on where the requests' hidden tests are the "
            "gate"
        )
    if draw.vacuous_visible == NULL_UNKNOWN:
        # could-not-tell is not a stub that passed, but it must not license a skip either
        return (
            "the sandbox could not tell whether a null stub passes the visible tests (no slot, "
            "or their reference failed): a skip needs tests known to carry signal"
        )
    if draw.vacuous_visible is not None:
        return (
            f"the visible tests also pass a null stub ({draw.vacuous_visible}): they carry no "
            "signal"
        )
    if not cert.samples_like(draw.temperature, draw.top_p):
        # the request changed how samples are drawn: the certified rate is another draw's
        return (
            f"this request samples at {sampling_text(draw.temperature, draw.top_p)}; the "
            f"certificate {cert.id} was computed at "
            f"{sampling_text(cert.temperature, cert.top_p)}"
        )
    if draw.output_cap != cert.output_cap:
        # a cap changes which answers pass: the certified rate is another cap's
        return (
            f"this request's output cap is {_cap_text(draw.output_cap)}; the certificate "
            f"{cert.id} was computed with {_cap_text(cert.output_cap)}"
        )
    gate, hidden = cert.gate, draw.gate_hidden_tests
    if hidden is not None and gate is not None and hidden not in gate.hidden_tests:
        # labels judged with the hidden tests say nothing of a gate without them, and back
        seen = " or ".join(_hidden_text(v) for v in gate.hidden_tests) or "no gate at all"
        return (
            f"this request's gate runs {_hidden_text(hidden)}; the certificate {cert.id} was "
            f"labelled by gates {seen}"
        )
    return None


def applicable(
    *,
    lam: float | None,
    licence: Licence,
    draw: RequestDraw,
    enforce: bool,
    shadow_lambda: float,
) -> Applied:
    """The certificate and λ that hold for one request at one (route, rung).

    ``lam`` is the (route, rung)'s λ in the request's mode (``ElasticConfig.lambda_for``) and
    ``licence`` its certificate; ``shadow_lambda`` is the hand-set λ an uncertified rung is
    labelled with outside enforce. The first reason that voids the certificate is kept.
    """
    cert = licence.certificate if lam is not None else None
    if cert is None:
        return Applied(lam=lam, certificate=None, problem=licence.problem)
    problem = _void(cert, draw)
    if problem is None:
        return Applied(lam=lam, certificate=cert, problem=licence.problem)
    return Applied(lam=None if enforce else shadow_lambda, certificate=None, problem=problem)
