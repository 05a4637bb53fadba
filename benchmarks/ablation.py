"""Ablation: does each part of the verification design pay for itself?

The configurations the design calls for, each on the same test halves, same recorded samples
(same replay seeds), through the real pipeline:

- **A** model only: the cheap model's answer, unchecked;
- **B** + visible tests on one sample: the cascade with only the visible tests (no gate);
- **C** + the full gate: the verified cascade (visible tests + hidden-test gate);
- **D** + the elastic probe: enforce mode with λ calibrated on the split's other half (α, δ);
  when no λ is certified, D is not run on that split (the advice is to keep C);
- **E** + the revision loop: not measured, the pipeline has no revision loop yet.

Each step is compared with the one before it (paired, per split, task-bootstrap intervals).

    python -m benchmarks.ablation --tasks TASKS.jsonl --cheap-samples CHEAP.jsonl \
        --top-samples TOP.jsonl --splits 20 --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._e2e import Policy
from benchmarks._report import RESULTS, dump_json, write_text
from benchmarks.datasets import DataMissing
from benchmarks.elastic_vs_uniform import (
    build_parser as _evu_parser,
)
from benchmarks.elastic_vs_uniform import (
    elastic_policy,
    markdown,
    run_splits,
    uncertified_policy,
)

__all__ = ["STEPS", "ablation_pairs", "ablation_policies", "main"]

STEPS = {
    "A model only": "the cheap model's answer, unchecked",
    "B + visible tests": "cascade with the visible tests only",
    "C + gate": "cascade with visible tests and the hidden-test gate",
    "D + elastic probe α=…": "enforce with the λ calibrated at that α (run only on splits where one is certified)",
    "D' elastic λ=1 uncertified": "enforce at λ = 1 without a guarantee: a reference point, not advice",
    "E + revision loop": "not measured: the pipeline has no revision loop yet",
}


def ablation_policies(args: argparse.Namespace, lambdas: dict[str, dict[str, Any]]) -> list[Policy]:
    """A–D for one split; one D per α whose λ was certified on this split."""
    out = [
        Policy(name="A model only", route="cheap", mode="passthrough", visible=False, hidden=False),
        Policy(name="B + visible tests", route="cascade", mode="cascade", hidden=False),
        Policy(name="C + gate", route="cascade", mode="cascade"),
    ]
    for name, cal in lambdas.items():
        if cal["lambda"] is not None:
            alpha = name.split("@", 1)[-1]
            out.append(elastic_policy(f"D + elastic probe α={alpha}", args.k, cal))
    if args.uncertified_lambda is not None:
        p = uncertified_policy(args.k, args.uncertified_lambda)
        out.append(dataclasses.replace(p, name=f"D' {p.name}"))
    return out


def ablation_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """Each step against the one before it (D' against C as well)."""
    pairs = [("B + visible tests", "A model only"), ("C + gate", "B + visible tests")]
    pairs += [(n, "C + gate") for n in names if n.startswith("D")]
    return pairs


def build_parser() -> argparse.ArgumentParser:
    p = _evu_parser()
    p.description = __doc__.splitlines()[0]
    p.set_defaults(alphas="0.10,0.20")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks.ablation " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        with tempfile.TemporaryDirectory(prefix="fp-ablation-") as tmp:
            args.workdir = tmp
            doc = asyncio.run(
                run_splits(args, make_policies=ablation_policies, make_pairs=ablation_pairs)
            )
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc["steps"] = STEPS
    md = markdown(doc, command, title="Ablation")
    md += "\n## Steps\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in STEPS.items()) + "\n"
    print(md)
    if args.json:
        dump_json(Path(args.json), doc)
    if not args.no_md:
        write_text(Path(args.md) if args.md else RESULTS / "ablation.md", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
