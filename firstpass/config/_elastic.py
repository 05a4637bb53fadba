"""``[escalation.elastic]`` and the calibration JSON that λ may come from.

When the block cites a calibration file that exists, its ``id``, ``alpha`` and ``delta`` are read
so receipts can name where λ came from, and a λ in the file that the calibration did not certify
is refused: a receipt must not claim a guarantee the config does not carry.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from firstpass.config import _fields as f
from firstpass.config._model import MAX_K, ElasticConfig, ProbeScore
from firstpass.errors import ConfigError

#: where the block lives, for key paths (the TOML key "lambda" is ``ElasticConfig.lambda_``)
ELASTIC_PATH = "escalation.elastic"
_ELASTIC_KEYS = (
    "k", "lambda", "escalate_at", "mode", "calibration", "alpha", "delta", "max_gate_candidates",
    "score",
)  # fmt: skip
#: the probe scores: the config model's ``ProbeScore`` (``firstpass.policy.SCORES`` must equal it)
SCORES: tuple[str, ...] = typing.get_args(ProbeScore)


def build_elastic(escalation: Mapping[str, Any], base_dir: Path) -> ElasticConfig | None:
    """The elastic policy from ``[escalation]``; None (plain cascade) when the block is absent."""
    f.check_keys(escalation, "escalation", ("elastic",))
    table = f.get_table(escalation, "elastic", "escalation", None)
    if table is None:
        return None
    p = ELASTIC_PATH
    f.check_keys(table, p, _ELASTIC_KEYS)
    k = f.get_int(table, "k", p, 5, lo=1, hi=MAX_K)
    calibration = f.get_path(table, "calibration", p, base_dir, None)
    cal = read_calibration(calibration) if calibration is not None else {}
    lam = f.get_float(table, "lambda", p, None, lo=0.0, hi=1.0)
    uncertified = lam is None and "lambda" in cal and cal["lambda"] is None
    if lam is None:
        lam = cal.get("lambda") if cal.get("lambda") is not None else 1.0
    elif "lambda" in cal and cal["lambda"] != lam:
        certified = "no λ" if cal["lambda"] is None else f"λ = {cal['lambda']:g}"
        raise ConfigError(
            f"{p}.lambda",
            f"{lam:g} differs from the calibration file, which certified {certified}"
            f" ({calibration}); paste the block it printed, or drop `calibration`",
        )
    values: dict[str, Any] = {}
    for key in ("alpha", "delta"):
        mine = f.get_float(table, key, p, None, lo=0.0, hi=1.0)
        if mine is not None and cal.get(key) is not None and cal[key] != mine:
            raise ConfigError(
                f"{p}.{key}", f"{mine:g} differs from the calibration file's {cal[key]:g}"
            )
        values[key] = mine if mine is not None else cal.get(key)
    escalate_at = f.get_int(table, "escalate_at", p, 0, lo=0, hi=k - 1)
    score = f.get_choice(table, "score", p, SCORES, "pass_share")
    mismatch = _context_mismatch(cal, k=k, escalate_at=escalate_at, score=score)
    mode = f.get_choice(table, "mode", p, ("shadow", "enforce"), "shadow")
    if mismatch is not None and mode == "enforce":
        key, mine, theirs = mismatch
        raise ConfigError(
            f"{p}.{key}",
            f"{mine!r} differs from the certificate's {theirs!r} ({calibration}): its guarantee "
            f"was computed for {key} = {theirs!r}, not for this policy. Calibrate again under "
            "this block (shadow mode), or set it back",
        )
    elastic = ElasticConfig(
        k=k,
        lambda_=lam,
        escalate_at=escalate_at,
        mode=mode,
        calibration=calibration,
        calibration_id=cal.get("id"),
        alpha=values["alpha"],
        delta=values["delta"],
        max_gate_candidates=f.get_int(table, "max_gate_candidates", p, 1, lo=1, hi=k),
        score=score,
        uncertified=uncertified,
        lambda_certified=cal.get("lambda") is not None and cal["lambda"] == lam,
        certificate_mismatch=(
            None
            if mismatch is None
            else f"{mismatch[0]} = {mismatch[1]!r}, the certificate's is {mismatch[2]!r}"
        ),
    )
    check_enforceable(elastic, f"{p}.mode")
    return elastic


def _context_mismatch(
    cal: Mapping[str, Any], *, k: int, escalate_at: int, score: str
) -> tuple[str, Any, Any] | None:
    """The first setting the certificate's guarantee depends on that this block changes."""
    for key, mine in (("k", k), ("score", score), ("escalate_at", escalate_at)):
        theirs = cal.get(key)
        if theirs is None or (key == "escalate_at" and theirs < 0):
            continue  # not recorded (or "any") in the certificate
        if theirs != mine:
            return key, mine, theirs
    return None


def check_enforceable(elastic: ElasticConfig | None, key_path: str) -> None:
    """Refuse to enforce a λ that the cited calibration did not certify."""
    if elastic is not None and elastic.mode == "enforce" and elastic.uncertified:
        raise ConfigError(
            key_path,
            f'"enforce" with {elastic.calibration}, which certified no λ: enforcing would skip '
            'the gate without a guarantee. Keep mode = "shadow" (the cascade serves) and '
            "calibrate on more shadow receipts, or set lambda yourself",
        )


def read_calibration(path: Path) -> dict[str, Any]:
    """From a calibration JSON: ``id``, ``lambda``, ``alpha``, ``delta``, and the context its
    guarantee holds for (``score``, ``k``, ``escalate_at``); a missing file gives {}."""
    where = f"{ELASTIC_PATH}.calibration"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(where, f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(where, f"{path}: expected a JSON object, got {f.describe(data)}")
    out: dict[str, Any] = {}
    if "id" in data:
        if not isinstance(data["id"], str) or not data["id"]:
            raise ConfigError(where, f'{path}: "id" must be a non-empty string')
        out["id"] = data["id"]
    if isinstance(data.get("score"), str):
        out["score"] = data["score"]
    for key in ("k", "escalate_at"):
        value = data.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(where, f'{path}: "{key}" must be an integer')
            out[key] = value
    for key, lo, hi in (("lambda", 0.0, 1.0), ("alpha", 0.0, 1.0), ("delta", 0.0, 1.0)):
        if key not in data:
            continue
        value = data[key]
        if value is None:
            out[key] = None
            continue
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not lo <= value <= hi:
            raise ConfigError(where, f'{path}: "{key}" must be a number in [{lo:g}, {hi:g}]')
        out[key] = float(value)
    return out
