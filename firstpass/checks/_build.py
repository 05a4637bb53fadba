"""Checks from their written form: a config's ``[[route.gate_checks]]`` or a request's
``firstpass.checks``.

``parse_check`` validates a definition completely (every option, a JSON Schema against its
metaschema, a command's executable) and returns a ``CheckDef``; ``build_check`` turns one into a
runnable check, given what only the server has (a judge's provider). A request may only use
``REQUEST_KINDS``: ``command`` runs an executable and ``judge`` spends money on a model, so
they come from the operator's config alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar

from firstpass.checks._base import Check, Options
from firstpass.checks._command import CommandCheck
from firstpass.checks._composite import Composite
from firstpass.checks._context import ContextCheck
from firstpass.checks._judge import Grader, JudgeCheck, _Priced
from firstpass.checks._result import OnAbstain, Severity
from firstpass.checks._schema import JsonSchemaCheck
from firstpass.checks._text import BasicCheck, RegexCheck
from firstpass.errors import CheckSpecError

__all__ = [
    "CONFIG_KINDS",
    "REQUEST_KINDS",
    "CheckDef",
    "JudgeBinding",
    "build_check",
    "checks_digest",
    "field_path",
    "parse_check",
    "parse_checks",
]

Origin = Literal["config", "request"]

#: kind → its own options (besides ``kind``, ``name``, ``on_abstain``, ``severity``)
_OPTIONS: dict[str, tuple[str, ...]] = {
    "basic": ("min_length",),
    "regex": ("must_match", "must_not_match", "ignore_case", "multiline", "dotall"),
    "context": ("min_overlap", "require_context"),
    "json_schema": ("schema", "assert_formats"),
    "composite": ("checks", "mode"),
    "command": ("argv", "timeout_s", "cpu_s", "memory_mb"),
    "judge": ("model", "rubric", "min_score", "max_tokens"),
    "sql_evidence": (
        "database",
        "tool",
        "argument",
        "rerun_ms",
        "budget_ms",
        "rerun",
        "reask",
        "self_check",
        "reask_rows",
    ),
}
_COMMON = ("kind", "name", "on_abstain", "severity")
_REQUIRED = {
    "json_schema": ("schema",),
    "command": ("argv",),
    "judge": ("model", "rubric"),
    "sql_evidence": ("database",),
}

#: safe for a client to add: deterministic, in-process, bounded, no executable and no spend
REQUEST_KINDS = ("basic", "regex", "context", "json_schema", "composite")
CONFIG_KINDS = (*REQUEST_KINDS, "command", "judge", "sql_evidence")
#: what receipts and the summary call a stage's test specs
RESERVED_NAMES = ("tests", "hidden tests")
#: composites nest at most this deep
_MAX_DEPTH = 4


@dataclass(frozen=True, kw_only=True)
class JudgeBinding:
    """What a judge needs from the server: its provider, the model id there, its price."""

    grader: Grader
    model: str
    price: _Priced | None = None


#: ``provider/model`` → its binding (the server's providers and prices)
JudgeResolver = Callable[[str], JudgeBinding]


@dataclass(frozen=True, kw_only=True)
class CheckDef:
    """One validated check definition, as written (``build_check`` makes it runnable)."""

    kind: str
    name: str
    raw: Mapping[str, object]
    parts: tuple[CheckDef, ...] = ()
    #: the check as validation built it, reused by ``build_check`` (building a schema check
    #: validates the schema against its metaschema: milliseconds, once is enough); None for a
    #: definition holding a judge, which needs its provider first
    built: Check | None = field(default=None, compare=False, repr=False)

    @property
    def judges(self) -> tuple[str, ...]:
        """The ``provider/model`` of every judge in this definition (composites included)."""
        if self.kind == "judge":
            return (str(self.raw["model"]),)
        return tuple(j for p in self.parts for j in p.judges)


class _Unbound:
    """Stands in for a judge's provider while a definition is only being validated."""

    async def complete(
        self,
        model: str,
        body: Mapping[str, object],
        *,
        n: int = 1,
        request_key: str | None = None,
    ) -> NoReturn:
        raise RuntimeError("a judge check was run before it was bound to its provider")


