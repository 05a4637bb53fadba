"""Probe inputs: new calls of the entry point, mutated from the visible tests' own calls.

Behavioural agreement compares what the k samples *do* on inputs no test checks. The inputs are
derived, deterministically, from the arguments of the visible tests' calls of the entry point
(``assert f([1, 2], 3) == ...`` or a case's ``args``) by type-aware mutation: the value changes,
its type does not. Hidden tests are never read here: they are the gate's, and a probe that saw
them would leak the gate into the score calibrated against it.

Everything here is pure CPU (about a millisecond for MBPP-sized tests; the pipeline runs it off
the event loop and ``cached_probe_inputs`` remembers it per spec); seeds larger than
``MAX_SEED_CHARS`` in wire form are not mutated, so a huge visible input cannot make a request
pay for copying it dozens of times.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import json
import random
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from firstpass._json import JSON
from firstpass.sandbox import (
    DEFAULT_PER_INPUT_S,
    NonData,
    ProbeInputs,
    TestSpec,
    WireError,
    from_json,
    from_wire,
    to_wire,
)

__all__ = [
    "DEFAULT_COUNT",
    "MAX_COUNT",
    "build_probe_inputs",
    "cached_probe_inputs",
    "mutate_value",
    "seed_calls",
]

#: generated inputs per request (the issue asks for 10-20)
DEFAULT_COUNT = 16
MAX_COUNT = 20
#: "a large value" for ints and floats
LARGE_INT = 10_007
LARGE_FLOAT = 1.0e6
#: seeds (and generated calls) bigger than this many characters of wire JSON are left out
MAX_SEED_CHARS = 4_096
_BUILTINS = frozenset(dir(builtins))


# --------------------------------------------------------------------------- seeds


def seed_calls(
    spec: TestSpec | None, entry_point: str | None = None
) -> tuple[str | None, list[tuple[object, ...]]]:
    """The entry point and the argument tuples (Python values) of the visible tests' calls.

    Asserts: every call ``entry_point(<literals>)`` anywhere in an assert (``set(f(...))``
    included); calls with keywords, ``*args`` or non-literal arguments are skipped. Without a
    named entry point, the non-builtin name called in the most asserts is taken. Cases: each
    case's ``args``.
    """
    cases = getattr(spec, "cases", None)
    if cases is not None:
        name = entry_point or getattr(spec, "entry_point", None)
        seeds: list[tuple[object, ...]] = []
        for case in cases:
            try:
                seeds.append(tuple(from_wire(list(case.args))))
            except WireError:
                continue
        return name, seeds
    asserts = getattr(spec, "asserts", None) or ()
    trees = []
    for src in asserts:
        try:
            trees.append(ast.parse(src))
        except (SyntaxError, ValueError):
            continue
    name = entry_point or getattr(spec, "entry_point", None) or _infer_entry_point(trees)
    if name is None:
        return None, []
    seeds = []
    for tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id != name or node.keywords:
                continue
            try:
                seeds.append(tuple(ast.literal_eval(a) for a in node.args))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue  # a starred or non-literal argument: nothing to mutate from
    return name, seeds


def _infer_entry_point(trees: Iterable[ast.Module]) -> str | None:
    counts: dict[str, int] = {}
    for tree in trees:
        called = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id not in _BUILTINS
        }
        for fname in called:
            counts[fname] = counts.get(fname, 0) + 1
    if not counts:
        return None
    # most asserts first; dict order (first seen) breaks ties deterministically
    return max(counts, key=lambda n: counts[n])


# --------------------------------------------------------------------------- mutation


def mutate_value(value: object, rng: random.Random, depth: int = 0) -> list[object]:
    """Type-preserving variants of ``value`` (never ``value`` itself; may hold duplicates).

    ints: 0, 1, -1, x±1, 2x, -x, a large value; floats likewise (and 0.5); strings: empty, one
    character, reversed, upper, lower, with spaces, doubled; lists/tuples: empty, singleton,
    reversed, duplicated, sorted, with negatives, one element mutated (recursively); sets the
    same where it makes sense; dicts: empty, one item, one value mutated (recursively).
    """
    out: list[object]
    if type(value) is bool:
        out = [not value]
    elif type(value) is int:
        out = [0, 1, -1, value + 1, value - 1, 2 * value, -value, LARGE_INT]
    elif type(value) is float:
        out = [0.0, 1.0, -1.0, 0.5, value + 1.0, value - 1.0, 2.0 * value, -value, LARGE_FLOAT]
    elif type(value) is str:
        out = [
            "",
            value[:1] or "a",
            value[::-1],
            value.upper(),
            value.lower(),
            f" {value} ",
            " ".join(value.split()) if " " in value else " ".join(value),
            value + value,
        ]
    elif type(value) is bytes:
        out = [b"", value[:1] or b"a", value[::-1], value + value]
    elif type(value) is list or type(value) is tuple:
        seq = type(value)
        out = [seq(v) for v in _sequence_variants(list(value), rng, depth)]
    elif type(value) is set or type(value) is frozenset:
        group = type(value)
        items = list(value)
        out = [group(), *(group([v]) for v in items[:1])]
        negated = [_negate(v) for v in items]
        if all(v is not None for v in negated):
            with contextlib.suppress(TypeError):
                out.append(group(value) | group(negated))
    elif type(value) is dict:
        out = [{}]
        keys = list(value)
        if keys:
            out.append({keys[0]: value[keys[0]]})
            if depth < 3:
                key = keys[rng.randrange(len(keys))]
                for variant in mutate_value(value[key], rng, depth + 1)[:4]:
                    out.append({**value, key: variant})
    else:
        out = []  # None, complex and the rest: nothing type-preserving worth trying
    return [v for v in out if not _same(v, value)]


def _sequence_variants(items: list[object], rng: random.Random, depth: int) -> list[list[object]]:
    out: list[list[object]] = [[], items[:1] if items else [0], items[::-1], items + items]
    with contextlib.suppress(TypeError):
        # sorting is tried, and refused by a TypeError, when the items do not compare (a mix
        # of types): whether they do is known only at run time, so the type is left open
        comparable: list[Any] = items
        out.append(sorted(comparable))
    negated = [_negate(v) for v in items]
    if items and all(v is not None for v in negated):
        out.append(items + negated)
    if items and depth < 3:
        i = rng.randrange(len(items))
        for variant in mutate_value(items[i], rng, depth + 1)[:4]:
            out.append([*items[:i], variant, *items[i + 1 :]])
    return out


def _negate(v: object) -> int | float | None:
    if type(v) is int or type(v) is float:
        return -v
    return None


def _same(a: object, b: object) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError, RecursionError):  # plain data compares; be safe anyway
        return False


def _key(value: object) -> str | None:
    """Canonical text of a value's wire form (None when it is not plain data)."""
    try:
        return json.dumps(to_wire(value), sort_keys=True, separators=(",", ":"))
    except (NonData, ValueError, TypeError, RecursionError):
        return None


