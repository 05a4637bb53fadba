"""Presenting a calibration: the calibration JSON, the human report, the TOML block to paste."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from firstpass._json import JSON
from firstpass.calibration._looks import LookRef, SliceKey, delta_at_look
from firstpass.calibration._until import fold, fold_oldest
from firstpass.calibration.data import PASS_SHARE, RouteContext
from firstpass.calibration.fit import Calibration, Fit
from firstpass.calibration.stats import ProportionRow
from firstpass.config import Certificate, GateContext, Given, calibration_id, candidate_rule

__all__ = ["guarantee_text", "text_report", "to_json_dict", "to_json_text", "toml_block"]

_METHOD_NAMES = {"ltt": "Learn then Test", "crc": "conformal risk control"}


def guarantee_text(method: str, alpha: float, delta: float) -> str:
    """The promise λ̂ carries, stated with its assumption."""
    if method == "ltt":
        return (
            f"With probability at least {1 - delta:g} over the calibration data, the share of "
            f"requests skipping the gate whose candidate fails the gate is at most {alpha:g}, "
            "for future requests exchangeable with the calibration requests."
        )
    return (
        f"In expectation over the calibration data and a new request, P(skip the gate and fail "
        f"it) ≤ {alpha:g}: at most a share {alpha:g} of all requests are served without the "
        "gate and fail it. This bounds the joint rate over all requests, not the failure rate "
        "among requests that skip the gate (which can be far higher); no δ applies. For "
        "requests exchangeable with the calibration requests."
    )


def _fit_dict(fit: Fit) -> dict[str, JSON]:
    return {
        "route": fit.route,
        "lambda": fit.lam,
        "lambda_label": fit.lam_label,
        "n": fit.n,
        "k": fit.k,
        "skip_share": fit.skip_share,
        "escalate_share": fit.escalate_share,
        "gate_calls": {
            "uniform": fit.n,
            "saved": fit.gate_calls_saved,
            "saved_share": fit.gate_calls_saved / fit.n,
        },
        "levels": [level.to_dict() for level in fit.levels],
        "regimes": [row.to_dict() for row in fit.regimes],
        "regimes_by_level": [row.to_dict() for row in fit.by_level],
        "auc": {
            "failure_positive": True,
            "one_minus_score": fit.auc_one_minus_score.auc,
            "binary_entropy": fit.auc_entropy.auc,
            "n_failed": fit.auc_entropy.n_positive,
            "n_passed": fit.auc_entropy.n_negative,
            "rows": fit.n_all,
        },
        "explanation": fit.explanation,
        "holdout": None if fit.holdout is None else fit.holdout.to_dict(),
        "delta_tested": fit.delta,
    }


def certificates(cal: Calibration) -> tuple[list[Certificate], list[dict[str, JSON]]]:
    """The certificates this calibration issues, one per (route, rung) it certified a λ for,
    and the slices it examined without certifying (with why), for the calibration JSON.

    With ``--by-route`` each route gets its own; otherwise one for the pooled traffic of the
    routes in the data (its guarantee is over that mix), named after the route when there is
    only one. A slice with mixed k certifies nothing a config could use.
    """
    s = cal.settings
    fits = cal.routes if cal.routes else (cal.overall,)
    names = tuple(n for n in cal.route_names)
    issued: list[Certificate] = []
    refused: list[dict[str, JSON]] = []
    for fit in fits:
        route = fit.route if cal.routes else (names[0] if len(names) == 1 else None)
        routes = (fit.route,) if cal.routes else names
        pooled = [c for c in cal.contexts if c.route in set(routes)]
        drawn = {
            (c.model, c.temperature, c.top_p, c.checks, c.endpoint, c.output_cap, c.gate_checks)
            for c in pooled
        }
        why = None
        if fit.lam is None:
            why = "no λ certified"
        elif fit.k is None:
            why = "the rows mix k values"
        elif len(drawn) > 1:
            why = (
                "its routes ran different models, sampling settings, endpoints, output caps, "
                "visible checks or gate checks: calibrate --by-route"
            )
        if why is not None or fit.lam is None or fit.k is None:
            refused.append({"route": route, "rung": cal.rung, "reason": why})
            continue
        model, temperature, top_p, checks, endpoint, output_cap, gate_checks = (
            drawn.pop() if drawn else (None, None, None, None, None, None, None)
        )
        issued.append(
            Certificate(
                id="",
                path=Path(),
                route=route,
                routes=routes,
                rung=cal.rung,
                lambda_=fit.lam,
                method=s.method,
                alpha=s.alpha,
                delta=s.delta if s.method == "ltt" else None,
                score=cal.score_name,
                k=fit.k,
                escalate_at=s.escalate_at,
                candidate_rule=candidate_rule(cal.score_name),
                model=model,
                temperature=temperature,
                top_p=top_p,
                given=tuple(g for g in map(Given.from_dict, cal.given) if g is not None),
                n=fit.n,
                skipped=fit.skipped,
                failures=_failures_at(fit),
                visible_checks=checks,
                endpoint=endpoint,
                output_cap=output_cap,
                gate=_gate(pooled, gate_checks),
                # the oldest and the newest row any of its routes gave (None: a study, or a row
                # without time)
                data_since=fold_oldest(cal.data_since.get(r) for r in routes),
                data_until=fold(cal.data_until.get(r) for r in routes),
            )
        )
    return issued, refused


def _gate(contexts: Sequence[RouteContext], checks: str | None) -> GateContext | None:
    """What failure meant for the pooled rows: their gate checks and every
    ``gate_hidden_tests`` value they had; None when some receipts predate the record (or the
    rows came from a study, which records no gate)."""
    seen: set[bool] = set()
    for c in contexts:
        if c.gate_hidden is None:
            return None
        seen.update(c.gate_hidden)
    return GateContext(checks=checks, hidden_tests=tuple(sorted(seen))) if contexts else None


def _failures_at(fit: Fit) -> int:
    """Calibration rows that skip the gate at λ̂ and fail it."""
    for level in fit.levels:
        if level.lam == fit.lam:
            return level.failures
    return 0


def to_json_dict(cal: Calibration, *, created_at: datetime | None = None) -> dict[str, JSON]:
    """The calibration JSON. ``id`` is derived from the content (same data and settings, same
    id), so a receipt that names it points at exactly this calibration. Under conformal risk
    control no δ is written: its α bounds P(skip and fail) in expectation, with no δ."""
    s = cal.settings
    issued, refused = certificates(cal)
    body: dict[str, JSON] = {
        "method": s.method,
        "alpha": s.alpha,
        "delta": s.delta if s.method == "ltt" else None,
        "guarantee": guarantee_text(s.method, s.alpha, s.delta),
        "score": cal.score_name,
        "candidate_rule": candidate_rule(cal.score_name),
        "rung": cal.rung,
        "given": list(cal.given),
        "escalate_at": s.escalate_at,
        "holdout_fraction": s.holdout,
        "seed": s.seed,
        **_fit_dict(cal.overall),
        "routes": [_fit_dict(fit) for fit in cal.routes],
        "data_digest": cal.data_digest,
        "source": cal.source.to_dict(),
        "certificates": [_with_look(c.to_dict(), cal.look_for(_slice(c))) for c in issued],
        "uncertified": list(refused),
        "looks": [ref.to_dict() for ref in cal.looks],
        "ledger": cal.ledger.to_dict() if cal.ledger is not None else None,
    }
    body.pop("route")
    when = (created_at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"id": calibration_id(body), "created_at": when, **body}


def _slice(c: Certificate) -> SliceKey:
    return SliceKey(route=c.route, routes=c.routes, rung=c.rung)


def _with_look(cert: dict[str, JSON], ref: LookRef | None) -> dict[str, JSON]:
    """A certificate with the look that issued it: its number, the δ it spent and the ledger
    line, so that a reviewer sees how many looks the guarantee was shared among."""
    if ref is None:
        return cert
    return {**cert, "looks": ref.certificate_dict()}


def to_json_text(obj: Mapping[str, object]) -> str:
    """Pretty JSON for files and ``--json``."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def toml_block(cal: Calibration, *, out_path: str | None) -> str:
    """The one ``[escalation.elastic]`` block that uses this calibration's certificates (each
    (route, rung) takes its own λ from the file), or a comment saying why there is none.

    The block pins the context the certificates were computed for (k, score, escalate_at):
    the config refuses to enforce them under anything else. λ is not repeated here: it lives in
    the file, per (route, rung), and the comments list it.
    """
    s = cal.settings
    issued, refused = certificates(cal)
    lines: list[str] = []
    for c in issued:
        where = "pooled routes " + json.dumps(list(c.routes)) if c.route is None else c.route
        risk = f"α = {c.alpha:g}, " + (
            "no δ (CRC: α bounds P(skip and fail))" if c.delta is None else f"δ = {c.delta:g}"
        )
        lines.append(
            f"# certificate: route {where}, rung {c.rung}: λ = {c.lambda_:g} "
            f"({s.method.upper()}, {risk}, n = {c.n})"
        )
    for r in refused:
        route = "pooled routes" if r["route"] is None else r["route"]
        lines.append(f"# no certificate: route {route}, rung {r['rung']}: {r['reason']}")
    if not issued:
        lines.append(
            "# no [escalation.elastic] block to enforce: nothing is certified by this data "
            '(keep the verified cascade, or keep mode = "shadow" to collect more labels)'
        )
        return "\n".join(lines) + "\n"
    if not cal.source.verified:
        lines.append(
            "# no [escalation.elastic] block to enforce: the receipt logs' hash chain does not "
            "verify (--allow-unverified), so the config will not enforce these certificates"
        )
        return "\n".join(lines) + "\n"
    if any(c.model is None for c in issued):
        lines.append(
            "# no [escalation.elastic] block to enforce: the data names no model (a study: pass "
            "--model PROVIDER/MODEL --temperature T), and a certificate holds for one model"
        )
        return "\n".join(lines) + "\n"
    ks = sorted({c.k for c in issued})
    lines.append("[escalation.elastic]")
    if cal.rung == 0:
        lines.append(f"k = {ks[0]}")
        if len(ks) > 1:
            lines.append(f"# the certificates hold for k = {ks}: one block has one k")
    else:
        lines.append(
            f"# rung {cal.rung} probes with its own k = {ks[0]}: "
            f'ladder = [..., {{rung = "provider/model", k = {ks[0]}}}]'
        )
    lines.append(f"escalate_at = {s.escalate_at}")
    if s.method == "crc":
        lines.append('method = "crc"   # α bounds P(skip and fail), not the rate among skips')
    if cal.score_name != PASS_SHARE:
        lines.append(f'score = "{cal.score_name}"')
    lines.append('mode = "enforce"   # from "shadow", once you accept these certificates')
    if out_path is not None:  # absolute: the config resolves paths against its own directory
        where = str(Path(out_path).expanduser().absolute())
        lines.append(f"calibration = {json.dumps(where, ensure_ascii=False)}")
        if cal.rung:
            lines.append("# (with the lower rungs' calibration files: calibration = [...])")
    else:
        lines.append('# calibration = "..."   (pass --out FILE to write the calibration JSON)')
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:5.1f}%"