_C = TypeVar("_C", bound=str)
_ON_ABSTAIN: tuple[OnAbstain, ...] = ("fail_open", "fail_closed")
_SEVERITIES: tuple[Severity, ...] = ("error", "warning")


def _one_of(value: object, choices: tuple[_C, ...]) -> _C | None:
    """The choice ``value`` is (typed as the choices are), or None."""
    for choice in choices:
        if value == choice:
            return choice
    return None


def _options(raw: Mapping[str, object], name: str) -> Options:
    given = raw.get("on_abstain", "fail_closed")
    on_abstain = _one_of(given, _ON_ABSTAIN)
    if on_abstain is None:
        raise CheckSpecError("on_abstain", f'expected "fail_open" or "fail_closed", got {given!r}')
    given = raw.get("severity", "error")
    severity = _one_of(given, _SEVERITIES)
    if severity is None:
        raise CheckSpecError("severity", f'expected "error" or "warning", got {given!r}')
    return Options(name=name, on_abstain=on_abstain, severity=severity)


def _unknown(key: str, allowed: tuple[str, ...]) -> CheckSpecError:
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return CheckSpecError(key, f"unknown option{hint}; this kind takes {', '.join(allowed)}")


def parse_check(raw: object, *, origin: Origin, depth: int = 0, prefix: str = "") -> CheckDef:
    """Validate one definition; ``CheckSpecError`` names the bad option."""
    if not isinstance(raw, Mapping):
        raise CheckSpecError("", 'expected an object like {"kind": "json_schema", "schema": {...}}')
    kind = raw.get("kind")
    allowed_kinds = REQUEST_KINDS if origin == "request" else CONFIG_KINDS
    if kind == "tests":
        where = "firstpass.tests" if origin == "request" else "[route.checks]"
        raise CheckSpecError("kind", f"tests are given in {where}, not as a check")
    if kind not in allowed_kinds:
        if origin == "request" and kind in CONFIG_KINDS:
            raise CheckSpecError(
                "kind",
                f"{kind!r} checks come from the server's config only, never from a request "
                f"(a request may add: {', '.join(REQUEST_KINDS)})",
            )
        raise CheckSpecError("kind", f"unknown kind {kind!r} (known: {', '.join(allowed_kinds)})")
    assert isinstance(kind, str)
    allowed = (*_COMMON, *_OPTIONS[kind])
    for key in raw:
        if key not in allowed:
            raise _unknown(str(key), allowed)
    for key in _REQUIRED.get(kind, ()):
        if key not in raw:
            raise CheckSpecError(key, f"required for a {kind} check")
    name = raw.get("name", kind)
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > 100
        or not name.isprintable()  # names reach terminals (receipts summary) and logs
    ):
        raise CheckSpecError("name", f"expected a short non-empty printable string, got {name!r}")
    if name in RESERVED_NAMES:
        raise CheckSpecError("name", f"{name!r} names the stage's tests on receipts: pick another")
    parts: tuple[CheckDef, ...] = ()
    if kind == "composite":
        if depth >= _MAX_DEPTH:
            raise CheckSpecError("checks", f"composites nest at most {_MAX_DEPTH} deep")
        parts = _parse_list(raw.get("checks"), origin=origin, depth=depth + 1, field="checks")
    defn = CheckDef(kind=kind, name=prefix + name, raw=raw, parts=parts)
    # built now, so every option is checked now and not at first use
    built = _construct(defn, None)
    return defn if defn.judges else dataclasses.replace(defn, built=built)


def _parse_list(
    raw: object, *, origin: Origin, depth: int, field: str, prefix: str = ""
) -> tuple[CheckDef, ...]:
    if not isinstance(raw, list) or not raw:
        raise CheckSpecError(field, "expected a non-empty list of checks")
    out: list[CheckDef] = []
    for i, item in enumerate(raw):
        try:
            out.append(parse_check(item, origin=origin, depth=depth, prefix=prefix))
        except CheckSpecError as exc:
            raise CheckSpecError(field_path(f"{field}[{i}]", exc.field), exc.message) from exc
    names = [d.name for d in out]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise CheckSpecError(
                f"{field}[{i}].name", f"{n!r} is used twice: give each check a name"
            )
    return tuple(out)


