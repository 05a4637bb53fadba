"""``[escalation.elastic]``, the calibration files it cites, and which certificate each probed
(route, rung) runs under.

Two steps, because the environment may switch the mode after the file is read:
``build_elastic`` reads the block and the certificates of every cited file;
``bind_licences`` (once the routes are built and the environment applied) decides, per probed
(route, rung), which certificate is in force or why none is. Under enforce a certificate whose
context differs from the block is an error naming the key and both values; a rung with no
certificate at all gates (it never skips). Enforce with a hand-set λ and no certificate is
refused, and so is enforce citing calibrations that certify nothing for any probed rung (a
calibration that failed should not look like one in force); enforce citing nothing runs
without skips: 0/k escalates at once, the rest is gated.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from firstpass.config import _fields as f
from firstpass.config._certificate import (
    Given,
    Licence,
    Policy,
    licence_for,
    read_certificates,
)
from firstpass.config._model import (
    MAX_K,
    BudgetsConfig,
    ClientKey,
    ElasticConfig,
    ProbeScore,
    ProviderConfig,
    RouteConfig,
)
from firstpass.config._signature import HOW_TO_SIGN, signature_problem
from firstpass.errors import ConfigError, ReceiptError
from firstpass.receipts import key_id, load_public_key, load_signing_key

#: where the block lives, for key paths (the TOML key "lambda" is ``ElasticConfig.lambda_``)
ELASTIC_PATH = "escalation.elastic"
_ELASTIC_KEYS = (
    "k", "lambda", "escalate_at", "mode", "calibration", "alpha", "delta", "max_gate_candidates",
    "score", "method", "trusted_keys", "audit_rate", "monitor_level", "monitor_stale_s",
)  # fmt: skip
#: the probe scores: the config model's ``ProbeScore`` (``firstpass.policy.SCORES`` must equal it)
SCORES: tuple[ProbeScore, ...] = typing.get_args(ProbeScore)


def build_elastic(escalation: Mapping[str, object], base_dir: Path) -> ElasticConfig | None:
    """The elastic policy from ``[escalation]``; None (plain cascade) when the block is absent."""
    f.check_keys(escalation, "escalation", ("elastic",))
    table = f.get_table(escalation, "elastic", "escalation", None)
    if table is None:
        return None
    p = ELASTIC_PATH
    f.check_keys(table, p, _ELASTIC_KEYS)
    k = f.get_int(table, "k", p, ElasticConfig.k, lo=1, hi=MAX_K)
    paths = _calibration_paths(table, base_dir)
    files = tuple(
        cf for path in paths if (cf := read_certificates(path, f"{p}.calibration")) is not None
    )
    lam = f.get_float(table, "lambda", p, None, lo=0.0, hi=1.0)
    return ElasticConfig(
        k=k,
        lambda_=ElasticConfig.lambda_ if lam is None else lam,
        lambda_set=lam is not None,
        escalate_at=f.get_int(table, "escalate_at", p, ElasticConfig.escalate_at, lo=0, hi=k - 1),
        mode=f.get_choice(table, "mode", p, ("shadow", "enforce"), ElasticConfig.mode),
        calibration=paths,
        alpha=f.get_float(table, "alpha", p, None, lo=0.0, hi=1.0),
        delta=f.get_float(table, "delta", p, None, lo=0.0, hi=1.0),
        max_gate_candidates=f.get_int(
            table, "max_gate_candidates", p, ElasticConfig.max_gate_candidates, lo=1, hi=k
        ),
        score=f.get_choice(table, "score", p, SCORES, ElasticConfig.score),
        method=f.get_choice(table, "method", p, ("ltt", "crc"), ElasticConfig.method),
        trusted_keys=_trusted_key_paths(table, base_dir),
        audit_rate=f.get_float(table, "audit_rate", p, ElasticConfig.audit_rate, lo=0.0, hi=1.0),
        monitor_level=f.get_float(table, "monitor_level", p, None, lo=0.0, hi=0.5, lo_open=True),
        monitor_stale_s=f.get_float(
            table, "monitor_stale_s", p, ElasticConfig.monitor_stale_s, lo=0.0, lo_open=True
        ),
        files=files,
    )


def _calibration_paths(table: Mapping[str, object], base_dir: Path) -> tuple[Path, ...]:
    """``calibration``: one path or a list (one file per rung calibrated, say)."""
    raw = table.get("calibration")
    if raw is None:
        return ()
    key = f"{ELASTIC_PATH}.calibration"
    items = f.get_str_list(table, "calibration", ELASTIC_PATH) if isinstance(raw, list) else None
    if items is None:
        items = (f.get_str(table, "calibration", ELASTIC_PATH),)
    if not items:
        raise ConfigError(key, "the list is empty: cite at least one calibration file, or drop it")
    return tuple(base_dir / Path(item).expanduser() for item in items)


def _trusted_key_paths(table: Mapping[str, object], base_dir: Path) -> tuple[Path, ...]:
    """``trusted_keys``: public key files whose signature on a calibration file enforce takes;
    each is read now, so a missing or wrong one fails the start naming its index."""
    items = f.get_str_list(table, "trusted_keys", ELASTIC_PATH, ())
    paths = tuple(base_dir / Path(item).expanduser() for item in items)
    for i, path in enumerate(paths):
        try:
            load_public_key(path)
        except ReceiptError as exc:
            raise ConfigError(
                f"{ELASTIC_PATH}.trusted_keys[{i}]",
                f"{exc}; list the `.pub` files `firstpass keygen` writes",
            ) from None
    return paths


def check_signatures(
    elastic: ElasticConfig, receipts_key: Path | None, key_path: str
) -> ElasticConfig:
    """Which trusted key vouches for each cited calibration file: it signed the file and, when
    the file records the key whose checkpoints vouched for its receipts, that key is trusted
    too (a trusted signature over evidence only an untrusted key vouched for vouches for
    nothing). Trusted: ``trusted_keys`` and ``[receipts] signing_key``'s public half.

    With any trusted key, a file they do not vouch for licenses nothing, whatever the mode: a
    request may ask for enforce under a shadow block (``client_modes``), and enforce takes only
    what a trusted key vouches for. Under the block's enforce such a file fails the start,
    naming it; shadow keeps it cited (its counterfactual runs at the block's λ) and the ready
    line says why. Without any trusted key every file is recorded as unchecked.
    """
    trusted = {key_id(k): k for k in map(load_public_key, elastic.trusted_keys)}
    if receipts_key is not None:
        own = load_signing_key(receipts_key).public_key()
        trusted[key_id(own)] = own
    files = []
    for cf in elastic.files:
        if not trusted:
            why = "it is not signed" if cf.signature is None else "no trusted key to check it"
            files.append(dataclasses.replace(cf, unsigned=why))
            continue
        problem, advice = signature_problem(cf.signature, trusted), HOW_TO_SIGN
        if problem is None and cf.evidence_key is not None and cf.evidence_key not in trusted:
            problem = (
                f"it was calibrated on receipts vouched for by checkpoints signed by "
                f"{cf.evidence_key}, which is not a trusted key (trusted: "
                f"{', '.join(sorted(trusted))})"
            )
            advice = (
                "calibrate on receipts written under a trusted [receipts] signing_key (`firstpass "
                "calibrate --signing-key KEY` checks their checkpoints against KEY), or list "
                f"that key's `.pub` in {ELASTIC_PATH}.trusted_keys if you trust who holds it"
            )
        if problem is None:
            signer = cf.signature.key_id if cf.signature is not None else None
            files.append(dataclasses.replace(cf, signed_by=signer))
            continue
        if elastic.mode == "enforce":
            raise ConfigError(
                f"{ELASTIC_PATH}.calibration",
                f"{cf.path}: {problem}, and enforce ({key_path}) takes only calibration files "
                f"a trusted key vouches for ([receipts] signing_key, {ELASTIC_PATH}.trusted_keys):"
                f" {advice}",
            )
        files.append(
            dataclasses.replace(
                cf,
                certificates=(),
                uncertified=tuple((c.route, c.rung) for c in cf.certificates) + cf.uncertified,
                void=cf.void or f"no trusted key vouches for it: {problem}",
                unsigned=problem,
            )
        )
    return dataclasses.replace(elastic, files=tuple(files))


def probed_rungs(route: RouteConfig) -> tuple[int, ...]:
    """The rungs elastic probes on a route: the cheapest, and every rung with its own ``k``."""
    return tuple(i for i, rung in enumerate(route.ladder) if i == 0 or rung.k)


def bind_licences(
    elastic: ElasticConfig | None,
    routes: Sequence[RouteConfig],
    key_path: str,
    *,
    receipts_key: Path | None = None,
    providers: Sequence[ProviderConfig] = (),
    output_cap: int | None = None,
) -> ElasticConfig | None:
    """Decide, per probed (route, rung), which certificate is in force; under enforce refuse a
    certificate made for another context, and a block that would certify nothing at all.

    ``key_path`` names where the mode came from (the block's ``mode``, or the environment
    variable that overrode it), for the error when nothing is certified. ``receipts_key``:
    ``[receipts] signing_key``, whose public half is a trusted signer of calibration files.
    ``providers``: the configured upstreams, whose endpoints the certificates are bound to.
    ``output_cap``: the ``max_tokens`` a probe's call that sets none gets from the budgets
    (``probe_output_cap``): a certificate computed uncapped is refused under it (no request
    would be drawn uncapped); one computed with a cap is bound per request (``applicable``).
    """
    if elastic is None:
        return None
    elastic = check_signatures(elastic, receipts_key, key_path)
    licences: dict[tuple[str, int], Licence] = {}
    for route_index, route in enumerate(routes):
        given: list[Given] = []
        for index in probed_rungs(route):
            rung = route.ladder[index]
            policy = Policy(
                route=route.name,
                rung=index,
                model=rung.name,
                method=elastic.method,
                k=rung.k or elastic.k,
                score=elastic.score,
                escalate_at=elastic.escalate_at,
                alpha=elastic.alpha,
                delta=elastic.delta,
                temperature=route.temperature,
                given=tuple(given),
                visible_checks=route.visible_checks_digest,
                endpoint=_endpoint(providers, rung.provider),
                gate_checks=route.gate_checks_digest,
                output_cap=output_cap,
            )
            licence = licence_for(policy, elastic.files)
            if elastic.mode == "enforce" and licence.key is not None:
                key = f"{ELASTIC_PATH}.{licence.key}"
                if licence.key == "model":  # the rung's model changed since it was calibrated
                    key = f"route[{route_index}].ladder[{index}]"
                elif licence.key == "temperature":
                    key = f"route[{route_index}].temperature"
                elif licence.key in ("visible_checks", "gate_checks"):
                    key = f"route[{route_index}].{licence.key}"
                elif licence.key == "endpoint":
                    key = _endpoint_key(providers, rung.provider)
                elif licence.key == "output_cap":
                    key = "budgets.default_max_tokens"
                raise ConfigError(key, f"{licence.problem}. {licence.advice}")
            licences[(route.name, index)] = licence
            cert = licence.certificate
            if cert is not None:
                lam: float | None = cert.lambda_
            else:  # enforce gates there; shadow records its counterfactual at the block's λ
                lam = None if elastic.mode == "enforce" else elastic.lambda_
            given.append(
                Given(
                    rung=index,
                    certificate=None if cert is None else cert.id,
                    lambda_=lam,
                    escalate_at=elastic.escalate_at,
                    max_gate_candidates=elastic.max_gate_candidates,
                )
            )
    bound = dataclasses.replace(elastic, licences=MappingProxyType(licences))
    if bound.mode == "enforce":
        _check_enforceable(bound, licences, key_path)
    return bound


def counts_spend(budgets: BudgetsConfig | None, keys: Sequence[ClientKey]) -> bool:
    """Whether spend is counted at all: a [budgets] table, or a client key's ``daily_usd``.

    The one rule behind the ledger (``firstpass.budgets.ledger_for``), the output cap a call
    gets (``probe_output_cap``) and the cap its probe records: were they decided apart, a probe
    could be sent under a cap its certificate does not name."""
    return budgets is not None or any(k.daily_usd is not None for k in keys)


def probe_output_cap(budgets: BudgetsConfig | None, keys: Sequence[ClientKey]) -> int | None:
    """The ``max_tokens`` the proxy adds to a call that sets none: ``default_max_tokens``
    whenever spend is counted (``counts_spend``), else none."""
    if not counts_spend(budgets, keys):
        return None
    return (budgets or BudgetsConfig()).default_max_tokens


def _endpoint(providers: Sequence[ProviderConfig], provider_id: str) -> str | None:
    """The endpoint of the provider a rung names (None: not among ``providers``)."""
    return next((p.endpoint for p in providers if p.id == provider_id), None)


def _endpoint_key(providers: Sequence[ProviderConfig], provider_id: str) -> str:
    """The config key that sets a provider's endpoint: its ``base_url`` (replay: ``samples``)."""
    for j, p in enumerate(providers):
        if p.id == provider_id:
            return f"provider[{j}].{'base_url' if p.kind == 'openai' else 'samples'}"
    return "provider"


def _check_enforceable(
    elastic: ElasticConfig, licences: Mapping[tuple[str, int], Licence], key_path: str
) -> None:
    """Enforce must be able to skip somewhere, and only where a certificate says so."""
    certified = [key for key, lic in licences.items() if lic.certificate is not None]
    if certified:
        return
    if elastic.lambda_set:
        raise ConfigError(
            f"{ELASTIC_PATH}.lambda",
            f"{elastic.lambda_:g} is set by hand, and no calibration certifies it: enforce skips "
            'the gate only where a certificate licenses it. Keep mode = "shadow", run '
            "`firstpass calibrate --receipts <log> --out calibration.json` on its receipts and "
            "cite that file with `calibration`",
        )
    if not elastic.calibration:
        return  # no λ, nothing cited: elastic escalates at once on 0/k and gates the rest
    missing = [str(path) for path in elastic.calibration if not path.exists()]
    if missing:
        raise ConfigError(
            f"{ELASTIC_PATH}.calibration",
            f"{', '.join(missing)} does not exist: enforce needs the calibration file written by "
            "`firstpass calibrate --out` (paths are relative to the config file's directory)",
        )
    problems = "; ".join(lic.problem for lic in licences.values() if lic.problem) or (
        "no route is probed"
    )
    raise ConfigError(
        key_path,
        f'"enforce" under a calibration that licenses no skip ({problems}). Keep mode = '
        '"shadow" (the cascade serves, every receipt is labelled) and calibrate again on more '
        "receipts: the calibration report says how many a level needs, or that the observed "
        "failure rate is too high for any. Or drop `calibration` to run enforce without skips "
        "(0/k escalates at once, everything else is gated), or drop [escalation.elastic] for "
        "the plain verified cascade",
    )