def _ci(ci: Sequence[float]) -> str:
    return f"[{100 * ci[0]:5.1f}, {100 * ci[1]:5.1f}]"


def _table(rows: Sequence[ProportionRow], title: str) -> list[str]:
    out = [
        title,
        f"  {'':<8} {'n':>9}  {'share':>6} {'95% CI':<15} {'gate pass':>9} {'95% CI':<15}",
    ]
    for r in rows:
        out.append(
            f"  {r.name:<8} {r.n:>9}  {_pct(r.share)} {_ci(r.share_ci):<15} "
            f"{_pct(r.pass_rate):>9} {_ci(r.pass_rate_ci):<15}"
        )
    return out


def _fit_text(fit: Fit, cal: Calibration, *, title: str | None) -> list[str]:
    s = cal.settings
    out = []
    if title is not None:
        out.append(f"── {title} ──")
    if fit.lam is None:
        out.append("λ̂: none certified")
    else:
        out.append(f"λ̂ = {fit.lam_label} (λ = {fit.lam:g})")
    out.append(
        f"  skip the gate:       {_pct(fit.skip_share)} of {fit.n} requests "
        f"(gate runs saved vs uniform verification: {fit.gate_calls_saved} of {fit.n})"
    )
    if fit.escalate_share is not None and s.escalate_at >= 0:
        out.append(
            f"  escalate at once:    {_pct(fit.escalate_share)} "
            f"(visible pass count ≤ {s.escalate_at})"
        )
    out.append("  " + fit.explanation)
    out.append("")
    bound = "UCB" if s.method == "ltt" else "(m+1)/(N+1)"
    out.append(
        f"  {'level':<8} {'λ':>7} {'n skip':>9} {'failures':>9} {'p-value':>9} "
        f"{bound:>11} {'skip':>6}  certified"
    )
    for lv in fit.levels:
        p = "" if lv.p_value is None else f"{lv.p_value:.3g}"
        out.append(
            f"  {lv.label:<8} {lv.lam:>7.4f} {lv.n:>9} {lv.failures:>9} {p:>9} "
            f"{lv.risk_bound:>11.4f} {_pct(lv.skip_share)}  {'yes' if lv.certified else 'no'}"
        )
    out.append("")
    out += _table(fit.regimes, f"  regimes over {fit.n_all} rows (95% Clopper–Pearson intervals)")
    out += _table(fit.by_level, "  per level")
    a1, ae = fit.auc_one_minus_score, fit.auc_entropy
    if a1.auc is None:
        out.append("  AUC: undefined (every row has the same label)")
    else:
        out.append(
            f"  AUC predicting gate failure ({a1.n_positive} failed, {a1.n_negative} passed): "
            f"1 − score {a1.auc:.3f}; binary entropy of the score {ae.auc:.3f} "
            "(entropy has no direction: 0/k and k/k both score 0)"
        )
    if fit.holdout is not None:
        h = fit.holdout
        out.append(
            f"  holdout ({h.n} rows): skip share {_pct(h.skip_share)} {_ci(h.skip_share_ci)}; "
            f"served failure among skips {_pct(h.served_failure)} "
            f"{_ci(h.served_failure_ci)} ({h.failures} of {h.skipped})"
        )
    out.append("")
    return out