def parse_checks(raw: object, *, origin: Origin, prefix: str = "") -> tuple[CheckDef, ...]:
    """A list of definitions (names unique); ``CheckSpecError`` fields read ``[2].schema``."""
    return _parse_list(raw, origin=origin, depth=0, field="", prefix=prefix)


def field_path(parent: str, field: str) -> str:
    """``checks[1]`` + ``schema.type`` → ``checks[1].schema.type`` (an index joins bare)."""
    if not field:
        return parent
    if not parent or field.startswith("["):
        return f"{parent}{field}"
    return f"{parent}.{field}"


def checks_digest(defs: Sequence[CheckDef]) -> str | None:
    """``sha256:`` over the definitions as written (None for none): what a certificate records
    of the visible checks its probes were scored by, so changing them voids it."""
    if not defs:
        return None
    canonical = json.dumps(
        [_verdict_options(d.raw) for d in defs], sort_keys=True, separators=(",", ":"), default=str
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


#: options that change no verdict, left out of ``checks_digest``: an ``sql_evidence`` check's
#: follow-up calls run after its verdict, on cascade attempts only, never on a probe's samples
_NOT_VERDICT = {"sql_evidence": frozenset({"reask", "self_check", "reask_rows"})}


def _verdict_options(raw: Mapping[str, object]) -> Mapping[str, object]:
    """``raw`` without the options that change no verdict (composites' parts too)."""
    dropped = _NOT_VERDICT.get(str(raw.get("kind")), frozenset())
    out = {k: v for k, v in raw.items() if k not in dropped}
    parts = out.get("checks")
    if isinstance(parts, list):
        out["checks"] = [_verdict_options(p) if isinstance(p, Mapping) else p for p in parts]
    return out


def build_check(defn: CheckDef, judges: JudgeResolver | None = None) -> Check:
    """A runnable check; ``judges`` binds a judge to its provider (required for one)."""
    if judges is None and defn.judges:
        raise CheckSpecError("model", "a judge check needs the server's providers to run")
    if defn.built is not None:
        return defn.built
    return _construct(defn, judges)


def _construct(defn: CheckDef, judges: JudgeResolver | None) -> Check:
    raw = defn.raw
    options = _options(raw, defn.name)
    # the kind's options as written, handed to its dataclass, whose own checks (and the
    # TypeError below) judge them: no one static type fits every kind's keywords
    params: dict[str, Any] = {k: v for k, v in raw.items() if k not in _COMMON}
    try:
        if defn.kind == "basic":
            return BasicCheck(options=options, **params)
        if defn.kind == "regex":
            for flag in ("ignore_case", "multiline", "dotall"):
                if not isinstance(params.get(flag, False), bool):
                    raise CheckSpecError(flag, "expected true or false")
            return RegexCheck(options=options, **params)
        if defn.kind == "context":
            return ContextCheck(options=options, **params)
        if defn.kind == "json_schema":
            return JsonSchemaCheck(options=options, **params)
        if defn.kind == "command":
            return CommandCheck(options=options, **params)
        if defn.kind == "judge":
            return _judge(options, params, judges)
        if defn.kind == "sql_evidence":
            from firstpass.checks._sql import SqlEvidenceCheck  # sqlglot loads only when used

            return SqlEvidenceCheck(options=options, **params)
        mode = params.get("mode", "all")
        return Composite(
            options=options,
            checks=[p.built or _construct(p, judges) for p in defn.parts],
            mode=mode,
        )
    except TypeError as exc:  # a dataclass refusing an option's shape
        raise CheckSpecError("", f"bad options for a {defn.kind} check: {exc}") from exc


def _judge(options: Options, params: dict[str, Any], judges: JudgeResolver | None) -> JudgeCheck:
    label = params.pop("model")
    if not isinstance(label, str) or "/" not in label.strip("/"):
        raise CheckSpecError("model", f'expected "provider/model", got {label!r}')
    if judges is None:
        return JudgeCheck(options=options, grader=_Unbound(), model=label, label=label, **params)
    bound = judges(label)
    return JudgeCheck(
        options=options,
        grader=bound.grader,
        model=bound.model,
        price=bound.price,
        label=label,
        **params,
    )
