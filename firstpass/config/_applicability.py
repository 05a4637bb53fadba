"""Does the certificate in force at a (route, rung) apply to *this* request?

A certificate bounds the failure rate of samples drawn the way its calibration data was drawn,
checked by the checks it was computed under. A request can change either: its own visible
checks, a ``logit_bias``, another temperature or top_p. Then no certificate covers it, and λ
falls back to what an uncertified rung runs at (enforce: None, so it gates; shadow: the
block's hand-set λ, labelled uncertified). Pure: table-tested in tests/test_applicability.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from firstpass.config._certificate import Certificate, Licence

__all__ = ["Applied", "RequestDraw", "applicable"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestDraw:
    """How a request has its samples drawn and checked, as far as a certificate cares."""

    temperature: float | None
    top_p: float | None
    logit_bias: bool = False
    #: names of the visible checks the request added itself
    request_checks: tuple[str, ...] = ()


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
    problem = licence.problem
    if cert is None:
        return Applied(lam=lam, certificate=None, problem=problem)
    if draw.request_checks:
        # the request's own visible checks change what a passing sample means
        problem = (
            "this request adds visible checks ("
            + ", ".join(draw.request_checks)
            + "), which no certificate is computed under"
        )
    elif draw.logit_bias:
        # a bias can make every draw the same: k agreeing samples would then be one sample
        problem = "this request sets logit_bias, which no certificate is computed under"
    elif not cert.samples_like(draw.temperature, draw.top_p):
        # the request changed how samples are drawn: the certified rate is another draw's
        problem = (
            f"this request samples at {sampling_text(draw.temperature, draw.top_p)}; the "
            f"certificate {cert.id} was computed at "
            f"{sampling_text(cert.temperature, cert.top_p)}"
        )
    else:
        return Applied(lam=lam, certificate=cert, problem=problem)
    return Applied(lam=None if enforce else shadow_lambda, certificate=None, problem=problem)