def _looks_text(looks: Sequence[LookRef]) -> list[str]:
    """Which look each slice took, the δ it was tested at, and every warning about it."""
    out: list[str] = []
    if any(ref.new_ledger for ref in looks):
        out.append(
            f"  NEW looks ledger {looks[0].ledger}: this is look 1. If this target was calibrated "
            "before into another file, pass --looks with that file's ledger: looks it does not "
            "count void the 1 − δ"
        )
    for ref in looks:
        if ref.look is None:
            where = "not recorded (no ledger)"
        else:
            where = f"look {ref.look} in {ref.ledger}"
        spent = (
            ""
            if ref.delta_spent is None
            else f"; tested at δ_{ref.look or 1} = {ref.delta_spent:.3g} of δ = {ref.delta:g}"
            + (f" (earlier looks spent {ref.spent_before:.3g})" if ref.spent_before else "")
        )
        if ref.delta is not None and ref.look is not None:
            after = ref.earlier_looks + 2 if ref.repeat_of is None else ref.earlier_looks + 1
            nxt = delta_at_look(ref.delta, after)
            spent += f"; a next look would be tested at δ_{after} = {nxt:.3g}"
        out.append(f"  {ref.slice.label()}: {where}{spent}")
        out += [f"    WARNING: {w}" for w in ref.warnings]
        if ref.note is not None:
            out.append(f"    note: {ref.note}")
    return out


