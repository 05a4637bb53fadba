"""What a probe records of a sample: digests of its canonical outputs, never a verdict.

Apart from the judge's tests because it judges nothing: two samples agree or not on the
probe inputs, and the digest is all that leaves the sandbox. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
from typing import TypedDict, cast

from . import codec
from .codec import Wire

#: significant digits floats are compared to (sum order must not split a cluster)
FLOAT_DIGITS = 12
#: what a probe output that never arrived counts as
LOST: Wire = {"$e": "lost"}
_UNORDERED = ("$s", "$fs", "$d", "$ctr", "$dd", "$dk", "$di")


class Behaviour(TypedDict):
    """What a probe records: ``sha256:`` of the output vector, and each output's digest."""

    digest: str
    outputs: list[str]


def canonical_output(item: object) -> Wire:
    """One probe output as canonical data: sets and dicts sorted, floats rounded, errors tagged.

    Runs in the judge on what the worker sent; raises ValueError on a malformed record.
    """
    if type(item) is not dict:
        raise ValueError("probe output is not an object")
    if "v" in item:
        return _canon(item["v"], 0)
    if "h" in item:
        digest = item["h"]
        if type(digest) is not str or len(digest) != 64:
            raise ValueError("malformed probe output digest")
        return {"$h": digest}
    err = item.get("e")
    if type(err) is not str or not err or len(err) > 100:
        raise ValueError("malformed probe error")
    return {"$e": err}


def _canon(w: Wire, depth: int) -> Wire:
    """(Dispatched on ``t``, which mypy cannot narrow ``w`` by: the casts say what ``t`` says.)"""
    if depth > codec.MAX_DEPTH + 2:
        raise ValueError("probe output nests too deeply")
    t = type(w)
    if w is None or t is bool or t is int or t is str:
        return w
    if t is float:
        return {"$f": format(cast(float, w) + 0.0, f".{FLOAT_DIGITS}g")}  # -0.0 is 0.0
    d = depth + 1
    if t is list:
        return [_canon(x, d) for x in cast("list[Wire]", w)]
    if t is not dict or len(cast("dict[str, Wire]", w)) != 1:
        raise ValueError("malformed probe output")
    ((tag, body),) = cast("dict[str, Wire]", w).items()
    if tag in ("$f", "$i") and type(body) is str:
        return {tag: body}
    if tag in ("$b", "$ba", "$dec", "$bt") and type(body) is str:
        return w
    if tag == "$ddf" and type(body) is list and len(body) == 2 and type(body[0]) is str:
        pairs = cast("dict[str, Wire]", _canon({"$dd": body[1]}, depth))  # {"$dd": sorted}
        return {tag: [body[0], pairs["$dd"]]}
    if type(body) is not list:
        raise ValueError("malformed probe output")
    items = [_canon(x, d) for x in body]
    if tag in _UNORDERED:  # unordered: the order a hash seed gave is not behaviour
        items.sort(key=_text)
    return {tag: items}


def _text(value: Wire) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def behaviour(outs: list[Wire] | None, n: int) -> Behaviour:
    """The digest of a sample's output vector and each output's digest (``sha256:`` hex).

    ``outs`` None (the record never arrived: the sample was killed mid-probe) counts every
    output as lost. Raises ValueError on a malformed record.
    """
    items = [canonical_output(o) for o in outs] if outs is not None else [LOST] * n
    if len(items) != n:
        raise ValueError("wrong number of probe outputs")
    texts = [_text(item) for item in items]
    per = [hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts]
    whole = hashlib.sha256(("[" + ",".join(texts) + "]").encode()).hexdigest()
    return {"digest": "sha256:" + whole, "outputs": per}