# --------------------------------------------------------------------------- the inputs


def build_probe_inputs(
    spec: TestSpec | None,
    *,
    entry_point: str | None = None,
    extra: Sequence[Sequence[JSON]] = (),
    count: int = DEFAULT_COUNT,
    seed: int = 0,
    per_input_s: float = DEFAULT_PER_INPUT_S,
) -> ProbeInputs | None:
    """The probe inputs for a request whose visible tests are ``spec``.

    ``extra`` are the request's own argument lists (plain JSON, as in ``firstpass.probe_inputs``);
    they come first, then up to ``count`` generated calls, deduplicated, never a visible call
    itself. The choice is seeded by ``seed`` and the seeds' content, so the same request always
    gets the same inputs. None when there is no entry point to call.
    """
    if not 0 <= count <= MAX_COUNT:
        raise ValueError(f"count must be in [0, {MAX_COUNT}], got {count}")
    name, seeds = seed_calls(spec, entry_point)
    if name is None:
        return None
    seen: set[str] = set()
    chosen: list[tuple[JSON, ...]] = []  # wire form (JSON: ``firstpass.sandbox``'s codec)
    for args in extra:
        wire = tuple(from_json(a) for a in args)
        key = json.dumps(list(wire), sort_keys=True, separators=(",", ":"))
        if key not in seen:
            seen.add(key)
            chosen.append(wire)
    n_request = len(chosen)
    keyed = [(s, k) for s in seeds if (k := _key(list(s))) is not None and len(k) <= MAX_SEED_CHARS]
    small = [s for s, _ in keyed]
    seen.update(k for _, k in keyed)  # the visible calls are the tests' own: never probe inputs
    material = json.dumps([k for _, k in keyed], separators=(",", ":"))
    digest = hashlib.sha256(f"{seed}:{name}:{material}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    generated = 0
    for order in (_first_order, _second_order):  # one argument changed first; more to fill up
        if generated >= count:
            break
        candidates = order(small, rng)
        rng.shuffle(candidates)
        for call in candidates:
            if generated >= count:
                break
            call_key = _call_key(call)
            if call_key is None or call_key in seen or len(call_key) > MAX_SEED_CHARS:
                continue
            seen.add(call_key)
            chosen.append(tuple(json.loads(call_key)))
            generated += 1
    return ProbeInputs(
        entry_point=name, args=tuple(chosen), per_input_s=per_input_s, from_request=n_request
    )


_CACHE: OrderedDict[tuple[str, str], ProbeInputs | None] = OrderedDict()
_CACHE_SIZE = 1024
_CACHE_LOCK = threading.Lock()


def cached_probe_inputs(
    spec: TestSpec | None, *, extra: Sequence[Sequence[JSON]] = ()
) -> ProbeInputs | None:
    """``build_probe_inputs`` with the defaults, remembered per (spec digest, extra inputs).

    Requests with the same tests and entry point (a benchmark, a retried prompt) then pay the
    mutation once; the result is the same either way, since the inputs are deterministic.
    """
    assert spec is not None, "probe inputs are built for requests with visible tests"
    extra_key = json.dumps([list(a) for a in extra], sort_keys=True, default=repr)
    key = (f"{spec.digest}:{getattr(spec, 'entry_point', None)}", extra_key)
    with _CACHE_LOCK:  # callers may run this in worker threads (it is CPU work, off the loop)
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    value = build_probe_inputs(spec, extra=extra)
    with _CACHE_LOCK:
        _CACHE[key] = value
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return value


def _first_order(seeds: list[tuple[object, ...]], rng: random.Random) -> list[tuple[object, ...]]:
    """Every seed with one argument replaced by one of its variants."""
    out: list[tuple[object, ...]] = []
    for args in seeds:
        for j, value in enumerate(args):
            for variant in mutate_value(value, rng):
                out.append((*args[:j], variant, *args[j + 1 :]))
    return out


def _second_order(seeds: list[tuple[object, ...]], rng: random.Random) -> list[tuple[object, ...]]:
    """To fill up when first-order calls are few (one small argument): seeds with every argument
    mutated at once, and with one argument mutated twice, drawn by ``rng``."""
    out: list[tuple[object, ...]] = []
    for args in seeds:
        variants = [mutate_value(value, rng) for value in args]
        if len(args) > 1 and all(variants):
            for _ in range(MAX_COUNT):
                out.append(tuple(rng.choice(options) for options in variants))
        for j, options in enumerate(variants):
            for _ in range(MAX_COUNT if options else 0):
                again = mutate_value(rng.choice(options), rng)
                if again:
                    out.append((*args[:j], rng.choice(again), *args[j + 1 :]))
    return out


def _call_key(args: tuple[object, ...]) -> str | None:
    return _key(list(args))
