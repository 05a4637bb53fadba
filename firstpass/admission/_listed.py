"""The request's listed checks (``firstpass.checks``) and evidence, built off the event loop.

Validating a JSON Schema against its metaschema and compiling a pattern are CPU work; they run
on the checks' own threads within ``BUILD_TIMEOUT_S`` (``with_listed_checks``), so one request
cannot stall every other on the loop. This is the one step of admission that is not pure: the
caller runs it between ``screen`` and ``admit``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from firstpass._json import JSON
from firstpass.admission._request import bad
from firstpass.checks import (
    Check,
    build_check,
    field_path,
    off_loop,
    parse_checks,
    request_patterns_problem,
)
from firstpass.errors import CheckSpecError, RequestError
from firstpass.pipeline import Checks

__all__ = ["BUILD_TIMEOUT_S", "MAX_REQUEST_CHECKS", "with_listed_checks"]

#: at most this many checks a request may add
MAX_REQUEST_CHECKS = 32
#: the longest a request's listed checks may take to validate and compile
BUILD_TIMEOUT_S = 5.0

A = TypeVar("A")
T = TypeVar("T")


async def with_listed_checks(checks: Checks, raw: JSON) -> Checks:
    """``checks`` plus the request's ``firstpass.checks``, validated and compiled on the checks'
    own threads (a schema's metaschema check and a pattern's compile are CPU work), and its
    ``firstpass.evidence`` validated there too (up to 32 items of 10,000 rows); a
    ``RequestError`` names what is wrong, or says it took too long."""
    if checks.request.evidence:
        await _off_loop_or_400(_validate_evidence, checks.request.evidence, "firstpass.evidence")
    if raw is None:
        return checks
    listed = await _off_loop_or_400(_listed_checks, raw, "firstpass.checks")
    return dataclasses.replace(
        checks,
        visible_checks=listed["visible"],
        gate_checks=listed["gate"],
        from_request=tuple(c.name for c in (*listed["visible"], *listed["gate"])),
    )


async def _off_loop_or_400(fn: Callable[[A], T], raw: A, where: str) -> T:
    """``fn(raw)`` on the checks' threads within ``BUILD_TIMEOUT_S``; too slow or too deeply
    nested is a 400 naming ``where``."""
    try:
        return await asyncio.wait_for(off_loop(fn, raw), BUILD_TIMEOUT_S)
    except TimeoutError:
        raise bad(where, f"took over {BUILD_TIMEOUT_S:g} s to validate: send less") from None
    except RecursionError:
        raise bad(where, "nested too deeply") from None


def _validate_evidence(raw: Sequence[Mapping[str, object]]) -> None:
    from firstpass.checks._sql import evidence_from_list

    try:
        evidence_from_list(list(raw))
    except CheckSpecError as exc:
        field = field_path("firstpass.evidence", exc.field)
        raise RequestError(f"{field}: {exc.message}", param=field, code="invalid_evidence") from exc


def _listed_checks(raw: JSON) -> dict[str, tuple[Check, ...]]:
    """``firstpass.checks``: ``{"visible": [...], "gate": [...]}``, or a bare list (visible).

    Only the safe kinds (``firstpass.checks.REQUEST_KINDS``); each is named ``request:NAME`` on
    receipts so it never passes for a route's check of the same name.
    """
    out: dict[str, tuple[Check, ...]] = {"visible": (), "gate": ()}
    if raw is None:
        return out
    if isinstance(raw, list):
        raw = {"visible": raw}
    if not isinstance(raw, Mapping):
        raise bad("firstpass.checks", 'expected {"visible": [...], "gate": [...]} or a list')
    unknown = set(raw) - {"visible", "gate"}
    if unknown:
        raise bad(f"firstpass.checks.{sorted(unknown)[0]}", 'unknown key (use "visible" or "gate")')
    total = sum(len(v) for v in raw.values() if isinstance(v, list))
    if total > MAX_REQUEST_CHECKS:
        raise bad("firstpass.checks", f"at most {MAX_REQUEST_CHECKS} checks, got {total}")
    costly = request_patterns_problem(raw)
    if costly is not None:  # before anything is compiled: a compile holds the GIL
        raise bad("firstpass.checks", costly)
    for stage in ("visible", "gate"):
        if raw.get(stage) is None:
            continue
        where = f"firstpass.checks.{stage}"
        try:
            defs = parse_checks(raw[stage], origin="request", prefix="request:")
        except CheckSpecError as exc:
            field = field_path(where, exc.field)
            raise RequestError(
                f"{field}: {exc.message}", param=field, code="invalid_checks"
            ) from exc
        except RecursionError:
            raise bad(where, "nested too deeply") from None
        out[stage] = tuple(build_check(d) for d in defs)
    return out