def _score_text(cal: Calibration) -> str:
    """The header's score: ``pass_share (c/k)``, a probe score's name, or, for a study that
    declared its own scores and levels, that (its name is the key ``score``)."""
    if cal.source.kind == "study" and cal.score_name != PASS_SHARE:
        return 'score: the study\'s own ("score" on its "levels")'
    if cal.score_name == PASS_SHARE:
        return f"score = {PASS_SHARE} (c/k)"
    return f"score = {cal.score_name}"


def text_report(cal: Calibration) -> str:
    """The human report printed by the CLI."""
    s, src = cal.settings, cal.source
    out = [
        f"Calibration by {_METHOD_NAMES[s.method]}: "
        + (
            f"α = {s.alpha:g}, δ = {s.delta:g}, "
            if s.method == "ltt"
            else f"α = {s.alpha:g} on P(skip and fail), no δ, "
        )
        + _score_text(cal),
        "  " + guarantee_text(s.method, s.alpha, s.delta),
        f"  data: {src.used} labelled rows from {', '.join(src.paths)} ({src.lines} lines read)",
    ]
    if src.skipped:
        out.append(
            "  skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(src.skipped.items()))
        )
    if src.kind == "receipts":
        if src.verified:
            heads = ", ".join(h or "(empty)" for h in src.chain_heads)
            out.append(f"  hash chain verified; head {heads}")
        else:
            out.append(
                f"  UNVERIFIED: {src.lines} lines read, {src.used} labelled receipts used, from "
                "logs whose hash chain does not verify:"
            )
            out += [f"    {p}" for p in src.chain_problems]
    if src.feedback is not None:
        fb = src.feedback
        out.append(
            f"  feedback: {fb['used']} labels from client feedback ({fb['changed']} differ from "
            f"the gate's), of {fb['lines']} feedback lines; not used: {fb['other_answer']} on "
            f"another answer than the labelled one, {fb['no_row']} on no labelled row"
        )
    if s.holdout is not None:
        out.append(f"  holdout: {s.holdout:g} of the rows held out (seed {s.seed})")
    out += _looks_text(cal.looks)
    out.append("")
    out += _fit_text(cal.overall, cal, title="all routes" if cal.routes else None)
    for fit in cal.routes:
        name = "(no route)" if fit.route is None else repr(fit.route)
        out += _fit_text(fit, cal, title=f"route {name}")
    return "\n".join(out)
