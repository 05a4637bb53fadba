"""The benchmarks' data: readers for ``../shared/data`` and the Task set / Sample set formats.

The data directory is ``$FIRSTPASS_DATA`` if set, else ``<repo>/../shared/data``; nothing from it
is ever copied into this repository. Every reader raises ``DataMissing`` naming the path when the
data is absent, so scripts and tests can skip with that message.

    python -m benchmarks.datasets [--out benchmarks/.cache/data] [--limit N] [--data DIR]

writes ``tasks.jsonl`` (MBPP+ as a Task set, hidden expected outputs computed in the sandbox) and
``samples-<model>.jsonl`` (the SpecFix samples as Sample sets) for the three models; see
``benchmarks/README.md`` for both formats. ``--setting aligned`` writes the aligned-gate Task set
instead (``tasks-aligned.jsonl``: visible = MBPP's first two original asserts, gate = all three),
with what it dropped and why in ``conversion-aligned.json``; the sample files are shared.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firstpass.errors import SpecError

__all__ = [
    "ALIGNED_DROP_REASONS",
    "MODELS",
    "SETTINGS",
    "AlignedConversion",
    "DataMissing",
    "MbppOriginal",
    "MbppPlusTask",
    "Task",
    "TaskConversion",
    "aligned_row",
    "convert_aligned",
    "convert_tasks",
    "data_dir",
    "load_mbpp_original",
    "load_mbppplus",
    "load_sample_rows",
    "load_specfix_samples",
    "load_tasks",
    "shown_asserts",
    "write_jsonl",
]

ROOT = Path(__file__).resolve().parent.parent
#: where the CLI writes by default (gitignored)
DEFAULT_OUT = ROOT / "benchmarks" / ".cache" / "data"

#: our model name -> the SpecFix files holding its MBPP samples (pilot_label + full_entropy_repair)
MODELS: dict[str, tuple[str, ...]] = {
    "deepseek-v3": (
        "pilot_label/deepseek-v3/mbpp.jsonl.gz",
        "full_entropy_repair/deepseek-v3/mbpp_0.359.jsonl.gz",
    ),
    "qwen2.5-coder-32b": (
        "pilot_label/qwen2.5-coder-32b-instruct/mbpp.jsonl.gz",
        "full_entropy_repair/qwen2.5-coder-32b-instruct/mbpp_0.611.jsonl.gz",
    ),
    "qwen2.5-coder-7b": ("pilot_label/qwen25-coder-7b-instruct/mbpp.jsonl.gz",),
}

#: names a visible assert may use without importing them (Mbpp/120, /293, /596, /742 do)
_SETUP_MODULES = ("math", "sys", "cmath", "re")

#: the gate settings: strict (hidden = MBPP+ inputs) and aligned (gate = MBPP's three asserts)
SETTINGS = ("strict", "aligned")
#: the task file each setting writes
TASK_FILES = {"strict": "tasks.jsonl", "aligned": "tasks-aligned.jsonl"}
#: why the aligned conversion drops a task, in the order they are checked
ALIGNED_DROP_REASONS = (
    "not_in_mbpp",
    "fewer_than_3_asserts",
    "reference_fails_original_asserts",
)


class DataMissing(FileNotFoundError):
    """The shared data set is not where we looked."""


def data_dir() -> Path:
    """Where the shared data lives: ``$FIRSTPASS_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("FIRSTPASS_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def _jsonl_gz(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        raise DataMissing(
            f"{path} not found: set FIRSTPASS_DATA to the shared data directory "
            "(it holds mbppplus/, mbpp/, specfix-llm-samples/)"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


# -- MBPP+ ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MbppPlusTask:
    """One MBPP+ task as stored (inputs are JSON-decoded: tuples arrive as lists)."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    asserts: tuple[str, ...]  # the original MBPP assert lines
    base_inputs: tuple[Any, ...]
    plus_inputs: tuple[Any, ...]
    atol: float

    @property
    def first_assert(self) -> str:
        return self.asserts[0]


def _inputs(value: Any) -> tuple[Any, ...]:
    return tuple(json.loads(value) if isinstance(value, str) else value)


def load_mbppplus(root: Path | None = None) -> list[MbppPlusTask]:
    """All MBPP+ tasks from ``mbppplus/MbppPlus.jsonl.gz`` (see its SOURCE.md and NOTES.md)."""
    path = (root or data_dir()) / "mbppplus" / "MbppPlus.jsonl.gz"
    tasks = []
    for row in _jsonl_gz(path):
        asserts = tuple(
            line.strip()
            for line in row["assertion"].splitlines()
            if line.strip().startswith("assert")
        )
        tasks.append(
            MbppPlusTask(
                task_id=row["task_id"],
                prompt=row["prompt"],
                entry_point=row["entry_point"],
                canonical_solution=row["canonical_solution"],
                asserts=asserts,
                base_inputs=_inputs(row["base_input"]),
                plus_inputs=_inputs(row["plus_input"]),
                atol=float(row.get("atol") or 0),
            )
        )
    return tasks


# -- original MBPP ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MbppOriginal:
    """One task of the original MBPP: its three asserts and the setup code they need, if any."""

    number: int
    asserts: tuple[str, ...]
    setup: str | None


def load_mbpp_original(root: Path | None = None) -> dict[int, MbppOriginal]:
    """``task number -> MbppOriginal`` from ``mbpp/mbpp.jsonl.gz`` (``test_list``, ``test_setup_code``)."""
    path = (root or data_dir()) / "mbpp" / "mbpp.jsonl.gz"
    out: dict[int, MbppOriginal] = {}
    for row in _jsonl_gz(path):
        setup = (row.get("test_setup_code") or "").replace("\r\n", "\n").strip()
        out[int(row["task_id"])] = MbppOriginal(
            number=int(row["task_id"]),
            asserts=tuple(a.strip() for a in row.get("test_list") or () if a.strip()),
            setup=setup or None,
        )
    return out


# -- SpecFix samples --------------------------------------------------------------------------


def shown_asserts(requirement: str) -> list[str]:
    """The assert lines inside a SpecFix ``requirement``: the visible test the model was shown."""
    return [ln.strip() for ln in requirement.splitlines() if ln.strip().startswith("assert")]


def _programs(row: dict[str, Any]) -> list[str]:
    clusters = row.get("clusters") or row.get("original_clusters") or {}
    return [p for c in clusters.get("cluster_list", []) for p in c.get("programs_str", [])]


def load_specfix_samples(model: str, root: Path | None = None) -> dict[str, dict[str, Any]]:
    """``task_id -> {"requirement", "samples"}`` for one model, pilot and full files merged.

    Cluster order is the file's; programs keep their order inside clusters. The SpecFix visible
    labels are ignored on purpose (they were computed on one program per cluster).
    """
    if model not in MODELS:
        raise KeyError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    base = (root or data_dir()) / "specfix-llm-samples"
    out: dict[str, dict[str, Any]] = {}
    for rel in MODELS[model]:
        for row in _jsonl_gz(base / rel):
            out[row["task_id"]] = {"requirement": row["requirement"], "samples": _programs(row)}
    return out


def _specfix_dataset(root: Path | None = None) -> dict[str, dict[str, Any]]:
    base = (root or data_dir()) / "specfix-llm-samples" / "dataset" / "mbpp.jsonl.gz"
    return {row["task_id"]: row for row in _jsonl_gz(base)}


# -- the Task set format ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Task:
    """One row of a Task set, with its tests parsed into sandbox specs."""

    task_id: str
    prompt: str
    entry_point: str
    visible: Any  # firstpass.sandbox.TestSpec
    hidden: Any  # firstpass.sandbox.TestSpec
    setup: str | None = None
    row: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _wire_cases_spec(hidden: dict[str, Any], setup: str | None, entry_point: str) -> Any:
    """A ``CasesSpec`` from cases whose args/expected are already in the sandbox's wire form."""
    from firstpass.sandbox import Case, CasesSpec

    cases = hidden.get("cases")
    if not isinstance(cases, list) or not cases:
        raise SpecError("hidden_tests.cases", "must be a non-empty list")
    out = []
    for i, case in enumerate(cases):
        if (
            not isinstance(case, dict)
            or not isinstance(case.get("args"), list)
            or "expected" not in case
        ):
            raise SpecError(f"hidden_tests.cases[{i}]", 'needs "args" (a list) and "expected"')
        out.append(Case(args=tuple(case["args"]), expected=case["expected"]))
    return CasesSpec(
        entry_point=hidden.get("entry_point") or entry_point,
        cases=tuple(out),
        atol=float(hidden.get("atol") or 0.0),
        setup=setup,
    )


def parse_task(row: dict[str, Any], where: str = "") -> Task:
    """One Task set row -> :class:`Task`; a bad row raises ``SpecError`` naming the field."""
    from firstpass.sandbox import parse_spec

    for key in ("task_id", "prompt", "entry_point", "visible_tests", "hidden_tests"):
        if key not in row:
            raise SpecError(key, f"{where}missing")
    setup = row.get("setup")
    entry_point = str(row["entry_point"])
    visible = parse_spec(row["visible_tests"], setup=setup, entry_point=entry_point)
    if row.get("hidden_wire"):
        hidden = _wire_cases_spec(row["hidden_tests"], setup, entry_point)
    else:
        hidden = parse_spec(row["hidden_tests"], setup=setup, entry_point=entry_point)
    return Task(
        task_id=str(row["task_id"]),
        prompt=str(row["prompt"]),
        entry_point=entry_point,
        visible=visible,
        hidden=hidden,
        setup=setup,
        row=row,
    )


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.exists():
        raise DataMissing(f"{path} not found (make it with: python -m benchmarks.datasets)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for no, line in enumerate(f, start=1):
            if line.strip():
                yield no, json.loads(line)


def load_tasks(path: Path) -> list[Task]:
    """Read a Task set JSONL (blocking)."""
    tasks = []
    for no, row in _read_jsonl(Path(path)):
        try:
            tasks.append(parse_task(row, f"{path} line {no}: "))
        except SpecError as exc:
            raise SpecError(exc.field, f"{path} line {no}: {exc}") from exc
    return tasks


def load_sample_rows(path: Path) -> dict[str, dict[str, Any]]:
    """A Sample set JSONL as ``task_id -> row`` (one model per file; blocking)."""
    rows: dict[str, dict[str, Any]] = {}
    models = set()
    for no, row in _read_jsonl(Path(path)):
        if "task_id" not in row or not isinstance(row.get("samples"), list):
            raise ValueError(f"{path} line {no}: a sample row needs task_id and samples")
        rows[str(row["task_id"])] = row
        models.add(row.get("model"))
    if len(models) > 1:
        raise ValueError(f"{path}: one model per sample file, found {sorted(map(str, models))}")
    return rows


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write rows atomically (temp file, then rename); returns how many (blocking)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    tmp.replace(path)
    return n


# -- conversion -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskConversion:
    """What ``convert_tasks`` kept and dropped, with reasons and counts."""

    rows: list[dict[str, Any]]
    dropped_tasks: dict[str, str]  # task_id -> why
    dropped_inputs: int  # inputs dropped because the reference raised or was not deterministic
    total_inputs: int
    visible_from_requirement_differs: list[str]  # tasks whose shown assert is not MBPP+'s first


def _setup_for(assert_line: str) -> str | None:
    used = [m for m in _SETUP_MODULES if re.search(rf"\b{m}\.", assert_line)]
    return "\n".join(f"import {m}" for m in used) or None


async def _sampled_tasks(
    root: Path | None, task_ids: Sequence[str] | None, limit: int | None
) -> tuple[dict[str, MbppPlusTask], dict[str, dict[str, Any]], list[str]]:
    """MBPP+ by id, the SpecFix rows, and the ids of the tasks both have (filtered, limited)."""
    mbpp = {t.task_id: t for t in await asyncio.to_thread(load_mbppplus, root)}
    shown = await asyncio.to_thread(_specfix_dataset, root)
    ids = [t for t in shown if t in mbpp]
    if task_ids is not None:
        wanted = set(task_ids)
        ids = [t for t in ids if t in wanted]
    if limit is not None:
        ids = ids[:limit]
    return mbpp, shown, ids


async def convert_tasks(
    sandbox: Any,
    *,
    root: Path | None = None,
    limit: int | None = None,
    task_ids: Sequence[str] | None = None,
) -> TaskConversion:
    """MBPP+ -> Task set rows, for the 378 tasks the SpecFix samples cover.

    visible = the assert the models were shown (from the SpecFix ``requirement``; for 9 tasks it
    is not MBPP+'s first assert); hidden = base + plus inputs with expected outputs computed by
    running the canonical solution in ``sandbox`` (twice, in two processes: ``Sandbox.resolve``);
    inputs where it raises or answers differently are dropped and counted; a task left with no
    hidden input is dropped with its reason.
    """
    from firstpass.sandbox import CasesSpec, parse_spec

    mbpp, shown, ids = await _sampled_tasks(root, task_ids, limit)
    rows: dict[str, dict[str, Any]] = {}
    dropped: dict[str, str] = {}
    differs: list[str] = []
    counts = {"dropped": 0, "total": 0}
    gate = asyncio.Semaphore(max(1, getattr(sandbox, "concurrency", 2)))

    async def one(tid: str) -> None:
        task = mbpp[tid]
        asserts = shown_asserts(shown[tid]["requirement"])
        visible = asserts[:1] or list(task.asserts[:1])
        if visible[0] != task.first_assert:
            differs.append(tid)
        setup = _setup_for(visible[0])
        inputs = list(task.base_inputs) + list(task.plus_inputs)
        counts["total"] += len(inputs)
        spec = parse_spec(
            {
                "entry_point": task.entry_point,
                "cases": [{"args": list(a)} for a in inputs],
                "reference": task.canonical_solution,
                "atol": task.atol,
            },
            setup=setup,
        )
        assert isinstance(spec, CasesSpec)
        async with gate:
            try:
                resolved = await sandbox.resolve(spec)
            except SpecError as exc:
                counts["dropped"] += len(inputs)
                dropped[tid] = f"the canonical solution fails on every input ({exc})"
                return
        counts["dropped"] += len(resolved.dropped)
        row: dict[str, Any] = {
            "task_id": tid,
            "prompt": shown[tid]["requirement"],
            "entry_point": task.entry_point,
            "visible_tests": visible,
            "hidden_tests": {
                "entry_point": task.entry_point,
                "cases": [{"args": list(c.args), "expected": c.expected} for c in resolved.cases],
                "atol": task.atol,
            },
            "hidden_wire": True,
            "source": {
                "hidden_inputs": len(inputs),
                "hidden_dropped": len(resolved.dropped),
                "visible_is_mbppplus_first_assert": visible[0] == task.first_assert,
            },
        }
        if setup:
            row["setup"] = setup
        rows[tid] = row

    await asyncio.gather(*(one(t) for t in ids))
    return TaskConversion(
        rows=[rows[t] for t in ids if t in rows],
        dropped_tasks={t: dropped[t] for t in ids if t in dropped},
        dropped_inputs=counts["dropped"],
        total_inputs=counts["total"],
        visible_from_requirement_differs=sorted(differs, key=_task_number),
    )


@dataclass(frozen=True, kw_only=True)
class AlignedConversion:
    """What ``convert_aligned`` kept, and each dropped task with its reason and a detail."""

    rows: list[dict[str, Any]]
    dropped: dict[str, tuple[str, str]]  # task_id -> (one of ALIGNED_DROP_REASONS, detail)
    #: kept tasks whose reference failed once and passed on a second run (the first failure)
    reference_retried: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Dropped tasks per reason (every reason listed, zeros included)."""
        return {
            r: sum(1 for why, _ in self.dropped.values() if why == r) for r in ALIGNED_DROP_REASONS
        }

    def summary(self) -> dict[str, Any]:
        """The ``conversion-aligned.json`` document."""
        return {
            "setting": "aligned",
            "tasks": len(self.rows),
            "dropped_counts": self.counts(),
            "dropped": {
                r: [t for t, (why, _) in self.dropped.items() if why == r]
                for r in ALIGNED_DROP_REASONS
            },
            "dropped_detail": {t: detail for t, (_, detail) in self.dropped.items()},
            "reference_retried": dict(self.reference_retried),
        }


def _aligned_setup(original: MbppOriginal) -> str | None:
    """MBPP's ``test_setup_code``, plus imports the asserts use without importing them."""
    parts = [original.setup, _setup_for("\n".join(original.asserts))]
    return "\n".join(p for p in parts if p) or None


def aligned_row(task: MbppPlusTask, original: MbppOriginal, prompt: str) -> dict[str, Any]:
    """The aligned-gate Task set row: visible = the first two original asserts, gate = all three.

    Both are assert specs sharing the row's ``setup``; prompt and entry point are the strict
    row's (the text the models were shown, MBPP+'s function name).
    """
    asserts = list(original.asserts[:3])
    row: dict[str, Any] = {
        "task_id": task.task_id,
        "prompt": prompt,
        "entry_point": task.entry_point,
        "visible_tests": asserts[:2],
        "hidden_tests": asserts,
        "source": {"setting": "aligned", "mbpp_task_id": original.number},
    }
    setup = _aligned_setup(original)
    if setup:
        row["setup"] = setup
    return row


async def convert_aligned(
    sandbox: Any,
    *,
    root: Path | None = None,
    limit: int | None = None,
    task_ids: Sequence[str] | None = None,
) -> AlignedConversion:
    """The aligned-gate Task set, for the same tasks as ``convert_tasks``.

    MBPP+ task ``Mbpp/N`` is matched with original MBPP task N. A task is dropped (reasons in
    ``ALIGNED_DROP_REASONS``) when there is no such task, when it has fewer than three asserts,
    or when MBPP+'s canonical solution fails any of the three in ``sandbox`` twice in a row (a
    failure the second run does not repeat is the sandbox's, and is recorded): MBPP+ changed
    tasks (signature, name, corrected expected values), and a gate that rejects the
    reference would label correct programs wrong (56 here; ``NOTES.md`` counts 48 changed tasks,
    and a plain-CPython run of the references fails the same 56).
    """
    from firstpass.sandbox import parse_spec

    mbpp, shown, ids = await _sampled_tasks(root, task_ids, limit)
    original = await asyncio.to_thread(load_mbpp_original, root)
    rows: dict[str, dict[str, Any]] = {}
    dropped: dict[str, tuple[str, str]] = {}
    retried: dict[str, str] = {}
    gate = asyncio.Semaphore(max(1, getattr(sandbox, "concurrency", 2)))

    async def one(tid: str) -> None:
        orig = original.get(_task_number(tid))
        if orig is None:
            dropped[tid] = ("not_in_mbpp", f"no original MBPP task {_task_number(tid)}")
            return
        if len(orig.asserts) < 3:
            dropped[tid] = ("fewer_than_3_asserts", f"{len(orig.asserts)} asserts")
            return
        row = aligned_row(mbpp[tid], orig, shown[tid]["requirement"])
        spec = parse_spec(
            row["hidden_tests"], setup=row.get("setup"), entry_point=row["entry_point"]
        )
        async with gate:
            result = await sandbox.run(mbpp[tid].canonical_solution, spec)
            if not result.passed:  # a reference fails the same way twice; a flaky run does not
                first, result = result, await sandbox.run(mbpp[tid].canonical_solution, spec)
                if result.passed:
                    retried[tid] = _failure_detail(first)
        if not result.passed:
            dropped[tid] = ("reference_fails_original_asserts", _failure_detail(result))
            return
        rows[tid] = row

    await asyncio.gather(*(one(t) for t in ids))
    return AlignedConversion(
        rows=[rows[t] for t in ids if t in rows],
        dropped={t: dropped[t] for t in sorted(dropped, key=_task_number)},
        reference_retried={t: retried[t] for t in sorted(retried, key=_task_number)},
    )


def _failure_detail(result: Any) -> str:
    failed = [
        f"assert {t.index + 1}: {t.error_type}: {t.message}" for t in result.tests if not t.passed
    ]
    return ("; ".join(failed) or str(result.category))[:500]


def _task_number(tid: str) -> int:
    tail = tid.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def sample_rows(
    model: str, task_ids: Iterable[str], root: Path | None = None
) -> list[dict[str, Any]]:
    """Sample set rows for ``model``: tasks in ``task_ids`` that have at least one sample."""
    found = load_specfix_samples(model, root)
    return [
        {"task_id": tid, "model": model, "samples": found[tid]["samples"]}
        for tid in task_ids
        if tid in found and found[tid]["samples"]
    ]


# -- CLI --------------------------------------------------------------------------------------


async def _convert_aligned(args: argparse.Namespace) -> int:
    from firstpass.sandbox import Sandbox

    out = Path(args.out)
    t0 = time.perf_counter()
    async with Sandbox(isolation=args.isolation) as sb:
        conv = await convert_aligned(sb, root=args.data, limit=args.limit)
    n = await asyncio.to_thread(write_jsonl, out / TASK_FILES["aligned"], conv.rows)
    print(
        f"{TASK_FILES['aligned']}: {n} tasks ({time.perf_counter() - t0:.1f} s, sandbox isolation "
        f"{args.isolation}); visible = MBPP's first two original asserts, gate = all three"
    )
    counts = conv.counts()
    print(
        f"  dropped {sum(counts.values())} tasks: "
        + ", ".join(f"{r} {c}" for r, c in counts.items())
    )
    summary = conv.summary()
    for reason, ids in summary["dropped"].items():
        if ids:
            print(f"  {reason}: " + ", ".join(ids))
    for tid, detail in conv.reference_retried.items():
        print(f"  kept {tid}: the reference failed once, then passed ({detail[:120]})")
    text = json.dumps(summary, indent=2)
    await asyncio.to_thread((out / "conversion-aligned.json").write_text, text)
    return 0


async def _convert(args: argparse.Namespace) -> int:
    from firstpass.sandbox import Sandbox

    if args.setting == "aligned":
        return await _convert_aligned(args)
    out = Path(args.out)
    t0 = time.perf_counter()
    async with Sandbox(isolation=args.isolation) as sb:
        conv = await convert_tasks(sb, root=args.data, limit=args.limit)
    n = await asyncio.to_thread(write_jsonl, out / "tasks.jsonl", conv.rows)
    print(
        f"tasks.jsonl: {n} tasks ({time.perf_counter() - t0:.1f} s, sandbox isolation {args.isolation})"
    )
    print(
        f"  hidden inputs: {conv.total_inputs}, dropped {conv.dropped_inputs} "
        "(reference raised, returned non-data, or differed between two processes)"
    )
    for tid, why in conv.dropped_tasks.items():
        print(f"  dropped task {tid}: {why}")
    print(
        f"  visible test taken from the SpecFix requirement; differs from MBPP+'s first assert "
        f"for {len(conv.visible_from_requirement_differs)}: "
        + ", ".join(conv.visible_from_requirement_differs)
    )
    ids = [r["task_id"] for r in conv.rows]
    for model in MODELS:
        rows = await asyncio.to_thread(sample_rows, model, ids, args.data)
        m = await asyncio.to_thread(write_jsonl, out / f"samples-{model}.jsonl", rows)
        total = sum(len(r["samples"]) for r in rows)
        print(f"samples-{model}.jsonl: {m} tasks, {total} samples")
    summary = {
        "tasks": n,
        "dropped_tasks": conv.dropped_tasks,
        "hidden_inputs": conv.total_inputs,
        "hidden_inputs_dropped": conv.dropped_inputs,
        "visible_differs_from_mbppplus": conv.visible_from_requirement_differs,
        "hidden_inputs_dropped_by_task": {
            r["task_id"]: r["source"]["hidden_dropped"]
            for r in conv.rows
            if r["source"]["hidden_dropped"]
        },
    }
    await asyncio.to_thread((out / "conversion.json").write_text, json.dumps(summary, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Convert ../shared/data into Task / Sample sets")
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)"
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument(
        "--setting",
        choices=SETTINGS,
        default="strict",
        help="strict: tasks.jsonl + sample sets (hidden = MBPP+ inputs); aligned: "
        "tasks-aligned.jsonl (gate = MBPP's three original asserts) (default: %(default)s)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="the shared data directory (default: $FIRSTPASS_DATA, else <repo>/../shared/data)",
    )
    parser.add_argument(
        "--isolation",
        default="auto",
        help="sandbox isolation level (auto, netns+uid, netns, uid, none)",
    )
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_convert(args))
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
